"""8-bit activations (`csrc/act8.c`, `csrc/arch/x86/dot8.c`, `csrc/grouped8.c`,
`csrc/arch/x86/grouped8.c`; Q5_0 / Q5_1 / Q5_K: `csrc/act8_q5.c`, `csrc/arch/x86/dot8_q5.c`,
`csrc/arch/x86/grouped8_q5.c`): every kind with 8-bit dots (`Kind.act8`), its rows as the file
lays them or repacked in groups of 8 (where it has a repacked layout), against activation rows
quantised to int8 blocks. A row's result is the same alone or in any
batch, in either layout, and every build gives the portable build's floats bit for bit; the result
is the dot of the dequantised weights with the dequantised 8-bit activations; EXO_ACTIVATIONS /
`set_activations` switch between the formats."""

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, dequantize

from exo.modelgen.quants import random_blocks
from exo.worker.engines.cpu_kernels import (
    PROLOGUE_NONE,
    KernelArgumentError,
    QuantWeights,
    load_kernels_for,
)
from exo.worker.engines.kernel_build import ISAS, Isa, cpu_runs
from exo.worker.engines.kinds import KINDS, Kind
from exo.worker.engines.linear import QuantLinear

from .kernel_skip import kernels_for_isa as _kernels

ACT8 = [k for k in KINDS if k.act8]
ACT8_GROUPED = [k for k in ACT8 if k.grouped is not None]  # every 8-bit kind (issue 22 q5g: Q5_1, Q5_K too)
ROWS = (1, 2, 4, 8, 9, 64)
LAYOUTS = ("rows", "groups")  # the file's rows (dot8), repacked groups of 8 (grouped8)
# every 8-bit kind in its file rows, and in its groups where it has a repacked layout
KIND_LAYOUTS = [
    pytest.param(k, layout, id=f"{k.name}-{layout}")
    for layout in LAYOUTS
    for k in (ACT8 if layout == "rows" else ACT8_GROUPED)
]




@pytest.fixture
def eight_bit() -> Iterator[None]:
    """Every build's setting back to the environment's (load_kernels_for sets it) after the test."""
    yield
    for isa in ISAS:
        if cpu_runs(isa):
            load_kernels_for(isa)


def _weights(kind: Kind, n: int, k: int, layout: str = "rows") -> tuple[np.ndarray, QuantWeights]:
    raw = random_blocks(GGMLQuantizationType(kind.ggml), n, k, seed=5)
    rows, kernel = torch.from_numpy(raw), kind.kernel
    if layout == "groups":
        assert kind.grouped is not None
        kernel, grouped = kind.grouped, torch.empty_like(rows)
        _kernels("portable").repack_rows(kind.kernel, rows, grouped)
        rows = grouped
    w = QuantWeights(kernel, PROLOGUE_NONE, [rows], None, 0.0, None, k, [kernel])
    return raw, w


def _odd_k(kind: Kind) -> int:
    """A width of 18 blocks of 32 (a partial lane group), or 3 super-blocks of the K-quants."""
    return 576 if kind.block_values == 32 else 768


def _quantise8(x: torch.Tensor) -> torch.Tensor:
    """The activations as the 8-bit blocks hold them (d q), computed here independently."""
    blocks = x.double().reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(dim=2, keepdim=True) / 127.0
    q = torch.where(d > 0, blocks / torch.where(d > 0, d, 1.0), 0.0)
    q = torch.sign(q) * torch.floor(q.abs() + 0.5)  # round half away from zero, as roundf
    return (q * d.float().double()).reshape(x.shape)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("kind", "layout"), KIND_LAYOUTS)
@pytest.mark.parametrize("odd", [False, True])  # 576 (768 for K-quants): not a power of two
def test_a_row_is_the_same_alone_or_batched_and_on_every_build(
    isa: Isa, kind: Kind, layout: str, odd: bool, eight_bit: None
) -> None:
    k = _odd_k(kind) if odd else 512
    _, w = _weights(kind, 40, k, layout)  # (loading a build resets its setting: first)
    _, file_rows = _weights(kind, 40, k)
    ours, portable = _kernels(isa), _kernels("portable")
    ours.set_activations(8)
    portable.set_activations(8)
    torch.manual_seed(1)
    x = torch.randn(64, k)
    alone = torch.cat([ours.linear(w, x[i : i + 1]) for i in range(64)])
    assert torch.equal(alone, portable.linear(w, x)), "differs from the portable build"
    assert torch.equal(alone, portable.linear(file_rows, x)), "differs from the file rows' dots"
    for m in ROWS:
        assert torch.equal(ours.linear(w, x[:m]), alone[:m]), (isa, kind.name, m)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ACT8, ids=lambda k: k.name)
