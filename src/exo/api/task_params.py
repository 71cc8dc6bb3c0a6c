"""What the request formats share: lenient request models, text content, and the one
way to build ``TextGenerationTaskParams`` with errors that name the client's parameter."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Annotated, Any, cast

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from exo.api.errors import ApiError
from exo.api.images import ImageError
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.text_generation import (
    InputImage,
    InputMessage,
    TextGenerationTaskParams,
    ToolChoice,
    ToolSpec,
)

INT64_MIN = -(2**63)
UINT64_MAX = 2**64 - 1


class ApiModel(BaseModel):
    """A client's request: lax types (JSON numbers), unknown fields ignored, no NaN."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, value: object) -> object:
        """Clients send ``null`` for optional fields they do not set: the default."""
        if isinstance(value, dict):
            items = _as_dict(cast(dict[Any, Any], value)).items()
            return {k: v for k, v in items if v is not None}
        return value


def _stop_list(value: object) -> object:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return value


# ``stop``: a string or a list of strings (null: none).
StopList = Annotated[list[str], BeforeValidator(_stop_list)]


IMAGE_PARTS = frozenset({"image_url", "input_image", "image", "input_file", "file"})
NOT_HERE = "images are accepted only in a message's content"

# Reads one image part (its fields) of a format's content into an image.
ImageReader = Callable[[dict[str, object]], InputImage]


@dataclass(frozen=True)
class Content:
    """A message's content: its text parts joined, and its images in order."""

    text: str
    images: tuple[InputImage, ...] = ()


def text_content(value: object, part_types: Sequence[str]) -> str:
    """Text from a string or a list of text parts (``{"type": "text", "text": ...}``);
    a ValueError naming the first part that is not text."""
    return message_content(value, part_types, {}).text


def message_content(
    value: object, part_types: Sequence[str], images: Mapping[str, ImageReader]
) -> Content:
    """Text and images from a string or a list of parts: text parts of ``part_types``, image
    parts of the types ``images`` reads; a ValueError naming the first part that is neither
    or whose image is unusable."""
    if value is None:
        return Content("")
    if isinstance(value, str):
        return Content(value)
    if not isinstance(value, list):
        raise ValueError("must be a string or a list of content parts")
    texts: list[str] = []
    decoded: list[InputImage] = []
    for i, part in enumerate(_as_list(value)):
        if not isinstance(part, dict):
            raise ValueError(f"part {i} must be an object")
        fields_ = _as_dict(part)
        kind = fields_.get("type")
        reader = images.get(kind) if isinstance(kind, str) else None
        if reader is not None:
            try:
                decoded.append(reader(fields_))
            except ImageError as e:
                raise ValueError(f"part {i} ({kind}): {e}") from e
            continue
        if kind in IMAGE_PARTS:
            raise ValueError(f"part {i} is {kind!r}: {NOT_HERE}")
        if kind not in part_types:
            allowed = " or ".join(repr(t) for t in part_types)
            raise ValueError(
                f"part {i} has type {kind!r}: only text parts ({allowed}) are supported"
            )
        text = fields_.get("text")
        if not isinstance(text, str):
            raise ValueError(f"part {i} needs a string 'text'")
        texts.append(text)
    return Content("\n".join(texts), tuple(decoded))


def no_vision(card: ModelCard) -> str:
    return f"model {card.model_id} does not take images (it has no vision encoder)"


def _as_list(value: list[Any]) -> list[object]:
    return list(value)


def _as_dict(value: dict[Any, Any]) -> dict[str, object]:
    return {str(k): v for k, v in value.items()}


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters as a client gave them; None: the default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # OpenAI's logit_bias: token id -> bias (the runner checks the ids against its vocabulary).
    logit_bias: dict[int, float] | None = None
    # llama-server's extension: end-of-sequence tokens are never sampled (a fixed length).
    ignore_eos: bool = False


TokenId = Annotated[int, Field(ge=0)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0)]


