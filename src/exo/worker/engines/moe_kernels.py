"""The chosen experts of an MoE step in one native call (`csrc/moe.c`'s `exo_moe_experts`).

The Python loop of `models/moe.py` calls, for each expert chosen by any token, its gate|up
layer on the rows that chose it and its down layer, then scatters the rows to their (token,
rank) slots. `MoeExperts` runs the same two `exo_qlinear` calls per expert on the same rows
from C: the results are the loop's bit for bit, without the per-expert Python work.

`MoeFfn` runs a whole MoE feed-forward in one call (`exo_moe_ffn`): the pre-norm, the router's
logits (a fixed-order dot per token and expert), the routing of `models/router.py` (ties to the
lower expert), the experts as `MoeExperts` runs them, the rank-ordered weighted sum, the shared
expert and the residual. `HeadLinears` runs one quantised linear per head (MLA's absorbed
matrices) in one call (`exo_head_linears`).
"""

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from exo.worker.engines.config import RouterKind
from exo.worker.engines.cpu_kernels import (
    PROLOGUE_GEGLU,
    PROLOGUE_SWIGLU,
    KernelArgumentError,
    QKernels,
    QuantWeights,
)

_INT_MAX = 2**31 - 1


class MoeExperts:
    """Every expert's (gate|up, down) quantised layers, as one table the C call reads."""

    def __init__(
        self, kernels: QKernels, gate_up: Sequence[QuantWeights], down: Sequence[QuantWeights],
        clamped: bool = False,
    ) -> None:  # fmt: skip
        """clamped: gpt-oss's clamped SwiGLU runs between the layers (in `MoeFfn` only)."""
        if not gate_up or len(gate_up) != len(down):
            raise KernelArgumentError("one gate|up and one down layer per expert")
        self.d, self.o = gate_up[0].k, down[0].n
        for g, w in zip(gate_up, down, strict=True):
            glu = clamped or w.prologue in (PROLOGUE_SWIGLU, PROLOGUE_GEGLU)
            width = 2 * w.k if glu else w.k
            if g.k != self.d or w.n != self.o or width != g.n:
                raise KernelArgumentError("the experts' layers do not chain x -> gate|up -> down")
        self._held = (list(gate_up), list(down))  # the specs' tensors live as long as this
        self.gate_up_table = torch.tensor([g.spec_address for g in gate_up], dtype=torch.int64)
        self.down_table = torch.tensor([w.spec_address for w in down], dtype=torch.int64)
        self.n_experts = len(gate_up)
        self.kernels = kernels
        p, i = ctypes.c_void_p, ctypes.c_int
        self._fn = kernels.lib.exo_moe_experts
        self._fn.argtypes = [p, p, i, p, p, i, p, i, p, i, i, i, p]
        self._fn.restype = i

    def __call__(self, x: Tensor, chosen: Tensor, counts: Tensor, picks: Tensor, k: int) -> Tensor:
        """x [n, D] float32; chosen, counts [c] int32: the experts to run and their rows; picks
        [n k] int32: the slots (token * k + rank), grouped by expert in `chosen` order ->
        out [n k, O], row t k + r = expert(x[t]) for token t's rank-r expert."""
        if x.dtype != torch.float32 or not x.is_cpu or x.dim() != 2 or x.shape[1] != self.d:
            raise KernelArgumentError(f"x must be float32 [n, {self.d}] on the CPU")
        n = x.shape[0]
        if k <= 0 or n * k > _INT_MAX:
            raise KernelArgumentError("k must be positive and n * k fit an int")
        for name, t, size in (("chosen", chosen, None), ("counts", counts, chosen.numel()),
                              ("picks", picks, n * k)):  # fmt: skip
            if t.dtype != torch.int32 or not t.is_cpu or t.dim() != 1:
                raise KernelArgumentError(f"{name} must be a 1-D int32 CPU tensor")
            if size is not None and t.numel() != size:
                raise KernelArgumentError(f"{name} must have {size} entries, got {t.numel()}")
        x_c, chosen_c, counts_c, picks_c = (t.contiguous() for t in (x, chosen, counts, picks))
        out = torch.empty(n * k, self.o, dtype=torch.float32)
        rc = self._fn(
            self.gate_up_table.data_ptr(), self.down_table.data_ptr(), self.n_experts,
            chosen_c.data_ptr(), counts_c.data_ptr(), chosen_c.numel(), picks_c.data_ptr(), k,
            x_c.data_ptr(), n, self.d, self.o, out.data_ptr(),
        )  # fmt: skip
        del x_c, chosen_c, counts_c, picks_c  # alive until here: the kernel has returned
        if rc == -2:
            raise KernelArgumentError("exo_moe_experts refused its arguments (see csrc/moe.c)")
        if rc != 0:
            raise RuntimeError(f"exo_moe_experts failed with code {rc}")
        return out


# --- issue 23 moedecode: the whole feed-forward (norm, router, experts, sum) in one call ---------

ROUTE_KINDS = {"softmax": 0, "softmax_selected": 1, "sigmoid": 2}  # csrc MOE_ROUTE_*
_P = ctypes.c_void_p


class _MoeSpec(ctypes.Structure):
    _fields_: ClassVar = [
        ("D", ctypes.c_int), ("E", ctypes.c_int), ("k", ctypes.c_int), ("eps", ctypes.c_float),
        ("norm", _P), ("router", _P), ("router_bias", _P), ("correction", _P),
        ("route_kind", ctypes.c_int), ("normalize", ctypes.c_int), ("n_group", ctypes.c_int),
        ("topk_group", ctypes.c_int), ("scaling", ctypes.c_float), ("clamped", ctypes.c_int),
        ("alpha", ctypes.c_float), ("limit", ctypes.c_float), ("gate_up", _P), ("down", _P),
        ("shared_gate_up", _P), ("shared_down", _P),
    ]  # fmt: skip


