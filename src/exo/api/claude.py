"""Anthropic Messages: ``POST /v1/messages``, whole or as the event stream the
``anthropic`` SDK expects (message_start, content_block_start, ping,
content_block_delta..., content_block_stop, message_delta, message_stop; failures as
``event: error``)."""

from typing import Annotated, Any, Literal, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator, Field, PlainValidator
from starlette.responses import Response

from exo.api.errors import ApiError, claude_error_type
from exo.api.generation_events import (
    Failed,
    Finished,
    FinishKind,
    GenerationEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallEvent,
)
from exo.api.generation_service import GenerationService
from exo.api.images import ImageError, check_media_type, image_from_base64, image_from_url
from exo.api.streaming import GenerationStream, client_gone, complete, sse
from exo.api.task_params import ApiModel, Sampling, build_task_params, text_content
from exo.api.tool_models import (
    Tools,
    arguments_text,
    continues_final,
    json_object,
    schema_text,
    thinking_kwargs,
)
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.chunks import Usage
from exo.shared.types.common import CommandId
from exo.shared.types.text_generation import (
    InputImage,
    InputMessage,
    TextGenerationTaskParams,
    ToolCall,
    ToolSpec,
)


def _system_text(value: object) -> object:
    return None if value is None else text_content(value, ("text",))


class TextBlock(ApiModel):
    type: Literal["text"]
    text: str


class ToolUseBlock(ApiModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: object = None


class ToolResultBlock(ApiModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Annotated[str, BeforeValidator(_system_text)] = ""
    is_error: bool = False


def _claude_image(value: object) -> InputImage:
    """An image block's ``source``: ``{"type": "base64", "media_type", "data"}`` or
    ``{"type": "url", "url"}``."""
    if not isinstance(value, dict):
        raise ValueError("must be an object with a 'type' of 'base64' or 'url'")
    source = cast(dict[str, object], value)
    try:
        match source.get("type"):
            case "base64":
                media_type, data = source.get("media_type"), source.get("data")
                if not isinstance(data, str):
                    raise ImageError("a base64 source needs a string 'data'")
                check_media_type(media_type if isinstance(media_type, str) else None)
                return image_from_base64(data)
            case "url":
                url = source.get("url")
                if not isinstance(url, str):
                    raise ImageError("a url source needs a string 'url'")
                return image_from_url(url)
            case other:
                raise ImageError(f"source type {other!r} is not supported: use base64 or url")
    except ImageError as e:
        raise ValueError(str(e)) from e


class ImageBlock(ApiModel):
    type: Literal["image"]
    source: Annotated[InputImage, PlainValidator(_claude_image)]


class DocumentBlock(ApiModel):
    type: Literal["document"]


class ThinkingBlock(ApiModel):
    """Earlier thinking: not shown to the model again."""

    type: Literal["thinking", "redacted_thinking"]


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ImageBlock | DocumentBlock | ThinkingBlock,
    Field(discriminator="type"),
]


def _blocks(value: object) -> object:
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class ClaudeMessage(ApiModel):
    role: Literal["user", "assistant"]
    content: Annotated[list[Block], BeforeValidator(_blocks)]

    def messages(self, names: dict[str, str]) -> list[InputMessage]:
        """Tool results become tool messages (before the turn's text); tool uses, the
        assistant's calls. ``names`` maps call ids to function names, across turns."""
        out: list[InputMessage] = []
        texts: list[str] = []
        calls: list[ToolCall] = []
        images: list[InputImage] = []
        for block in self.content:
            match block:
                case TextBlock():
                    texts.append(block.text)
                case ToolUseBlock():
                    names[block.id] = block.name
                    calls.append(
                        ToolCall(
                            id=block.id, name=block.name, arguments=arguments_text(block.input)
                        )
                    )
                case ToolResultBlock():
                    out.append(
                        InputMessage(
                            role="tool",
                            content=block.content,
                            tool_call_id=block.tool_use_id,
                            name=names.get(block.tool_use_id),
                        )
                    )
                case ThinkingBlock():
                    pass
                case ImageBlock():
                    images.append(block.source)
                case DocumentBlock():
                    raise ApiError(
                        400, "messages: document blocks are not supported", param="messages"
                    )
        if texts or calls or images or not out:
            out.append(
                InputMessage(
                    role=self.role, content="\n".join(texts), tool_calls=calls, images=images
                )
            )
        return out


class ClaudeTool(ApiModel):
    name: str = Field(min_length=1)
    description: str = ""
    input_schema: dict[str, Any] | None = None
    type: str | None = None

    def spec(self) -> ToolSpec:
        if self.type not in (None, "custom"):
            raise ApiError(400, f"tools: server tool {self.type!r} is not supported", param="tools")
        return ToolSpec(
            name=self.name, description=self.description, parameters=schema_text(self.input_schema)
        )


class ClaudeToolChoice(ApiModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None


def claude_tools(tools: list[ClaudeTool] | None, choice: ClaudeToolChoice | None) -> Tools:
    specs = tuple(t.spec() for t in tools or ())
    if choice is None:
        return Tools(specs)
    match choice.type:
        case "auto":
            return Tools(specs)
        case "none":
            return Tools(specs, "none")
        case "any":
            return Tools(specs, "required").checked("tool_choice")
        case "tool":
            return Tools(specs, "required", choice.name or "").checked("tool_choice")


class ThinkingConfig(ApiModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


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
    tools: list[ClaudeTool] | None = None
    tool_choice: ClaudeToolChoice | None = None
    thinking: ThinkingConfig | None = None


class CountTokensRequest(MessagesRequest):
    """``/v1/messages/count_tokens``: a Messages request without ``max_tokens``."""

    max_tokens: int = Field(default=1, ge=1)


def messages_task_params(request: MessagesRequest, card: ModelCard) -> TextGenerationTaskParams:
    messages: list[InputMessage] = []
    if request.system:
        messages.append(InputMessage(role="system", content=request.system))
    names: dict[str, str] = {}
    for m in request.messages:
        messages.extend(m.messages(names))
    tools = claude_tools(request.tools, request.tool_choice)
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
        tools=tools.specs,
        tool_choice=tools.choice,
        forced_tool=tools.forced,
        template_kwargs=thinking_kwargs(
            None if request.thinking is None else request.thinking.type != "disabled"
        ),
    ).model_copy(update={"continue_final_message": continues_final(messages)})


def stop_reason(reason: FinishKind) -> str:
    match reason:
        case "stop" | "cancelled":
            return "end_turn"
        case "length":
            return "max_tokens"
        case "stop_sequence":
            return "stop_sequence"
        case "tool_calls":
            return "tool_use"


def tool_use_block(call: ToolCallEvent, with_input: bool = True) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": json_object(call.arguments) if with_input else {},
    }


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
        "content": [
            *(
                [{"type": "thinking", "thinking": finished.reasoning, "signature": ""}]
                if finished.reasoning
                else []
            ),
            *([{"type": "text", "text": text}] if text or not finished.tool_calls else []),
            *(tool_use_block(call) for call in finished.tool_calls),
        ],
        "stop_reason": stop_reason(finished.reason),
        "stop_sequence": finished.stop_sequence,
        "usage": usage_json(finished.usage),
    }


