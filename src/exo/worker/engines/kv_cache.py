"""A preallocated key/value cache: `max_batch` slots of `max_seq` positions for every layer.

Allocated once; a step only writes the new positions of its slots. The cache does not track
lengths: whoever schedules requests (the `BatchGenerator`) owns slot assignment and lengths
and passes them to the model with every step.
"""

import torch
from torch import Tensor


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
        shape = (n_layers, max_batch, kv_heads, max_seq, head_dim)
        self.k: Tensor = torch.zeros(shape, dtype=dtype, device=device)  # [L, slot, KV, pos, hd]
        self.v: Tensor = torch.zeros(shape, dtype=dtype, device=device)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` positions of slot `src` to slot `dst` (all layers)."""
        if src == dst or length == 0:
            return
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]

    @property
    def n_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
