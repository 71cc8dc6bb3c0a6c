"""Tiny random models of each supported architecture, saved by transformers and as GGUF files.

The weights are rounded to float16 before saving, so the F32 and F16 GGUF files and the
safetensors folder hold exactly the same model: every copy must give transformers' logits
(a Q8_0 file holds the same model in 8-bit blocks: close, not equal).
The GGUF files follow llama.cpp's converter: its tensor names, q/k rows of llama-architecture
files permuted to the interleaved rotary layout, Gemma's norm gains stored whole (1 + w),
llama3 rope scaling as the `rope_freqs.weight` divisors.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

GgufType = Literal["F32", "F16", "Q8_0"]

_COMMON: dict[str, Any] = {
    "vocab_size": 160,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.1,  # logits far enough apart that greedy choices are not ties
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@dataclass(frozen=True)
class ArchCase:
    """One architecture under test: its transformers classes and config, and its GGUF name."""

    name: str
    model_type: str  # transformers' model_type
    gguf_arch: str | None  # None: no GGUF variant (llama.cpp would not keep its features)
    extra: dict[str, Any]


CASES = {
    c.name: c
    for c in (
        ArchCase(
            "llama",
            "llama",
            "llama",
            {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
        ),
        ArchCase(
            "llama3",
            "llama",
            "llama",
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 16,
                },
            },
        ),
        # llama.cpp converts Mistral to the llama architecture and drops its sliding window
        ArchCase("mistral", "mistral", None, {"sliding_window": 5, "tie_word_embeddings": True}),
        ArchCase("qwen2", "qwen2", "qwen2", {"tie_word_embeddings": True}),
        ArchCase("qwen3", "qwen3", "qwen3", {}),
        ArchCase(
            "gemma3",
            "gemma3_text",
            "gemma3",
            {
                "num_hidden_layers": 6,  # five sliding layers, then a global one (llama.cpp's rule)
                "sliding_window": 4,
                "query_pre_attn_scalar": 16,  # = head_dim, as llama.cpp assumes
                "final_logit_softcapping": 5.0,
                "tie_word_embeddings": True,
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                },
            },
        ),
        # fused q|k|v and gate|up matrices, a sliding window on every layer
        ArchCase("phi3", "phi3", "phi3", {"sliding_window": 6, "pad_token_id": 0}),
        # a scale of its own and a cap on the logits (Hugging Face only: GGUF cannot say it)
        ArchCase(
            "gemma3-scaled",
            "gemma3_text",
            None,
            {"sliding_window": 3, "query_pre_attn_scalar": 40, "final_logit_softcapping": 2.0},
        ),
    )
}


def _classes(model_type: str) -> tuple[Any, Any]:
    import transformers

    return {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "gemma3_text": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
    }[model_type]


def build_hf_model(case: ArchCase, folder: Path, seed: int = 0) -> Any:
    """A random model of `case`, float16-exact weights, saved to `folder` (safetensors)."""
    config_cls, model_cls = _classes(case.model_type)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**_COMMON, **case.extra})).eval()
    gemma = case.model_type.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # ones (Gemma: zeros) at init: make them matter
                p.copy_((0.0 if gemma else 1.0) + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            p.copy_(p.half().float())
    model.save_pretrained(folder, safe_serialization=True)
    return model


# --- GGUF, the way llama.cpp's converter writes it --------------------------------------------

LAYER_NAMES = {  # (the MoE test writers add theirs: moe_writer)
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",  # Phi-3's fused matrices
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LLAMA_NORMS = {"post_attention_layernorm.weight": "ffn_norm.weight"}
_GEMMA_NORMS = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def _gguf_name(hf_name: str, gemma: bool) -> str | None:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    names = {**LAYER_NAMES, **(_GEMMA_NORMS if gemma else _LLAMA_NORMS)}
    return f"blk.{layer}.{names[rest]}" if rest in names else None


def _permute(w: np.ndarray[Any, Any], n_head: int) -> np.ndarray[Any, Any]:
    """llama.cpp's q/k permutation: half-split rotary rows -> interleaved pairs."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _llama3_factors(config: Any) -> np.ndarray[Any, Any]:
    """rope_freqs.weight: plain frequencies / llama3-scaled ones, from transformers' own rope."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    hd = config.head_dim
    theta = config.rope_parameters["rope_theta"]
    plain = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    return (plain / scaled.double()).float().numpy()


def write_gguf(model: Any, case: ArchCase, path: Path, dtype: GgufType) -> Path:
    """`model` (from `build_hf_model`) as a GGUF file of 2-D tensors in `dtype`."""
    import gguf

    assert case.gguf_arch is not None
    arch, c = case.gguf_arch, model.config
    gemma = arch == "gemma3"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    params = c.rope_parameters.get("full_attention", c.rope_parameters)
    w.add_rope_freq_base(params["rope_theta"])
    w.add_bos_token_id(c.bos_token_id)
    w.add_eos_token_id(c.eos_token_id if isinstance(c.eos_token_id, int) else c.eos_token_id[0])
    if gemma or arch == "phi3":
        w.add_sliding_window(c.sliding_window)
    if getattr(c, "final_logit_softcapping", None) is not None:
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    if params.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", _llama3_factors(c))
    for hf_name, tensor in model.state_dict().items():
        name = _gguf_name(hf_name, gemma)
        if name is None or (name == "output.weight" and c.tie_word_embeddings):
            continue
        data = tensor.float().numpy()
        if gemma and name.endswith("norm.weight"):
            data = data + 1.0  # llama.cpp stores Gemma's (1 + w)
        if arch == "llama" and name.split(".")[-2] in ("attn_q", "attn_k"):
            heads = c.num_attention_heads if "attn_q" in name else c.num_key_value_heads
            data = _permute(data, heads)
        if dtype == "F16" and data.ndim == 2:
            data = data.astype(np.float16)
        if dtype == "Q8_0" and data.ndim == 2:  # the file's blocks, as llama-quantize writes
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(data), q8), raw_dtype=q8)
            continue
        w.add_tensor(name, np.ascontiguousarray(data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
