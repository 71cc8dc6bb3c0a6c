"""The Q4_0 / Q4_1 / Q8_0 groups' batched 8-bit kernels (`csrc/arch/x86/grouped8_q4.c` on the
AVX-512 VNNI build: two groups a pass, an odd group left over on its own): at one row and at every
pass size, with an even and an odd number of groups, every build gives the portable build's
file-row floats bit for bit, and a row's result is the same alone or in a batch."""

import pytest
import torch

from exo.worker.engines.kernel_build import ISAS, Isa
from exo.worker.engines.kinds import kind_named
from exo.worker.engines.tests.test_engine_kernel_act8 import _kernels, _weights, eight_bit

__all__ = ["eight_bit"]  # the fixture, used by name

K = 2048  # 64 blocks of 32
BATCHES = (2, 3, 4, 7, 8, 9, 17, 60, 64)  # every pass size and threshold, a row left over, 60 and 64


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "portable"])
@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("n", [16, 24])  # two groups (one pair), three (a pair and one left over)
def test_group_pairs_give_the_file_rows_floats(isa: Isa, name: str, n: int, eight_bit: None) -> None:
    kind = kind_named(name)
    _, groups = _weights(kind, n, K, "groups")
    _, file_rows = _weights(kind, n, K)
    ours, portable = _kernels(isa), _kernels("portable")
    ours.set_activations(8)
    portable.set_activations(8)
    torch.manual_seed(6)
    x = torch.randn(max(BATCHES), K) * torch.rand(max(BATCHES), K) * 4  # uneven blocks
    want = portable.linear(file_rows, x)
    alone = torch.cat([ours.linear(groups, x[i : i + 1]) for i in range(x.shape[0])])
    assert torch.equal(alone, want), "a single row differs from the file rows' dots"
    for m in BATCHES:
        assert torch.equal(ours.linear(groups, x[:m]), want[:m]), m
