"""Ollama: ``/api/chat`` and ``/api/generate`` (newline-delimited JSON streams, on by
default), ``/api/tags``, ``/api/show``, ``/api/ps`` and ``/api/version``."""

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self, cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field, PlainValidator, field_validator, model_validator
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
from exo.api.generation_service import GenerationService, served_card
from exo.api.images import ImageError, decode_all, image_from_base64, image_from_url
from exo.api.ollama_models import ps_entry, show_entry, tag_entry
from exo.api.streaming import GenerationStream, client_gone, complete, ndjson
from exo.api.task_params import (
    ApiModel,
    Sampling,
    SamplingOptions,
    build_task_params,
)
from exo.api.tool_models import (
    CalledFunction,
    FunctionTool,
    OpenAIToolChoice,
    arguments_text,
    continues_final,
    json_object,
    ollama_format,
    openai_tools,
    supports_thinking,
    thinking_kwargs,
)
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.commands import DeleteInstance
from exo.shared.types.common import CommandId
from exo.shared.types.state_queries import instances_of, serving_instance
from exo.shared.types.text_generation import (
    InputImage,
    InputMessage,
    TextGenerationTaskParams,
    ToolCall,
)

# The Ollama API version we speak (clients check it).
OLLAMA_VERSION = "0.12.0"

_OPTION_NAMES = {
    "max_tokens": "options.num_predict",
    "temperature": "options.temperature",
    "top_p": "options.top_p",
    "top_k": "options.top_k",
    "min_p": "options.min_p",
    "seed": "options.seed",
    "stop": "options.stop",
    "repetition_penalty": "options.repeat_penalty",
    "presence_penalty": "options.presence_penalty",
    "frequency_penalty": "options.frequency_penalty",
}


