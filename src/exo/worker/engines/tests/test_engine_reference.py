"""Our logits against Hugging Face transformers' Llama on the same GGUF weights.

transformers is the independent reference for the rotary convention: it un-permutes llama.cpp's
q/k rows (its own GGUF tensor processor) and uses the half-split rotation; we keep the file's
interleaved layout. The exact (dense float32) model must match closely, the fast one within
the error of its 16-bit activation blocks.
"""

from pathlib import Path

import pytest
import torch

from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.tests.hf_reference import transformers_llama
from exo.worker.engines.tokenizer import EngineTokenizer

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_logits(gguf_path: Path, tokenizer: EngineTokenizer) -> tuple[list[int], torch.Tensor]:
    model = transformers_llama(gguf_path)
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Name three colours."}])
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0]  # [T, V]
    return prompt, logits


def _our_logits(model: LlamaModel, prompt: list[int]) -> torch.Tensor:
    """Prefill all but the last token, then decode it: both paths take part."""
    cache = model.new_cache(1, len(prompt) + 1)
    with torch.inference_mode():
        prefill = torch.tensor([prompt[:-1]])
        model.forward(prefill, StepInputs.single(0, 0, len(prompt) - 1), cache)
        last = torch.tensor([prompt[-1:]])
        return model.forward(last, StepInputs.single(0, len(prompt) - 1, 1), cache)[0]


def test_dense_logits_match_transformers(
    dense_model: LlamaModel, hf_logits: tuple[list[int], torch.Tensor]
) -> None:
    prompt, expected = hf_logits
    torch.testing.assert_close(_our_logits(dense_model, prompt), expected[-1], atol=2e-3, rtol=1e-4)


def test_fast_logits_match_transformers(
    fast_model: LlamaModel, hf_logits: tuple[list[int], torch.Tensor]
) -> None:
    prompt, expected = hf_logits
    ours = _our_logits(fast_model, prompt)
    assert int(ours.argmax()) == int(expected[-1].argmax())
    torch.testing.assert_close(ours, expected[-1], atol=0.05, rtol=0.0)
