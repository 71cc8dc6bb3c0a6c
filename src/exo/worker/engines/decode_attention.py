"""The compiled decode attention with gpt-oss's sinks and sliding window (`csrc/attention.c`'s
`exo_attend_decode_kv`), bound to a loaded kernel library.

    p = softmax([q K^T / sqrt(hd), s_h])[:L];  a = p V      keys: the last `window` positions

It is `QKernels.attend_decode` (rotate q and k, append k and v to the paged cache, attend) with
a sink logit per head and a window; the same checks run before a pointer reaches C.
"""

import ctypes
from functools import cache

import torch
from torch import Tensor

from exo.worker.engines.cpu_kernels import KernelArgumentError, QKernels
from exo.worker.engines.kv_cache import PagedLayer


def _check_float(name: str, t: Tensor, shape: tuple[int, ...]) -> None:
    if t.dtype != torch.float32 or not t.is_cpu:
        raise KernelArgumentError(f"{name} must be float32 on the CPU, got {t.dtype} {t.device}")
    if tuple(t.shape) != shape:
        raise KernelArgumentError(f"{name} must be {list(shape)}, got {list(t.shape)}")


class SinkAttention:
    """`exo_attend_decode_kv` with checked arguments."""

    def __init__(self, kernels: QKernels) -> None:
        p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        self._fn = kernels.lib.exo_attend_decode_kv
        self._fn.argtypes = [p, i, i, i, i, p, p, f, p, i, i, ctypes.c_long, p, p, i, i, p]
        self._fn.restype = i

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
        if heads <= 0 or kv_heads <= 0 or heads % kv_heads or hd <= 0 or hd % 2:
            raise KernelArgumentError(f"heads {heads} must be a multiple of kv_heads {kv_heads}; "
                                      f"head_dim {hd} even")  # fmt: skip
        if window is not None and not 0 < window < 2**31:
            raise KernelArgumentError(f"the window must be a positive int, got {window}")
        bsz = qkv.shape[0] if qkv.dim() == 3 else -1
        _check_float("qkv", qkv, (bsz, 1, (heads + 2 * kv_heads) * hd))
        if rope.dtype != torch.complex64 or not rope.is_cpu or rope.dim() != 2:
            raise KernelArgumentError(f"rope must be complex64 [P, {hd // 2}] on the CPU")
        _check_float("rope", torch.view_as_real(rope), (rope.shape[0], hd // 2, 2))
        if qk_norm is not None:
            _check_float("qk_norm", qk_norm, (heads + kv_heads, hd))
        if sinks is not None:
            _check_float("sinks", sinks, (heads,))
        self._check_positions(positions, bsz, rope, cache, (kv_heads, hd))
        held = [t.contiguous() for t in (qkv, rope, cache.pages, positions)]
        norm_c = None if qk_norm is None else qk_norm.contiguous()
        sinks_c = None if sinks is None else sinks.contiguous()
        out = torch.empty(bsz, 1, heads * hd, dtype=torch.float32)
        rc = self._fn(
            held[0].data_ptr(), bsz, heads, kv_heads, hd, held[1].data_ptr(),
            None if norm_c is None else norm_c.data_ptr(), eps, held[2].data_ptr(),
            held[2].shape[1], cache.page, cache.offset, held[3].data_ptr(),
            None if sinks_c is None else sinks_c.data_ptr(), window or 0,
            int(cache.dtype == torch.float16), out.data_ptr(),
        )  # fmt: skip
        del held, norm_c, sinks_c  # alive until here: the kernel has returned
        if rc != 0:
            raise RuntimeError(f"exo_attend_decode_kv failed with code {rc}")
        return out

    @staticmethod
    def _check_positions(
        positions: Tensor, bsz: int, rope: Tensor, cache: PagedLayer, kv: tuple[int, int]
    ) -> None:
        if positions.dtype != torch.int64 or not positions.is_cpu or positions.shape != (bsz,):
            raise KernelArgumentError(f"positions must be int64 [{bsz}] on the CPU")
        pages = cache.pages
        if pages.dtype != torch.int64 or not pages.is_cpu or pages.dim() != 2:
            raise KernelArgumentError("the cache's pages must be an int64 [B, n] CPU tensor")
        if pages.shape[0] != bsz:
            raise KernelArgumentError(f"the cache's pages must be [{bsz}, n]")
        if (cache.kv_heads, cache.head_dim) != kv or cache.dtype not in (torch.float32,
                                                                           torch.float16):
            raise KernelArgumentError(
                f"the cache holds {cache.kv_heads} kv heads of {cache.head_dim} "
                f"({cache.dtype}), not {kv[0]} of {kv[1]} (float32 or float16)"
            )
        pos_list: list[int] = positions.tolist()
        if pos_list and min(pos_list) < 0:
            raise KernelArgumentError("positions must not be negative")
        if pos_list and max(pos_list) >= min(rope.shape[0], pages.shape[1] * cache.page):
            raise KernelArgumentError("a position is past the rope table or the row's pages")


@cache
def sink_attention(kernels: QKernels) -> SinkAttention:
    """The entry point of `kernels`' library, bound once."""
    return SinkAttention(kernels)
