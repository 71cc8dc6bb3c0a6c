"""The chosen experts of a step in one native call (`moe_kernels.py`, `csrc/moe.c`): every
(token, rank) output equals the Python loop's bit for bit, for each family's generated tiny
quantised file, at 1, 2, 9 and 64 tokens, 16- and 8-bit activations, on every x86 build; gpt-oss
(its clamp runs in torch between the layers) keeps the loop; bad arguments are refused."""

from pathlib import Path

import pytest
import torch

from exo.worker.engines.cpu_kernels import KernelArgumentError
from exo.worker.engines.kernel_build import X86_ISAS, Isa
from exo.worker.engines.models.moe import MoeFeedForward
from exo.worker.engines.tests.kernel_skip import kernels_for_isa as kernels_of
from exo.worker.engines.tests.moe_kernel_models import (
    built_model,
    moe_layers,
    tiny_files,
)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_files(tmp_path_factory.mktemp("moe-native"))


def _loop_outputs(ffn: MoeFeedForward, x: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    native, ffn.native = ffn.native, None
    try:
        return ffn.expert_outputs(x, experts)
    finally:
        ffn.native = native


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2", "glm4moe"])
@pytest.mark.parametrize("isa", X86_ISAS)
def test_native_experts_equal_the_loop(
    files: dict[str, Path], isa: Isa, arch: str, bits: int
) -> None:
    kernels = kernels_of(isa)
    was = kernels.activations
    kernels.set_activations(bits)
    try:
        layers = moe_layers(built_model(files[arch], kernels))
        assert layers and all(f.native is not None for f in layers)
        torch.manual_seed(bits)
        for ffn in layers:
            e, k, d = ffn.spec.n_experts, ffn.spec.top_k, ffn.norm.shape[0]
            for n in (1, 2, 9, 64):
                x = torch.randn(n, d) * 3
                _, routed = ffn.route(x)
                one = torch.arange(k).repeat(n, 1)  # every token to the same experts
                ties = torch.randint(0, e, (n, k))  # any choice: repeats, unchosen experts
                for experts in (routed, one, ties):
                    got = ffn.expert_outputs(x, experts)
                    assert torch.equal(got, _loop_outputs(ffn, x, experts)), (n, experts)
                alone = torch.cat([ffn.routed(x[i : i + 1]) for i in range(n)])
                if bits == 8:  # (16-bit: a row's strategy depends on the rows an expert takes)
                    assert torch.equal(ffn.routed(x), alone)
    finally:
        kernels.set_activations(was)


def test_gpt_oss_keeps_the_loop(files: dict[str, Path]) -> None:
    layers = moe_layers(built_model(files["gpt-oss"], kernels_of("avx2")))
    assert layers and all(f.native is None for f in layers)


def test_bad_arguments_are_refused(files: dict[str, Path]) -> None:
    ffn = moe_layers(built_model(files["qwen3moe"], kernels_of("avx2")))[0]
    native = ffn.native
    assert native is not None
    d, i32 = ffn.norm.shape[0], torch.int32
    x, one = torch.randn(2, d), torch.tensor([0], dtype=i32)
    picks = torch.arange(2 * ffn.spec.top_k, dtype=i32)
    k = ffn.spec.top_k
    with pytest.raises(KernelArgumentError, match="float32"):
        native(x.double(), one, one, picks, k)
    with pytest.raises(KernelArgumentError, match="picks"):
        native(x, one, torch.tensor([2 * k], dtype=i32), picks[:-1], k)
    with pytest.raises(KernelArgumentError, match="refused"):  # counts do not sum to n k
        native(x, one, torch.tensor([k], dtype=i32), picks, k)
    with pytest.raises(KernelArgumentError, match="refused"):  # an expert out of range
        native(
            x,
            torch.tensor([ffn.spec.n_experts], dtype=i32),
            torch.tensor([2 * k], dtype=i32),
            picks,
            k,
        )
    with pytest.raises(KernelArgumentError, match="refused"):  # a slot out of range
        native(x, one, torch.tensor([2 * k], dtype=i32), picks * 5, k)
