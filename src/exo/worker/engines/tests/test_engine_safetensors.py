"""Hugging Face safetensors folders: our loader and model against transformers' own models."""

from pathlib import Path

import pytest
import torch

from exo.worker.engines.linear import WeightFormat
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.safetensors_loader import hf_config, load_hf_shard

from .tiny_models import TINY, write_tiny_model

pytest.importorskip("transformers")

PROMPT = [3, 17, 42, 99, 5, 150, 7, 8, 64]


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("fmt", ["dense", "fp16", "q8", "q4"])
def test_tiny_hf_model_matches_transformers(
    tmp_path: Path, model_type: str, fmt: WeightFormat
) -> None:
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
