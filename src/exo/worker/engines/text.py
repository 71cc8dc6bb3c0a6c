"""Streaming text out of token ids: an incremental detokenizer and a stop-string matcher."""

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"  # what a lossy UTF-8 decode gives for an incomplete character

Decode = Callable[[Sequence[int]], str]


class IncrementalDetokenizer:
    """Text deltas as tokens arrive, never emitting half of a multi-byte character.

    Byte-level tokenizers split characters across tokens, so decoding a prefix may end in a
    replacement character. Each push decodes a short window of recent tokens, compares it with
    the text already emitted from that window, and holds the delta back while it ends in an
    incomplete character. Decoding a window (not one token) also keeps the spaces that
    sentencepiece-style decoders strip from the first token of a sequence.
    """

    def __init__(self, decode: Decode, prompt_ids: Sequence[int] = ()) -> None:
        self._decode = decode
        self._ids: list[int] = list(prompt_ids[-4:])  # context for the first window
        self._prefix = 0  # start of the window
        self._read = len(self._ids)  # tokens whose text has been emitted

    def push(self, token_id: int) -> str:
        """The new complete text after `token_id` (possibly empty)."""
        self._ids.append(token_id)
        emitted = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if len(text) <= len(emitted) or text.endswith(REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(emitted) :]

    def flush(self) -> str:
        """Whatever is still held back (the end of the stream, even if it is incomplete)."""
        emitted = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        self._prefix = self._read = len(self._ids)
        return text[len(emitted) :] if len(text) > len(emitted) else ""


class StopMatcher:
    """Cuts a text stream at the first occurrence of any stop string.

    Text that might be the start of a stop string is held back until it is known not to be.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        # The stop string that matched.
        self.matched: str | None = None

    def push(self, text: str) -> str:
        """The part of `text` (plus held text) that is safe to emit; sets `stopped` on a match."""
        if self.stopped:
            return ""
        buf = self._held + text
        hits = [(i, s) for s, i in ((s, buf.find(s)) for s in self._stops) if i >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])
            self.stopped = True
            self._held = ""
            return buf[:at]
        keep = self._longest_stop_prefix_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of the stream, held text was not a stop string after all."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _longest_stop_prefix_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
