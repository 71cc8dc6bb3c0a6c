"""The chosen experts of an MoE step in one native call (`csrc/moe.c`'s `exo_moe_experts`).

The Python loop of `models/moe.py` calls, for each expert chosen by any token, its gate|up
layer on the rows that chose it and its down layer, then scatters the rows to their (token,
rank) slots. `MoeExperts` runs the same two `exo_qlinear` calls per expert on the same rows
from C: the results are the loop's bit for bit, without the per-expert Python work.
"""

import ctypes
from collections.abc import Sequence

import torch
from torch import Tensor

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
        self, kernels: QKernels, gate_up: Sequence[QuantWeights], down: Sequence[QuantWeights]
    ) -> None:
        if not gate_up or len(gate_up) != len(down):
            raise KernelArgumentError("one gate|up and one down layer per expert")
        self.d, self.o = gate_up[0].k, down[0].n
        for g, w in zip(gate_up, down, strict=True):
            width = 2 * w.k if w.prologue in (PROLOGUE_SWIGLU, PROLOGUE_GEGLU) else w.k
            if g.k != self.d or w.n != self.o or width != g.n:
                raise KernelArgumentError("the experts' layers do not chain x -> gate|up -> down")
        self._held = (list(gate_up), list(down))  # the specs' tensors live as long as this
        self._gate_up = torch.tensor([g.spec_address for g in gate_up], dtype=torch.int64)
        self._down = torch.tensor([w.spec_address for w in down], dtype=torch.int64)
        self.n_experts = len(gate_up)
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
            self._gate_up.data_ptr(), self._down.data_ptr(), self.n_experts,
            chosen_c.data_ptr(), counts_c.data_ptr(), chosen_c.numel(), picks_c.data_ptr(), k,
            x_c.data_ptr(), n, self.d, self.o, out.data_ptr(),
        )  # fmt: skip
        del x_c, chosen_c, counts_c, picks_c  # alive until here: the kernel has returned
        if rc == -2:
            raise KernelArgumentError("exo_moe_experts refused its arguments (see csrc/moe.c)")
        if rc != 0:
            raise RuntimeError(f"exo_moe_experts failed with code {rc}")
        return out
