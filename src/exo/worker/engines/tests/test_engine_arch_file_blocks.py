"""Every architecture with its matrices kept as a file's blocks (`QuantTensor`), as runners load.

Where the architectures meet memory-faithful loading: Phi-3's fused q|k|v and gate|up split by
rows of blocks, Gemma's attention scale folded into its q-norm gain (never into Wq's bytes),
its embedding scale and tied head on a table of blocks, sliding-window masks on the paged cache
and the compiled decode attention only while a window holds every cached position.

A Q8_0 GGUF of each architecture is loaded twice: dequantised to float32 (the reference) and
with the file's blocks kept. Without the compiled kernels the blocks are dequantised a few rows
at a time (exact: same logits); with them the kernels run the blocks (activations rounded to 16
bits: close logits, same tokens).
"""

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from exo.worker.engines.cpu_kernels import QKernels, load_kernels
from exo.worker.engines.engine import load_config, load_shard_weights
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.load_report import load_plan
from exo.worker.engines.materialise import kernel_plan
from exo.worker.engines.qtensor import QuantTensor
from exo.worker.engines.weights import LayerWeights, ShardWeights

from .arch_models import CASES, build_hf_model, write_gguf

pytest.importorskip("transformers")

PROMPT = [5, 9, 33, 70, 101, 12, 44, 7, 150, 3, 88, 61]  # longer than every sliding window
N_NEW = 6
GGUF_ARCHS = [name for name, case in CASES.items() if case.gguf_arch is not None]
CPU = torch.device("cpu")


