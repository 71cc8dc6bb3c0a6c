"""Function calls out of streamed model text, in the formats models are trained on.

* Hermes / Qwen / SmolLM2: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (SmolLM2 puts a list of calls inside one pair of tags);
* Llama 3.1+: ``<|python_tag|>{"name": ..., "parameters": {...}}`` (``;`` between calls),
  or the bare JSON object as the whole answer (Llama 3.2);
* Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``.

``ToolCallParser.feed`` takes text as it streams (markers may arrive split anywhere) and
gives back text that is surely not part of a call, and each call once it is complete.
Text that looked like a call but does not parse comes back as text: a malformed call is
the model's answer, not an error.
"""

import json
from uuid import uuid4

from exo.api.generation_events import TextDelta, ToolCallEvent

ParsedEvent = TextDelta | ToolCallEvent

TAGGED = ("<tool_call>", "</tool_call>")
# Markers after which everything to the end of the answer is calls.
OPEN_ENDED = ("<|python_tag|>", "[TOOL_CALLS]")
MARKERS = (TAGGED[0], *OPEN_ENDED)


def new_call_id() -> str:
    return f"call_{uuid4().hex[:24]}"


def _call(value: object) -> tuple[str, str] | None:
    """(name, arguments JSON) of one call object, or None."""
    if not isinstance(value, dict):
        return None
    fields = {str(k): v for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
    name = fields.get("name")
    args = fields.get("arguments", fields.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        return None
    return name, json.dumps(args, ensure_ascii=False)


def parse_calls(text: str) -> list[tuple[str, str]] | None:
    """Every call in a call body (an object, a list of objects, or objects separated by
    ``;``); None when any part is not a call."""
    body = text.strip()
    if not body:
        return None
    try:
        value: object = json.loads(body)
    except ValueError:
        parts = [p for p in body.split(";") if p.strip()]
        if len(parts) < 2:
            return None
        calls: list[tuple[str, str]] = []
        for part in parts:
            one = parse_calls(part)
            if one is None:
                return None
            calls.extend(one)
        return calls
    items: list[object] = list(value) if isinstance(value, list) else [value]  # pyright: ignore[reportUnknownArgumentType]
    parsed = [_call(item) for item in items]
    if not parsed or any(p is None for p in parsed):
        return None
    return [p for p in parsed if p is not None]


def _partial_marker(buffer: str) -> int:
    """Length of the longest end of ``buffer`` that begins a marker."""
    for size in range(min(len(buffer), max(len(m) for m in MARKERS) - 1), 0, -1):
        if any(m.startswith(buffer[-size:]) for m in MARKERS):
            return size
    return 0


class ToolCallParser:
    def __init__(self) -> None:
        self._buffer = ""
        # The marker of the call being read (None: reading text); "" for a bare object.
        self._marker: str | None = None
        self._emitted_text = False
        self.calls: list[ToolCallEvent] = []

    def feed(self, text: str) -> list[ParsedEvent]:
        self._buffer += text
        events: list[ParsedEvent] = []
        while True:
            before = (self._marker, len(self._buffer))
            events.extend(self._step())
            if (self._marker, len(self._buffer)) == before:
                return events

    def finish(self) -> list[ParsedEvent]:
        """The end of the answer: an unclosed call is parsed as it is."""
        buffer, self._buffer = self._buffer, ""
        marker, self._marker = self._marker, None
        if marker is None:
            return [TextDelta(buffer)] if buffer else []
        body = buffer[: -len(TAGGED[1])] if buffer.endswith(TAGGED[1]) else buffer
        return self._calls_or_text(marker, body, buffer)

    def _step(self) -> list[ParsedEvent]:
        if self._marker is None:
            return self._read_text()
        if self._marker == TAGGED[0]:
            end = self._buffer.find(TAGGED[1])
            if end < 0:
                return []
            body = self._buffer[:end]
            raw = self._buffer[: end + len(TAGGED[1])]
            self._buffer = self._buffer[end + len(TAGGED[1]) :]
            self._marker = None
            return self._calls_or_text(TAGGED[0], body, raw)
        return []  # open-ended or bare: everything to the end

    def _read_text(self) -> list[ParsedEvent]:
        buffer = self._buffer
        if not self._emitted_text and not self.calls:
            stripped = buffer.lstrip()
            if not stripped:
                return []
            if stripped.startswith("{"):
                self._marker = ""
                self._buffer = stripped
                return []
        hits = [(buffer.find(m), m) for m in MARKERS if m in buffer]
        if hits:
            at, marker = min(hits)
            self._marker = marker
            self._buffer = buffer[at + len(marker) :]
            return self._text(buffer[:at])
        keep = _partial_marker(buffer)
        self._buffer = buffer[len(buffer) - keep :]
        return self._text(buffer[: len(buffer) - keep])

    def _text(self, text: str) -> list[ParsedEvent]:
        if not text:
            return []
        self._emitted_text = True
        return [TextDelta(text)]

    def _calls_or_text(self, marker: str, body: str, raw: str) -> list[ParsedEvent]:
        calls = parse_calls(body)
        if calls is None:
            return self._text(marker + raw)
        events: list[ParsedEvent] = []
        for name, arguments in calls:
            call = ToolCallEvent(len(self.calls), new_call_id(), name, arguments)
            self.calls.append(call)
            events.append(call)
        return events
