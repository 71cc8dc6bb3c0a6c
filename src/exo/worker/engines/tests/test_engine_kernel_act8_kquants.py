"""The Q4_K and Q6_K groups' 8-bit kernels at a real layer's width (`csrc/arch/x86/grouped8_k1.c`:
the single-row decode kernels, the AVX-512 batched Q4_K one and the batched Q6_K one): over 32
super-blocks, at one row and across each pass size, every build gives the portable build's file-row
floats bit for bit, and a row's result is the same alone or in a batch."""

import pytest
import torch

from exo.worker.engines.kernel_build import ISAS, Isa
from exo.worker.engines.kinds import kind_named
from exo.worker.engines.tests.test_engine_kernel_act8 import _kernels, _weights, eight_bit

__all__ = ["eight_bit"]  # the fixture, used by name

K = 8192  # a 1B-shaped down projection's width: 32 super-blocks, 2 x 256 16-value halves
BATCHES = (2, 3, 7, 8, 9, 17)  # every pass size of the batched kernels, and a single row left over


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "portable"])
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_wide_groups_give_the_file_rows_floats(isa: Isa, name: str, eight_bit: None) -> None:
    kind = kind_named(name)
    _, groups = _weights(kind, 16, K, "groups")
    _, file_rows = _weights(kind, 16, K)
    ours, portable = _kernels(isa), _kernels("portable")
    ours.set_activations(8)
    portable.set_activations(8)
    torch.manual_seed(4)
    x = torch.randn(max(BATCHES), K) * torch.rand(max(BATCHES), K) * 4  # uneven blocks
    want = portable.linear(file_rows, x)
    alone = torch.cat([ours.linear(groups, x[i : i + 1]) for i in range(x.shape[0])])
    assert torch.equal(alone, want), "a single row differs from the file rows' dots"
    for m in BATCHES:
        assert torch.equal(ours.linear(groups, x[:m]), want[:m]), m
