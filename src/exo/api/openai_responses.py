"""OpenAI Responses: ``POST /v1/responses``, whole or as the event stream the official
SDK parses (created, in_progress, output_item.added, content_part.added,
output_text.delta..., output_text.done, content_part.done, output_item.done, then
completed / incomplete / failed)."""

import time
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator, Field, field_validator
from starlette.responses import Response

from exo.api.generation import GenerationService
from exo.api.generation_events import (
    Failed,
    Finished,
    GenerationEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallEvent,
)
from exo.api.streaming import GenerationStream, client_gone, complete, sse
from exo.api.task_params import ApiModel, Sampling, build_task_params, text_content
from exo.api.tool_models import TextFormat, Tools, logprob_json, schema_text, thinking_kwargs
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.chunks import TokenLogprob, Usage
from exo.shared.types.common import CommandId
from exo.shared.types.text_generation import (
    InputMessage,
    Role,
    TextGenerationTaskParams,
    ToolCall,
    ToolSpec,
)

ResponseStatus = Literal["completed", "incomplete", "failed", "cancelled", "in_progress"]


def _input_text(value: object) -> object:
    return text_content(value, ("input_text", "output_text", "text"))


class InputItem(ApiModel):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[str, BeforeValidator(_input_text)]


class FunctionCallItem(ApiModel):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = "{}"


class FunctionCallOutputItem(ApiModel):
    type: Literal["function_call_output"]
    call_id: str
    output: Annotated[str, BeforeValidator(_input_text)] = ""


class ReasoningItem(ApiModel):
    """Earlier reasoning: not shown to the model again."""

    type: Literal["reasoning"]


Item = Annotated[
    InputItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem,
    Field(discriminator="type"),
]


def _typed(item: object) -> object:
    if isinstance(item, dict) and "type" not in item:
        return {**item, "type": "message"}  # pyright: ignore[reportUnknownVariableType]
    return item


def _input_items(value: object) -> object:
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return [_typed(item) for item in value]  # pyright: ignore[reportUnknownVariableType]
    return value


class ResponsesTool(ApiModel):
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None

    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description or "",
            parameters=schema_text(self.parameters),
        )


class ResponsesNamedChoice(ApiModel):
    type: Literal["function"]
    name: str


class ReasoningOptions(ApiModel):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None


class TextOptions(ApiModel):
    format: TextFormat | None = None


class ResponsesRequest(ApiModel):
    model: str
    input: Annotated[list[Item], BeforeValidator(_input_items)] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stream: bool = False
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ResponsesNamedChoice | None = None
    parallel_tool_calls: bool = True
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    include: list[str] = []
    previous_response_id: str | None = None

    @field_validator("previous_response_id")
    @classmethod
    def _no_previous(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("responses are not stored: send the whole conversation as input")
        return value

    def tool_set(self) -> Tools:
        specs = tuple(t.spec() for t in self.tools or ())
        match self.tool_choice:
            case None:
                return Tools(specs)
            case ResponsesNamedChoice():
                return Tools(specs, "required", self.tool_choice.name).checked("tool_choice")
            case _:
                return Tools(specs, self.tool_choice).checked("tool_choice")


_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}


def input_messages(items: list[Item]) -> list[InputMessage]:
    """Input items as messages: a run of function calls joins the assistant turn before
    it; each call's output is a tool message."""
    out: list[InputMessage] = []
    names: dict[str, str] = {}
    for item in items:
        match item:
            case InputItem():
                out.append(InputMessage(role=_ROLES[item.role], content=item.content))
            case FunctionCallItem():
                names[item.call_id] = item.name
                call = ToolCall(id=item.call_id, name=item.name, arguments=item.arguments)
                if out and out[-1].role == "assistant":
                    last = out[-1]
                    out[-1] = last.model_copy(update={"tool_calls": [*last.tool_calls, call]})
                else:
                    out.append(InputMessage(role="assistant", content="", tool_calls=[call]))
            case FunctionCallOutputItem():
                out.append(
                    InputMessage(
                        role="tool",
                        content=item.output,
                        tool_call_id=item.call_id,
                        name=names.get(item.call_id),
                    )
                )
            case ReasoningItem():
                pass
    return out


def responses_task_params(request: ResponsesRequest, card: ModelCard) -> TextGenerationTaskParams:
    messages: list[InputMessage] = []
    if request.instructions:
        messages.append(InputMessage(role="system", content=request.instructions))
    messages.extend(input_messages(request.input))
    tools = request.tool_set()
    sampling = Sampling(
        max_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
    )
    return build_task_params(
        card,
        messages,
        sampling,
        stream=request.stream,
        names={"max_tokens": "max_output_tokens", "input": "input"},
        tools=tools.specs,
        tool_choice=tools.choice,
        forced_tool=tools.forced,
        template_kwargs=thinking_kwargs(
            None if request.reasoning is None else request.reasoning.effort
        ),
        logprobs="message.output_text.logprobs" in request.include,
        top_logprobs=request.top_logprobs or 0,
        json_schema=(
            request.text.format.schema_text()
            if request.text is not None and request.text.format is not None
            else None
        ),
    )


