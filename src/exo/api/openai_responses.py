"""OpenAI Responses: ``POST /v1/responses``, whole or as the event stream the official
SDK parses (created, in_progress, output_item.added, content_part.added,
output_text.delta..., output_text.done, content_part.done, output_item.done, then
completed / incomplete / failed)."""

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BeforeValidator, Field, field_validator
from starlette.responses import Response

from exo.api.generation import GenerationService
from exo.api.generation_events import Failed, Finished, GenerationEvent, TextDelta
from exo.api.streaming import GenerationStream, client_gone, complete, sse
from exo.api.task_params import ApiModel, Sampling, build_task_params, text_content
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.chunks import Usage
from exo.shared.types.common import CommandId
from exo.shared.types.text_generation import InputMessage, Role, TextGenerationTaskParams

ResponseStatus = Literal["completed", "incomplete", "failed", "cancelled", "in_progress"]


def _input_text(value: object) -> object:
    return text_content(value, ("input_text", "output_text", "text"))


class InputItem(ApiModel):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[str, BeforeValidator(_input_text)]


def _input_items(value: object) -> object:
    return [{"role": "user", "content": value}] if isinstance(value, str) else value


class ResponsesRequest(ApiModel):
    model: str
    input: Annotated[list[InputItem], BeforeValidator(_input_items)] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stream: bool = False
    tools: list[object] | None = None
    previous_response_id: str | None = None

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, tools: list[object] | None) -> list[object] | None:
        if tools:
            raise ValueError("tool calling is not supported by this server")
        return tools

    @field_validator("previous_response_id")
    @classmethod
    def _no_previous(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("responses are not stored: send the whole conversation as input")
        return value


_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}


def responses_task_params(request: ResponsesRequest, card: ModelCard) -> TextGenerationTaskParams:
    messages: list[InputMessage] = []
    if request.instructions:
        messages.append(InputMessage(role="system", content=request.instructions))
    messages.extend(InputMessage(role=_ROLES[i.role], content=i.content) for i in request.input)
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


def output_text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(command_id: CommandId, text: str | None, status: str) -> dict[str, Any]:
    """The assistant message; ``text`` None: no content part yet."""
    return {
        "id": message_id(command_id),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [] if text is None else [output_text_part(text)],
    }


def ending_status(finished: Finished) -> ResponseStatus:
    match finished.reason:
        case "stop" | "stop_sequence":
            return "completed"
        case "length":
            return "incomplete"
        case "cancelled":
            return "cancelled"


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
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "text": {"format": {"type": "text"}},
            "metadata": {},
            "previous_response_id": None,
            "store": False,
            "error": None if error is None else {"code": "server_error", "message": error},
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "usage": usage_json(usage) if (usage is not None and done) else None,
        }


def whole_response(shape: ResponseShape, text: str, finished: Finished) -> dict[str, Any]:
    status = ending_status(finished)
    item_status = "completed" if status == "completed" else "incomplete"
    output = [message_item(shape.command_id, text, item_status)]
    return shape.render(status, output, finished.usage)


class ResponsesStreamEncoder:
    def __init__(self, shape: ResponseShape) -> None:
        self._shape = shape
        self._sequence = 0
        self._text: list[str] = []
        self._item_id = message_id(shape.command_id)

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse(payload, event=kind)

    def _part_fields(self) -> dict[str, Any]:
        return {"item_id": self._item_id, "output_index": 0, "content_index": 0}

    def begin(self, prompt_tokens: int) -> list[bytes]:
        in_progress = self._shape.render("in_progress", [])
        return [
            self._event("response.created", response=in_progress),
            self._event("response.in_progress", response=in_progress),
            self._event(
                "response.output_item.added",
                output_index=0,
                item=message_item(self._shape.command_id, None, "in_progress"),
            ),
            self._event(
                "response.content_part.added", part=output_text_part(""), **self._part_fields()
            ),
        ]

    def encode(self, event: GenerationEvent, index: int = 0) -> list[bytes]:
        match event:
            case TextDelta():
                self._text.append(event.text)
                return [
                    self._event(
                        "response.output_text.delta",
                        delta=event.text,
                        logprobs=[],
                        **self._part_fields(),
                    )
                ]
            case Finished():
                return self._finish(event)
            case Failed():
                text = "".join(self._text)
                item = message_item(self._shape.command_id, text, "incomplete")
                failed = self._shape.render("failed", [item], error=event.message)
                return [self._event("response.failed", response=failed)]

    def _finish(self, finished: Finished) -> list[bytes]:
        text = "".join(self._text)
        status = ending_status(finished)
        item_status = "completed" if status == "completed" else "incomplete"
        item = message_item(self._shape.command_id, text, item_status)
        final = self._shape.render(status, [item], finished.usage)
        final_kind = "response.completed" if status == "completed" else "response.incomplete"
        return [
            self._event("response.output_text.done", text=text, logprobs=[], **self._part_fields()),
            self._event(
                "response.content_part.done", part=output_text_part(text), **self._part_fields()
            ),
            self._event("response.output_item.done", output_index=0, item=item),
            self._event(final_kind, response=final),
        ]


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
