"""A paged key/value cache: pages of PAGE positions, allocated as requests grow, freed as they end.

    page   [L, 2, KV, PAGE, hd]   keys (index 0) and values (1) of PAGE positions, every layer
    table  slot -> [page id, ...]  page i holds positions i*PAGE .. (i+1)*PAGE - 1 of the slot

Nothing is preallocated: a slot holds ceil(length / PAGE) pages, so memory follows the tokens
actually cached, up to `max_batch` slots of `max_seq` positions. Moving a request to another
slot moves its page list (no copy); a slot that starts again at position 0 (a new request)
drops its old pages first. A page is one allocation with every layer, so a step needs one
table of page addresses ([B, pages], built by `prepare`) for all layers; the compiled decode
attention reads keys and values where they lie, the torch path gathers a row's pages.

The cache does not track lengths: whoever schedules requests (the `BatchGenerator`) owns slot
assignment and lengths and passes them to the model with every step.

A model computing in float32 on the CPU keeps its cache in float16 by default (as llama.cpp
does): half the memory, and half the bytes decode attention reads per token at long contexts,
where it runs at the memory's rate. Keys and values are rounded to nearest once, when stored;
attention widens them back to float32 as it reads them. `EXO_KV_CACHE=f32` keeps float32.
"""

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from loguru import logger
from torch import Tensor

PAGE = 64  # positions per page

KV_CACHE_TYPES = {"f16": torch.float16, "f32": torch.float32}


def kv_cache_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The cache's element type for a model computing in `dtype` on `device`: float16 for a
    float32 model on the CPU unless EXO_KV_CACHE=f32 (then float32), else `dtype` itself."""
    if dtype != torch.float32 or device.type != "cpu":
        return dtype
    text = os.environ.get("EXO_KV_CACHE", "").strip().lower()
    if text and text not in KV_CACHE_TYPES:
        logger.warning(f"EXO_KV_CACHE={text!r} is not f16 or f32: a float16 cache")
    return KV_CACHE_TYPES.get(text, torch.float16)


def pages_for(positions: int) -> int:
    """The pages that hold `positions` cache positions."""
    return -(-positions // PAGE)


@dataclass(frozen=True)
class PagedLayer:
    """One layer of the pages of a step's rows, as the compiled decode attention reads them."""

    pages: Tensor  # int64 [B, max_pages]: address of each row's pages (0 past its last)
    page: int  # positions per page
    offset: int  # float offset of this layer's keys in a page (values follow KV*page*hd later)
    kv_heads: int  # the page layout [L, 2, KV, page, hd], for the kernel's checks
    head_dim: int
    dtype: torch.dtype


