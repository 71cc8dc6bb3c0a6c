"""The kernels' row dequantisation (`csrc/dequant.c`, the embedding's lookups) against gguf-py's,
bit for bit, on every instruction-set build this machine runs; and the embedding through it."""

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from exo.worker.engines.cpu_kernels import KernelArgumentError, QKernels
from exo.worker.engines.embedding import Embedding
from exo.worker.engines.kinds import BY_GGML, BY_NAME
from exo.worker.engines.qtensor import QuantTensor

_T = GGMLQuantizationType
# where each layout keeps its half-float scales in a block (the rest: any bytes are values)
SCALES: dict[GGMLQuantizationType, tuple[int, ...]] = {
    _T.Q4_0: (0,), _T.Q4_1: (0, 2), _T.Q5_0: (0,), _T.Q5_1: (0, 2), _T.Q8_0: (0,),
    _T.Q4_K: (0, 2), _T.Q5_K: (0, 2), _T.Q6_K: (208,),
}  # fmt: skip


@pytest.fixture(scope="module")
def kernels(isa_kernels: QKernels) -> QKernels:
    return isa_kernels  # every build this machine runs (conftest.py)


def random_rows(qtype: GGMLQuantizationType, n: int, k: int, seed: int) -> torch.Tensor:
    """n rows of k values: random value bytes, finite random half-float scales."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    for at in SCALES[qtype]:
        scales = (rng.standard_normal((n, k // block)) * 0.05).astype(np.float16)
        raw[..., at : at + 2] = scales.view(np.uint8).reshape(n, k // block, 2)
    return torch.from_numpy(raw.reshape(n, -1).copy())


@pytest.mark.parametrize("qtype", list(SCALES), ids=lambda t: t.name)
def test_rows_dequantise_as_gguf_py_does_bit_for_bit(
    kernels: QKernels, qtype: GGMLQuantizationType
) -> None:
    k = 2 * GGML_QUANT_SIZES[qtype][0] * (4 if GGML_QUANT_SIZES[qtype][0] == 32 else 1)
    rows = random_rows(qtype, 5, k, seed=int(qtype))
    want = torch.from_numpy(dequantize(rows.numpy(), qtype).reshape(5, k).astype(np.float32))
    got = kernels.dequant_rows(BY_GGML[qtype].kernel, rows, k)
    assert got is not None
    assert got.dtype == torch.float32 and got.shape == (5, k)
    assert torch.equal(got, want)
    none = kernels.dequant_rows(BY_GGML[qtype].kernel, rows[:0], k)
    assert none is not None and none.shape == (0, k)


def test_layouts_it_does_not_take_say_so(kernels: QKernels) -> None:
    rows = random_rows(_T.Q4_1, 2, 64, seed=1)
    grouped = BY_NAME["Q4_1"].grouped
    assert grouped is not None
    assert kernels.dequant_rows(grouped, torch.zeros(8, 40, dtype=torch.uint8), 64) is None
    q2k = torch.zeros(1, 84, dtype=torch.uint8)
    assert kernels.dequant_rows(BY_NAME["Q2_K"].kernel, q2k, 256) is None
    assert kernels.dequant_rows(12345, rows, 64) is None
    with pytest.raises(KernelArgumentError, match="bytes"):
        kernels.dequant_rows(BY_NAME["Q4_1"].kernel, rows, 96)
    with pytest.raises(KernelArgumentError, match="uint8"):
        kernels.dequant_rows(BY_NAME["Q4_1"].kernel, rows.float(), 64)


@pytest.mark.parametrize("qtype", [_T.Q6_K, _T.Q4_K], ids=lambda t: t.name)
def test_the_embedding_looks_rows_up_the_same_with_or_without_the_kernels(
    kernels: QKernels, qtype: GGMLQuantizationType
) -> None:
    table = QuantTensor(qtype, random_rows(qtype, 40, 512, seed=7), 512)
    tokens = torch.tensor([[3, 0, 39, 3], [17, 17, 5, 1]])
    fast = Embedding(table, "q4", torch.float32, torch.device("cpu"), None, kernels)(tokens)
    slow = Embedding(table, "q4", torch.float32, torch.device("cpu"))(tokens)
    assert fast.shape == (2, 4, 512)
    assert torch.equal(fast, slow)
