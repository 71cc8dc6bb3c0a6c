"""Function tools as the request formats describe them, and what they become in a task."""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import Field

from exo.api.errors import ApiError
from exo.api.task_params import ApiModel
from exo.shared.types.chunks import TokenLogprob, TopLogprob
from exo.shared.types.text_generation import InputMessage, ToolCall, ToolChoice, ToolSpec


@dataclass(frozen=True)
class Tools:
    """A request's tools: the functions, whether a call is required, and which one."""

    specs: tuple[ToolSpec, ...] = ()
    choice: ToolChoice = "auto"
    forced: str | None = None

    def checked(self, param: str) -> "Tools":
        if self.forced is not None and self.forced not in {t.name for t in self.specs}:
            raise ApiError(400, f"{param}: no tool named {self.forced!r} in tools", param=param)
        if self.choice == "required" and not self.specs:
            raise ApiError(
                400, f"{param}: a tool call is required but no tools are given", param=param
            )
        return self


def schema_text(schema: dict[str, Any] | None) -> str:
    return json.dumps(schema if schema else {"type": "object", "properties": {}})


def json_object(text: str) -> dict[str, Any]:
    """A call's arguments as an object (the parser only emits JSON objects)."""
    try:
        value: object = json.loads(text)
    except ValueError:
        return {}
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
    return {}


def arguments_text(value: object) -> str:
    """Arguments as a JSON object's text (clients send text or an object)."""
    if isinstance(value, str):
        return value or "{}"
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


# ---------------------------------------------------------------- OpenAI / Ollama shape


class FunctionDef(ApiModel):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any] | None = None


class FunctionTool(ApiModel):
    type: Literal["function"] = "function"
    function: FunctionDef

    def spec(self) -> ToolSpec:
        f = self.function
        return ToolSpec(
            name=f.name, description=f.description, parameters=schema_text(f.parameters)
        )


class NamedFunction(ApiModel):
    name: str


class NamedToolChoice(ApiModel):
    type: Literal["function"] = "function"
    function: NamedFunction


OpenAIToolChoice = Literal["auto", "none", "required"] | NamedToolChoice


def openai_tools(tools: Sequence[FunctionTool] | None, choice: OpenAIToolChoice | None) -> Tools:
    specs = tuple(t.spec() for t in tools or ())
    match choice:
        case None:
            return Tools(specs).checked("tool_choice")
        case NamedToolChoice():
            return Tools(specs, "required", choice.function.name).checked("tool_choice")
        case _:
            return Tools(specs, choice).checked("tool_choice")


class CalledFunction(ApiModel):
    name: str
    arguments: object = None


class CallIn(ApiModel):
    """An earlier call in a conversation's history."""

    id: str = ""
    type: Literal["function"] = "function"
    function: CalledFunction

    def call(self, index: int) -> ToolCall:
        return ToolCall(
            id=self.id or f"call_{index}",
            name=self.function.name,
            arguments=arguments_text(self.function.arguments),
        )


# ---------------------------------------------------------------- structured output

JSON_OBJECT_SCHEMA = '{"type": "object"}'


class JsonSchemaSpec(ApiModel):
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


FormatKind = Literal["text", "json_object", "json_schema"]


class ResponseFormat(ApiModel):
    """OpenAI chat ``response_format``."""

    type: FormatKind
    json_schema: JsonSchemaSpec | None = None

    def schema_text(self, param: str) -> str | None:
        if self.type == "json_schema" and self.json_schema is None:
            raise ApiError(400, f"{param}.json_schema is required", param=param)
        schema = None if self.json_schema is None else self.json_schema.schema_
        return _format_schema(self.type, schema)


class TextFormat(ApiModel):
    """Responses ``text.format``: the schema sits beside the type."""

    type: FormatKind
    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    def schema_text(self) -> str | None:
        return _format_schema(self.type, self.schema_)


