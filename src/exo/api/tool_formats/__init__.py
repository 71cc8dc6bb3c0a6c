"""A model's answer split into reasoning, text and calls, in the format its template says.

``output_parser(template, parse_tools)`` picks the parser by the chat template's markers
(``exo.shared.chat_formats``): harmony has its own (channels carry reasoning and
calls); the other formats think in ``<think>`` (``ReasoningSplitter``) and call in their
own syntax (``SectionCallParser`` for DeepSeek, Kimi and GLM, ``ToolCallParser`` for the
rest). Every parser takes text as it streams.
"""

from typing import Protocol

from exo.api.generation_events import ReasoningDelta, TextDelta, ToolCallEvent
from exo.api.reasoning import ReasoningSplitter
from exo.api.tool_calls import ToolCallParser
from exo.api.tool_formats.harmony import HarmonyParser
from exo.api.tool_formats.sections import SectionCallParser, section_parser
from exo.shared.chat_formats import native_format

Event = TextDelta | ReasoningDelta | ToolCallEvent


class OutputParser(Protocol):
    @property
    def reasoning(self) -> list[str]:
        """The reasoning's pieces so far."""
        ...

    @property
    def reasoning_tokens(self) -> int:
        """The output's tokens up to the end of the reasoning (0: none)."""
        ...

    @property
    def calls(self) -> list[ToolCallEvent]:
        ...

    def feed(self, text: str, tokens: int = 0) -> list[Event]:
        """Events of ``text``; ``tokens``: the output's tokens so far, this text's included."""
        ...

    def finish(self, tokens: int = 0) -> list[Event]:
        """The end of the output (``tokens`` long)."""
        ...


class ThinkThenCalls:
    """``<think>`` apart, then calls out of the answer (when the request offered tools)."""

    def __init__(self, calls: ToolCallParser | SectionCallParser | None) -> None:
        self._thinking = ReasoningSplitter()
        self._calls = calls
        self.reasoning = self._thinking.reasoning

    @property
    def reasoning_tokens(self) -> int:
        return self._thinking.reasoning_tokens

    @property
    def calls(self) -> list[ToolCallEvent]:
        return self._calls.calls if self._calls is not None else []

    def feed(self, text: str, tokens: int = 0) -> list[Event]:
        return self._split(self._thinking.feed(text, tokens))

    def finish(self, tokens: int = 0) -> list[Event]:
        out = self._split(self._thinking.finish(tokens))
        if self._calls is not None:
            out.extend(self._calls.finish())
        return out

    def _split(self, events: list[TextDelta | ReasoningDelta]) -> list[Event]:
        parser = self._calls
        out: list[Event] = []
        for event in events:
            if parser is not None and isinstance(event, TextDelta):
                out.extend(parser.feed(event.text))
            else:
                out.append(event)
        return out


def output_parser(template: str | None, parse_tools: bool) -> OutputParser:
    """The parser of a model's answers, from its chat template (None: not known)."""
    fmt = native_format(template)
    if fmt == "harmony":
        return HarmonyParser(parse_tools)
    if not parse_tools:
        return ThinkThenCalls(None)
    if fmt is None:
        return ThinkThenCalls(ToolCallParser())
    return ThinkThenCalls(section_parser(fmt))
