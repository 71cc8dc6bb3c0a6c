"""Whole models in MXFP4 / IQ4_NL / IQ4_XS on the native kernels: a generated dense llama in the
IQ4 recipes, the tiny gpt-oss GGUF whose merged experts are MXFP4 (`moe_models.py`) and a gpt-oss
safetensors folder with MXFP4 `_blocks` / `_scales` experts give the
greedy tokens of the same file dequantised and run densely, and their load lines name the C
kernel for every such matrix (none is left to the streaming dequantiser)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from exo.modelgen.custom import Size, llama_gguf
from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.engine import load_family, load_shard_weights
from exo.worker.engines.materialise import DENSE_PLAN
from exo.worker.engines.models.base import BuildOptions, ShardModel

from .kernel_skip import skip_without_kernels
from .moe_models import CASES, build_hf_model
from .test_engine_moe_checkpoints import _random_mxfp4  # pyright: ignore[reportPrivateUsage]
from .test_engine_moe_families import PROMPTS, _Models, greedy, load

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> _Models:
    return _Models(tmp_path_factory.mktemp("iq4-moe"))


def test_gpt_oss_mxfp4_experts_run_on_the_kernel_with_the_dequantised_tokens(moe: _Models) -> None:
    skip_without_kernels("q8")
    path = moe.path("gpt-oss", "MXFP4")
    blocks, dense = load(path, "q8"), load(path)
    experts = [k for k in blocks.kernels_used() if k.startswith("expert")]
    assert experts and all("MXFP4 C kernel" in k for k in experts), experts
    assert not any("dequantised per call" in k for k in blocks.kernels_used())
    for prompt in PROMPTS:
        assert greedy(blocks, prompt, 16)[0] == greedy(dense, prompt, 16)[0], prompt


@pytest.mark.parametrize("quant", ["IQ4_NL", "IQ4_XS"])
def test_a_dense_iq4_file_runs_on_the_kernel_with_the_dequantised_tokens(
    tmp_path: Path, quant: str
) -> None:
    skip_without_kernels("q8")
    path = llama_gguf(tmp_path / f"llama-{quant}.gguf", quant, Size(hidden=256, ffn=512), seed=3)
    blocks, dense = load(path, "q8"), load(path)
    used = blocks.kernels_used()
    assert any(f"{quant} C kernel" in k for k in used), used
    assert not any("dequantised per call" in k for k in used), used
    for prompt in PROMPTS:
        assert greedy(blocks, prompt, 16)[0] == greedy(dense, prompt, 16)[0], prompt


def _mxfp4_safetensors(tmp: Path) -> Path:
    """The tiny gpt-oss as Hugging Face's MXFP4 checkpoint: random expert blocks and scales."""
    float_folder, folder = tmp / "float", tmp / "mxfp4"
    c = build_hf_model(CASES["gpt-oss"], float_folder).config
    e, d, f = c.num_local_experts, c.hidden_size, c.intermediate_size
    state = load_file(str(float_folder / "model.safetensors"))
    gen = torch.Generator().manual_seed(3)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}.mlp.experts."
        for name, rows, cols in (("gate_up_proj", 2 * f, d), ("down_proj", d, f)):
            del state[p + name]
            blocks, scales = _random_mxfp4((e, rows, cols // 32), gen)
            state[p + name + "_blocks"], state[p + name + "_scales"] = blocks, scales
    shutil.copytree(float_folder, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file(state, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _load_float(folder: Path, with_kernels: bool) -> ShardModel:
    """Every float matrix kept float (F.linear), the MXFP4 experts on the kernels or not."""
    family, config = load_family(folder)
    weights = load_shard_weights(folder, 0, config.n_layers, plan=DENSE_PLAN)
    return family.build(weights, BuildOptions(kernels=load_kernels() if with_kernels else None))


def test_gpt_oss_mxfp4_safetensors_experts_run_on_the_kernel(tmp_path: Path) -> None:
    """The experts on the kernel, everything else as in the reference: the experts dequantised
    per call (the file's floats otherwise the same)."""
    skip_without_kernels("q8")
    folder = _mxfp4_safetensors(tmp_path)
    blocks, dense = _load_float(folder, True), _load_float(folder, False)
    experts = [k for k in blocks.kernels_used() if k.startswith("expert")]
    assert experts and all("MXFP4 C kernel" in k for k in experts), experts
    assert all("dequantised per call" in k for k in dense.kernels_used() if k.startswith("expert"))
    for prompt in PROMPTS:
        assert greedy(blocks, prompt, 16)[0] == greedy(dense, prompt, 16)[0], prompt
