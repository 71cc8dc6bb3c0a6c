"""Hugging Face safetensors folders: our loader and model against transformers' own models."""

from pathlib import Path

import pytest
import torch

from exo.worker.engines.linear import WeightFormat
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.safetensors_loader import hf_config, load_hf_shard

from .kernel_skip import skip_without_kernels
from .tiny_models import TINY, write_tiny_model

pytest.importorskip("transformers")

PROMPT = [3, 17, 42, 99, 5, 150, 7, 8, 64]


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("fmt", ["dense", "fp16", "q8", "q4"])
def test_tiny_hf_model_matches_transformers(
    tmp_path: Path, model_type: str, fmt: WeightFormat
) -> None:
    skip_without_kernels(fmt)
    reference = write_tiny_model(tmp_path, model_type)
    config = hf_config(tmp_path)
    assert (config.n_layers, config.heads, config.kv_heads, config.head_dim) == (3, 6, 3, 16)
    assert config.qkv_bias == (model_type == "qwen2") and config.qk_norm == (model_type == "qwen3")
    ours = LlamaModel(load_hf_shard(tmp_path, 0, 3), weight_format=fmt)
    cache = ours.new_cache(1, 16)
    with torch.inference_mode():
        expected = reference(torch.tensor([PROMPT])).logits[0]  # [T, V]
        prefill = ours.forward(
            torch.tensor([PROMPT[:-1]]), StepInputs.single(0, 0, len(PROMPT) - 1), cache
        )
        decode = ours.forward(
            torch.tensor([PROMPT[-1:]]), StepInputs.single(0, len(PROMPT) - 1, 1), cache
        )
    tol = {"dense": 1e-4, "fp16": 2e-3, "q8": 2e-2, "q4": 0.15}[fmt]  # weight precision
    torch.testing.assert_close(prefill[0], expected[-2], atol=tol, rtol=0.0)
    torch.testing.assert_close(decode[0], expected[-1], atol=tol, rtol=0.0)


def test_partial_hf_load(tmp_path: Path) -> None:
    write_tiny_model(tmp_path, "llama")
    done: list[tuple[int, int]] = []
    shard = load_hf_shard(tmp_path, 1, 3, progress=lambda i, n: done.append((i, n)))
    assert done == [(1, 2), (2, 2)] and shard.embed is None and shard.lm_head is not None
    assert shard.layers[0].wq.shape == (TINY["num_attention_heads"] * TINY["head_dim"], 96)


def test_bfloat16_dense_path_runs_and_agrees(tmp_path: Path) -> None:
    """The non-float32 code path (what CUDA runs): rotary in float32, the rest in bfloat16."""
    write_tiny_model(tmp_path, "qwen3")
    weights = load_hf_shard(tmp_path, 0, 3)
    ref, bf16 = LlamaModel(weights), LlamaModel(weights, dtype=torch.bfloat16)
    results = []
    for model in (ref, bf16):
        cache = model.new_cache(2, 16)
        with torch.inference_mode():
            model.forward(torch.tensor([PROMPT]), StepInputs.single(1, 0, len(PROMPT)), cache)
            model.forward(torch.tensor([PROMPT[:4]]), StepInputs.single(0, 0, 4), cache)
            step = StepInputs((0, 1), (4, len(PROMPT)), 1)
            results.append(model.forward(torch.tensor([[5], [6]]), step, cache))
    assert results[1].dtype == torch.float32
    torch.testing.assert_close(results[1], results[0], atol=0.1, rtol=0.05)


@pytest.mark.parametrize("fmt", ["dense", "q8"])
def test_batched_decode_rows_in_any_slot_order(tmp_path: Path, fmt: WeightFormat) -> None:
    skip_without_kernels(fmt)
    write_tiny_model(tmp_path, "llama")
    model = LlamaModel(load_hf_shard(tmp_path, 0, 3), weight_format=fmt)
    outs = []
    for slots in ((0, 1), (1, 0)):
        cache = model.new_cache(2, 16)
        with torch.inference_mode():
            model.forward(
                torch.tensor([PROMPT]), StepInputs.single(slots[0], 0, len(PROMPT)), cache
            )
            model.forward(torch.tensor([PROMPT[:4]]), StepInputs.single(slots[1], 0, 4), cache)
            step = StepInputs(slots, (len(PROMPT), 4), 1)
            outs.append(model.forward(torch.tensor([[5], [6]]), step, cache))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=0.0)
