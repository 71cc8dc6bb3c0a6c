"""Our logits against Hugging Face transformers' Llama on the same GGUF weights.

transformers is the independent reference for the rotary convention: it un-permutes llama.cpp's
q/k rows (its own GGUF tensor processor) and uses the half-split rotation; we keep the file's
interleaved layout. The exact (dense float32) model must match closely, the fast one within
the error of its 16-bit activation blocks.
"""

from pathlib import Path

import pytest
import torch

from exo.worker.engines.gguf_loader import gguf_config
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.tokenizer import EngineTokenizer

transformers = pytest.importorskip("transformers")


def _hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    _, layer, rest = gguf_name.split(".", 2)
    names = {
        "attn_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "attn_q.weight": "self_attn.q_proj.weight",
        "attn_k.weight": "self_attn.k_proj.weight",
        "attn_v.weight": "self_attn.v_proj.weight",
        "attn_output.weight": "self_attn.o_proj.weight",
        "ffn_gate.weight": "mlp.gate_proj.weight",
        "ffn_up.weight": "mlp.up_proj.weight",
        "ffn_down.weight": "mlp.down_proj.weight",
    }
    return f"model.layers.{layer}.{names[rest]}"


@pytest.fixture(scope="module")
def hf_logits(gguf_path: Path, tokenizer: EngineTokenizer) -> tuple[list[int], torch.Tensor]:
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    f = GGUFFile(gguf_path)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        rms_norm_eps=gguf_config(f).rms_eps,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    processor = LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3})
    state = {
        _hf_name(name): torch.from_numpy(processor.process(f.load(name), name).weights)
        for name in f.tensors
    }
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(state, strict=False, assign=True)
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # its buffers, off meta
    model.tie_weights()
    model.eval()
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
