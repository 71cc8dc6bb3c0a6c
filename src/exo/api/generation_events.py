"""From the chunks a runner sends to what an API answers: text, then one ending.

Pure: ``ChunkTranslator.feed(chunk, now_ns)`` turns each chunk into events. Every
generation ends with exactly one ``Finished`` or ``Failed``; the API formats render
those events and nothing else.

Stop sequences are applied here too, whatever the engine does with them: text is held
back while it could be the start of a stop sequence, and a match ends the output just
before it (the OpenAI, Claude and Ollama behaviour), with ``stop_sequence`` set.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from exo.shared.types.chunks import (
    Chunk,
    EchoedPrompt,
    ErrorChunk,
    ErrorCode,
    TokenChunk,
    TokenLogprob,
    Usage,
)

FinishKind = Literal["stop", "length", "stop_sequence", "cancelled", "tool_calls"]


@dataclass(frozen=True)
class Timings:
    """Monotonic nanoseconds: request accepted, generation sent, first token, end."""

    accepted_ns: int
    sent_ns: int
    first_token_ns: int | None
    finished_ns: int


@dataclass(frozen=True)
class TextDelta:
    text: str
    # The tokens of this text, when the request asked for log-probabilities.
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ReasoningDelta:
    """Thinking text (``<think>...</think>``), apart from the answer."""

    text: str


@dataclass(frozen=True)
class ToolCallEvent:
    """A complete function call the model made."""

    index: int
    id: str
    name: str
    # A JSON object's text.
    arguments: str


@dataclass(frozen=True)
class Finished:
    reason: FinishKind
    usage: Usage
    timings: Timings
    stop_sequence: str | None = None
    # Every call of the answer (reason "tool_calls" when there are some).
    tool_calls: tuple[ToolCallEvent, ...] = ()
    # The whole thinking text, if the model thought.
    reasoning: str = ""
    # How many of the output tokens were thinking.
    reasoning_tokens: int = 0
    # Every output token's log-probability, when the request asked for them.
    logprobs: tuple[TokenLogprob, ...] = ()
    # An embedding request's vector.
    embedding: tuple[float, ...] = ()
    # The prompt's and the output's token ids, when the request asked for them.
    context: tuple[int, ...] | None = None
    # The prompt as the model read it, when the request asked for it (completions' echo).
    echo: EchoedPrompt | None = None


@dataclass(frozen=True)
class Failed:
    message: str
    # The request was at fault (a client error, 4xx) when set.
    code: ErrorCode | None = None


GenerationEvent = TextDelta | ReasoningDelta | ToolCallEvent | Finished | Failed


class StopScanner:
    """Finds the first stop sequence in streamed text, holding back possible starts."""

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """The text that is safe to emit, and the stop sequence that ended it, if any."""
        if not self._stops:
            return text, None
        buffer = self._held + text
        match: tuple[int, str] | None = None
        for stop in self._stops:
            at = buffer.find(stop)
            if at >= 0 and (match is None or at < match[0]):
                match = (at, stop)
        if match is not None:
            self._held = ""
            return buffer[: match[0]], match[1]
        keep = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep], None

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest end of ``buffer`` that begins some stop sequence."""
        for size in range(min(len(buffer), self._longest - 1), 0, -1):
            tail = buffer[-size:]
            if any(stop.startswith(tail) for stop in self._stops):
                return size
        return 0


class ChunkTranslator:
    """One generation's chunks in, events out."""

    def __init__(self, stops: Sequence[str], accepted_ns: int, sent_ns: int) -> None:
        self._scanner = StopScanner(stops)
        self._accepted_ns = accepted_ns
        self.sent_ns = sent_ns
        self._first_token_ns: int | None = None
        self.tokens = 0
        # The prompt's length, once the runner said it (on its first chunk).
        self.prompt_tokens: int | None = None
        # The client's answer is complete (a stop sequence may end it before the runner).
        self.done = False
        # The runner said its last word: nothing to cancel.
        self.command_done = False

    def feed(self, chunk: Chunk, now_ns: int) -> list[GenerationEvent]:
        if chunk.finish_reason is not None:
            self.command_done = True
        if self.done:
            return []
        match chunk:
            case ErrorChunk():
                self.done = True
                return [Failed(chunk.error_message or "generation failed", chunk.error_code)]
            case TokenChunk():
                return self._token(chunk, now_ns)

    def end_of_stream(self) -> list[GenerationEvent]:
        """The chunk stream ended: an unfinished generation failed."""
        self.command_done = True
        if self.done:
            return []
        self.done = True
        return [Failed("the response stream ended before the generation finished")]

    def _token(self, chunk: TokenChunk, now_ns: int) -> list[GenerationEvent]:
        if chunk.prompt_tokens is not None:
            self.prompt_tokens = chunk.prompt_tokens
        if chunk.token_id >= 0:
            self.tokens += 1
        if self._first_token_ns is None:
            self._first_token_ns = now_ns
        if chunk.finish_reason == "error":
            self.done = True
            return [Failed("generation failed")]
        text, stop = self._scanner.feed(chunk.text)
        events: list[GenerationEvent] = [TextDelta(text)] if text else []
        if stop is not None:
            events.append(self._finish("stop_sequence", chunk.usage, now_ns, stop))
        elif chunk.stop_sequence is not None:
            # The runner cut the text at a stop string (it may apply its own).
            rest = self._scanner.flush()
            if rest:
                events.append(TextDelta(rest))
            events.append(self._finish("stop_sequence", chunk.usage, now_ns, chunk.stop_sequence))
        elif chunk.finish_reason is not None:
            rest = self._scanner.flush()
            if rest:
                events.append(TextDelta(rest))
            events.append(self._finish(chunk.finish_reason, chunk.usage, now_ns, None))
        if events and isinstance(events[-1], Finished):
            done = events[-1]
            if chunk.embedding is not None:
                done = replace(done, embedding=tuple(chunk.embedding))
            if chunk.context is not None:
                done = replace(done, context=tuple(chunk.context))
            if chunk.echo is not None:
                done = replace(done, echo=chunk.echo)
            events[-1] = done
        return events

    def _finish(
        self, reason: FinishKind, usage: Usage | None, now_ns: int, stop: str | None
    ) -> Finished:
        self.done = True
        timings = Timings(self._accepted_ns, self.sent_ns, self._first_token_ns, now_ns)
        # Without the runner's final count (a stop sequence ended the answer early), the
        # prompt length it gave on its first chunk.
        usage = usage or Usage(prompt_tokens=self.prompt_tokens or 0, completion_tokens=self.tokens)
        return Finished(reason=reason, usage=usage, timings=timings, stop_sequence=stop)