def response_id(command_id: CommandId) -> str:
    return f"resp_{command_id}"


def message_id(command_id: CommandId) -> str:
    return f"msg_{command_id}"


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def output_text_part(text: str, logprobs: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
    return {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": [logprob_json(e) for e in logprobs],
    }


def message_item(
    command_id: CommandId, text: str | None, status: str, logprobs: Sequence[TokenLogprob] = ()
) -> dict[str, Any]:
    """The assistant message; ``text`` None: no content part yet."""
    return {
        "id": message_id(command_id),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [] if text is None else [output_text_part(text, logprobs)],
    }


def ending_status(finished: Finished) -> ResponseStatus:
    match finished.reason:
        case "stop" | "stop_sequence" | "tool_calls":
            return "completed"
        case "length":
            return "incomplete"
        case "cancelled":
            return "cancelled"


def _format_json(request: ResponsesRequest) -> dict[str, Any]:
    if request.text is None or request.text.format is None:
        return {"type": "text"}
    return request.text.format.model_dump(by_alias=True, exclude_none=True)


def _choice_json(request: ResponsesRequest) -> object:
    choice = request.tool_choice
    if choice is None:
        return "auto"
    return choice if isinstance(choice, str) else choice.model_dump()


class ResponseShape:
    """The fields of a response object that do not change while it is generated."""

    def __init__(
        self, command_id: CommandId, request: ResponsesRequest, model: str, created: float
    ):
        self.command_id = command_id
        self._request = request
        self._model = model
        self._created = created

    def render(
        self,
        status: ResponseStatus,
        output: list[dict[str, Any]],
        usage: Usage | None = None,
        error: str | None = None,
    ) -> dict[str, Any]:
        request = self._request
        done = status not in ("in_progress",)
        return {
            "id": response_id(self.command_id),
            "object": "response",
            "created_at": self._created,
            "status": status,
            "model": self._model,
            "output": output,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "parallel_tool_calls": request.parallel_tool_calls,
            "tool_choice": _choice_json(request),
            "tools": [t.model_dump(exclude_none=True) for t in request.tools or ()],
            "text": {"format": _format_json(request)},
            "metadata": {},
            "previous_response_id": None,
            "store": False,
            "error": None if error is None else {"code": "server_error", "message": error},
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "usage": usage_json(usage) if (usage is not None and done) else None,
        }


def function_call_item(call: ToolCallEvent, arguments: str | None = None) -> dict[str, Any]:
    return {
        "id": f"fc_{call.id}",
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments if arguments is None else arguments,
        "status": "completed" if arguments is None else "in_progress",
    }


def reasoning_item(command_id: CommandId, text: str) -> dict[str, Any]:
    return {
        "id": f"rs_{command_id}",
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}] if text else [],
    }


def whole_response(shape: ResponseShape, text: str, finished: Finished) -> dict[str, Any]:
    status = ending_status(finished)
    item_status = "completed" if status == "completed" else "incomplete"
    output: list[dict[str, Any]] = []
    if finished.reasoning:
        output.append(reasoning_item(shape.command_id, finished.reasoning))
    if text or not finished.tool_calls:
        output.append(message_item(shape.command_id, text, item_status, finished.logprobs))
    output.extend(function_call_item(call) for call in finished.tool_calls)
    return shape.render(status, output, finished.usage)