class SamplingOptions(ApiModel):
    """The sampling parameters the OpenAI-style and Ollama requests share, with their
    bounds; ``to_sampling`` maps them to ``Sampling``, the one way into a task."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=INT64_MIN, le=UINT64_MAX)
    stop: StopList = []
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    # OpenAI's logit_bias: {"token id": bias in -100..100}; empty or null: none.
    logit_bias: dict[TokenId, Bias] | None = None

    def to_sampling(self, max_tokens: int | None, ignore_eos: bool = False) -> Sampling:
        return Sampling(
            ignore_eos=ignore_eos,
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            seed=self.seed,
            stop=tuple(self.stop),
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=dict(self.logit_bias) if self.logit_bias else None,
        )


def build_task_params(
    card: ModelCard,
    messages: Sequence[InputMessage],
    sampling: Sampling,
    *,
    stream: bool,
    names: Mapping[str, str] | None = None,
    raw_prompt: str | None = None,
    num_ctx: int | None = None,
    tools: Sequence[ToolSpec] = (),
    tool_choice: ToolChoice = "auto",
    forced_tool: str | None = None,
    template_kwargs: Mapping[str, str | bool] | None = None,
    json_schema: str | None = None,
    logprobs: bool = False,
    top_logprobs: int = 0,
) -> TextGenerationTaskParams:
    """The task for a request. ``names`` maps our field names to the client's (for
    errors); ``max_tokens`` is capped at the model's context length."""
    names = names or {}
    if not messages:
        name = names.get("input", "messages")
        raise ApiError(400, f"{name}: at least one message is required", param=name)
    values: dict[str, Any] = {
        f.name: getattr(sampling, f.name)
        for f in fields(sampling)
        if getattr(sampling, f.name) is not None
    }
    _check_prompt_size(messages, raw_prompt, card, names)
    _check_images(messages, card, names)
    values["stop"] = list(sampling.stop)
    if sampling.top_p is not None and sampling.top_p <= 0:
        # top_p 0 keeps only the most likely token.
        values["top_p"] = 1.0
        values.setdefault("top_k", 1)
    if sampling.max_tokens is not None and card.context_length > 0:
        values["max_tokens"] = min(sampling.max_tokens, card.context_length)
    try:
        return TextGenerationTaskParams(
            model=card.model_id,
            input=list(messages),
            stream=stream,
            raw_prompt=raw_prompt,
            num_ctx=num_ctx,
            tools=list(tools),
            tool_choice=tool_choice,
            forced_tool=forced_tool,
            template_kwargs=dict(template_kwargs or {}),
            json_schema=json_schema,
            logprobs=logprobs or top_logprobs > 0,
            top_logprobs=top_logprobs,
            **values,
        )
    except ValidationError as e:
        first = e.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "request"
        name = names.get(field, field)
        raise ApiError(400, f"{name}: {first['msg']}", param=name) from e


MAX_CHARS_PER_TOKEN = 32
"""No tokenizer packs more characters than this into one token of ordinary text: a
prompt longer than the context times this cannot fit, and is refused before a runner
spends time tokenising it."""


def _check_prompt_size(
    messages: Sequence[InputMessage],
    raw_prompt: str | None,
    card: ModelCard,
    names: Mapping[str, str],
) -> None:
    if card.context_length <= 0:
        return
    limit = card.context_length * MAX_CHARS_PER_TOKEN
    size = len(raw_prompt or "") + sum(len(m.model_dump_json()) for m in messages)
    if size > limit:
        name = names.get("input", "messages")
        raise ApiError(
            400,
            f"{name}: the prompt ({size} characters) cannot fit in the model's context of "
            f"{card.context_length} tokens (at most {limit} characters are accepted)",
            param=name,
            code="context_length_exceeded",
        )


def _check_images(
    messages: Sequence[InputMessage], card: ModelCard, names: Mapping[str, str]
) -> None:
    """Images only go to a model that reads them."""
    if card.vision or not any(m.images for m in messages):
        return
    name = names.get("images", names.get("input", "messages"))
    raise ApiError(400, f"{name}: {no_vision(card)}", param=name)