def test_rows_not_in_eights_are_the_same_alone_or_batched(isa: Isa, kind: Kind, eight_bit: None) -> None:
    """43 file rows: the x86 dots that take 8 rows at once (Q5_0 / Q5_1 / Q5_K) leave the last 3
    to the per-row kernel; every row's floats are still the portable build's, alone or batched."""
    _, w = _weights(kind, 43, 512)
    ours, portable = _kernels(isa), _kernels("portable")
    ours.set_activations(8)
    portable.set_activations(8)
    torch.manual_seed(4)
    x = torch.randn(9, 512)
    alone = torch.cat([ours.linear(w, x[i : i + 1]) for i in range(9)])
    assert torch.equal(alone, portable.linear(w, x)), "differs from the portable build"
    for m in (2, 4, 5, 8, 9):
        assert torch.equal(ours.linear(w, x[:m]), alone[:m]), (isa, kind.name, m)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("kind", "layout"), KIND_LAYOUTS)
def test_the_result_is_the_dequantised_dot(
    isa: Isa, kind: Kind, layout: str, eight_bit: None
) -> None:
    ours = _kernels(isa)
    k, n = _odd_k(kind), 24
    raw, w = _weights(kind, n, k, layout)
    dense = torch.from_numpy(
        dequantize(raw, GGMLQuantizationType(kind.ggml)).reshape(n, k)
    ).double()
    torch.manual_seed(2)
    x = torch.randn(9, k) * 3
    ours.set_activations(8)
    got = ours.linear(w, x).double()
    want = _quantise8(x) @ dense.T
    scale = x.double().abs() @ dense.abs().T
    assert torch.all((got - want).abs() <= 1e-5 * scale + 1e-6), (got - want).abs().max()
    ours.set_activations(16)  # the 16-bit path: closer to the float activations' dot
    err16 = (ours.linear(w, x).double() - x.double() @ dense.T).abs().max()
    err8 = (got - x.double() @ dense.T).abs().max()
    assert err16 < err8


def test_the_setting_takes_8_or_16_bits(eight_bit: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXO_ACTIVATIONS", raising=False)
    kernels = _kernels("portable")
    assert kernels.activations == 8  # the default
    with pytest.raises(KernelArgumentError, match="8 or 16"):
        kernels.set_activations(7)
    kernels.set_activations(8)
    assert kernels.activations == 8
    monkeypatch.setenv("EXO_ACTIVATIONS", "16")
    assert _kernels("portable").activations == 16
    monkeypatch.setenv("EXO_ACTIVATIONS", "8")
    assert _kernels("portable").activations == 8


@pytest.mark.parametrize("kind", ACT8_GROUPED, ids=lambda k: k.name)
def test_a_layer_built_at_8_bits_runs_its_groups(kind: Kind, eight_bit: None) -> None:
    """A layer is repacked in groups of 8 on x86 at either setting (Q5_1, Q5_K: at 8 bits only,
    their 16-bit groups being slower than their rows at decode), and its groups' 8-bit dots give
    the file rows' 8-bit results bit for bit, at any number of rows."""
    kernels = _kernels("avx2")
    raw = torch.from_numpy(random_blocks(GGMLQuantizationType(kind.ggml), 16, 256, seed=5))
    kernels.set_activations(16)
    at16 = kind.grouped if kind.name not in ("Q5_1", "Q5_K") else kind.kernel
    assert QuantLinear([raw], 256, None, None, [kind], kernels).kinds == [at16]
    _, w = _weights(kind, 16, 256)
    kernels.set_activations(8)
    layer = QuantLinear([raw], 256, None, None, [kind], kernels)
    assert layer.kinds == [kind.grouped]
    torch.manual_seed(3)
    for m in ROWS:
        x = torch.randn(m, 256)
        assert torch.equal(layer(x), kernels.linear(w, x)), m