@dataclass(frozen=True)
class FfnRouting:
    """How the fused call routes and norms (models/router.py's RouterSpec, the pre-norm)."""

    kind: RouterKind
    top_k: int
    normalize: bool
    n_group: int
    topk_group: int
    scaling: float
    norm: Tensor  # [D] float32
    eps: float
    router: Tensor  # [E, D] float32
    router_bias: Tensor | None = None  # [E]
    correction: Tensor | None = None  # [E]
    clamp: tuple[float, float] | None = None  # gpt-oss's (alpha, limit) between the layers


@dataclass(frozen=True)
class FfnOutput:
    out: Tensor  # [n, D]
    experts: Tensor | None  # [n, k] int32 (when asked for)
    weights: Tensor | None  # [n, k] float32


class MoeFfn:
    """h [n, D] -> [h +] sum_r w_r expert_{e_r}(rmsnorm(h) g) (+ shared): `exo_moe_ffn`."""

    def __init__(
        self, experts: MoeExperts, routing: FfnRouting,
        shared: tuple[QuantWeights, QuantWeights] | None = None,
    ) -> None:  # fmt: skip
        r = routing
        vectors = [r.norm, r.router, r.router_bias, r.correction]
        held = [None if t is None else t.detach().float().contiguous() for t in vectors]
        norm, router, bias, corr = held
        assert norm is not None and router is not None
        if router.shape != (experts.n_experts, experts.d) or norm.shape != (experts.d,):
            raise KernelArgumentError("the router and norm do not fit the experts' width")
        if experts.o != experts.d:
            raise KernelArgumentError("the experts must map the width back to itself")
        self._held = (experts, held, shared)
        self.router = router  # the [E, D] float32 weights the call reads
        alpha, limit = r.clamp or (0.0, 0.0)
        self.spec = _MoeSpec(
            experts.d, experts.n_experts, r.top_k, r.eps, norm.data_ptr(), router.data_ptr(),
            _addr(bias), _addr(corr), ROUTE_KINDS[r.kind], int(r.normalize), r.n_group,
            r.topk_group, r.scaling, int(r.clamp is not None), alpha, limit,
            experts.gate_up_table.data_ptr(), experts.down_table.data_ptr(),
            None if shared is None else shared[0].spec_address,
            None if shared is None else shared[1].spec_address,
        )  # fmt: skip
        self.d, self.k = experts.d, r.top_k
        self._fn = experts.kernels.lib.exo_moe_ffn
        self._fn.argtypes = [_P, _P, ctypes.c_int, ctypes.c_int, _P, _P, _P]
        self._fn.restype = ctypes.c_int

    def __call__(self, h: Tensor, residual: bool = True, routing: bool = False) -> FfnOutput:
        """h [n, D] float32 -> out [n, D] (h added when `residual`); with `routing`, the
        experts [n, k] (int32) and weights [n, k] chosen too."""
        if h.dtype != torch.float32 or not h.is_cpu or h.dim() != 2 or h.shape[1] != self.d:
            raise KernelArgumentError(f"h must be float32 [n, {self.d}] on the CPU")
        h_c = h.contiguous()
        n = h_c.shape[0]
        out = torch.empty(n, self.d, dtype=torch.float32)
        experts = torch.empty(n, self.k, dtype=torch.int32) if routing else None
        weights = torch.empty(n, self.k, dtype=torch.float32) if routing else None
        rc = self._fn(ctypes.addressof(self.spec), h_c.data_ptr(), n, int(residual),
                      out.data_ptr(), _addr(experts), _addr(weights))  # fmt: skip
        del h_c  # alive until here: the kernel has returned
        if rc == -2:
            raise KernelArgumentError("exo_moe_ffn refused its arguments (see csrc/moe.c)")
        if rc != 0:
            raise RuntimeError(f"exo_moe_ffn failed with code {rc}")
        return FfnOutput(out, experts, weights)


def _addr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


class HeadLinears:
    """One quantised linear per head (MLA's absorbed Wuk_h, Wuv_h): x [.., H, K] -> y [.., H, N],
    y[.., h] = x[.., h] W_h^T, in one C call (`exo_head_linears`)."""

    def __init__(self, kernels: QKernels, heads: Sequence[QuantWeights]) -> None:
        if not heads or any(w.k != heads[0].k or w.n != heads[0].n for w in heads):
            raise KernelArgumentError("every head's layer must have the same shape")
        self._held = list(heads)
        self._table = torch.tensor([w.spec_address for w in heads], dtype=torch.int64)
        self.h, self.k, self.n = len(heads), heads[0].k, heads[0].n
        self._fn = kernels.lib.exo_head_linears
        i = ctypes.c_int
        self._fn.argtypes = [_P, i, _P, i, i, i, _P]
        self._fn.restype = i

    def __call__(self, x: Tensor) -> Tensor:
        if x.dtype != torch.float32 or not x.is_cpu or tuple(x.shape[-2:]) != (self.h, self.k):
            raise KernelArgumentError(f"x must be float32 [.., {self.h}, {self.k}] on the CPU")
        x_c = x.contiguous()
        m = x_c.numel() // (self.h * self.k)
        y = torch.empty(*x.shape[:-1], self.n, dtype=torch.float32)
        rc = self._fn(self._table.data_ptr(), self.h, x_c.data_ptr(), m, self.k, self.n,
                      y.data_ptr())  # fmt: skip
        del x_c  # alive until here: the kernel has returned
        if rc != 0:
            raise RuntimeError(f"exo_head_linears failed with code {rc}")
        return y
