"""OpenAI Responses: ``POST /v1/responses``, whole or as the event stream the official
SDK parses (created, in_progress, output_item.added, content_part.added,
output_text.delta..., output_text.done, content_part.done, output_item.done, then
completed / incomplete / failed)."""

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response

from exo.api.errors import ApiError
from exo.api.generation_events import (
    Failed,
    Finished,
    GenerationEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallEvent,
)
from exo.api.generation_service import GenerationService
from exo.api.openai_responses_request import ResponsesRequest, responses_task_params
from exo.api.response_store import ResponseStore
from exo.api.streaming import GenerationStream, client_gone, complete, sse
from exo.api.tool_models import logprob_json
from exo.shared.types.chunks import TokenLogprob, Usage
from exo.shared.types.common import CommandId
from exo.shared.types.text_generation import InputMessage

ResponseStatus = Literal["completed", "incomplete", "failed", "cancelled", "in_progress"]


def response_id(command_id: CommandId) -> str:
    return f"resp_{command_id}"


def message_id(command_id: CommandId) -> str:
    return f"msg_{command_id}"


def usage_json(usage: Usage, reasoning_tokens: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
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
        reasoning_tokens: int = 0,
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
            "previous_response_id": request.previous_response_id,
            "store": request.store,
            "error": None if error is None else {"code": "server_error", "message": error},
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "usage": usage_json(usage, reasoning_tokens) if (usage is not None and done) else None,
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
    return shape.render(
        status, output, finished.usage, reasoning_tokens=finished.reasoning_tokens
    )


class ResponsesStreamEncoder:
    """Output items in order: a message while text comes, a function call per call.
    ``on_final`` receives the finished response object (to store it)."""

    def __init__(
        self, shape: ResponseShape, on_final: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self._shape = shape
        self._on_final = on_final
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
        final = self._shape.render(
            status, self._items, finished.usage, reasoning_tokens=finished.reasoning_tokens
        )
        if self._on_final is not None:
            self._on_final(final)
        final_kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*out, self._event(final_kind, response=final)]


def router(service: GenerationService) -> APIRouter:
    api = APIRouter()
    settings = service.settings
    store = ResponseStore(settings.data_dir, settings.max_stored_responses)

    def stored(response_id: str) -> dict[str, Any]:
        body = store.get(response_id)
        if body is None:
            raise ApiError(404, f"no stored response with id {response_id}", code="not_found")
        return body

    @api.post("/v1/responses", response_model=None)
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        card = await service.resolve_model_async(body.model)
        history: list[InputMessage] = []
        if body.previous_response_id:
            found = store.conversation(body.previous_response_id)
            if found is None:
                raise ApiError(
                    404,
                    f"previous_response_id: no stored response {body.previous_response_id}",
                    param="previous_response_id",
                    code="not_found",
                )
            history = found
        params = responses_task_params(body, card, history)
        # What a later request continues from: this one's conversation, without the system
        # instructions.
        conversation = [m for m in params.input if m.role != "system"]

        def keep(response: dict[str, Any]) -> None:
            if body.store:
                store.put(response, conversation)

        created = time.time()
        if body.stream:

            def encoder(command_id: CommandId) -> ResponsesStreamEncoder:
                shape = ResponseShape(command_id, body, card.model_id, created)
                return ResponsesStreamEncoder(shape, keep)

            return GenerationStream(service, params, card, encoder, "text/event-stream")
        result = await complete(service, request, params, card)
        if result is None:
            return client_gone()
        command_id, text, finished = result
        shape = ResponseShape(command_id, body, card.model_id, created)
        response = whole_response(shape, text, finished)
        keep(response)
        return JSONResponse(response)

    @api.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str) -> dict[str, Any]:
        return stored(response_id)

    @api.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> dict[str, Any]:
        if not store.delete(response_id):
            raise ApiError(404, f"no stored response with id {response_id}", code="not_found")
        return {"id": response_id, "object": "response", "deleted": True}

    return api