def _format_schema(kind: FormatKind, schema: dict[str, Any] | None) -> str | None:
    """The JSON schema a response format constrains the output to (None: free text)."""
    match kind:
        case "text":
            return None
        case "json_object":
            return JSON_OBJECT_SCHEMA
        case "json_schema":
            return json.dumps(schema or {})


# Keywords whose values are data, not schemas (and "not": closing an object inside a
# negation would widen what the schema allows).
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "not"})
# Keywords whose values map names to schemas (a property may be named "properties").
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def closed_objects(value: Any) -> Any:
    """The schema ``value`` with every object schema in it that lists ``properties`` but
    says nothing of ``additionalProperties`` closed to other keys, nested ones included
    (as Ollama, through llama.cpp's schema grammar, reads such schemas; an object with
    no ``properties`` stays any object)."""
    if isinstance(value, list):
        return [closed_objects(item) for item in cast(list[Any], value)]
    if not isinstance(value, dict):
        return value
    schema = cast(dict[str, Any], value)
    out: dict[str, Any] = {}
    for key, item in schema.items():
        if key in _DATA_KEYWORDS:
            out[key] = item
        elif key in _SCHEMA_MAPS and isinstance(item, dict):
            named = cast(dict[str, Any], item)
            out[key] = {name: closed_objects(sub) for name, sub in named.items()}
        else:
            out[key] = closed_objects(item)
    if "properties" in schema and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def ollama_format(value: object) -> str | None:
    """Ollama ``format``: "json", a JSON schema (closed as Ollama closes it), or nothing."""
    if value is None or value == "":
        return None
    if value == "json":
        return JSON_OBJECT_SCHEMA
    if isinstance(value, dict):
        return json.dumps(closed_objects(value))
    raise ApiError(400, 'format: must be "json" or a JSON schema object', param="format")


def continues_final(messages: Sequence[InputMessage]) -> bool:
    """Whether a conversation ends in a prefill: an assistant message (text, no calls)
    that the answer continues (Claude and Ollama; OpenAI chat opens a new turn)."""
    if not messages:
        return False
    last = messages[-1]
    return last.role == "assistant" and bool(last.content) and not last.tool_calls


# ---------------------------------------------------------------- thinking

# Every reasoning effort the openai SDK lists (openai.types.shared.ReasoningEffort).
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


# What a chat template that can think mentions: the tag it opens or the switch it reads.
_THINKING_MARKS = ("<think>", "enable_thinking", "reasoning_content", "reasoning_effort")


def supports_thinking(template: str | None) -> bool:
    """Whether a model's chat template knows thinking (a model without one does not)."""
    return template is not None and any(mark in template for mark in _THINKING_MARKS)


def thinking_kwargs(
    effort: str | bool | None, extra: dict[str, str | bool] | None = None
) -> dict[str, str | bool]:
    """Chat template variables for a request's thinking switch: ``enable_thinking``
    (Qwen3 and others) and ``reasoning_effort``; ``extra`` (chat_template_kwargs) wins."""
    out: dict[str, str | bool] = {}
    if isinstance(effort, bool):
        out["enable_thinking"] = effort
    elif effort is not None:
        out["enable_thinking"] = effort != "none"
        out["reasoning_effort"] = effort
    return {**out, **(extra or {})}


# ---------------------------------------------------------------- log-probabilities


def logprob_json(entry: TopLogprob) -> dict[str, Any]:
    """OpenAI's shape of one token's log-probability (and its alternatives', for a sampled
    token). ``bytes`` are the token's own: where a character's UTF-8 is split over tokens,
    each part's text alone is U+FFFD and the bytes are what joins into the answer."""
    out: dict[str, Any] = {
        "token": entry.token,
        "logprob": entry.logprob,
        "bytes": list(entry.raw),
    }
    if isinstance(entry, TokenLogprob):
        out["top_logprobs"] = [logprob_json(t) for t in entry.top]
    return out
