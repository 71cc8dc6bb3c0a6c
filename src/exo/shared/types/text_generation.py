"""The parameters of one text generation request, independent of API format."""

from typing import Literal

from pydantic import Field

from exo.shared.models.model_cards import ModelId
from exo.shared.types.common import FrozenModel

Role = Literal["system", "user", "assistant", "tool"]


class InputMessage(FrozenModel):
    role: Role
    content: str


class TextGenerationTaskParams(FrozenModel):
    model: ModelId
    input: list[InputMessage] = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = None
    stop: list[str] = []
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    # A raw prompt bypasses the chat template (Ollama /api/generate with raw=true).
    raw_prompt: str | None = None
    # The context for this request (Ollama num_ctx), at most the runner's own.
    num_ctx: int | None = Field(default=None, ge=1)
    # Count the prompt's tokens and generate nothing (Claude count_tokens).
    count_only: bool = False
