"""OpenAI Chat Completions: ``POST /v1/chat/completions``, ``GET /v1/models`` and
``POST /v1/cancel/{command_id}``."""

import time
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field, PlainValidator
from starlette.responses import Response

from exo.api.errors import ApiError
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
from exo.api.images import openai_image_part
from exo.api.streaming import GenerationStream, client_gone, complete, sse
from exo.api.task_params import (
    ApiModel,
    Content,
    SamplingOptions,
    build_task_params,
    message_content,
)
from exo.api.tool_models import (
    CallIn,
    FunctionTool,
    OpenAIToolChoice,
    ReasoningEffort,
    ResponseFormat,
    logprob_json,
    openai_tools,
    thinking_kwargs,
)
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.chunks import Usage
from exo.shared.types.common import CommandId
from exo.shared.types.text_generation import InputMessage, Role, TextGenerationTaskParams


def _chat_content(value: object) -> object:
    return message_content(value, ("text", "input_text"), {"image_url": openai_image_part})


class ChatMessage(ApiModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[Content, PlainValidator(_chat_content)] = Content("")
    tool_calls: list[CallIn] = []
    tool_call_id: str | None = None
    name: str | None = None

    def message(self) -> InputMessage:
        return InputMessage(
            role=_ROLES[self.role],
            content=self.content.text,
            images=list(self.content.images),
            tool_calls=[c.call(i) for i, c in enumerate(self.tool_calls)],
            tool_call_id=self.tool_call_id,
            name=self.name,
        )


class StreamOptions(ApiModel):
    include_usage: bool = False


def usage_wanted(options: StreamOptions | None) -> bool:
    """Whether a stream ends with a usage chunk (``stream_options.include_usage``)."""
    return options is not None and options.include_usage


MAX_CHOICES = 16


class ChatCompletionRequest(SamplingOptions):
    """Sampling as ``SamplingOptions`` (``top_k``, ``min_p`` and ``repetition_penalty``
    are extensions many OpenAI-compatible servers accept)."""

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    # Choices are generated one after another (each a generation of its own).
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    tools: list[FunctionTool] | None = None
    tool_choice: OpenAIToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    reasoning_effort: ReasoningEffort | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # An extension many OpenAI-compatible servers accept.
    chat_template_kwargs: dict[str, str | bool] | None = None
    # llama-server's extension: end-of-sequence tokens are never sampled (a fixed length).
    ignore_eos: bool = False


_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


def chat_task_params(request: ChatCompletionRequest, card: ModelCard) -> TextGenerationTaskParams:
    messages = [m.message() for m in request.messages]
    tools = openai_tools(request.tools, request.tool_choice)
    sampling = request.to_sampling(
        request.max_completion_tokens or request.max_tokens, request.ignore_eos
    )
    return build_task_params(
        card,
        messages,
        sampling,
        stream=request.stream,
        names={"max_tokens": "max_tokens", "input": "messages"},
        tools=tools.specs,
        tool_choice=tools.choice,
        forced_tool=tools.forced,
        template_kwargs=thinking_kwargs(request.reasoning_effort, request.chat_template_kwargs),
        logprobs=request.logprobs,
        top_logprobs=request.top_logprobs or 0,
        json_schema=(
            request.response_format.schema_text("response_format")
            if request.response_format is not None
            else None
        ),
    )


def finish_reason(reason: FinishKind) -> str:
    match reason:
        case "length":
            return "length"
        case "stop" | "stop_sequence" | "cancelled":
            return "stop"
        case "tool_calls":
            return "tool_calls"


def tool_call_json(call: ToolCallEvent, index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {} if index is None else {"index": index}
    out.update(
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
    )
    return out


def assistant_message(text: str, finished: Finished) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if finished.reasoning:
        message["reasoning_content"] = finished.reasoning
    if finished.tool_calls:
        message["content"] = text or None
        message["tool_calls"] = [tool_call_json(c) for c in finished.tool_calls]
    return message


def usage_json(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def completion_id(command_id: CommandId) -> str:
    return f"chatcmpl-{command_id}"


def chat_completion(
    command_id: CommandId, model: str, created: int, choices: Sequence[tuple[str, Finished]]
) -> dict[str, Any]:
    """A whole ``chat.completion`` of one or more choices."""
    return {
        "id": completion_id(command_id),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": index,
                "message": assistant_message(text, finished),
                "logprobs": (
                    {"content": [logprob_json(e) for e in finished.logprobs]}
                    if finished.logprobs
                    else None
                ),
                "finish_reason": finish_reason(finished.reason),
            }
            for index, (text, finished) in enumerate(choices)
        ],
        "usage": usage_json(total_usage([finished for _, finished in choices])),
    }


def choice_params(params: TextGenerationTaskParams, n: int) -> list[TextGenerationTaskParams]:
    """n generations of one request; with a seed, choice i uses seed + i (they differ,
    and the whole answer is reproducible)."""
    if params.seed is None:
        return [params] * n
    return [params.model_copy(update={"seed": params.seed + i}) for i in range(n)]


def openai_error(message: str, code: str = "generation_failed") -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": code}}


class ChatStreamEncoder:
    """``chat.completion.chunk`` events of ``n`` choices (one after another), then
    ``[DONE]``."""

    def __init__(
        self, command_id: CommandId, model: str, created: int, include_usage: bool, n: int = 1
    ):
        self._head = {
            "id": completion_id(command_id),
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._include_usage = include_usage
        self._n = n
        self._finished: list[Finished] = []
        # Choices whose role delta was sent (begin sends choice 0's).
        self._open: set[int] = {0}

    def _chunk(self, delta: dict[str, Any], finish: str | None, index: int = 0) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            **self._head,
            "choices": [
                {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            ],
        }
        if self._include_usage:
            chunk["usage"] = None
        return chunk

    def begin(self, prompt_tokens: int) -> list[bytes]:
        return [sse(self._chunk({"role": "assistant", "content": ""}, None))]

    def _opening(self, index: int) -> list[bytes]:
        """The role delta of a choice that speaks for the first time."""
        if index in self._open:
            return []
        self._open.add(index)
        return [sse(self._chunk({"role": "assistant", "content": ""}, None, index))]

    def encode(self, event: GenerationEvent, index: int = 0) -> list[bytes]:
        match event:
            case TextDelta():
                chunk = self._chunk({"content": event.text}, None, index)
                if event.logprobs:
                    chunk["choices"][0]["logprobs"] = {
                        "content": [logprob_json(e) for e in event.logprobs]
                    }
                return [*self._opening(index), sse(chunk)]
            case ReasoningDelta():
                delta = {"reasoning_content": event.text}
                return [*self._opening(index), sse(self._chunk(delta, None, index))]
            case ToolCallEvent():
                calls = {"tool_calls": [tool_call_json(event, event.index)]}
                return [sse(self._chunk(calls, None, index))]
            case Finished():
                self._finished.append(event)
                out = [sse(self._chunk({}, finish_reason(event.reason), index))]
                if len(self._finished) < self._n:
                    return out
                usage = total_usage(self._finished) if self._include_usage else None
                return [*out, *stream_end(self._head, usage)]
            case Failed():
                return failure_sse(event)


def stream_end(head: dict[str, Any], usage: Usage | None) -> list[bytes]:
    """The end of an OpenAI stream: a chunk of no choices with the ``usage`` when the
    client asked for it (``stream_options.include_usage``), then ``[DONE]``."""
    out = [] if usage is None else [sse({**head, "choices": [], "usage": usage_json(usage)})]
    return [*out, sse("[DONE]")]


def failure_sse(failed: Failed) -> list[bytes]:
    """A failed generation, as the error event of an OpenAI stream."""
    return [sse(openai_error(failed.message, failed.code or "generation_failed"))]


def total_usage(finished: Sequence[Finished]) -> Usage:
    """n choices of one prompt: the prompt counts once, every completion counts."""
    return Usage(
        prompt_tokens=finished[0].usage.prompt_tokens,
        completion_tokens=sum(f.usage.completion_tokens for f in finished),
    )


def model_entry(card: ModelCard, created: int) -> dict[str, Any]:
    """OpenAI's model object; ``input_modalities`` (an extension) says whether it takes images."""
    return {
        "id": card.model_id,
        "object": "model",
        "created": created,
        "owned_by": "exo",
        "input_modalities": ["text", "image"] if card.vision else ["text"],
    }


def model_list(cards: list[ModelCard], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_entry(card, created) for card in cards]}


_ID_PREFIXES = ("chatcmpl-", "resp_", "msg_")


def command_id_of(value: str) -> CommandId:
    """A command id from itself or an id we derived from it (``chatcmpl-<id>``...)."""
    for prefix in _ID_PREFIXES:
        if value.startswith(prefix) and len(value) > len(prefix):
            return CommandId(value[len(prefix) :])
    return CommandId(value)


def router(service: GenerationService) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        card = await service.resolve_model_async(body.model)
        params = chat_task_params(body, card)
        created = int(time.time())
        if body.stream:
            include_usage = usage_wanted(body.stream_options)

            def encoder(command_id: CommandId) -> ChatStreamEncoder:
                return ChatStreamEncoder(command_id, card.model_id, created, include_usage, body.n)

            return GenerationStream(
                service, choice_params(params, body.n), card, encoder, "text/event-stream"
            )
        choices: list[tuple[str, Finished]] = []
        first_id: CommandId | None = None
        for choice in choice_params(params, body.n):
            result = await complete(service, request, choice, card)
            if result is None:
                return client_gone()
            command_id, text, finished = result
            first_id = first_id or command_id
            choices.append((text, finished))
        assert first_id is not None
        return JSONResponse(chat_completion(first_id, card.model_id, created, choices))

    @api.get("/v1/models")
    async def models() -> dict[str, Any]:
        return model_list(service.model_cards(), int(time.time()))

    @api.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        return model_entry(service.resolve_model(model_id), int(time.time()))

    @api.post("/v1/cancel/{command_id}")
    async def cancel(command_id: str) -> dict[str, str]:
        if not command_id:
            raise ApiError(404, "command id is required")
        cid = command_id_of(command_id)
        if not await service.cancel(cid):
            raise ApiError(404, f"no running request with command id {command_id}")
        return {"object": "cancellation", "command_id": cid, "status": "cancelled"}

    return api
