"""Calls written between a begin and an end marker: DeepSeek V3/V3.1/R1, Kimi K2, GLM-4.5.

``SectionCallParser.feed`` takes text as it streams (markers may arrive split anywhere):
text before a section comes back as soon as it surely is not a marker's start; a section
comes back as its calls once its end marker arrived (or the answer ended). A section whose
body does not parse is the model's text, markers and all.
"""

import json
from collections.abc import Callable
from typing import Literal

from exo.api.generation_events import TextDelta, ToolCallEvent
from exo.api.tool_calls import new_call_id
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
    KIMI_ARGS,
    KIMI_CALL_BEGIN,
    KIMI_CALL_END,
    KIMI_SECTION_BEGIN,
    KIMI_SECTION_END,
)

Call = tuple[str, str]  # name, arguments as a JSON object's text
BodyParser = Callable[[str], list[Call] | None]


def held_prefix(buffer: str, marker: str) -> int:
    """Length of the longest end of ``buffer`` that begins ``marker``."""
    for size in range(min(len(buffer), len(marker) - 1), 0, -1):
        if marker.startswith(buffer[-size:]):
            return size
    return 0


def arguments_json(text: str) -> str | None:
    """The compact text of a JSON object, or None when ``text`` is not one."""
    try:
        value: object = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)


def _pieces(body: str, begin: str, end: str) -> list[str] | None:
    """The texts between each ``begin`` and ``end`` in ``body`` (the last may be unclosed);
    None when anything but whitespace lies outside them, or there are none."""
    out: list[str] = []
    rest = body
    while rest.strip():
        rest = rest.lstrip()
        if not rest.startswith(begin):
            return None
        rest = rest[len(begin) :]
        at = rest.find(end)
        out.append(rest if at < 0 else rest[:at])
        rest = "" if at < 0 else rest[at + len(end) :]
    return out or None


def _deepseek_call(piece: str) -> Call | None:
    head, sep, rest = piece.partition(DS_SEP)
    if not sep:
        return None
    if head.strip() == "function":  # V3 / R1: the name, then the arguments in a fence
        name, _, fenced = rest.partition("\n")
        body = fenced.strip()
        body = body.removeprefix("```json").removeprefix("```").removesuffix("```")
    else:  # V3.1: the name before the separator, the arguments after it
        name, body = head, rest
    arguments = arguments_json(body.strip())
    name = name.strip()
    return (name, arguments) if name and arguments is not None else None


def _kimi_call(piece: str) -> Call | None:
    head, sep, rest = piece.partition(KIMI_ARGS)
    if not sep:
        return None
    # "functions.NAME:INDEX"
    name = head.strip().removeprefix("functions.").rsplit(":", 1)[0]
    arguments = arguments_json(rest.strip())
    return (name, arguments) if name and arguments is not None else None


def glm_value(text: str) -> object:
    """An argument's value: JSON when it parses as JSON, else the text itself."""
    try:
        value: object = json.loads(text)
    except ValueError:
        return text
    return value


def _glm_call(piece: str) -> Call | None:
    name, _, rest = piece.partition(GLM_KEY)
    name = name.strip()
    if not name or "\n" in name or "{" in name:
        return None
    arguments: dict[str, object] = {}
    pairs = f"{GLM_KEY}{rest}" if GLM_KEY in piece else ""
    while pairs.strip():
        pairs = pairs.lstrip()
        if not pairs.startswith(GLM_KEY) or GLM_KEY_END not in pairs:
            return None
        key, _, pairs = pairs[len(GLM_KEY) :].partition(GLM_KEY_END)
        pairs = pairs.lstrip()
        if not pairs.startswith(GLM_VALUE):
            return None
        value, _, pairs = pairs[len(GLM_VALUE) :].partition(GLM_VALUE_END)
        arguments[key.strip()] = glm_value(value)
    return name, json.dumps(arguments, ensure_ascii=False)


def _each(parse: Callable[[str], Call | None], begin: str, end: str) -> BodyParser:
    def body_parser(body: str) -> list[Call] | None:
        pieces = _pieces(body, begin, end)
        if pieces is None:
            return None
        calls = [parse(p) for p in pieces]
        return None if any(c is None for c in calls) else [c for c in calls if c is not None]

    return body_parser


def _glm_body(body: str) -> list[Call] | None:
    call = _glm_call(body)
    return None if call is None else [call]


SectionFormat = Literal["glm", "deepseek3", "deepseek31", "kimi"]


def section_parser(fmt: SectionFormat) -> "SectionCallParser":
    match fmt:
        case "deepseek3" | "deepseek31":
            parse = _each(_deepseek_call, DS_CALL_BEGIN, DS_CALL_END)
            return SectionCallParser(DS_CALLS_BEGIN, DS_CALLS_END, parse)
        case "kimi":
            parse = _each(_kimi_call, KIMI_CALL_BEGIN, KIMI_CALL_END)
            return SectionCallParser(KIMI_SECTION_BEGIN, KIMI_SECTION_END, parse)
        case "glm":
            return SectionCallParser(GLM_CALL, GLM_CALL_END, _glm_body)


class SectionCallParser:
    def __init__(self, begin: str, end: str, parse: BodyParser) -> None:
        self._begin, self._end, self._parse = begin, end, parse
        self._buffer = ""
        self._in_section = False
        self.calls: list[ToolCallEvent] = []

    def feed(self, text: str) -> list[TextDelta | ToolCallEvent]:
        self._buffer += text
        out: list[TextDelta | ToolCallEvent] = []
        while True:
            if not self._in_section:
                at = self._buffer.find(self._begin)
                if at < 0:
                    keep = held_prefix(self._buffer, self._begin)
                    out.extend(self._text(self._buffer[: len(self._buffer) - keep]))
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    return out
                out.extend(self._text(self._buffer[:at]))
                self._buffer = self._buffer[at + len(self._begin) :]
                self._in_section = True
            at = self._buffer.find(self._end)
            if at < 0:
                return out
            body = self._buffer[:at]
            self._buffer = self._buffer[at + len(self._end) :]
            self._in_section = False
            out.extend(self._section(body, closed=True))

    def finish(self) -> list[TextDelta | ToolCallEvent]:
        """The end of the answer: an unclosed section is read as it is."""
        rest, self._buffer = self._buffer, ""
        if not self._in_section:
            return self._text(rest)
        self._in_section = False
        return self._section(rest, closed=False)

    def _section(self, body: str, closed: bool) -> list[TextDelta | ToolCallEvent]:
        calls = self._parse(body)
        if calls is None:
            return self._text(self._begin + body + (self._end if closed else ""))
        events: list[TextDelta | ToolCallEvent] = []
        for name, arguments in calls:
            call = ToolCallEvent(len(self.calls), new_call_id(), name, arguments)
            self.calls.append(call)
            events.append(call)
        return events

    @staticmethod
    def _text(text: str) -> list[TextDelta | ToolCallEvent]:
        return [TextDelta(text)] if text else []
