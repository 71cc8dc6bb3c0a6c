# ruff: noqa: RUF001, RUF002 (DeepSeek's markers are written with full-width bars)
"""The chat formats of the mixture-of-experts families, told apart by their templates.

Each family's chat template writes its own markers (its special tokens), so the template
says which format the model answers in; no model name is consulted:

* ``harmony`` (gpt-oss): ``<|channel|>`` in the template. Output is a run of messages,
  ``<|channel|>analysis<|message|>...<|end|>`` (reasoning), ``<|start|>assistant<|channel|>
  final<|message|>...`` (the answer), ``<|channel|>commentary to=functions.NAME
  <|constrain|>json<|message|>{...}<|call|>`` (a call);
* ``glm`` (GLM-4.5+): ``<arg_key>`` in the template: ``<tool_call>NAME\\n<arg_key>k</arg_key>
  \\n<arg_value>v</arg_value>\\n</tool_call>``;
* ``deepseek3`` (DeepSeek V3 / R1): ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function
  <｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>``;
  ``deepseek31`` (V3.1+): the same without the type and the fence, ``NAME<｜tool▁sep｜>{...}``;
* ``kimi`` (Kimi K2): ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
  <|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|>``.

Their markers are special tokens, so a runner decodes these models' output with special
tokens kept (``keeps_special_tokens``).
"""

import json
from collections.abc import Mapping, Sequence
from typing import Literal

NativeFormat = Literal["harmony", "glm", "deepseek3", "deepseek31", "kimi"]
NATIVE_FORMATS: tuple[NativeFormat, ...] = ("harmony", "glm", "deepseek3", "deepseek31", "kimi")

