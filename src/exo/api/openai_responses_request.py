"""OpenAI Responses requests: input items (messages, function calls and their outputs),
tools, text format and reasoning options, and the task they become."""

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PlainValidator

from exo.api.images import responses_image_part
from exo.api.task_params import (
    ApiModel,
    Content,
    Sampling,
    build_task_params,
    message_content,
    text_content,
)
from exo.api.tool_models import (
    ReasoningEffort,
    TextFormat,
    Tools,
    schema_text,
    thinking_kwargs,
)
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.text_generation import (
    InputMessage,
    Role,
    TextGenerationTaskParams,
    ToolCall,
    ToolSpec,
)


def _input_text(value: object) -> object:
    return text_content(value, ("input_text", "output_text", "text"))


def _input_content(value: object) -> object:
    return message_content(
        value, ("input_text", "output_text", "text"), {"input_image": responses_image_part}
    )


class InputItem(ApiModel):
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: Annotated[Content, PlainValidator(_input_content)]


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
    effort: ReasoningEffort | None = None


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
    store: bool = True

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
                out.append(
                    InputMessage(
                        role=_ROLES[item.role],
                        content=item.content.text,
                        images=list(item.content.images),
                    )
                )
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


def responses_task_params(
    request: ResponsesRequest, card: ModelCard, history: Sequence[InputMessage] = ()
) -> TextGenerationTaskParams:
    """``history``: the conversation of ``previous_response_id`` (its instructions are
    not carried over)."""
    messages: list[InputMessage] = []
    if request.instructions:
        messages.append(InputMessage(role="system", content=request.instructions))
    messages.extend(history)
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