class OllamaOptions(SamplingOptions):
    # Ollama's name for it.
    repetition_penalty: float | None = Field(
        default=None, gt=0.0, validation_alias="repeat_penalty"
    )
    # -1: no limit, -2: until the context is full.
    num_predict: int | None = Field(default=None, ge=-2)
    num_ctx: int | None = Field(default=None, ge=1)

    @field_validator("num_predict")
    @classmethod
    def _not_zero(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("must be at least 1, or -1 for no limit")
        return value

    def sampling(self) -> Sampling:
        limit = self.num_predict if self.num_predict is not None and self.num_predict > 0 else None
        return self.to_sampling(limit)


def _ollama_images(value: object) -> object:
    """Ollama's ``images``: base64 texts (a data URL is taken too)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError("must be a list of base64-encoded images")
    sources = cast(list[object], value)
    if not all(isinstance(v, str) for v in sources):
        raise ValueError("each image must be a base64 string")
    try:
        return decode_all([str(v) for v in sources], "image", _ollama_image)
    except ImageError as e:
        raise ValueError(str(e)) from e


def _ollama_image(source: str) -> InputImage:
    return image_from_url(source) if source.startswith("data:") else image_from_base64(source)


OllamaImages = Annotated[list[InputImage], PlainValidator(_ollama_images)]


class OllamaCall(ApiModel):
    function: CalledFunction


class OllamaMessage(ApiModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: OllamaImages = []
    tool_calls: list[OllamaCall] = []
    tool_name: str | None = None
    tool_call_id: str | None = None

    def message(self, index: int) -> InputMessage:
        calls = [
            ToolCall(
                id=f"call_{index}_{i}",
                name=c.function.name,
                arguments=arguments_text(c.function.arguments),
            )
            for i, c in enumerate(self.tool_calls)
        ]
        return InputMessage(
            role=self.role,
            content=self.content,
            images=self.images,
            tool_calls=calls,
            tool_call_id=self.tool_call_id,
            name=self.tool_name,
        )


class ChatRequest(ApiModel):
    model: str
    messages: list[OllamaMessage] = []
    stream: bool = True
    options: OllamaOptions = OllamaOptions()
    format: object = None
    tools: list[FunctionTool] | None = None
    keep_alive: object = None
    think: bool | Literal["low", "medium", "high"] | None = None
    # An extension (Ollama has none): OpenAI's tool_choice, to force a call.
    tool_choice: OpenAIToolChoice | None = None


class GenerateRequest(ApiModel):
    model: str
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    stream: bool = True
    options: OllamaOptions = OllamaOptions()
    format: object = None
    images: OllamaImages = []
    keep_alive: object = None
    think: bool | Literal["low", "medium", "high"] | None = None
    # An earlier answer's ``context``: the token ids this prompt continues from.
    context: list[Annotated[int, Field(strict=True, ge=0)]] | None = None


class NamedModelRequest(ApiModel):
    """A request naming one model, as ``model`` or (older clients) ``name``."""

    model: str = ""
    name: str = ""

    @model_validator(mode="after")
    def _named(self) -> Self:
        if not (self.model or self.name):
            raise ValueError("model is required")
        return self

    @property
    def model_name(self) -> str:
        return self.model or self.name


class ShowRequest(NamedModelRequest):
    pass


def check_thinking(think: bool | str | None, name: str, card: ModelCard) -> None:
    """As Ollama: thinking asked of a model that cannot think is a 400."""
    if think is not None and think is not False and not supports_thinking(card.chat_template):
        raise ApiError(400, f'"{name}" does not support thinking', param="think")


def chat_task_params(request: ChatRequest, card: ModelCard) -> TextGenerationTaskParams:
    messages = [m.message(i) for i, m in enumerate(request.messages)]
    tools = openai_tools(request.tools, request.tool_choice)
    return build_task_params(
        card,
        messages,
        request.options.sampling(),
        stream=request.stream,
        names={**_OPTION_NAMES, "input": "messages"},
        num_ctx=request.options.num_ctx,
        tools=tools.specs,
        tool_choice=tools.choice,
        forced_tool=tools.forced,
        template_kwargs=thinking_kwargs(request.think),
        json_schema=ollama_format(request.format),
    ).model_copy(update={"continue_final_message": continues_final(messages)})


def _context_tokens(request: GenerateRequest, card: ModelCard) -> list[int]:
    """The request's ``context``, checked against what the prompt may hold (the runner
    checks each id against the model's vocabulary)."""
    context = request.context or []
    if context and request.raw:
        # As Ollama: a raw prompt is the whole prompt.
        raise ApiError(400, "context: raw mode does not support context", param="context")
    served = served_card(card).context_length
    limit = min(served, request.options.num_ctx or served)
    if limit > 0 and len(context) >= limit:
        raise ApiError(
            400,
            f"context: {len(context)} tokens leave no room for the prompt in the model's "
            f"context of {limit} tokens",
            param="context",
            code="context_length_exceeded",
        )
    return context


def generate_task_params(request: GenerateRequest, card: ModelCard) -> TextGenerationTaskParams:
    context = _context_tokens(request, card)
    messages: list[InputMessage] = []
    if request.system and not request.raw:
        messages.append(InputMessage(role="system", content=request.system))
    if request.raw and request.images:
        raise ApiError(400, "images: a raw prompt cannot carry images", param="images")
    messages.append(InputMessage(role="user", content=request.prompt, images=request.images))
    return build_task_params(
        card,
        messages,
        request.options.sampling(),
        stream=request.stream,
        names={**_OPTION_NAMES, "input": "prompt", "images": "images"},
        raw_prompt=request.prompt if request.raw else None,
        num_ctx=request.options.num_ctx,
        template_kwargs=thinking_kwargs(request.think),
        json_schema=ollama_format(request.format),
    ).model_copy(update={"return_context": not request.raw, "context_tokens": context})


def done_reason(reason: FinishKind) -> str:
    match reason:
        case "length":
            return "length"
        case "stop" | "stop_sequence" | "cancelled" | "tool_calls":
            return "stop"


def ollama_call(call: ToolCallEvent) -> dict[str, Any]:
    return {
        "function": {
            "index": call.index,
            "name": call.name,
            "arguments": json_object(call.arguments),
        }
    }


def final_fields(finished: Finished) -> dict[str, Any]:
    """The statistics of the last object of an answer, durations in nanoseconds."""
    t = finished.timings
    first = t.first_token_ns if t.first_token_ns is not None else t.finished_ns
    return {
        "done": True,
        "done_reason": done_reason(finished.reason),
        "total_duration": max(t.finished_ns - t.accepted_ns, 0),
        "load_duration": max(t.sent_ns - t.accepted_ns, 0),
        "prompt_eval_count": finished.usage.prompt_tokens,
        "prompt_eval_duration": max(first - t.sent_ns, 0),
        "eval_count": finished.usage.completion_tokens,
        "eval_duration": max(t.finished_ns - first, 0),
    } | ({"context": list(finished.context)} if finished.context is not None else {})


def timestamp(now: datetime) -> str:
    return now.astimezone(UTC).isoformat().replace("+00:00", "Z")


Kind = Literal["chat", "generate"]


def _content(
    kind: Kind, text: str, calls: Sequence[ToolCallEvent] = (), thinking: str = ""
) -> dict[str, Any]:
    if kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = [ollama_call(c) for c in calls]
        return {"message": message}
    return {"response": text, **({"thinking": thinking} if thinking else {})}


def whole_answer(
    kind: Kind, model: str, created_at: str, text: str, finished: Finished
) -> dict[str, Any]:
    return {
        "model": model,
        "created_at": created_at,
        **_content(kind, text, finished.tool_calls, finished.reasoning),
        **final_fields(finished),
    }


def load_answer(kind: Kind, model: str, created_at: str) -> dict[str, Any]:
    """Ollama's answer to an empty request: the model is loaded, nothing generated."""
    return {
        "model": model,
        "created_at": created_at,
        **_content(kind, ""),
        "done": True,
        "done_reason": "load",
    }


class OllamaStreamEncoder:
    def __init__(self, kind: Kind, model: str, now: Callable[[], str]) -> None:
        self._kind: Kind = kind
        self._model = model
        self._now = now

    def begin(self, prompt_tokens: int) -> list[bytes]:
        return []

    def encode(self, event: GenerationEvent, index: int = 0) -> list[bytes]:
        # Each object carries the time it was made, as Ollama's do.
        head = {"model": self._model, "created_at": self._now()}
        match event:
            case TextDelta():
                return [ndjson({**head, **_content(self._kind, event.text), "done": False})]
            case ToolCallEvent():
                return [ndjson({**head, **_content(self._kind, "", [event]), "done": False})]
            case ReasoningDelta():
                thought = _content(self._kind, "", thinking=event.text)
                return [ndjson({**head, **thought, "done": False})]
            case Finished():
                return [ndjson({**head, **_content(self._kind, ""), **final_fields(event)})]
            case Failed():
                return [ndjson({"error": event.message})]


_HUB_PREFIXES = ("hf.co/", "huggingface.co/", "https://hf.co/", "https://huggingface.co/")


async def resolve(service: GenerationService, name: str) -> ModelCard:
    """A known model, or a card built from the hub. Ollama names carry a tag
    (``model:latest``) and name hub repos as ``hf.co/org/repo[:QUANT]``."""
    try:
        return service.resolve_model(name)
    except ApiError:
        pass
    base, sep, tag = name.rpartition(":")
    untagged = base if sep and base and "/" not in tag else None
    if untagged is not None:
        try:
            return service.resolve_model(untagged)
        except ApiError:
            pass
    hub_name = untagged if untagged is not None and tag.lower() == "latest" else name
    for prefix in _HUB_PREFIXES:
        if hub_name.lower().startswith(prefix):
            hub_name = hub_name[len(prefix):]
            break
    return await service.resolve_model_async(hub_name)


def router(service: GenerationService) -> APIRouter:
    api = APIRouter()

    def now() -> str:
        return timestamp(datetime.now(UTC))

    async def load_or_unload(kind: Kind, card: ModelCard, keep_alive: object) -> dict[str, Any]:
        """An empty request loads the model; with ``keep_alive: 0`` it unloads it."""
        if keep_alive in (0, "0", "0s", "0m"):
            for instance in instances_of(service.handle.state(), card.model_id):
                await service.send(
                    DeleteInstance(
                        instance_id=instance.instance_id, reason="unloaded (keep_alive 0)"
                    )
                )
            return {**load_answer(kind, card.model_id, now()), "done_reason": "unload"}
        await service.ensure_serving(card)
        return load_answer(kind, card.model_id, now())

    def streamed(kind: Kind, params: TextGenerationTaskParams, card: ModelCard) -> Response:
        def encoder(_: CommandId) -> OllamaStreamEncoder:
            return OllamaStreamEncoder(kind, card.model_id, now)

        # NDJSON has no comments: no keep-alive lines.
        return GenerationStream(
            service, params, card, encoder, "application/x-ndjson", keep_alive=False
        )

    async def whole(
        kind: Kind, request: Request, params: TextGenerationTaskParams, card: ModelCard
    ) -> Response:
        result = await complete(service, request, params, card)
        if result is None:
            return client_gone()
        _, text, finished = result
        return JSONResponse(whole_answer(kind, card.model_id, now(), text, finished))

    @api.post("/api/chat", response_model=None)
    async def chat(body: ChatRequest, request: Request) -> Response:
        card = await resolve(service, body.model)
        check_thinking(body.think, body.model, card)
        if not body.messages:
            return JSONResponse(await load_or_unload("chat", card, body.keep_alive))
        params = chat_task_params(body, card)
        if body.stream:
            return streamed("chat", params, card)
        return await whole("chat", request, params, card)

    @api.post("/api/generate", response_model=None)
    async def generate(body: GenerateRequest, request: Request) -> Response:
        card = await resolve(service, body.model)
        check_thinking(body.think, body.model, card)
        if not body.prompt and not body.system:
            return JSONResponse(await load_or_unload("generate", card, body.keep_alive))
        params = generate_task_params(body, card)
        if body.stream:
            return streamed("generate", params, card)
        return await whole("generate", request, params, card)

    @api.get("/api/tags")
    async def tags() -> dict[str, Any]:
        modified_at = now()
        return {"models": [tag_entry(card, modified_at) for card in service.model_cards()]}

    @api.post("/api/show")
    async def show(body: ShowRequest) -> dict[str, Any]:
        return show_entry(await resolve(service, body.model_name), now())

    @api.get("/api/ps")
    async def ps() -> dict[str, Any]:
        state = service.handle.state()
        running = [
            card
            for card in service.model_cards()
            if serving_instance(state, card.model_id) is not None
        ]
        # Instances stay until deleted: no expiry.
        expires_at = timestamp(datetime(2999, 1, 1, tzinfo=UTC))
        return {"models": [ps_entry(card, expires_at) for card in running]}

    @api.get("/api/version")
    async def version() -> dict[str, str]:
        return {"version": OLLAMA_VERSION}

    return api
