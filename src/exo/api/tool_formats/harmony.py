"""gpt-oss's harmony output: reasoning, the answer and calls, each its own message.

The prompt ends with ``<|start|>assistant``, so the answer is a run of messages, each a
header up to ``<|message|>`` and a content up to ``<|end|>``, ``<|call|>`` or
``<|return|>`` (the last two end the turn, so the runner usually stops before them):

* ``<|channel|>analysis<|message|>...``: reasoning, streamed as reasoning deltas;
* ``<|channel|>final<|message|>...`` (and ``commentary`` without a recipient, a preamble
  shown to the user): the answer;
* ``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}`` (the
  recipient may stand in the role part too, ``<|start|>assistant to=functions.NAME
  <|channel|>commentary json``): a call, once its arguments are complete.

``<|call|>`` and ``<|return|>`` end the turn: anything after them (a model that goes on
to imagine the tool's answer) is not part of the answer. Output that does not open with a
header (a raw prompt's continuation) is all answer.
"""

import re

from exo.api.generation_events import ReasoningDelta, TextDelta, ToolCallEvent
from exo.api.tool_calls import new_call_id
from exo.api.tool_formats.sections import arguments_json, held_prefix
from exo.shared.chat_formats import H_CALL, H_CHANNEL, H_END, H_MESSAGE, H_RETURN, H_START

Event = TextDelta | ReasoningDelta | ToolCallEvent
_ENDS = (H_END, H_CALL, H_RETURN, H_START)
_HEAD_STARTS = (H_CHANNEL, H_START, "to=")
_RECIPIENT = re.compile(r"to=([^\s<]+)")
# A header is a role, a channel, a recipient and a content type: text this long without
# its <|message|> is not one.
_MAX_HEADER = 400
_CHANNEL = re.compile(re.escape(H_CHANNEL) + r"\s*([^\s<]+)")


def _could_be_header(buffer: str) -> bool:
    text = buffer.lstrip()
    return any(text.startswith(m) or m.startswith(text) for m in _HEAD_STARTS)


class HarmonyParser:
    def __init__(self, parse_tools: bool) -> None:
        self._parse_tools = parse_tools
        self._buffer = ""
        self._in_content = False
        self._plain = False  # not harmony: everything is answer text
        self._over = False  # the turn ended (<|call|>, <|return|>)
        self._channel = ""
        self._call: str | None = None  # the recipient of the message (functions.NAME)
        self._arguments = ""
        self._in_thought = False
        self.reasoning: list[str] = []
        self.reasoning_tokens = 0
        self.calls: list[ToolCallEvent] = []

    def feed(self, text: str, tokens: int = 0) -> list[Event]:
        self._buffer += text
        self._in_thought = False
        out: list[Event] = []
        while self._step(out):
            pass
        if self._in_thought:
            self.reasoning_tokens = max(self.reasoning_tokens, tokens)
        return out

    def finish(self, tokens: int = 0) -> list[Event]:
        out: list[Event] = []
        rest, self._buffer = self._buffer, ""
        if self._plain or self._in_content:
            if self._channel == "analysis" and self._call is None:
                self.reasoning_tokens = max(self.reasoning_tokens, tokens)
            self._content(rest, out)
            if self._in_content:
                self._close(out)
        elif rest.strip() and "<|" not in rest:
            out.append(TextDelta(rest))
        return out

    def _step(self, out: list[Event]) -> bool:
        """One move through the buffer; False when it needs more text."""
        if self._over:
            self._buffer = ""
            return False
        if self._plain:
            self._content(self._buffer, out)
            self._buffer = ""
            return False
        if not self._in_content:
            at = self._buffer.find(H_MESSAGE)
            if at < 0:
                if len(self._buffer) > _MAX_HEADER or not _could_be_header(self._buffer):
                    self._plain = True
                    return True
                return False
            self._open(self._buffer[:at])
            self._buffer = self._buffer[at + len(H_MESSAGE) :]
            return True
        hits = [(self._buffer.find(m), m) for m in _ENDS if m in self._buffer]
        if not hits:
            keep = max(held_prefix(self._buffer, m) for m in _ENDS)
            self._content(self._buffer[: len(self._buffer) - keep], out)
            self._buffer = self._buffer[len(self._buffer) - keep :]
            return False
        at, marker = min(hits)
        self._content(self._buffer[:at], out)
        if marker in (H_CALL, H_RETURN):  # the turn is over: what follows is not the answer
            self._close(out)
            self._buffer, self._over = "", True
            return False
        # A new message's <|start|> stays: it begins the next header.
        self._buffer = self._buffer[at + (0 if marker == H_START else len(marker)) :]
        self._close(out)
        return True

    def _open(self, header: str) -> None:
        channel = _CHANNEL.search(header)
        recipient = _RECIPIENT.search(header)
        self._channel = channel.group(1) if channel else ""
        # The recipient (a function, or another of harmony's tools): not the user's text.
        self._call = recipient.group(1) if recipient else None
        self._arguments = ""
        self._in_content = True

    def _content(self, text: str, out: list[Event]) -> None:
        if not text:
            return
        if self._plain:
            out.append(TextDelta(text))
        elif self._call is not None:
            self._arguments += text
        elif self._channel == "analysis":
            self._in_thought = True
            self.reasoning.append(text)
            out.append(ReasoningDelta(text))
        else:
            out.append(TextDelta(text))

    def _close(self, out: list[Event]) -> None:
        self._in_content = False
        recipient, self._call = self._call, None
        if recipient is None:
            return
        name = recipient.removeprefix("functions.")
        function = recipient.startswith("functions.") and self._parse_tools
        arguments = arguments_json(self._arguments.strip()) if function else None
        if arguments is None:
            if self._arguments.strip():  # not a call we can give: the model's text
                out.append(TextDelta(self._arguments))
            return
        call = ToolCallEvent(len(self.calls), new_call_id(), name, arguments)
        self.calls.append(call)
        out.append(call)
