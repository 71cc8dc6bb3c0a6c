"""Lark grammars for one call in the MoE families' own syntax (``exo.shared.chat_formats``).

A marker that is one token of the model's vocabulary (harmony's ``<|channel|>``,
DeepSeek's tool separator) is written as that token (``<[id]>``), so the model emits
the special token it was trained on, not its spelling in ordinary tokens; other text is
a literal. Each offered tool is one alternative: its name, then arguments that follow its
schema (GLM's ``<arg_key>``/``<arg_value>`` pairs: a string property's value is raw text,
any other is JSON, as GLM's template writes them).
"""

import json
from collections.abc import Callable, Sequence
from typing import Any

from exo.shared.chat_formats import (
    DS_CALL_BEGIN,
    DS_CALL_END,
    DS_CALLS_BEGIN,
    DS_CALLS_END,
    DS_SEP,
    GLM_CALL,
    GLM_CALL_END,
    GLM_KEY,
    GLM_KEY_END,
    GLM_VALUE,
    GLM_VALUE_END,
    H_CHANNEL,
    H_CONSTRAIN,
    H_MESSAGE,
    KIMI_ARGS,
    KIMI_CALL_BEGIN,
    KIMI_CALL_END,
    KIMI_SECTION_BEGIN,
    KIMI_SECTION_END,
    NativeFormat,
)
from exo.shared.types.text_generation import ToolSpec

TokenId = Callable[[str], int | None]
Styled = Callable[[dict[str, Any]], dict[str, Any]]


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class _Writer:
    def __init__(self, token_id: TokenId | None, styled: Styled) -> None:
        self._token_id = token_id
        self.styled = styled

    def marker(self, text: str) -> str:
        """A marker as its token when the vocabulary has it whole, else as text."""
        token = self._token_id(text) if self._token_id is not None else None
        return f"<[{token}]>" if token is not None else _literal(text)

    def json(self, schema: dict[str, Any]) -> str:
        return f"%json {json.dumps(self.styled(schema))}"


def _glm_pairs(w: _Writer, schema: dict[str, Any]) -> str:
    raw_props: object = schema.get("properties", {})
    props: dict[str, Any] = raw_props if isinstance(raw_props, dict) else {}  # pyright: ignore[reportUnknownVariableType]
    required_raw: object = schema.get("required", [])
    required = set(required_raw) if isinstance(required_raw, list) else set()  # pyright: ignore[reportUnknownArgumentType]
    parts: list[str] = []
    for key, sub in props.items():
        sub_schema: dict[str, Any] = sub if isinstance(sub, dict) else {}  # pyright: ignore[reportUnknownVariableType]
        value = '/[^<]*/' if sub_schema.get("type") == "string" else w.json(sub_schema)
        pair = (
            f"{w.marker(GLM_KEY)} {_literal(key)} {w.marker(GLM_KEY_END)} \"\\n\" "
            f"{w.marker(GLM_VALUE)} {value} {w.marker(GLM_VALUE_END)} \"\\n\""
        )
        parts.append(pair if key in required else f"({pair})?")
    return " ".join(parts) if parts else '""'


def _one_call(fmt: NativeFormat, w: _Writer, name: str, args: dict[str, Any]) -> str:
    n = _literal(name)
    match fmt:
        case "harmony":
            return (
                f'{w.marker(H_CHANNEL)} "commentary to=functions." {n} " " '
                f'{w.marker(H_CONSTRAIN)} "json" {w.marker(H_MESSAGE)} {w.json(args)}'
            )
        case "deepseek3":
            return (
                f'{w.marker(DS_CALLS_BEGIN)} {w.marker(DS_CALL_BEGIN)} "function" '
                f'{w.marker(DS_SEP)} {n} "\\n```json\\n" {w.json(args)} "\\n```" '
                f"{w.marker(DS_CALL_END)} {w.marker(DS_CALLS_END)}"
            )
        case "deepseek31":
            return (
                f"{w.marker(DS_CALLS_BEGIN)} {w.marker(DS_CALL_BEGIN)} {n} {w.marker(DS_SEP)} "
                f"{w.json(args)} {w.marker(DS_CALL_END)} {w.marker(DS_CALLS_END)}"
            )
        case "kimi":
            return (
                f'{w.marker(KIMI_SECTION_BEGIN)} {w.marker(KIMI_CALL_BEGIN)} "functions." {n} '
                f'":0" {w.marker(KIMI_ARGS)} {w.json(args)} {w.marker(KIMI_CALL_END)} '
                f"{w.marker(KIMI_SECTION_END)}"
            )
        case "glm":
            return (
                f'{w.marker(GLM_CALL)} {n} "\\n" {_glm_pairs(w, args)} {w.marker(GLM_CALL_END)}'
            )


def native_call_lark(
    fmt: NativeFormat,
    tools: Sequence[tuple[str, dict[str, Any]]],
    styled: Styled,
    token_id: TokenId | None,
) -> str:
    """Lark text of one call of any of ``tools`` ((name, arguments schema) pairs)."""
    w = _Writer(token_id, styled)
    rules = [f"call_{i}: {_one_call(fmt, w, name, args)}" for i, (name, args) in enumerate(tools)]
    start = "start: " + " | ".join(f"call_{i}" for i in range(len(tools)))
    return "\n".join([start, *rules])


def offered(
    tools: Sequence[ToolSpec], forced: str | None, schema: Callable[[ToolSpec], dict[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    return [(t.name, schema(t)) for t in tools if forced is None or t.name == forced]