def usage_json(usage: Usage) -> dict[str, int]:
    return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}


def claude_error(message: str, status: int = 500) -> dict[str, Any]:
    return {"type": "error", "error": {"type": claude_error_type(status), "message": message}}


class MessagesStreamEncoder:
    """Content blocks open as they come: thinking, text, a block per tool use."""

    def __init__(self, command_id: CommandId, model: str) -> None:
        self._id = message_id(command_id)
        self._model = model
        self._blocks = 0
        # The kind of the block being written ("text" or "thinking"), if one is open.
        self._open: str | None = None

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
        return [_event("message_start", message=message), _event("ping")]

    def _close(self) -> list[bytes]:
        if self._open is None:
            return []
        self._open = None
        self._blocks += 1
        return [_event("content_block_stop", index=self._blocks - 1)]

    def _write(self, kind: str, delta: dict[str, str]) -> list[bytes]:
        """A delta into an open block of ``kind`` (closing another, opening this)."""
        out: list[bytes] = []
        if self._open != kind:
            out.extend(self._close())
            self._open = kind
            block = {"type": "text", "text": ""}
            if kind == "thinking":
                block = {"type": "thinking", "thinking": "", "signature": ""}
            out.append(_event("content_block_start", index=self._blocks, content_block=block))
        return [*out, _event("content_block_delta", index=self._blocks, delta=delta)]

    def encode(self, event: GenerationEvent, index: int = 0) -> list[bytes]:
        match event:
            case TextDelta():
                return self._write("text", {"type": "text_delta", "text": event.text})
            case ReasoningDelta():
                return self._write("thinking", {"type": "thinking_delta", "thinking": event.text})
            case ToolCallEvent():
                out = self._close()
                at = self._blocks
                self._blocks += 1
                delta = {"type": "input_json_delta", "partial_json": event.arguments}
                return [
                    *out,
                    _event(
                        "content_block_start", index=at, content_block=tool_use_block(event, False)
                    ),
                    _event("content_block_delta", index=at, delta=delta),
                    _event("content_block_stop", index=at),
                ]
            case Finished():
                delta = {
                    "stop_reason": stop_reason(event.reason),
                    "stop_sequence": event.stop_sequence,
                }
                return [
                    *self._close(),
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
        card = await service.resolve_model_async(body.model)
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
