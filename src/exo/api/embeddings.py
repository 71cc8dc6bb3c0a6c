"""Embeddings: OpenAI ``POST /v1/embeddings``, Ollama ``POST /api/embed`` and the legacy
``POST /api/embeddings``.

A vector is the mean of the loaded model's final hidden states (after its final norm) over
the input's tokens, scaled to unit length; the runner computes it in one forward pass (an
embedding task is a text generation task with ``embed`` set, answered by one final chunk).
Several inputs are embedded one after another, each in its own slot.
"""

import base64
import struct
import time
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator, Field
from starlette.responses import Response

from exo.api.errors import ApiError
from exo.api.generation_service import GenerationService
from exo.api.ollama import resolve
from exo.api.streaming import client_gone, complete
from exo.api.task_params import ApiModel
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams

# OpenAI's own limit on inputs per request.
MAX_INPUTS = 2048


def _texts(value: object) -> object:
    """A string is one input; token-id arrays are refused by name (Ollama embeds text)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and any(
        isinstance(item, (int, list))
        for item in value  # pyright: ignore[reportUnknownVariableType]
    ):
        raise ValueError("token-id input is not supported: send text")
    return value


def _is_ids(value: object) -> bool:
    return (
        isinstance(value, list)
        and len(value) > 0  # pyright: ignore[reportUnknownArgumentType]
        and all(isinstance(i, int) and not isinstance(i, bool) for i in value)  # pyright: ignore[reportUnknownVariableType]
    )


def _openai_inputs(value: object) -> object:
    """OpenAI's four forms: a string, an array of strings, an array of token ids (one
    input), an array of token-id arrays."""
    if isinstance(value, str) or _is_ids(value):
        return [value]
    return value


TokenIds = Annotated[list[Annotated[int, Field(strict=True, ge=0)]], Field(min_length=1)]
Text = Annotated[str, Field(min_length=1)]
# An input: text, or the token ids of a text (in the model's own vocabulary).
EmbedInput = Text | TokenIds

Inputs = Annotated[
    list[Text],
    BeforeValidator(_texts),
    Field(min_length=1, max_length=MAX_INPUTS),
]
OpenAIInputs = Annotated[
    list[EmbedInput],
    BeforeValidator(_openai_inputs),
    Field(min_length=1, max_length=MAX_INPUTS),
]


class OpenAIEmbeddingRequest(ApiModel):
    model: str
    input: OpenAIInputs
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None


class OllamaEmbedRequest(ApiModel):
    model: str
    input: Inputs
    # Ollama's default: an input over the context is cut to fit.
    truncate: bool = True


class OllamaLegacyEmbeddingRequest(ApiModel):
    model: str
    prompt: str = Field(min_length=1)


def embedding_task_params(
    card: ModelCard, item: str | list[int], truncate: bool = False
) -> TextGenerationTaskParams:
    """The task embedding a text, or token ids (the runner checks them against its
    vocabulary and embeds them as they are)."""
    text = item if isinstance(item, str) else ""
    return TextGenerationTaskParams(
        model=card.model_id,
        input=[InputMessage(role="user", content=text)],
        raw_prompt=text,
        embed=True,
        truncate=truncate,
        max_tokens=1,
        context_tokens=[] if isinstance(item, str) else list(item),
    )


def as_base64(vector: list[float]) -> str:
    """Little-endian float32s, base64-encoded (what OpenAI's SDKs decode)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


async def embed_all(
    service: GenerationService,
    request: Request,
    card: ModelCard,
    texts: Sequence[str | list[int]],
    truncate: bool = False,
) -> tuple[list[list[float]], int] | None:
    """Each input's vector and the tokens they took; None when the client went away."""
    vectors: list[list[float]] = []
    tokens = 0
    for text in texts:
        try:
            params = embedding_task_params(card, text, truncate)
            result = await complete(service, request, params, card)
        except ApiError as e:
            if e.status == 400:
                raise ApiError(400, e.message, param="input", code=e.code) from e
            raise
        if result is None:
            return None
        _, _, finished = result
        if not finished.embedding:
            raise ApiError(502, "the runner answered no vector", code="generation_failed")
        vectors.append(list(finished.embedding))
        tokens += finished.usage.prompt_tokens
    return vectors, tokens


def router(service: GenerationService) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/embeddings", response_model=None)
    async def openai_embeddings(body: OpenAIEmbeddingRequest, request: Request) -> Response:
        card = service.resolve_model(body.model)
        result = await embed_all(service, request, card, body.input)
        if result is None:
            return client_gone()
        vectors, tokens = result
        if body.dimensions is not None and body.dimensions != len(vectors[0]):
            raise ApiError(
                400,
                f"dimensions: this model's vectors have {len(vectors[0])} dimensions",
                param="dimensions",
            )
        data: list[dict[str, Any]] = [
            {
                "object": "embedding",
                "index": i,
                "embedding": as_base64(v) if body.encoding_format == "base64" else v,
            }
            for i, v in enumerate(vectors)
        ]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": card.model_id,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    @api.post("/api/embed", response_model=None)
    async def ollama_embed(body: OllamaEmbedRequest, request: Request) -> Response:
        card = await resolve(service, body.model)
        started = time.monotonic_ns()
        result = await embed_all(service, request, card, body.input, body.truncate)
        if result is None:
            return client_gone()
        vectors, tokens = result
        return JSONResponse(
            {
                "model": body.model,
                "embeddings": vectors,
                "total_duration": time.monotonic_ns() - started,
                "load_duration": 0,
                "prompt_eval_count": tokens,
            }
        )

    @api.post("/api/embeddings", response_model=None)
    async def ollama_legacy_embeddings(
        body: OllamaLegacyEmbeddingRequest, request: Request
    ) -> Response:
        card = await resolve(service, body.model)
        result = await embed_all(service, request, card, [body.prompt])
        if result is None:
            return client_gone()
        return JSONResponse({"embedding": result[0][0]})

    return api
