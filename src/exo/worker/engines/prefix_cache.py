"""Keys and values of finished requests, kept for the next request that starts the same way
(a conversation's next turn re-sends the whole history).

Only whole prefill chunks are kept: a prompt is prefilled in chunks whose boundaries are
multiples of the batcher's chunk size from position 0, and a chunk's keys and values depend
only on the tokens up to its end. A new request whose prompt shares the first k whole chunks
with an entry takes those k chunks' pages and prefills from there: it computes exactly what it
would have computed from scratch, so answers do not depend on what came before.

A request takes an entry's pages over (no page is shared by two requests); the pages past its
reused positions are freed. Entries are evicted oldest first when the pages they hold, with
what the running requests may still need, would pass the cache's budget (the memory placement
reserved for a full cache).

A prompt with images is keyed by ``image_keyed``: an image's placeholder positions carry the
image's pixel hash, so two prompts with the same tokens but different pictures share nothing
from the first image position on.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

from exo.worker.engines.kv_cache import KVCache, pages_for

# One prompt position as the cache compares it: a token id, or an image position's
# "<image sha256>:<offset>".
KeyItem = int | str


@dataclass(frozen=True)
class ImageSpan:
    """One image's placeholder positions in a prompt, and the image's pixel hash."""

    start: int
    length: int
    sha256: str


def image_keyed(prompt: Sequence[int], spans: Sequence[ImageSpan]) -> list[KeyItem]:
    """The prompt's cache key: its token ids, each image position replaced by the image's
    hash and the position's offset in the image."""
    key: list[KeyItem] = list(prompt)
    for span in spans:
        if span.start < 0 or span.start + span.length > len(key):
            raise ValueError(f"image span {span.start}+{span.length} is outside the prompt")
        for i in range(span.length):
            key[span.start + i] = f"{span.sha256}:{i}"
    return key


@dataclass
class _Entry:
    tokens: list[KeyItem]  # the prompt positions whose keys/values the pages hold: whole chunks
    pages: list[int]
    used: int


@dataclass
class PrefixCache:
    cache: KVCache
    chunk: int
    min_chunks: int = 1
    _entries: list[_Entry] = field(default_factory=list[_Entry])
    _tick: int = 0

    @property
    def pages_held(self) -> int:
        return sum(len(e.pages) for e in self._entries)

    @property
    def budget_pages(self) -> int:
        return self.cache.max_pages

    def retain(
        self,
        prompt: Sequence[KeyItem],
        prefilled: int,
        pages: list[int],
        cuts: Sequence[int] | None = None,
    ) -> None:
        """Keep the whole chunks of ``prompt`` among its first ``prefilled`` positions (the
        pages of a finished request's slot); free the rest. ``cuts``: where the prompt's
        chunks end (default: at multiples of the chunk size; a prompt with images moves
        them so that no image is split)."""
        keep = self._cut(min(prefilled, len(prompt)), cuts)
        n_pages = pages_for(keep)
        if keep < self.chunk * self.min_chunks:
            self.cache.free(pages)
            return
        self.cache.free(pages[n_pages:])
        tokens = list(prompt[:keep])
        for e in list(self._entries):  # an entry this one extends (or repeats) goes
            if tokens[: len(e.tokens)] == e.tokens:
                self._entries.remove(e)
                self.cache.free(e.pages)
        self._tick += 1
        self._entries.append(_Entry(tokens, pages[:n_pages], self._tick))

    def take(
        self, prompt: Sequence[KeyItem], cuts: Sequence[int] | None = None
    ) -> tuple[int, list[int]] | None:
        """The longest reusable start of ``prompt`` that ends where one of its chunks ends
        (``cuts``, as `retain`'s): (positions, their pages), removed from the cache; None if
        no entry shares a whole chunk with it. At least one token of the prompt is always
        left to prefill (its logits give the first token)."""
        best: tuple[int, _Entry] | None = None
        for e in self._entries:
            n = self._cut(_common(e.tokens, prompt, len(prompt) - 1), cuts)
            if n >= self.chunk * self.min_chunks and (best is None or n > best[0]):
                best = (n, e)
        if best is None:
            return None
        n, e = best
        self._entries.remove(e)
        n_pages = pages_for(n)
        self.cache.free(e.pages[n_pages:])
        return n, e.pages[:n_pages]

    def _cut(self, n: int, cuts: Sequence[int] | None) -> int:
        """The last chunk end at or before position ``n``."""
        if cuts is None:
            return n // self.chunk * self.chunk
        return max((c for c in cuts if c <= n), default=0)

    def trim(self, reserved_pages: int) -> None:
        """Evict the oldest entries until they fit beside ``reserved_pages`` in the budget."""
        self._entries.sort(key=lambda e: e.used)
        while self._entries and self.pages_held + reserved_pages > self.budget_pages:
            self.cache.free(self._entries.pop(0).pages)

    def clear(self) -> None:
        for e in self._entries:
            self.cache.free(e.pages)
        self._entries.clear()


def _common(a: Sequence[KeyItem], b: Sequence[KeyItem], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
