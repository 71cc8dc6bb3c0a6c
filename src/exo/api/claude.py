"""Anthropic Messages: ``POST /v1/messages``, whole or as the event stream the
``anthropic`` SDK expects (message_start, content_block_start, ping,
content_block_delta..., content_block_stop, message_delta, message_stop; failures as
``event: error``)."""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator, Field, field_validator
from starlette.responses import Response

from exo.api.errors import claude_error_type
from exo.api.generation import GenerationService
from exo.api.generation_events import Failed, Finished, FinishKind, GenerationEvent, TextDelta
from exo.api.streaming import GenerationStream, client_gone, complete, sse
from exo.api.task_params import ApiModel, Sampling, build_task_params, text_content
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.chunks import Usage
from exo.shared.types.common import CommandId
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams


def _block_text(value: object) -> object:
    return text_content(value, ("text",))


def _system_text(value: object) -> object:
    return None if value is None else text_content(value, ("text",))


BlockText = Annotated[str, BeforeValidator(_block_text)]


class ClaudeMessage(ApiModel):
    role: Literal["user", "assistant"]
    content: BlockText


class MessagesRequest(ApiModel):
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[ClaudeMessage] = Field(min_length=1)
    system: Annotated[str | None, BeforeValidator(_system_text)] = None
    stop_sequences: list[str] = []
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    tools: list[object] | None = None

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, tools: list[object] | None) -> list[object] | None:
        if tools:
            raise ValueError("tool use is not supported by this server")
        return tools


class CountTokensRequest(MessagesRequest):
    """``/v1/messages/count_tokens``: a Messages request without ``max_tokens``."""

    max_tokens: int = Field(default=1, ge=1)


def messages_task_params(request: MessagesRequest, card: ModelCard) -> TextGenerationTaskParams:
    messages: list[InputMessage] = []
    if request.system:
        messages.append(InputMessage(role="system", content=request.system))
    messages.extend(InputMessage(role=m.role, content=m.content) for m in request.messages)
    sampling = Sampling(
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        stop=tuple(request.stop_sequences),
    )
    return build_task_params(
        card,
        messages,
        sampling,
        stream=request.stream,
        names={"stop": "stop_sequences", "input": "messages"},
    )


def stop_reason(reason: FinishKind) -> str:
    match reason:
        case "stop" | "cancelled":
            return "end_turn"
        case "length":
            return "max_tokens"
        case "stop_sequence":
            return "stop_sequence"


def message_id(command_id: CommandId) -> str:
    return f"msg_{command_id}"


def whole_message(
    command_id: CommandId, model: str, text: str, finished: Finished
) -> dict[str, Any]:
    return {
        "id": message_id(command_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason(finished.reason),
        "stop_sequence": finished.stop_sequence,
        "usage": usage_json(finished.usage),
    }


def usage_json(usage: Usage) -> dict[str, int]:
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}


def claude_error(message: str, status: int = 500) -> dict[str, Any]:
    return {"type": "error", "error": {"type": claude_error_type(status), "message": message}}


class MessagesStreamEncoder:
    def __init__(self, command_id: CommandId, model: str) -> None:
        self._id = message_id(command_id)
        self._model = model

    def begin(self, prompt_tokens: int) -> list[bytes]:
        message = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
        }
        return [
            _event("message_start", message=message),
            _event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            _event("ping"),
        ]

    def encode(self, event: GenerationEvent, index: int = 0) -> list[bytes]:
        match event:
            case TextDelta():
                delta = {"type": "text_delta", "text": event.text}
                return [_event("content_block_delta", index=0, delta=delta)]
            case Finished():
                delta = {
                    "stop_reason": stop_reason(event.reason),
                    "stop_sequence": event.stop_sequence,
                }
                return [
                    _event("content_block_stop", index=0),
                    _event("message_delta", delta=delta, usage=usage_json(event.usage)),
                    _event("message_stop"),
                ]
            case Failed():
                status = 500 if event.code is None else 400
                return [sse(claude_error(event.message, status), event="error")]


def _event(kind: str, **fields: Any) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


def router(service: GenerationService) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/messages", response_model=None)
    async def messages(body: MessagesRequest, request: Request) -> Response:
        card = service.resolve_model(body.model)
        params = messages_task_params(body, card)
        if body.stream:

            def encoder(command_id: CommandId) -> MessagesStreamEncoder:
                return MessagesStreamEncoder(command_id, card.model_id)

            return GenerationStream(service, params, card, encoder, "text/event-stream")
        result = await complete(service, request, params, card)
        if result is None:
            return client_gone()
        command_id, text, finished = result
        return JSONResponse(whole_message(command_id, card.model_id, text, finished))

    @api.post("/v1/messages/count_tokens", response_model=None)
    async def count_tokens(body: CountTokensRequest, request: Request) -> Response:
        # The model's own tokenizer and template count, in the runner that serves it.
        card = service.resolve_model(body.model)
        params = messages_task_params(body, card).model_copy(
            update={"count_only": True, "stream": False}
        )
        result = await complete(service, request, params, card)
        if result is None:
            return client_gone()
        _, _, finished = result
        return JSONResponse({"input_tokens": finished.usage.prompt_tokens})

    return api
