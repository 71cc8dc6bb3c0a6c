"""Pieces of a streamed response, sent from a runner to the API that took the request."""

from typing import Annotated, Literal

from pydantic import Field

from exo.shared.models.model_cards import ModelId
from exo.shared.types.common import FrozenModel

FinishReason = Literal["stop", "length", "cancelled", "error"]
# Errors an API maps to a client error (4xx) rather than a server error, and the master's
# log that cannot take a write (a full disk: 507).
ErrorCode = Literal["context_length_exceeded", "invalid_request", "insufficient_storage"]
# Why the master refused a command (``exo.master.decide``; the API maps each to a status).
RefusalKind = Literal["unknown_model", "no_placement", "no_instance", "not_serving", "log_full"]


class Usage(FrozenModel):
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def token_raw(token: str, token_bytes: list[int] | None) -> bytes:
    """A token's bytes: ``token_bytes`` where its text alone is part of a character, else its
    text's UTF-8."""
    return token.encode() if token_bytes is None else bytes(token_bytes)


class TopLogprob(FrozenModel):
    token: str
    logprob: float
    # The token's own bytes, only where its text alone is not whole characters (a byte-level
    # or byte-fallback token holding part of a character's UTF-8): its text is then U+FFFD.
    token_bytes: list[int] | None = None

    @property
    def raw(self) -> bytes:
        return token_raw(self.token, self.token_bytes)


class TokenLogprob(TopLogprob):
    """One generated token's text and log-probability, and the most likely alternatives."""

    top: list[TopLogprob] = []


class EchoedPrompt(FrozenModel):
    """The prompt as the model read it (OpenAI completions' echo): its text, each token's
    text and, when asked, the log-probability of every token after the first."""

    text: str
    tokens: list[str]
    logprobs: list[TokenLogprob] | None = None
    # Each token's own bytes where its text alone is not whole characters (see TopLogprob),
    # else None; None for all when no token splits a character.
    token_bytes: list[list[int] | None] | None = None


class TokenChunk(FrozenModel):
    kind: Literal["TokenChunk"] = "TokenChunk"
    model: ModelId
    text: str
    token_id: int
    idx: int
    finish_reason: FinishReason | None = None
    # Present on the last chunk of a request.
    usage: Usage | None = None
    # The prompt's length in tokens, on the first chunk of a request.
    prompt_tokens: int | None = None
    # The stop string that ended the output (finish_reason "stop"), if one did.
    stop_sequence: str | None = None
    # When the request asked for them: the tokens of this chunk's text.
    logprobs: list[TokenLogprob] | None = None
    # When the request asked for it (echo): the prompt (final chunk).
    echo: EchoedPrompt | None = None
    # An embedding request's answer: the unit-length vector of its input.
    embedding: list[float] | None = None
    # When the request asked for it: the prompt's and the output's token ids (final chunk).
    context: list[int] | None = None


class ErrorChunk(FrozenModel):
    kind: Literal["ErrorChunk"] = "ErrorChunk"
    model: ModelId
    error_message: str
    finish_reason: FinishReason = "error"
    # Set when the request itself was at fault (the prompt is too long...).
    error_code: ErrorCode | None = None
    # Set when the master refused the command (it was not applied).
    refusal: RefusalKind | None = None


def error_chunk(
    message: str,
    model: ModelId | None = None,
    code: ErrorCode | None = None,
    refusal: RefusalKind | None = None,
) -> ErrorChunk:
    """The one way an error reaches a request: from its model's runner (``model``), or from
    the cluster itself (no model: the node, the master, a lost link)."""
    return ErrorChunk(model=model or ModelId("exo"), error_message=message, error_code=code,
                      refusal=refusal)


Chunk = Annotated[TokenChunk | ErrorChunk, Field(discriminator="kind")]
