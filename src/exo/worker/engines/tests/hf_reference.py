"""Hugging Face transformers' Llama built from a GGUF file's tensors: the independent
reference the engine's logits are checked against (``test_engine_reference``) and timed
against (``bench/engine.py``).

transformers un-permutes llama.cpp's q/k rows itself (its own GGUF tensor processor) and
uses the half-split rotation; the engine keeps the file's interleaved layout.
``from_pretrained(gguf_file=...)`` needs ``accelerate``; this builds the same model directly.
"""

from pathlib import Path
from typing import Any

import torch

from exo.worker.engines.gguf_loader import gguf_config
from exo.worker.engines.gguf_reader import GGUFFile

_LAYER_NAMES = {
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


def hf_name(gguf_name: str) -> str:
    """transformers' Llama name of a GGUF tensor."""
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    _, layer, rest = gguf_name.split(".", 2)
    return f"model.layers.{layer}.{_LAYER_NAMES[rest]}"


def transformers_llama(path: Path, dtype: torch.dtype = torch.float32) -> Any:
    """transformers' ``LlamaForCausalLM`` with the GGUF's tensors in ``dtype``, in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    f = GGUFFile(path)
    c = gguf_config(f)
    config = LlamaConfig(
        vocab_size=c.vocab,
        hidden_size=c.hidden,
        intermediate_size=c.ffn,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.heads,
        num_key_value_heads=c.kv_heads,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        rms_norm_eps=c.rms_eps,
        max_position_embeddings=c.context_length,
        tie_word_embeddings=c.tie_embeddings,
    )
    processor = LlamaTensorProcessor(
        config={"num_attention_heads": c.heads, "num_key_value_heads": c.kv_heads}
    )
    state = {
        hf_name(n): torch.from_numpy(processor.process(f.load(n), n).weights).to(dtype)
        for n in f.tensors
    }
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(state, strict=False, assign=True)
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # its buffers, off meta
    model.tie_weights()
    return model.eval()
