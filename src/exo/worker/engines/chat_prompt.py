"""From a request's messages and tools to what a model's chat template renders.

Templates that know tools (Qwen/Hermes, Llama 3.1+, Mistral) get them the Hugging Face
way: ``tools`` as JSON schemas, assistant ``tool_calls`` with argument objects, ``tool``
messages. A template that knows none (the embedded SmolLM2-135M's) gets them as a system
prompt in SmolLM2's own format, ``<tool_call>[{"name": ..., "arguments": ...}]</tool_call>``,
with earlier calls and results written the same way. The MoE families' formats
(``exo.shared.chat_formats``: harmony, DeepSeek, Kimi K2, GLM) are their own: DeepSeek's templates get
the arguments as JSON text (they join them to their text), Kimi K2 its own call ids
(``functions.NAME:N``), and a template of theirs that knows no tools gets the system prompt
and the earlier calls in the family's own syntax.

``tool_choice`` required (or a named function) starts the answer with the opening of a
call in the model's format (the *prefix*): the model continues a call, it does not decide
whether to make one.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from exo.shared.chat_formats import (
    as_native,
    calls_text,
    native_format,
    native_prefix,
    native_system,
)
from exo.shared.types.text_generation import InputMessage, ToolCall, ToolSpec

ToolFormat = Literal[
    "hermes", "llama3", "mistral", "smollm", "harmony", "glm", "deepseek3", "deepseek31", "kimi"
]

def tool_format(template: str | None) -> ToolFormat:
    """The call format a chat template teaches its model."""
    text = template or ""
    native = native_format(template)
    if native is not None:
        return native
    if "<tool_call>" in text:
        return "hermes"
    if "<|python_tag|>" in text or "ipython" in text:
        return "llama3"
    if "[TOOL_CALLS]" in text or "[AVAILABLE_TOOLS]" in text:
        return "mistral"
    return "smollm"


def template_knows_tools(template: str | None) -> bool:
    return template is not None and "tools" in template


def json_object(text: str) -> dict[str, Any]:
    """A JSON object from text; anything else is kept under ``"value"``."""
    try:
        value: object = json.loads(text)
    except ValueError:
        return {"value": text}
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
    return {"value": value}


def tool_schema(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": json_object(tool.parameters),
        },
    }


def _call_ids(fmt: ToolFormat, messages: Sequence[InputMessage]) -> dict[str, str]:
    """Kimi K2 knows its calls by ``functions.NAME:N`` (N counts the conversation's calls),
    as it writes them: the ids its template sees, for each call id of the request."""
    if fmt != "kimi":
        return {}
    calls = [c for m in messages for c in m.tool_calls]
    return {c.id: f"functions.{c.name}:{i}" for i, c in enumerate(calls)}


def _hf_call(call: ToolCall, fmt: ToolFormat, ids: dict[str, str]) -> dict[str, Any]:
    # DeepSeek's templates join the arguments to their text: they want the JSON string.
    as_text = fmt in ("deepseek3", "deepseek31")
    arguments = call.arguments if as_text else json_object(call.arguments)
    return {
        "id": ids.get(call.id, call.id),
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _written_calls(fmt: ToolFormat, calls: Sequence[ToolCall]) -> str:
    """Earlier calls as text, for a template that does not take them."""
    native = as_native(fmt)
    if native is None:
        return _smollm_calls(calls)
    return calls_text(native, [(c.name, json_object(c.arguments)) for c in calls])


def _smollm_calls(calls: Sequence[ToolCall]) -> str:
    body = [{"name": c.name, "arguments": json_object(c.arguments)} for c in calls]
    return f"<tool_call>{json.dumps(body)}</tool_call>"


def _smollm_system(tools: Sequence[ToolSpec], fmt: ToolFormat) -> str:
    schemas = "\n".join(json.dumps(tool_schema(t)["function"]) for t in tools)
    native = as_native(fmt)
    if native is not None:
        return native_system(native, schemas)
    return (
        "You can call functions. Their JSON schemas:\n<tools>\n"
        f"{schemas}\n</tools>\n"
        "To call functions, answer with only "
        '<tool_call>[{"name": "<function name>", "arguments": {<arguments>}}]</tool_call>. '
        "Results come back in <tool_response></tool_response>."
    )


@dataclass(frozen=True)
class ChatPrompt:
    messages: list[dict[str, Any]]
    # For the template's ``tools`` variable (None: the template is not given tools).
    tools: list[dict[str, Any]] | None
    # Appended to the rendered prompt: the start of a forced call.
    prefix: str
    format: ToolFormat


def forced_prefix(fmt: ToolFormat, name: str | None) -> str:
    """The opening of a call in ``fmt``; with ``name``, up to its arguments."""
    native = as_native(fmt)
    if native is not None:
        return native_prefix(native, name)
    key = "parameters" if fmt == "llama3" else "arguments"
    head = {
        "hermes": '<tool_call>\n{"name": "',
        "smollm": '<tool_call>[{"name": "',
        "llama3": '{"name": "',
        "mistral": '[TOOL_CALLS][{"name": "',
    }.get(fmt, "")
    return head if name is None else f'{head}{name}", "{key}": '


def _content(m: InputMessage) -> str | list[dict[str, Any]]:
    """A message's content for the template: its text, or with images the Hugging Face
    parts (each image, then the text), from which a vision template writes its markers."""
    if not m.images:
        return m.content
    return [*({"type": "image"} for _ in m.images), {"type": "text", "text": m.content}]


def chat_prompt(
    messages: Sequence[InputMessage],
    tools: Sequence[ToolSpec],
    tool_choice: str,
    forced_tool: str | None,
    template: str | None,
) -> ChatPrompt:
    fmt = tool_format(template)
    offer = bool(tools) and tool_choice != "none"
    native = template_knows_tools(template)
    ids = _call_ids(fmt, messages)
    out: list[dict[str, Any]] = []
    for m in messages:
        if native or not (m.tool_calls or m.role == "tool"):
            entry: dict[str, Any] = {"role": m.role, "content": _content(m)}
            if m.tool_calls:
                entry["tool_calls"] = [_hf_call(c, fmt, ids) for c in m.tool_calls]
            if m.role == "tool":
                entry["tool_call_id"] = ids.get(m.tool_call_id or "", m.tool_call_id or "")
                entry["name"] = m.name or ""
            out.append(entry)
        elif m.role == "tool":
            content = f"<tool_response>\n{m.content}\n</tool_response>"
            out.append({"role": "user", "content": content})
        else:
            text = f"{m.content}\n" if m.content else ""
            out.append({"role": m.role, "content": text + _written_calls(fmt, m.tool_calls)})
    if offer and not native:
        system = _smollm_system(tools, fmt)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    prefix = ""
    if offer and tool_choice == "required":
        prefix = forced_prefix(fmt, forced_tool)
    schemas = [tool_schema(t) for t in tools] if offer and native else None
    return ChatPrompt(messages=out, tools=schemas, prefix=prefix, format=fmt)