class _Files:
    """Each architecture's transformers model, its folder and Q8_0 GGUF (made on first use)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hf: dict[str, tuple[Any, Path]] = {}

    def folder(self, arch: str) -> tuple[Any, Path]:
        if arch not in self.hf:
            folder = self.tmp / arch
            self.hf[arch] = (build_hf_model(CASES[arch], folder), folder)
        return self.hf[arch]

    def q8_gguf(self, arch: str) -> Path:
        path = self.tmp / f"{arch}-Q8_0.gguf"
        if not path.exists():
            write_gguf(self.folder(arch)[0], CASES[arch], path, "Q8_0")
        return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> _Files:
    return _Files(tmp_path_factory.mktemp("arch-blocks"))


def _kernels() -> QKernels:
    kernels = load_kernels()
    if kernels is None:
        pytest.skip("no C compiler for the CPU kernels")
    return kernels


def _load(path: Path, plan_kernels: QKernels | None, keep_blocks: bool) -> ShardWeights:
    n = load_config(path).n_layers
    if not keep_blocks:
        return load_shard_weights(path, 0, n)  # every tensor dequantised to float32
    plan = load_plan(CPU, torch.float32, plan_kernels, None)
    if plan_kernels is None:
        plan = kernel_plan(torch.float32, False)  # the blocks kept, no float16 repacking
    weights = load_shard_weights(path, 0, n, plan=plan)
    assert isinstance(weights.layers[0].wq, QuantTensor)  # the path under test
    assert isinstance(weights.layers[0].w_gate, QuantTensor)
    return weights


def _scale_q(layer: LayerWeights, scale: float) -> LayerWeights:
    assert isinstance(layer.wq, Tensor)
    return replace(layer, wq=layer.wq * scale)


def _logits(model: LlamaModel, continuation: list[int]) -> Tensor:
    """Prefill PROMPT, then decode `continuation` one token at a time: logits [1 + n, V]."""
    cache = model.new_cache(1, len(PROMPT) + len(continuation) + 1)
    with torch.inference_mode():
        out = [model.forward(torch.tensor([PROMPT]), StepInputs.single(0, 0, len(PROMPT)), cache)]
        for i, token in enumerate(continuation):
            step = StepInputs.single(0, len(PROMPT) + i, 1)
            out.append(model.forward(torch.tensor([[token]]), step, cache))
    return torch.cat(out).float()


def _greedy_tokens(model: LlamaModel) -> list[int]:
    cache = model.new_cache(1, len(PROMPT) + N_NEW)
    tokens: list[int] = []
    with torch.inference_mode():
        out = model.forward(torch.tensor([PROMPT]), StepInputs.single(0, 0, len(PROMPT)), cache)
        for i in range(N_NEW):
            tokens.append(int(out[0].argmax()))
            step = StepInputs.single(0, len(PROMPT) + i, 1)
            if i + 1 < N_NEW:
                out = model.forward(torch.tensor([[tokens[-1]]]), step, cache)
    return tokens


@pytest.mark.parametrize("arch", GGUF_ARCHS)
def test_file_blocks_give_the_dequantised_models_logits(files: _Files, arch: str) -> None:
    path = files.q8_gguf(arch)
    reference = LlamaModel(_load(path, None, keep_blocks=False))
    kept = LlamaModel(_load(path, None, keep_blocks=True))
    tokens = _greedy_tokens(reference)
    torch.testing.assert_close(
        _logits(kept, tokens), _logits(reference, tokens), atol=1e-4, rtol=1e-4
    )


@pytest.mark.parametrize("arch", GGUF_ARCHS)
def test_file_blocks_run_by_the_compiled_kernels_stay_close(files: _Files, arch: str) -> None:
    kernels = _kernels()
    path = files.q8_gguf(arch)
    reference = LlamaModel(_load(path, None, keep_blocks=False))
    compiled = LlamaModel(_load(path, kernels, keep_blocks=True), kernels=kernels)
    tokens = _greedy_tokens(reference)
    want, got = _logits(reference, tokens), _logits(compiled, tokens)
    # 16-bit activation blocks: well under 1% of the largest logit (a wrong scale, mask or
    # norm is off by tens of percent)
    assert (got - want).abs().max() <= 0.01 * want.abs().max()
    assert _greedy_tokens(compiled) == tokens


@pytest.mark.parametrize("arch", list(CASES))
def test_the_runners_plan_for_safetensors_stays_close_to_transformers(
    files: _Files, arch: str
) -> None:
    """Float matrices become q8 blocks as they load (`load_plan`): Gemma's q scale included."""
    kernels = _kernels()
    hf_model, folder = files.folder(arch)
    model = LlamaModel(_load(folder, kernels, keep_blocks=True), kernels=kernels)
    with torch.inference_mode():
        want = hf_model(torch.tensor([PROMPT])).logits[0, -1].float()
    got = _logits(model, [])[0]
    # as test_q8_weights_stay_close_to_transformers: 8-bit blocks of random 64-wide weights
    assert (got - want).abs().max() <= 0.05 * want.abs().max()


@pytest.mark.parametrize("compiled", [False, True], ids=["torch", "compiled"])
def test_an_attention_scale_without_a_q_norm_works_on_file_blocks(
    files: _Files, compiled: bool
) -> None:
    """A model-specific attention scale and no per-head q norm: Wq's blocks cannot take the
    scale (re-rounding them would change the model), so q is scaled after the matmul; it must
    equal the float model whose Wq rows carry the scale."""
    kernels = _kernels() if compiled else None
    path = files.q8_gguf("llama")
    kept = _load(path, kernels, keep_blocks=True)
    hd = kept.config.head_dim
    scaled = replace(kept, config=replace(kept.config, attn_scale=0.6 / hd**0.5))
    dense = _load(path, None, keep_blocks=False)
    folded = replace(dense, layers=[_scale_q(layer, 0.6) for layer in dense.layers])
    reference = LlamaModel(folded, kernels=kernels)
    tokens = _greedy_tokens(reference)
    want = _logits(reference, tokens)
    got = _logits(LlamaModel(scaled, kernels=kernels), tokens)
    unscaled = _logits(LlamaModel(kept, kernels=kernels), tokens)
    tolerance = 0.01 * float(want.abs().max()) if compiled else 1e-4
    assert (got - want).abs().max() <= tolerance
    assert (unscaled - want).abs().max() > 10 * tolerance  # the scale matters here