# DeepSeek's markers (full-width bars, "▁" for spaces, as its tokenizer spells them).
DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
KIMI_SECTION_BEGIN, KIMI_SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KIMI_CALL_BEGIN, KIMI_ARGS, KIMI_CALL_END = (
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
GLM_CALL, GLM_CALL_END = "<tool_call>", "</tool_call>"
GLM_KEY, GLM_KEY_END, GLM_VALUE, GLM_VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
H_START, H_CHANNEL, H_MESSAGE, H_CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
H_END, H_CALL, H_RETURN = "<|end|>", "<|call|>", "<|return|>"

# The tokens that end the model's turn in each format (a GGUF file may name only one of
# them its end of sequence): harmony's answer and call, GLM's next user or tool turn.
TURN_ENDS: dict[NativeFormat, tuple[str, ...]] = {
    "harmony": (H_RETURN, H_CALL),
    "glm": ("<|user|>", "<|observation|>", "<|endoftext|>"),
    "deepseek3": ("<｜end▁of▁sentence｜>",),
    "deepseek31": ("<｜end▁of▁sentence｜>",),
    "kimi": ("<|im_end|>",),
}

# Harmony's reasoning levels, from every effort the APIs accept.
_HARMONY_EFFORT = {
    "none": "low",
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


def native_format(template: str | None) -> NativeFormat | None:
    """The MoE families' format a chat template writes, or None for another template."""
    text = template or ""
    if H_CHANNEL in text and H_MESSAGE in text:
        return "harmony"
    if GLM_KEY in text:
        return "glm"
    if DS_CALL_BEGIN in text or "<｜Assistant｜>" in text:
        return "deepseek3" if "```json" in text else "deepseek31"
    if KIMI_CALL_BEGIN in text or "tool_declare" in text or "<|im_middle|>" in text:
        return "kimi"
    return None


def as_native(fmt: str) -> NativeFormat | None:
    """``fmt`` when it is one of these formats."""
    return next((f for f in NATIVE_FORMATS if f == fmt), None)


def keeps_special_tokens(template: str | None) -> bool:
    """Whether the model's answer is decoded with its special tokens (its markers)."""
    return native_format(template) is not None


def harmony_variables(template_kwargs: Mapping[str, object]) -> dict[str, object]:
    """Template variables for harmony: ``reasoning_effort`` in its three levels (a thought
    switched off is the lowest)."""
    out = dict(template_kwargs)
    effort = out.get("reasoning_effort")
    if isinstance(effort, str):
        out["reasoning_effort"] = _HARMONY_EFFORT.get(effort.lower(), "medium")
    elif out.get("enable_thinking") is False:
        out["reasoning_effort"] = "low"
    return out


def template_variables(
    template: str | None, template_kwargs: Mapping[str, object] | None
) -> dict[str, object]:
    """A request's template variables as the model's template reads them."""
    kwargs = dict(template_kwargs or {})
    return harmony_variables(kwargs) if native_format(template) == "harmony" else kwargs


Call = tuple[str, Mapping[str, object]]  # a function's name and its arguments


def calls_text(fmt: NativeFormat, calls: Sequence[Call]) -> str:
    """Calls as the model writes them: DeepSeek and Kimi put a turn's calls in one section,
    harmony and GLM write each on its own."""
    match fmt:
        case "harmony" | "glm":
            return "".join(_one_call(fmt, name, args, i) for i, (name, args) in enumerate(calls))
        case "deepseek3" | "deepseek31":
            body = "".join(_one_call(fmt, name, args, i) for i, (name, args) in enumerate(calls))
            return f"{DS_CALLS_BEGIN}{body}{DS_CALLS_END}"
        case "kimi":
            body = "".join(_one_call(fmt, name, args, i) for i, (name, args) in enumerate(calls))
            return f"{KIMI_SECTION_BEGIN}{body}{KIMI_SECTION_END}"


def call_text(fmt: NativeFormat, name: str, arguments: Mapping[str, object]) -> str:
    """One whole call (with its section markers) as the model writes it."""
    return calls_text(fmt, [(name, arguments)])


def _one_call(fmt: NativeFormat, name: str, arguments: Mapping[str, object], index: int) -> str:
    args = json.dumps(arguments, ensure_ascii=False)
    match fmt:
        case "harmony":
            return f"{H_CHANNEL}commentary to=functions.{name} {H_CONSTRAIN}json{H_MESSAGE}{args}{H_CALL}"
        case "glm":
            pairs = "".join(
                f"{GLM_KEY}{k}{GLM_KEY_END}\n{GLM_VALUE}{_glm_value(v)}{GLM_VALUE_END}\n"
                for k, v in arguments.items()
            )
            return f"{GLM_CALL}{name}\n{pairs}{GLM_CALL_END}"
        case "deepseek3":
            return f"{DS_CALL_BEGIN}function{DS_SEP}{name}\n```json\n{args}\n```{DS_CALL_END}"
        case "deepseek31":
            return f"{DS_CALL_BEGIN}{name}{DS_SEP}{args}{DS_CALL_END}"
        case "kimi":
            return f"{KIMI_CALL_BEGIN}functions.{name}:{index}{KIMI_ARGS}{args}{KIMI_CALL_END}"


def _glm_value(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def native_prefix(fmt: NativeFormat, name: str | None) -> str:
    """The opening of a forced call; with ``name``, up to its arguments."""
    match fmt:
        case "harmony":
            head = f"{H_CHANNEL}commentary to=functions."
            tail = f" {H_CONSTRAIN}json{H_MESSAGE}"
        case "glm":
            head, tail = GLM_CALL, "\n"
        case "deepseek3":
            head, tail = f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}function{DS_SEP}", "\n```json\n"
        case "deepseek31":
            head, tail = f"{DS_CALLS_BEGIN}{DS_CALL_BEGIN}", DS_SEP
        case "kimi":
            head, tail = f"{KIMI_SECTION_BEGIN}{KIMI_CALL_BEGIN}functions.", f":0{KIMI_ARGS}"
    return head if name is None else f"{head}{name}{tail}"


def native_system(fmt: NativeFormat, schemas: str) -> str:
    """A system prompt offering tools to a model whose template does not take them."""
    example = call_text(fmt, "<function name>", {"<argument>": "<value>"})
    return (
        "You can call functions. Their JSON schemas:\n<tools>\n"
        f"{schemas}\n</tools>\n"
        f"To call a function, answer with {example}"
    )
