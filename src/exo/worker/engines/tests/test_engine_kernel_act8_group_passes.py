"""The groups' batched and single-row 8-bit kernels, at every pass size: the Q4_0 / Q4_1 / Q8_0
pairs of groups (`csrc/arch/x86/grouped8_q4.c`, AVX-512 VNNI: two groups a pass, an odd group
left over on its own) and the Q4_K / Q6_K kernels at a real layer's width
(`csrc/arch/x86/grouped8_q6k.c`, `grouped8_q4k.c`: 32 super-blocks, the
single-row decode kernels and the batched ones; on AVX-512 VNNI the Q6_K pairs of groups from
4 rows, one group at a time below). Every build gives the portable build's file-row floats bit for
bit, and a row's result is the same alone or in a batch."""

import pytest
import torch

from exo.worker.engines.cpu_kernels import PROLOGUE_NONE, QuantWeights
from exo.worker.engines.kernel_build import ISAS, Isa
from exo.worker.engines.kinds import kind_named
from exo.worker.engines.tests.test_engine_kernel_act8 import _kernels, _weights, eight_bit

__all__ = ["eight_bit"]  # the fixture, used by name

PAIRS = (2, 3, 4, 7, 8, 9, 17, 60, 64)  # every pass size and threshold, a row left over, 60, 64
WIDE = (2, 3, 7, 8, 9, 17)  # every pass size of the batched K-quant kernels, a row left over
CASES = [
    # (kind, weight rows, K, batches, seed)
    *((name, n, 2048, PAIRS, 6) for name in ("Q4_0", "Q4_1", "Q8_0") for n in (16, 24)),
    # 16 rows: one pair of groups; 24: a pair and one left over. K 2048: 64 blocks of 32.
    *((name, 16, 8192, WIDE, 4) for name in ("Q4_K", "Q6_K")),
    # K 8192: a 1B-shaped down projection's width, 32 super-blocks.
    # issue 22 q5g: Q5_1's groups (Q5_0's kernel) and Q5_K's, every pass size
    *(("Q5_1", n, 2048, PAIRS, 6) for n in (16, 24)),
    ("Q5_K", 16, 8192, WIDE, 4),
]


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "portable"])
@pytest.mark.parametrize(("name", "n", "k", "batches", "seed"), CASES)
def test_group_passes_give_the_file_rows_floats(
    isa: Isa, name: str, n: int, k: int, batches: tuple[int, ...], seed: int, eight_bit: None
) -> None:
    kind = kind_named(name)
    _, groups = _weights(kind, n, k, "groups")
    _, file_rows = _weights(kind, n, k)
    ours, portable = _kernels(isa), _kernels("portable")
    ours.set_activations(8)
    portable.set_activations(8)
    torch.manual_seed(seed)
    x = torch.randn(max(batches), k) * torch.rand(max(batches), k) * 4  # uneven blocks
    want = portable.linear(file_rows, x)
    alone = torch.cat([ours.linear(groups, x[i : i + 1]) for i in range(x.shape[0])])
    assert torch.equal(alone, want), "a single row differs from the file rows' dots"
    for m in batches:
        assert torch.equal(ours.linear(groups, x[:m]), want[:m]), m


# issue 22 q6k512: grouped8_q6k.c's passes (1..8 rows a pass over a decoded super-block, two groups
# at once on AVX-512 VNNI from 4 rows): every pass size with each leftover, a prefill chunk, 64
Q6K_PASSES = (*range(2, 18), 60, 64)


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "portable"])
@pytest.mark.parametrize("threads", [1, 2])
def test_q6k_passes_over_pairs_and_an_odd_group(isa: Isa, threads: int, eight_bit: None) -> None:
    """40 Q6_K rows: two pairs of groups and one left over (AVX-512 VNNI: the pairs at 512 bits,
    the odd group at 256); at 2 threads, parts of 16 and 24 rows. Every pass size gives the
    portable build's file-row floats bit for bit."""
    kind = kind_named("Q6_K")
    _, groups = _weights(kind, 40, 2048, "groups")
    _, file_rows = _weights(kind, 40, 2048)
    ours, portable = _kernels(isa), _kernels("portable")
    ours.set_activations(8)
    portable.set_activations(8)
    torch.manual_seed(9)
    x = torch.randn(max(Q6K_PASSES), 2048) * torch.rand(max(Q6K_PASSES), 2048) * 4
    want = portable.linear(file_rows, x)
    ours.set_threads(threads)
    try:
        for m in Q6K_PASSES:
            assert torch.equal(ours.linear(groups, x[:m]), want[:m]), (isa, threads, m)
    finally:
        ours.set_threads(1)


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "portable"])
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
def test_group_pairs_add_bias_and_residual_as_the_file_rows(
    isa: Isa, name: str, eight_bit: None
) -> None:
    """The pairs' outputs with a bias and a residual (AVX-512 VNNI: 16 outputs a vector when both
    groups are there, the odd group's 8 one by one): the portable build's floats bit for bit, with
    either added alone, both, and at passes below and above the pairs' threshold. A zero output
    plus a missing bias or residual is +0.0 in both builds (-0.0 + 0.0)."""
    kind = kind_named(name)
    n, k = 24, 2048  # a pair of groups and one left over
    _, groups = _weights(kind, n, k, "groups")
    _, file_rows = _weights(kind, n, k)
    ours, portable = _kernels(isa), _kernels("portable")
    ours.set_activations(8)
    portable.set_activations(8)
    torch.manual_seed(11)
    x = torch.randn(9, k) * torch.rand(9, k) * 4
    x[3] = 0.0  # a row of zeros: its outputs are zeros before the sums
    bias, residual = torch.randn(n), torch.randn(9, n)
    residual[3, :8] = -0.0
    for with_bias in (False, True):
        b = bias if with_bias else None
        mine = QuantWeights(groups.kind, PROLOGUE_NONE, groups.parts, None, 0.0, b, k, groups.kinds)
        theirs = QuantWeights(
            file_rows.kind, PROLOGUE_NONE, file_rows.parts, None, 0.0, b, k, file_rows.kinds
        )
        for res in (None, residual):
            for m in (3, 4, 8, 9):
                r = None if res is None else res[:m]
                got, want = ours.linear(mine, x[:m], r), portable.linear(theirs, x[:m], r)
                assert torch.equal(got, want), (isa, name, with_bias, res is None, m)
                assert torch.equal(torch.signbit(got), torch.signbit(want)), (
                    isa,
                    name,
                    with_bias,
                    m,
                )