class ResponsesStreamEncoder:
    """Output items in order: a message while text comes, a function call per call."""

    def __init__(self, shape: ResponseShape) -> None:
        self._shape = shape
        self._sequence = 0
        self._text: list[str] = []
        self._items: list[dict[str, Any]] = []
        self._message_id = message_id(shape.command_id)
        # The output index of the message being written, if one is.
        self._open: int | None = None
        # The output index of the reasoning item being written, if one is.
        self._thought: int | None = None
        self._thinking: list[str] = []

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse(payload, event=kind)

    def _part_fields(self) -> dict[str, Any]:
        return {"item_id": self._message_id, "output_index": self._open, "content_index": 0}

    def begin(self, prompt_tokens: int) -> list[bytes]:
        in_progress = self._shape.render("in_progress", [])
        return [
            self._event("response.created", response=in_progress),
            self._event("response.in_progress", response=in_progress),
        ]

    def _reasoning(self, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self._thought is None:
            out.extend(self._close_message("completed"))
            self._thought = len(self._items)
            self._items.append(reasoning_item(self._shape.command_id, ""))
            item = self._items[self._thought]
            out.append(
                self._event("response.output_item.added", output_index=self._thought, item=item)
            )
        self._thinking.append(text)
        fields = {"item_id": self._items[self._thought]["id"], "output_index": self._thought}
        out.append(
            self._event("response.reasoning_text.delta", delta=text, content_index=0, **fields)
        )
        return out

    def _close_reasoning(self) -> list[bytes]:
        if self._thought is None:
            return []
        at, self._thought = self._thought, None
        text = "".join(self._thinking)
        item = reasoning_item(self._shape.command_id, text)
        self._items[at] = item
        fields = {"item_id": item["id"], "output_index": at}
        return [
            self._event("response.reasoning_text.done", text=text, content_index=0, **fields),
            self._event("response.output_item.done", output_index=at, item=item),
        ]

    def _open_message(self) -> list[bytes]:
        self._open = len(self._items)
        if self._open > 0:
            self._message_id = f"{message_id(self._shape.command_id)}_{self._open}"
        item = message_item(self._shape.command_id, None, "in_progress")
        item["id"] = self._message_id
        return [
            self._event("response.output_item.added", output_index=self._open, item=item),
            self._event(
                "response.content_part.added", part=output_text_part(""), **self._part_fields()
            ),
        ]

    def _close_message(self, status: str) -> list[bytes]:
        if self._open is None:
            return []
        text = "".join(self._text)
        self._text = []
        item = message_item(self._shape.command_id, text, status)
        item["id"] = self._message_id
        out = [
            self._event("response.output_text.done", text=text, logprobs=[], **self._part_fields()),
            self._event(
                "response.content_part.done", part=output_text_part(text), **self._part_fields()
            ),
            self._event("response.output_item.done", output_index=self._open, item=item),
        ]
        self._items.append(item)
        self._open = None
        return out

    def encode(self, event: GenerationEvent, index: int = 0) -> list[bytes]:
        match event:
            case ReasoningDelta():
                return self._reasoning(event.text)
            case TextDelta():
                opening = (
                    [*self._close_reasoning(), *self._open_message()] if self._open is None else []
                )
                self._text.append(event.text)
                delta = self._event(
                    "response.output_text.delta",
                    delta=event.text,
                    logprobs=[logprob_json(e) for e in event.logprobs],
                    **self._part_fields(),
                )
                return [*opening, delta]
            case ToolCallEvent():
                return self._call(event)
            case Finished():
                return self._finish(event)
            case Failed():
                items = [*self._items]
                if self._open is not None:
                    items.append(
                        message_item(self._shape.command_id, "".join(self._text), "incomplete")
                    )
                failed = self._shape.render("failed", items, error=event.message)
                return [self._event("response.failed", response=failed)]

    def _call(self, call: ToolCallEvent) -> list[bytes]:
        out = [*self._close_reasoning(), *self._close_message("completed")]
        at = len(self._items)
        item = function_call_item(call)
        fields = {"item_id": item["id"], "output_index": at}
        self._items.append(item)
        return [
            *out,
            self._event(
                "response.output_item.added", output_index=at, item=function_call_item(call, "")
            ),
            self._event("response.function_call_arguments.delta", delta=call.arguments, **fields),
            self._event(
                "response.function_call_arguments.done",
                arguments=call.arguments,
                name=call.name,
                **fields,
            ),
            self._event("response.output_item.done", output_index=at, item=item),
        ]

    def _finish(self, finished: Finished) -> list[bytes]:
        status = ending_status(finished)
        item_status = "completed" if status == "completed" else "incomplete"
        out = [*self._close_reasoning(), *self._close_message(item_status)]
        if not self._items:  # an empty answer is still a message
            out = [*self._open_message(), *self._close_message(item_status)]
        final = self._shape.render(status, self._items, finished.usage)
        final_kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*out, self._event(final_kind, response=final)]


def router(service: GenerationService) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/responses", response_model=None)
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        card = service.resolve_model(body.model)
        params = responses_task_params(body, card)
        created = time.time()
        if body.stream:

            def encoder(command_id: CommandId) -> ResponsesStreamEncoder:
                return ResponsesStreamEncoder(
                    ResponseShape(command_id, body, card.model_id, created)
                )

            return GenerationStream(service, params, card, encoder, "text/event-stream")
        result = await complete(service, request, params, card)
        if result is None:
            return client_gone()
        command_id, text, finished = result
        shape = ResponseShape(command_id, body, card.model_id, created)
        return JSONResponse(whole_response(shape, text, finished))

    return api
