"""The compiled decode attention with gpt-oss's sinks and sliding window (`csrc/attention.c`'s
`exo_attend_decode_kv`), bound to a loaded kernel library.

    p = softmax([q K^T / sqrt(hd), s_h])[:L];  a = p V      keys: the last `window` positions

It is `QKernels.attend_decode` (rotate q and k, append k and v to the paged cache, attend, with
its checks before a pointer reaches C: the positions are read only where the kernel's own check
is not enough) with a sink logit per head and a window, in the argument order of the torch
path's `attend_with_sinks`.
"""

from functools import cache

from torch import Tensor

from exo.worker.engines.cpu_kernels import QKernels
from exo.worker.engines.kv_cache import PagedLayer


class SinkAttention:
    """`QKernels.attend_decode` with sinks and a window."""

    def __init__(self, kernels: QKernels) -> None:
        self._kernels = kernels

    def __call__(
        self,
        qkv: Tensor,
        shape: tuple[int, int, int],
        rope: Tensor,
        qk_norm: Tensor | None,
        eps: float,
        cache: PagedLayer,
        positions: Tensor,
        sinks: Tensor | None,
        window: int | None,
    ) -> Tensor:
        """qkv [B, 1, (H + 2KV) hd] -> [B, 1, H hd], shape = (H, KV, hd); rope complex64
        [P, hd/2]; qk_norm [H + KV, hd] or None; positions int64 [B]; sinks [H] or None;
        window: keys a query sees (None: all)."""
        heads, kv_heads, hd = shape
        return self._kernels.attend_decode(
            qkv, heads, kv_heads, hd, rope, qk_norm, eps, cache, positions,
            sinks=sinks, window=window,
        )  # fmt: skip


@cache
def sink_attention(kernels: QKernels) -> SinkAttention:
    """The entry point of `kernels`' library, bound once."""
    return SinkAttention(kernels)
