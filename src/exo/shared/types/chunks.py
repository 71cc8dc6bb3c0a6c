"""Pieces of a streamed response, sent from a runner to the API that took the request."""

from typing import Annotated, Literal

from pydantic import Field

from exo.shared.models.model_cards import ModelId
from exo.shared.types.common import FrozenModel

FinishReason = Literal["stop", "length", "cancelled", "error"]


class Usage(FrozenModel):
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class TokenChunk(FrozenModel):
    kind: Literal["TokenChunk"] = "TokenChunk"
    model: ModelId
    text: str
    token_id: int
    idx: int
    finish_reason: FinishReason | None = None
    # Present on the last chunk of a request.
    usage: Usage | None = None


class ErrorChunk(FrozenModel):
    kind: Literal["ErrorChunk"] = "ErrorChunk"
    model: ModelId
    error_message: str
    finish_reason: FinishReason = "error"


Chunk = Annotated[TokenChunk | ErrorChunk, Field(discriminator="kind")]
