"""Q2_K and Q3_K weights on their native C kernels (issue 23; `csrc/kquant23.h`): the same
results as gguf's dequantiser then `F.linear`, on every instruction-set build this CPU runs, a
row's result bit for bit the same alone as in any batch, in one call with other kinds' parts."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from exo.modelgen.quants import random_blocks
from exo.worker.engines.cpu_kernels import load_kernels_for
from exo.worker.engines.kernel_build import ISAS, Isa, cpu_runs
from exo.worker.engines.linear import QuantLinear, RmsNorm, SwiGLU, make_linear
from exo.worker.engines.qtensor import QuantTensor

from .kernel_skip import kernels_for_isa as _kernels

T = GGMLQuantizationType
K23 = [T.Q2_K, T.Q3_K]
ROW_COUNTS = (1, 2, 4, 8, 9, 64, 70)  # passes of 4 and 1 rows; 70: two chunks of 64




def _reference(qtype: GGMLQuantizationType, raw: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(dequantize(raw, qtype).reshape(raw.shape[0], -1).astype(np.float32))


def _weights(qtype: GGMLQuantizationType, rows: int, k: int, seed: int) -> QuantTensor:
    return QuantTensor(qtype, torch.from_numpy(random_blocks(qtype, rows, k, seed=seed)), k)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", K23, ids=lambda t: t.name)
def test_kernel_matches_the_dequantised_reference_and_batches_change_nothing(
    qtype: GGMLQuantizationType, isa: Isa
) -> None:
    kernels = _kernels(isa)
    k = 768  # three super-blocks
    w = _weights(qtype, 37, k, seed=int(qtype))
    torch.manual_seed(3)
    gain, bias = torch.rand(k) + 0.5, torch.randn(37)
    x, residual = torch.randn(70, k) * 2.0, torch.randn(70, 37)
    lin = make_linear(w, bias, "dense", prologue=RmsNorm(gain, 1e-5), kernels=kernels)
    assert isinstance(lin, QuantLinear) and lin.kernel == f"{qtype.name} C kernel"
    dense = _reference(qtype, w.raw.numpy())
    alone = torch.cat([lin(x[i : i + 1], residual[i : i + 1]) for i in range(70)])
    for m in ROW_COUNTS:
        got = lin(x[:m], residual[:m])
        want = F.linear(F.rms_norm(x[:m], (k,), gain, 1e-5), dense, bias) + residual[:m]
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, atol=1e-3 * scale, rtol=1e-4)
        assert torch.equal(got, alone[:m]), f"{m} rows: a row's result depends on its batch"


@pytest.mark.parametrize("isa", ISAS)
def test_parts_of_q2_k_q3_k_and_other_kinds_run_in_one_call(isa: Isa) -> None:
    """gate | up as Q3_K | Q2_K (a SwiGLU down of Q4_K reading them), q | k | v as Q4_K | Q2_K |
    Q6_K: every part read where it lies, one kernel call."""
    kernels = _kernels(isa)
    k = 512
    torch.manual_seed(5)
    for types in ([T.Q4_K, T.Q2_K, T.Q6_K], [T.Q3_K, T.Q2_K], [T.Q3_K, T.Q8_0, T.Q3_K]):
        parts = [_weights(t, 8 * i + 5, k, seed=i) for i, t in enumerate(types)]
        lin = make_linear(parts, None, "dense", kernels=kernels)
        assert isinstance(lin, QuantLinear)
        dense = torch.cat([_reference(p.qtype, p.raw.numpy()) for p in parts])
        x = torch.randn(6, k)
        want = F.linear(x, dense)
        torch.testing.assert_close(lin(x), want, atol=1e-3 * want.abs().max().item(), rtol=1e-4)
    down = make_linear(_weights(T.Q3_K, 40, k, seed=9), None, "dense", prologue=SwiGLU(),
                       kernels=kernels)  # fmt: skip
    gu = torch.randn(3, 2 * k)
    want = F.linear(
        F.silu(gu[:, :k]) * gu[:, k:], _reference(T.Q3_K, random_blocks(T.Q3_K, 40, k, 9))
    )
    torch.testing.assert_close(down(gu), want, atol=1e-3 * want.abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize("qtype", K23, ids=lambda t: t.name)
def test_extreme_blocks_do_not_overflow(qtype: GGMLQuantizationType) -> None:
    """Every 2-bit value and scale at its largest (Q3_K: also its most negative, -4 * -32), full
    scale activations: the integer sums stay exact on every build."""
    k = 512
    raw = random_blocks(qtype, 8, k, seed=1).reshape(8, 2, -1)
    if qtype == T.Q2_K:
        raw[:4, :, :80] = 0xFF  # scales 15, mins 15, q = 3
        raw[4:, :, :16] = 0x0F  # scales 15, mins 0
        raw[4:, :, 16:80] = 0xFF
    else:
        raw[:4, :, :96] = 0xFF  # hmask set, q = 3: +3
        raw[:4, :, 96:108] = 0xFF  # scales 63 - 32 = 31
        raw[4:, :, :32] = 0x00  # hmask clear, q = 0: -4
        raw[4:, :, 32:96] = 0x00
        raw[4:, :, 96:108] = 0x00  # scales -32
    flat = np.ascontiguousarray(raw.reshape(8, -1))
    w = QuantTensor(qtype, torch.from_numpy(flat), k)
    dense = _reference(qtype, flat)
    x = torch.ones(3, k)
    x[1] = -1.0
    x[2, ::2] = -1.0
    for isa in ISAS:
        if not cpu_runs(isa) or (kernels := load_kernels_for(isa)) is None:
            continue
        lin = make_linear(w, None, "dense", kernels=kernels)
        want = F.linear(x, dense)
        torch.testing.assert_close(lin(x), want, atol=1e-4 * want.abs().max().item(), rtol=1e-5)
