"""Q4_0, Q4_1, Q8_0, Q5_0, Q4_K and Q6_K weights repacked in groups of 8 rows (`csrc/repack.c`): the
same results as the file's rows, a row's result independent of the batch, the caller's blocks
left alone unless handed over, a tied embedding reading its rows back, and refusals for parts
that are not whole groups."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType

from exo.modelgen.quants import random_blocks
from exo.worker.engines.cpu_kernels import (
    GROUPED,
    KIND_Q4,
    KIND_Q4_G8,
    KIND_Q4_K,
    KIND_Q5_0,
    KIND_Q6_K,
    KIND_Q8,
    KIND_Q8_G8,
    PROLOGUE_NONE,
    KernelArgumentError,
    QuantWeights,
)
from exo.worker.engines.engine import load_shard_weights
from exo.worker.engines.kernel_build import ISAS, Isa
from exo.worker.engines.kinds import kind_named
from exo.worker.engines.linear import QuantLinear, RmsNorm, make_linear
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.load_report import load_plan
from exo.worker.engines.qtensor import QuantTensor

from .kernel_skip import kernels_for_isa as _kernels

T = GGMLQuantizationType
Q4_1, Q8_0 = T.Q4_1, T.Q8_0
K = 256
LAYOUTS = {KIND_Q4: Q4_1, KIND_Q8: Q8_0, KIND_Q5_0: T.Q5_0, KIND_Q4_K: T.Q4_K, KIND_Q6_K: T.Q6_K}
LAYOUTS[kind_named("Q4_0").kernel] = T.Q4_0
LAYOUTS.update({kind_named("Q5_1").kernel: T.Q5_1, kind_named("Q5_K").kernel: T.Q5_K})  # issue 22 q5g




def _blocks(rows: int, seed: int, qtype: GGMLQuantizationType = Q4_1) -> QuantTensor:
    return QuantTensor(qtype, torch.from_numpy(random_blocks(qtype, rows, K, seed=seed)), K)


def test_regrouping_keeps_every_value() -> None:
    """Row c of group g, block b, read back from the groups' layout is the file's block."""
    kernels = _kernels("portable")  # (repacking is the same code in every build)
    raw = _blocks(24, 3).raw
    laid = torch.empty_like(raw)
    kernels.repack_rows(KIND_Q4, raw, laid)
    assert not torch.equal(laid, raw)
    g = laid.reshape(3, K // 32, 160)  # [group, block, bytes]
    for row in (0, 7, 8, 21):
        grp, c = divmod(row, 8)
        for b in (0, K // 32 - 1):
            block = raw[row, 20 * b : 20 * b + 20]
            assert torch.equal(g[grp, b, 2 * c : 2 * c + 2], block[0:2])  # d
            assert torch.equal(g[grp, b, 16 + 2 * c : 18 + 2 * c], block[2:4])  # m
            words = torch.stack([g[grp, b, 32 + 16 * i + 2 * c : 34 + 16 * i + 2 * c] for i in range(8)])
            assert torch.equal(words.flatten(), block[4:20])  # nibbles, word by word
    again = raw.clone()
    kernels.repack_rows(KIND_Q4, again, again)  # in place: the same bytes
    assert torch.equal(again, laid)


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
def test_grouped_rows_read_back_as_the_files(kind: int) -> None:
    kernels = _kernels("portable")
    raw = _blocks(40, 5, LAYOUTS[kind]).raw
    laid = raw.clone()
    kernels.repack_rows(kind, laid, laid)
    assert not torch.equal(laid, raw)
    index = torch.tensor([0, 39, 8, 7, 7, 21])
    assert torch.equal(kernels.unrepack_rows(kind, laid, index), raw[index])
    with pytest.raises(KernelArgumentError, match="row indices"):
        kernels.unrepack_rows(kind, laid, torch.tensor([40]))


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
@pytest.mark.parametrize("isa", ISAS)
def test_grouped_rows_match_the_file_rows(isa: Isa, kind: int) -> None:
    """The same layer as groups and as the file's rows: equal to float rounding at every
    batch size (1 to 9 rows: passes of 4, 4 and 1; 70: two chunks of activation rows), and a
    row's result exactly the same alone as in any batch."""
    kernels = _kernels(isa)
    parts = [_blocks(40, 1, LAYOUTS[kind]), _blocks(16, 2, LAYOUTS[kind])]  # q | k: whole groups
    torch.manual_seed(0)
    bias = torch.randn(56)
    plain = QuantWeights(kind, PROLOGUE_NONE, [p.raw for p in parts], None, 0.0, bias, K)
    laid = [torch.empty_like(p.raw) for p in parts]
    for p, out in zip(parts, laid, strict=True):
        kernels.repack_rows(kind, p.raw, out)
    grouped = QuantWeights(kind, PROLOGUE_NONE, laid, None, 0.0, bias, K, [GROUPED[kind]] * 2)
    x, residual = torch.randn(70, K), torch.randn(70, 56)
    alone = torch.cat([kernels.linear(grouped, x[i : i + 1], residual[i : i + 1]) for i in range(9)])
    for m in (1, 2, 3, 4, 5, 6, 8, 9, 16, 70):
        got = kernels.linear(grouped, x[:m], residual[:m])
        want = kernels.linear(plain, x[:m], residual[:m])
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, atol=1e-5 * scale, rtol=1e-5)
        assert torch.equal(got[: min(m, 9)], alone[: min(m, 9)])  # bit for bit


