"""`Engine.embedding`: mean-pooled final hidden states of the embedded model, unit length."""

import math
from pathlib import Path

import torch

from exo.worker.engines.engine import load_engine
from exo.worker.engines.llama import LlamaModel, StepInputs


def test_embedding_is_unit_length_deterministic_and_pooled(
    gguf_path: Path, tokenizer_cache: Path, dense_model: LlamaModel
) -> None:
    engine = load_engine(gguf_path, threads=1, cache_dir=tokenizer_cache)
    ids = engine.tokenizer.encode("The sea is calm tonight.", add_special_tokens=True)
    first = engine.embedding(ids)
    assert len(first) == engine.config.hidden
    assert math.isclose(math.sqrt(sum(x * x for x in first)), 1.0, rel_tol=1e-5)
    assert engine.embedding(ids) == first  # the same text, the same vector
    other = engine.embedding(engine.tokenizer.encode("def f(x): return x", add_special_tokens=True))
    assert other != first and len(other) == len(first)
    # The mean of the normed final hidden states, checked on the exact model by hand.
    with torch.inference_mode():
        h = dense_model.embed(torch.tensor([ids]))
        cache = dense_model.new_cache(1, len(ids))
        h = dense_model.forward_layers(h, StepInputs.single(0, 0, len(ids)), cache)[0]
        assert dense_model.final_norm is not None
        rms = h.pow(2).mean(-1, keepdim=True).add(dense_model.eps).rsqrt()
        mean = (h * rms * dense_model.final_norm).mean(0)
        reference = (mean / mean.norm()).tolist()
    cosine = sum(a * b for a, b in zip(first, reference, strict=True))
    assert cosine > 0.99  # the fast format is close to the exact one