class LayerCache:
    """The cache of one layer during one step (see `KVCache.prepare`)."""

    def __init__(self, cache: "KVCache", layer: int) -> None:
        self.cache = cache
        self.layer = layer

    @property
    def offset(self) -> int:
        """Where this layer's keys start in a page (`PagedLayer.offset`)."""
        return self.layer * 2 * self.cache.kv_heads * PAGE * self.cache.head_dim

    def paged(self) -> PagedLayer:
        c = self.cache
        return PagedLayer(c.step_pages, PAGE, self.offset, c.kv_heads, c.head_dim, c.dtype)

    def write_and_read(
        self, k: Tensor, v: Tensor, kv_len: int, lo: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Store the step's new k, v [B, T, KV, hd] (in the cache's type); return each row's
        keys/values at positions [lo, kv_len) in k's type: [B, KV, kv_len - lo, hd] (zeros past
        a row's own length: the caller masks them)."""
        c = self.cache
        n_new = k.shape[1]
        keys: list[Tensor] = []
        values: list[Tensor] = []
        for b, (slot, start) in enumerate(zip(c.step_slots, c.step_starts, strict=True)):
            pages = [c.pages[p][self.layer] for p in c.table[slot]]  # each [2, KV, PAGE, hd]
            done = 0
            while done < n_new:
                pos = start + done
                page, off = pages[pos // PAGE], pos % PAGE
                n = min(n_new - done, PAGE - off)
                page[0, :, off : off + n] = k[b, done : done + n].transpose(0, 1)
                page[1, :, off : off + n] = v[b, done : done + n].transpose(0, 1)
                done += n
            first = lo // PAGE
            row = torch.cat(pages[first : -(-kv_len // PAGE)], dim=2)  # from page `first`
            row = row[:, :, lo - first * PAGE : kv_len - first * PAGE]  # [2, KV, <= L - lo, hd]
            if row.shape[2] < kv_len - lo:
                row = torch.nn.functional.pad(row, (0, 0, 0, kv_len - lo - row.shape[2]))
            row = row.to(k.dtype)  # the cache's type widened (no copy when they are the same)
            keys.append(row[0])
            values.append(row[1])
        return torch.stack(keys), torch.stack(values)


class KVCache:
    def __init__(
        self,
        n_layers: int,
        max_batch: int,
        max_seq: int,
        kv_heads: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        if n_layers < 1 or max_batch < 1 or max_seq < 1:
            raise ValueError("a KV cache needs at least one layer, one slot and one position")
        self.n_layers, self.max_batch, self.max_seq = n_layers, max_batch, max_seq
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.pages: dict[int, Tensor] = {}  # id -> [L, 2, KV, PAGE, hd]
        self.table: list[list[int]] = [[] for _ in range(max_batch)]
        self._next_id = 0
        self.step_slots: tuple[int, ...] = ()
        self.step_starts: tuple[int, ...] = ()
        self.step_pages = torch.zeros((0, 0), dtype=torch.int64)

    # --- pages -----------------------------------------------------------------------------

    def _new_page(self) -> int:
        shape = (self.n_layers, 2, self.kv_heads, PAGE, self.head_dim)
        with torch.inference_mode(False):  # plain tensors: steps may run in or out of it
            page = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.pages[self._next_id] = page
        self._next_id += 1
        return self._next_id - 1

    def release(self, slot: int) -> None:
        """Free every page of `slot`."""
        for p in self.table[slot]:
            del self.pages[p]
        self.table[slot] = []

    def detach(self, slot: int) -> list[int]:
        """Take `slot`'s pages away without freeing them (the slot is left empty)."""
        pages, self.table[slot] = self.table[slot], []
        return pages

    def attach(self, slot: int, pages: list[int]) -> None:
        """`slot` (freed first) takes over `pages`, which hold its first positions."""
        self.release(slot)
        self.table[slot] = list(pages)

    def free(self, pages: list[int]) -> None:
        for p in pages:
            del self.pages[p]

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Slot `dst` takes over the cached positions of slot `src` (its page list: no copy)."""
        if src == dst or length == 0:
            return
        self.release(dst)
        self.table[dst], self.table[src] = self.table[src], []

    # --- a step ----------------------------------------------------------------------------

    def prepare(self, slots: Sequence[int], starts: Sequence[int], n_new: int) -> None:
        """Pages for row b's positions starts[b] .. starts[b] + n_new - 1 in slot slots[b]
        (a row starting at 0 is a new request: its slot's old pages go first), and the step's
        table of page addresses."""
        for slot, start in zip(slots, starts, strict=True):
            if not 0 <= slot < self.max_batch or start + n_new > self.max_seq:
                raise ValueError(f"slot {slot} / positions up to {start + n_new} out of range")
            if start == 0:
                self.release(slot)
            need = pages_for(start + n_new)
            while len(self.table[slot]) < need:
                self.table[slot].append(self._new_page())
        self.step_slots, self.step_starts = tuple(slots), tuple(starts)
        width = max(len(self.table[s]) for s in slots)
        addresses = [
            [self.pages[p].data_ptr() for p in self.table[s]] + [0] * (width - len(self.table[s]))
            for s in slots
        ]
        self.step_pages = torch.tensor(addresses, dtype=torch.int64)

    def layer(self, i: int) -> LayerCache:
        return LayerCache(self, i)

    # --- size ------------------------------------------------------------------------------

    @property
    def page_bytes(self) -> int:
        n = self.n_layers * 2 * self.kv_heads * PAGE * self.head_dim
        return n * self.dtype.itemsize

    @property
    def n_bytes(self) -> int:
        """Bytes held now."""
        return len(self.pages) * self.page_bytes

    @property
    def max_pages(self) -> int:
        """Pages with every slot at the maximum length."""
        return self.max_batch * pages_for(self.max_seq)

    @property
    def max_bytes(self) -> int:
        """Bytes with every slot at the maximum length."""
        return self.max_pages * self.page_bytes