def test_a_layer_regroups_whole_groups_only_and_copies_unless_handed_over() -> None:
    """q | k | v with v of 5 rows: q and k are re-laid, v stays in the file's layout; a part
    that starts off a group boundary stays too. "copy" leaves the caller's blocks as they were,
    "in_place" re-lays them where they lie."""
    kernels = _kernels("avx2")
    q, k, v = _blocks(40, 1), _blocks(16, 2), _blocks(5, 3)
    before = [p.raw.clone() for p in (q, k, v)]
    torch.manual_seed(1)
    gain, x = torch.rand(K) + 0.5, torch.randn(6, K)
    layer = make_linear([q, k, v], None, "dense", prologue=RmsNorm(gain, 1e-5), kernels=kernels)
    assert isinstance(layer, QuantLinear)
    assert layer.kinds == [KIND_Q4_G8, KIND_Q4_G8, KIND_Q4]
    assert all(torch.equal(p.raw, b) for p, b in zip((q, k, v), before, strict=True))
    dense = torch.cat([p.dequantize() for p in (q, k, v)])
    want = F.linear(F.rms_norm(x, (K,), gain, 1e-5), dense)
    scale = want.abs().max().item()
    torch.testing.assert_close(layer(x), want, atol=2e-3 * scale, rtol=1e-3)

    off = make_linear([v, k], None, "dense", kernels=kernels)  # k starts at row 5
    assert isinstance(off, QuantLinear) and off.kinds == [KIND_Q4, KIND_Q4]

    owned = make_linear(
        [q, k, v], None, "dense", prologue=RmsNorm(gain, 1e-5), kernels=kernels, regroup="in_place"
    )
    assert not torch.equal(q.raw, before[0]) and torch.equal(v.raw, before[2])
    assert torch.equal(owned(x), layer(x))
    never = make_linear([_blocks(40, 1)], None, "dense", kernels=kernels, regroup="no")
    assert isinstance(never, QuantLinear) and never.kinds == [KIND_Q4]


def test_parts_that_are_not_whole_groups_are_refused() -> None:
    kernels = _kernels("portable")
    raw = _blocks(16, 1).raw
    laid = torch.empty_like(raw)
    kernels.repack_rows(KIND_Q4, raw, laid)
    with pytest.raises(KernelArgumentError, match="multiple of 8 rows"):
        QuantWeights(4, PROLOGUE_NONE, [laid[:12]], None, 0.0, None, K, [KIND_Q4_G8])
    with pytest.raises(KernelArgumentError, match="start on one"):
        QuantWeights(4, PROLOGUE_NONE, [raw[:3], laid[:8]], None, 0.0, None, K, [KIND_Q4, KIND_Q4_G8])
    with pytest.raises(KernelArgumentError, match="not whole groups"):
        kernels.repack_rows(KIND_Q4, raw[:12], torch.empty_like(raw[:12]))
    with pytest.raises(KernelArgumentError, match="same shape"):
        kernels.repack_rows(KIND_Q4, raw, torch.empty_like(raw[:8]))
    with pytest.raises(KernelArgumentError, match="no repacked form"):
        kernels.repack_rows(KIND_Q4_G8, raw, torch.empty_like(raw))


def test_a_model_overwrites_its_weights_only_when_it_owns_them(gguf_path: Path) -> None:
    """Built from weights a caller keeps (tests, tools), a model copies what it re-lays; built
    by its loader (`own_weights`), it re-lays them where they lie: no second copy in memory.
    SmolLM2's head is its embedding table (Q8_0): the embedding reads its rows back."""
    kernels = _kernels("avx2")
    plan = load_plan(torch.device("cpu"), torch.float32, kernels, None)
    weights = load_shard_weights(gguf_path, 0, 30, plan=plan)  # SmolLM2: 30 layers
    w_gate, table = weights.layers[0].w_gate, weights.embed
    assert isinstance(w_gate, QuantTensor) and w_gate.qtype == Q4_1
    assert isinstance(table, QuantTensor) and table.qtype == Q8_0 and weights.lm_head is table
    before, table_before = w_gate.raw.clone(), table.raw.clone()
    tokens = torch.tensor([[1, 2, 3, 4], [49151, 0, 8, 17]])
    step = StepInputs((0, 1), (0, 0), 4)

    def run(model: LlamaModel) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.inference_mode():
            return model.embed(tokens), model.forward(tokens, step, model.new_cache(2, 8))

    kept = LlamaModel(weights, weight_format="q4", kernels=kernels)
    assert torch.equal(w_gate.raw, before) and torch.equal(table.raw, table_before)
    assert isinstance(kept.lm_head, QuantLinear) and kept.lm_head.kinds == [KIND_Q8_G8]
    kept_embed, kept_logits = run(kept)  # (kept reads `weights`: before they are handed over)
    owned = LlamaModel(weights, weight_format="q4", kernels=kernels, own_weights=True)
    assert not torch.equal(w_gate.raw, before) and not torch.equal(table.raw, table_before)
    gate_up, head = owned.blocks[0].gate_up, owned.lm_head
    assert isinstance(gate_up, QuantLinear) and gate_up.kinds == [KIND_Q4_G8] * 2
    assert gate_up.parts[0].data_ptr() == w_gate.raw.data_ptr()
    assert isinstance(head, QuantLinear) and head.kinds == [KIND_Q8_G8]
    assert head.parts[0].data_ptr() == table.raw.data_ptr()
    owned_embed, owned_logits = run(owned)
    want = QuantTensor(Q8_0, table_before, table.in_features).take_rows(tokens.flatten())
    assert torch.equal(owned_embed, want.dequantize().reshape(2, 4, -1))
    assert torch.equal(owned_embed, kept_embed) and torch.equal(owned_logits, kept_logits)
