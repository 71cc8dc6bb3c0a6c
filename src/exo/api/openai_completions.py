"""OpenAI legacy Completions: ``POST /v1/completions``, whole or streamed. The prompt is
raw text: no chat template."""

import time
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator, Field
from starlette.responses import Response

from exo.api.generation_events import (
    Failed,
    Finished,
    GenerationEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallEvent,
)
from exo.api.generation_service import GenerationService
from exo.api.openai_chat import (
    StreamOptions,
    failure_sse,
    finish_reason,
    stream_end,
    usage_json,
    usage_wanted,
)
from exo.api.streaming import GenerationStream, client_gone, complete, sse
from exo.api.task_params import (
    SamplingOptions,
    build_task_params,
)
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.common import CommandId
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams


def _one_prompt(value: object) -> object:
    """A string, or a list holding one string (several prompts are not batched here)."""
    if isinstance(value, list) and len(value) == 1:  # pyright: ignore[reportUnknownArgumentType]
        return value[0]  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list):
        raise ValueError("send one prompt per request")
    return value


class CompletionRequest(SamplingOptions):
    model: str
    prompt: Annotated[str, BeforeValidator(_one_prompt)] = Field(min_length=1)
    # OpenAI's default for this endpoint.
    max_tokens: int = Field(default=16, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    echo: bool = False


def completion_task_params(request: CompletionRequest, card: ModelCard) -> TextGenerationTaskParams:
    sampling = request.to_sampling(request.max_tokens)
    return build_task_params(
        card,
        [InputMessage(role="user", content=request.prompt)],
        sampling,
        stream=request.stream,
        names={"input": "prompt"},
        raw_prompt=request.prompt,
    )


def completion_id(command_id: CommandId) -> str:
    return f"cmpl-{command_id}"


def choice(text: str, finish: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}


class CompletionStreamEncoder:
    def __init__(
        self, command_id: CommandId, model: str, created: int, include_usage: bool, echo: str
    ) -> None:
        self._head = {
            "id": completion_id(command_id),
            "object": "text_completion",
            "created": created,
            "model": model,
        }
        self._include_usage = include_usage
        self._echo = echo

    def begin(self, prompt_tokens: int) -> list[bytes]:
        return [sse({**self._head, "choices": [choice(self._echo, None)]})] if self._echo else []

    def encode(self, event: GenerationEvent, index: int = 0) -> list[bytes]:
        match event:
            case TextDelta() | ReasoningDelta():
                return [sse({**self._head, "choices": [choice(event.text, None)]})]
            case ToolCallEvent():
                return []
            case Finished():
                out = [sse({**self._head, "choices": [choice("", finish_reason(event.reason))]})]
                return [*out, *stream_end(self._head, event.usage if self._include_usage else None)]
            case Failed():
                return failure_sse(event)


def router(service: GenerationService) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        card = await service.resolve_model_async(body.model)
        params = completion_task_params(body, card)
        created = int(time.time())
        echo = body.prompt if body.echo else ""
        if body.stream:
            include_usage = usage_wanted(body.stream_options)

            def encoder(command_id: CommandId) -> CompletionStreamEncoder:
                return CompletionStreamEncoder(
                    command_id, card.model_id, created, include_usage, echo
                )

            return GenerationStream(service, params, card, encoder, "text/event-stream")
        result = await complete(service, request, params, card)
        if result is None:
            return client_gone()
        command_id, text, finished = result
        return JSONResponse(
            {
                "id": completion_id(command_id),
                "object": "text_completion",
                "created": created,
                "model": card.model_id,
                "choices": [choice(echo + text, finish_reason(finished.reason))],
                "usage": usage_json(finished.usage),
            }
        )

    return api
