"""A groupable layer whose rows do not come in 8s (a generated model's head: SmolLM2's vocabulary
plus a family's special tokens, 49156 rows) runs its whole groups regrouped and only the rest in
the file's layout, instead of all of it per row; a tied embedding still reads the file's rows."""

import pytest
import torch
from gguf import GGMLQuantizationType

from exo.modelgen.quants import random_blocks
from exo.worker.engines.cpu_kernels import (
    GROUPED,
)
from exo.worker.engines.embedding import Embedding
from exo.worker.engines.kernel_build import X86_ISAS, Isa
from exo.worker.engines.kinds import kind_named
from exo.worker.engines.linear import QuantLinear, RmsNorm, make_linear
from exo.worker.engines.qtensor import QuantTensor

from .kernel_skip import kernels_for_isa as _kernels

K, ROWS = 256, 8 * 5 + 3
QTYPES = ("Q4_K", "Q6_K", "Q8_0")




def _blocks(name: str, rows: int = ROWS) -> QuantTensor:
    qtype = GGMLQuantizationType[name]
    return QuantTensor(qtype, torch.from_numpy(random_blocks(qtype, rows, K, seed=3)), K)


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("name", QTYPES)
@pytest.mark.parametrize("isa", X86_ISAS)
def test_a_ragged_layer_runs_its_whole_groups_regrouped(isa: Isa, name: str, bits: int) -> None:
    kernels = _kernels(isa)
    was = kernels.activations
    kernels.set_activations(bits)
    try:
        w, kernel = _blocks(name), kind_named(name).kernel
        torch.manual_seed(0)
        gain, x = torch.rand(K) + 0.5, torch.randn(9, K)
        norm = RmsNorm(gain, 1e-5)
        layer = make_linear(w, None, "dense", prologue=norm, kernels=kernels)
        plain = make_linear(w, None, "dense", prologue=norm, kernels=kernels, regroup="no")
        assert isinstance(layer, QuantLinear) and isinstance(plain, QuantLinear)
        assert layer.kinds == [GROUPED[kernel], kernel] and plain.kinds == [kernel]
        assert [p.shape[0] for p in layer.parts] == [40, 3]
        got, want = layer(x), plain(x)
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, atol=1e-5 * scale, rtol=1e-5)
        assert torch.equal(got[:, 40:], want[:, 40:])  # the rest: the same kernel as before
        alone = torch.cat([layer(x[i : i + 1]) for i in range(9)])
        plain_alone = torch.cat([plain(x[i : i + 1]) for i in range(9)])
        assert torch.equal(got[:, :40], alone[:, :40])  # the groups: a row's result is its own
        # the rest: as the file's rows were before (per row at 8 bits; at 16, tile vs dot)
        assert torch.equal(alone[:, 40:], plain_alone[:, 40:])
        if bits == 8:
            assert torch.equal(got, alone)
    finally:
        kernels.set_activations(was)


@pytest.mark.parametrize("name", QTYPES)
def test_a_tied_embedding_reads_a_split_heads_rows_as_the_files(name: str) -> None:
    kernels = _kernels("avx2")
    table = _blocks(name)
    before = table.raw.clone()
    head = make_linear(table, None, "dense", kernels=kernels, regroup="in_place")
    assert isinstance(head, QuantLinear) and len(head.parts) == 2
    assert not torch.equal(table.raw, before)  # its groups re-laid where they lie
    embed = Embedding(table, "q8", torch.float32, torch.device("cpu"), head)
    tokens = torch.tensor([[0, 7, 8, 39], [40, 42, 41, 3]])
    want = QuantTensor(table.qtype, before, K).take_rows(tokens.flatten()).dequantize()
    assert torch.equal(embed(tokens), want.reshape(2, 4, K))
    for one in (7, 41):  # a decode step's single row, from the groups or from the rest
        row = QuantTensor(table.qtype, before, K).take_rows(torch.tensor([one])).dequantize()
        assert torch.equal(embed(torch.tensor([[one]])), row.reshape(1, 1, K))
    with pytest.raises(ValueError, match="row indices"):
        head.block_rows(torch.tensor([3, head.out_features]))
