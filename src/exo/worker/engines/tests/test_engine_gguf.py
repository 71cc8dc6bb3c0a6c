"""GGUF loading and the model on the embedded SmolLM2-135M: config, layer ranges, generation."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.gguf_loader import load_gguf_config, load_gguf_shard
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.tokenizer import EngineTokenizer
from exo.worker.engines.weights import ShardWeights


def test_find_embedded_gguf_locates_the_file() -> None:
    path = find_embedded_gguf()
    assert path is not None and path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_config_matches_the_model_card(gguf_path: Path) -> None:
    c = load_gguf_config(gguf_path)
    assert (c.architecture, c.n_layers, c.hidden, c.ffn) == ("llama", 30, 576, 1536)
    assert (c.heads, c.kv_heads, c.head_dim, c.vocab, c.context_length) == (9, 3, 64, 49152, 8192)
    assert c.rope_theta == 100000.0 and c.rms_eps == pytest.approx(1e-5)
    assert c.tie_embeddings and not c.qkv_bias and not c.qk_norm
    assert c.bos_token_id == 1 and c.eos_token_ids == (2,)
    assert c.chat_template is not None and "<|im_start|>" in c.chat_template


def test_partial_load_holds_only_its_range(gguf_path: Path, full_weights: ShardWeights) -> None:
    calls: list[tuple[int, int]] = []
    shard = load_gguf_shard(
        gguf_path, 28, 30, progress=lambda done, total: calls.append((done, total))
    )
    assert calls == [(1, 2), (2, 2)]
    assert len(shard.layers) == 2 and shard.embed is None
    assert shard.lm_head is not None and shard.final_norm is not None
    down, full_down = shard.layers[1].w_down, full_weights.layers[29].w_down
    assert isinstance(down, torch.Tensor) and isinstance(full_down, torch.Tensor)
    assert torch.equal(down, full_down)
    head, embed = shard.lm_head, full_weights.embed
    assert isinstance(head, torch.Tensor) and isinstance(embed, torch.Tensor)
    assert torch.equal(head, embed)  # tied embeddings
    first = load_gguf_shard(gguf_path, 0, 1)
    assert first.embed is not None and first.lm_head is None and first.final_norm is None
    with pytest.raises(ValueError):
        load_gguf_shard(gguf_path, 10, 31)


def _greedy(model: LlamaModel, prompt: list[int], n: int) -> list[int]:
    cache = model.new_cache(1, len(prompt) + n + 1)
    out: list[int] = []
    with torch.inference_mode():
        logits = model.forward(torch.tensor([prompt]), StepInputs.single(0, 0, len(prompt)), cache)
        for i in range(n):
            out.append(int(logits[0].argmax()))
            step = StepInputs.single(0, len(prompt) + i, 1)
            logits = model.forward(torch.tensor([[out[-1]]]), step, cache)
    return out


def test_greedy_chat_is_coherent_and_deterministic(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    prompt = tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    first = _greedy(fast_model, prompt, 10)
    assert "Paris" in tokenizer.decode(first)
    assert _greedy(fast_model, prompt, 10) == first


def test_two_chained_shards_equal_the_full_model(
    full_weights: ShardWeights, fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    w, fmt = full_weights, fast_model.weight_format
    first = replace(w, end_layer=15, layers=w.layers[:15], final_norm=None, lm_head=None)
    second = replace(w, start_layer=15, layers=w.layers[15:], embed=None)
    a = LlamaModel(first, weight_format=fmt)  # embed + layers [0, 15)
    b = LlamaModel(second, weight_format=fmt)  # layers [15, 30) + head
    prompt = tokenizer.encode("The quick brown fox jumps over the lazy")
    full_cache, cache_a, cache_b = (m.new_cache(1, 32) for m in (fast_model, a, b))
    tokens = torch.tensor([prompt])
    with torch.inference_mode():
        for step in (StepInputs.single(0, 0, len(prompt)), StepInputs.single(0, len(prompt), 1)):
            full = fast_model.forward(tokens, step, full_cache)
            split = b.head(
                b.forward_layers(a.forward_layers(a.embed(tokens), step, cache_a), step, cache_b)
            )
            torch.testing.assert_close(split[:, -1], full, rtol=1e-5, atol=1e-4)
            tokens = full.argmax(-1, keepdim=True)
