"""A key/value cache that grows with use, up to `max_batch` slots of `max_seq` positions.

Layout: k, v [L, slots, KV, positions, hd], allocated for the slots and positions in use
(`reserve`), grown in pages of PAGE positions (at least doubling, so copies cost O(n) in all),
never beyond the maximum. A model reserves what a step writes before writing it; the decode
kernel reads the current capacity from the tensors' shapes. Nothing is preallocated: a runner
that serves short requests holds a short cache.

The cache does not track lengths: whoever schedules requests (the `BatchGenerator`) owns slot
assignment and lengths and passes them to the model with every step.
"""

import torch
from torch import Tensor

PAGE = 256  # positions added at a time (at least)


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
        self.max_batch = max_batch
        self.max_seq = max_seq
        self._dims = (n_layers, kv_heads, head_dim)
        self._dtype, self._device = dtype, device
        self.k: Tensor = self._empty(0, 0)  # [L, slot, KV, pos, hd]
        self.v: Tensor = self._empty(0, 0)

    def _empty(self, slots: int, positions: int) -> Tensor:
        n_layers, kv_heads, head_dim = self._dims
        shape = (n_layers, slots, kv_heads, positions, head_dim)
        return torch.zeros(shape, dtype=self._dtype, device=self._device)

    @property
    def slots(self) -> int:
        return self.k.shape[1]

    @property
    def positions(self) -> int:
        return self.k.shape[3]

    def reserve(self, slots: int, positions: int) -> None:
        """Make room for slots 0..slots-1 and positions 0..positions-1 (within the maximum)."""
        if slots > self.max_batch or positions > self.max_seq:
            raise ValueError(
                f"{slots} slots x {positions} positions exceed the cache's maximum "
                f"({self.max_batch} x {self.max_seq})"
            )
        if slots <= self.slots and positions <= self.positions:
            return
        with torch.inference_mode(False):  # plain tensors: steps may run in or out of it
            self._grow(slots, positions)

    def _grow(self, slots: int, positions: int) -> None:
        new_slots = max(slots, self.slots)
        new_positions = self.positions
        if positions > self.positions:
            grown = max(positions, 2 * self.positions)
            new_positions = min(self.max_seq, -(-grown // PAGE) * PAGE)
        old_slots, old_positions = self.slots, self.positions
        for name in ("k", "v"):
            old: Tensor = getattr(self, name)
            new = self._empty(new_slots, new_positions)
            new[:, :old_slots, :, :old_positions] = old
            setattr(self, name, new)
            del old

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot `src` to slot `dst` (all layers)."""
        if src == dst or length == 0:
            return
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]

    @property
    def n_bytes(self) -> int:
        """Bytes held now."""
        return 2 * self.k.numel() * self.k.element_size()

    @property
    def max_bytes(self) -> int:
        """Bytes at the maximum (every slot, every position)."""
        n_layers, kv_heads, head_dim = self._dims
        per_position = n_layers * kv_heads * head_dim * self.k.element_size()
        return 2 * per_position * self.max_batch * self.max_seq
