"""Thinking apart from the answer: ``<think>...</think>`` at the start of the output
(Qwen3, DeepSeek-R1 distills). When the chat template opens the block itself, the runner
sends the opening tag as the answer's first text, so the split is the same either way.

``ReasoningSplitter.feed`` takes text as it streams (tags may arrive split anywhere), with
the number of output tokens so far: ``reasoning_tokens`` is that number at the last text
that belonged to the thought (its tags included)."""

from exo.api.generation_events import ReasoningDelta, TextDelta

OPEN, CLOSE = "<think>", "</think>"


def _held(buffer: str, tag: str) -> int:
    """Length of the longest end of ``buffer`` that begins ``tag``."""
    for size in range(min(len(buffer), len(tag) - 1), 0, -1):
        if tag.startswith(buffer[-size:]):
            return size
    return 0


class ReasoningSplitter:
    def __init__(self) -> None:
        self._state = "start"  # start -> opened -> thinking -> after -> answer
        self._buffer = ""
        self.reasoning: list[str] = []
        # The output tokens up to the end of the thought (0: no thought).
        self.reasoning_tokens = 0
        self._in_thought = False  # this feed's text was (partly) thought

    def feed(self, text: str, tokens: int = 0) -> list[TextDelta | ReasoningDelta]:
        """Split ``text``; ``tokens``: the output's tokens so far, this text's included."""
        self._in_thought = False
        out = self._split(text)
        if self._in_thought:
            self.reasoning_tokens = max(self.reasoning_tokens, tokens)
        return out

    def _split(self, text: str) -> list[TextDelta | ReasoningDelta]:
        self._buffer += text
        out: list[TextDelta | ReasoningDelta] = []
        if self._state == "start":
            stripped = self._buffer.lstrip()
            if stripped.startswith(OPEN):
                self._state = "opened"
                self._buffer = stripped[len(OPEN) :]
            elif OPEN.startswith(stripped):
                return []  # perhaps the tag, not yet whole
            else:
                self._state = "answer"
        if self._state == "opened":
            self._in_thought = True
            self._buffer = self._buffer.lstrip("\n")
            if not self._buffer:
                return []
            self._state = "thinking"
        if self._state == "thinking":
            self._in_thought = True
            at = self._buffer.find(CLOSE)
            if at < 0:
                keep = _held(self._buffer, CLOSE)
                thought, self._buffer = (
                    self._buffer[: len(self._buffer) - keep],
                    self._buffer[len(self._buffer) - keep :],
                )
                return self._thought(thought)
            out.extend(self._thought(self._buffer[:at]))
            self._buffer = self._buffer[at + len(CLOSE) :]
            self._state = "after"
        if self._state == "after":
            # The newlines between the thought and the answer belong to neither.
            self._buffer = self._buffer.lstrip("\n")
            if not self._buffer:
                return out
            self._state = "answer"
        if self._state == "answer" and self._buffer:
            out.append(TextDelta(self._buffer))
            self._buffer = ""
        return out

    def finish(self, tokens: int = 0) -> list[TextDelta | ReasoningDelta]:
        """The end of the output (``tokens`` long): an unclosed thought is still a thought."""
        if self._state in ("opened", "thinking"):
            self.reasoning_tokens = max(self.reasoning_tokens, tokens)
        rest, self._buffer = self._buffer, ""
        if not rest:
            return []
        if self._state in ("opened", "thinking"):
            return self._thought(rest)
        return [TextDelta(rest)]

    def _thought(self, text: str) -> list[TextDelta | ReasoningDelta]:
        if not text:
            return []
        self.reasoning.append(text)
        return [ReasoningDelta(text)]
