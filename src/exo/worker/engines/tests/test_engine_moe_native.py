"""The chosen experts of a step in one native call (`moe_kernels.py`, `csrc/moe.c`): every
(token, rank) output equals the Python loop's bit for bit, for each family's generated tiny
quantised file, at 1, 2, 9 and 64 tokens, 16- and 8-bit activations, on every x86 build; gpt-oss
(its clamp runs in torch between the layers) keeps the loop; bad arguments are refused."""

from pathlib import Path
from typing import Any

import pytest
import torch

from exo.modelgen import Request, generate
from exo.worker.engines.cpu_kernels import KernelArgumentError, QKernels, load_kernels_for
from exo.worker.engines.engine import load_family, load_shard_weights
from exo.worker.engines.kernel_build import X86_ISAS, Isa, cpu_runs
from exo.worker.engines.load_report import load_plan
from exo.worker.engines.models.base import BuildOptions, ShardModel
from exo.worker.engines.models.moe import MoeFeedForward

FAMILIES = {"qwen3moe": "Q4_K_M", "deepseek2": "Q4_K_M", "glm4moe": "Q8_0", "gpt-oss": "MXFP4"}
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("moe-native")
    return {
        arch: generate(Request(arch, "tiny", quant, folder / f"{arch}-{quant}.gguf"))
        for arch, quant in FAMILIES.items()
    }


def _kernels(isa: Isa) -> QKernels:
    if not cpu_runs(isa):
        pytest.skip(f"this CPU cannot run the {isa} build")
    k = load_kernels_for(isa)
    if k is None:
        pytest.skip(f"no {isa} kernels here")
    return k


def _model(path: Path, kernels: QKernels) -> ShardModel:
    family, config = load_family(path)
    plan = load_plan(CPU, torch.float32, kernels, None)
    weights = load_shard_weights(path, 0, config.n_layers, plan=plan)
    return family.build(weights, BuildOptions("q8", torch.float32, CPU, kernels=kernels))


def _moe_layers(obj: Any, seen: set[int]) -> list[MoeFeedForward]:
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, MoeFeedForward):
        return [obj]
    if isinstance(obj, (list, tuple)):
        items = list(obj)  # pyright: ignore[reportUnknownArgumentType]
    elif type(obj).__module__.startswith("exo.") and hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return []
    return [m for item in items for m in _moe_layers(item, seen)]


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
    kernels = _kernels(isa)
    was = kernels.activations
    kernels.set_activations(bits)
    try:
        layers = _moe_layers(_model(files[arch], kernels), set())
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
    layers = _moe_layers(_model(files["gpt-oss"], _kernels("avx2")), set())
    assert layers and all(f.native is None for f in layers)


def test_bad_arguments_are_refused(files: dict[str, Path]) -> None:
    ffn = _moe_layers(_model(files["qwen3moe"], _kernels("avx2")), set())[0]
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
