"""Tiny random MoE models built by transformers (Qwen3-MoE, gpt-oss), saved as safetensors and
written as GGUF files the way llama.cpp's converter does (its tensor names and metadata keys:
merged 3-D expert tensors `ffn_{gate,up,down}_exps`, the router `ffn_gate_inp` kept in F32,
gpt-oss's gate and up de-interleaved and its pre-FFN norm named `post_attention_norm`).

Every feature of each family is kept at tiny size: QK-norm and a dense `mlp_only_layers` layer
(Qwen3-MoE); sinks, a sliding window shorter than the test prompts, YaRN, attention and expert
biases (gpt-oss). Weights are rounded to float16 so every copy holds the same model.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import moe_writer as mw
from .moe_writer import GgufType

__all__ = ["GgufType"]

_COMMON: dict[str, Any] = {
    "vocab_size": 160,
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "initializer_range": 0.1,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


@dataclass(frozen=True)
class MoeCase:
    name: str  # our family / GGUF architecture
    model_type: str
    extra: dict[str, Any]


CASES = {
    "qwen3moe": MoeCase(
        "qwen3moe",
        "qwen3_moe",
        {
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "num_experts": 16,
            "num_experts_per_tok": 4,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
            "rms_norm_eps": 1e-6,
        },
    ),
    "gpt-oss": MoeCase(
        "gpt-oss",
        "gpt_oss",
        {
            "intermediate_size": 32,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "sliding_window": 6,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 128,
                "rope_theta": 1000.0,
            },
        },
    ),
}


def _classes(model_type: str) -> tuple[Any, Any]:
    import transformers

    return {
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
        "gpt_oss": (transformers.GptOssConfig, transformers.GptOssForCausalLM),
    }[model_type]


def build_hf_model(case: MoeCase, folder: Path, seed: int = 0, vocab: int | None = None) -> Any:
    """A random model of `case`, float16-exact weights, saved to `folder` (`vocab`: a
    vocabulary size of its own, to go with a real tokenizer)."""
    config_cls, model_cls = _classes(case.model_type)
    torch.manual_seed(seed)
    sizes = {} if vocab is None else {"vocab_size": vocab}
    model = model_cls(config_cls(**{**_COMMON, **case.extra, **sizes})).eval()
    mw.peak(model, bias=0.5, router=0.5, half=True)
    model.save_pretrained(folder, safe_serialization=True)
    return model


# --- GGUF ------------------------------------------------------------------------------------------

_FFN_NORM = {
    name: {"post_attention_layernorm.weight": f"{norm}.weight"}
    for name, norm in (("qwen3moe", "ffn_norm"), ("gpt-oss", "post_attention_norm"))
}


def _gpt_oss_experts(state: dict[str, torch.Tensor], i: int) -> mw.Arrays:
    """gate_up [E, D, 2F] interleaved -> [E, F, D] each; down [E, F, D] -> [E, D, F]."""
    x, b = f"model.layers.{i}.mlp.experts.", f"blk.{i}."
    gu, bias = state[x + "gate_up_proj"].float(), state[x + "gate_up_proj_bias"].float()
    return {
        b + "ffn_gate_exps.weight": gu[:, :, 0::2].transpose(1, 2).numpy(),
        b + "ffn_up_exps.weight": gu[:, :, 1::2].transpose(1, 2).numpy(),
        b + "ffn_gate_exps.bias": bias[:, 0::2].numpy(),
        b + "ffn_up_exps.bias": bias[:, 1::2].numpy(),
        b + "ffn_down_exps.weight": state[x + "down_proj"].float().transpose(1, 2).numpy(),
        b + "ffn_down_exps.bias": state[x + "down_proj_bias"].float().numpy(),
    }


def write_gguf(
    model: Any, case: MoeCase, path: Path, dtype: GgufType, tokenizer: Path | None = None
) -> Path:
    """`model` (from `build_hf_model`) as a GGUF file of llama.cpp's `case.name` architecture
    (with the tokenizer and chat template of the GGUF file `tokenizer`, if given)."""
    import gguf

    arch, c = case.name, model.config
    gpt_oss = arch == "gpt-oss"
    w = gguf.GGUFWriter(str(path), arch)
    mw.add_base_meta(w, c, c.num_hidden_layers, tokenizer)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_expert_count(c.num_local_experts if gpt_oss else c.num_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    if gpt_oss:
        rope = c.rope_parameters
        w.add_expert_feed_forward_length(c.intermediate_size)
        w.add_sliding_window(c.sliding_window)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    else:
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    state = model.state_dict()
    tensors = mw.head_tensors(state)
    names = {**mw.LAYER_NAMES, **_FFN_NORM[arch]}
    for i in range(c.num_hidden_layers):
        tensors |= mw.layer_tensors(state, i, names)
        tensors |= _gpt_oss_experts(state, i) if gpt_oss else mw.merged_experts(state, i)
    mw.write_tensors(w, tensors, dtype)
    return path
