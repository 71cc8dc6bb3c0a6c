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
from typing import Any, Literal

import numpy as np
import torch

# MXFP4: experts in MXFP4, other matrices Q8_0; Q2_K / Q3_K (issue 23): rows of a multiple of
# 256 values in that type, others Q8_0
GgufType = Literal["F32", "Q8_0", "MXFP4", "Q2_K", "Q3_K"]

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
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias") or name.endswith("sinks"):
                p.copy_(0.5 * torch.randn_like(p))
            elif "router" in name or name.endswith("mlp.gate.weight"):
                p.copy_(0.5 * torch.randn_like(p))  # routing decided by clear margins
            p.copy_(p.half().float())
    model.save_pretrained(folder, safe_serialization=True)
    return model


# --- GGUF ------------------------------------------------------------------------------------------

_ATTENTION = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
}

Arrays = dict[str, np.ndarray[Any, Any]]


def _layer_tensors(state: dict[str, torch.Tensor], i: int, gpt_oss: bool) -> Arrays:
    p = f"model.layers.{i}."
    out: Arrays = {}
    for hf, gg in _ATTENTION.items():
        if p + hf in state:
            out[f"blk.{i}.{gg}"] = state[p + hf].float().numpy()
    norm = "post_attention_norm" if gpt_oss else "ffn_norm"
    out[f"blk.{i}.{norm}.weight"] = state[p + "post_attention_layernorm.weight"].float().numpy()
    x = p + "mlp.experts."
    if gpt_oss:  # gate_up [E, D, 2F] interleaved -> [E, F, D] each; down [E, F, D] -> [E, D, F]
        gu, b = state[x + "gate_up_proj"].float(), state[x + "gate_up_proj_bias"].float()
        out[f"blk.{i}.ffn_gate_exps.weight"] = gu[:, :, 0::2].transpose(1, 2).numpy()
        out[f"blk.{i}.ffn_up_exps.weight"] = gu[:, :, 1::2].transpose(1, 2).numpy()
        out[f"blk.{i}.ffn_gate_exps.bias"] = b[:, 0::2].numpy()
        out[f"blk.{i}.ffn_up_exps.bias"] = b[:, 1::2].numpy()
        down = state[x + "down_proj"].float().transpose(1, 2)
        out[f"blk.{i}.ffn_down_exps.weight"] = down.numpy()
        out[f"blk.{i}.ffn_down_exps.bias"] = state[x + "down_proj_bias"].float().numpy()
    elif x + "gate_up_proj" in state:  # transformers 5 in memory: gate_up [E, 2F, D]
        gate, up = state[x + "gate_up_proj"].float().chunk(2, dim=1)
        out[f"blk.{i}.ffn_gate_exps.weight"] = gate.numpy()
        out[f"blk.{i}.ffn_up_exps.weight"] = up.numpy()
        out[f"blk.{i}.ffn_down_exps.weight"] = state[x + "down_proj"].float().numpy()
    elif x + "0.gate_proj.weight" in state:
        n = 1 + max(int(k[len(x) :].split(".")[0]) for k in state if k.startswith(x))
        for name in ("gate", "up", "down"):
            stacked = torch.stack([state[f"{x}{e}.{name}_proj.weight"] for e in range(n)])
            out[f"blk.{i}.ffn_{name}_exps.weight"] = stacked.float().numpy()
    return out


def _block_type(name: str, data: np.ndarray[Any, Any], dtype: GgufType) -> Any:
    """The block type llama-quantize gives a tensor (None: kept F32): matrices only, never
    norms, routers or biases; gpt-oss's MXFP4 files hold their experts in MXFP4."""
    import gguf

    if dtype == "F32" or data.ndim < 2 or "ffn_gate_inp" in name or not name.endswith("weight"):
        return None
    if dtype == "MXFP4" and "_exps." in name:
        return gguf.GGMLQuantizationType.MXFP4
    if dtype in ("Q2_K", "Q3_K") and data.shape[-1] % 256 == 0:  # issue 23
        return gguf.GGMLQuantizationType[dtype]
    return gguf.GGMLQuantizationType.Q8_0


def _copy_tokenizer(w: Any, source: Path) -> int:
    """The `tokenizer.*` metadata of the GGUF file `source` added to the writer `w`; returns
    the vocabulary size."""
    from exo.worker.engines.gguf_reader import GGUFFile

    f = GGUFFile(source)
    try:
        meta = {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.")}
    finally:
        f.close()
    for key, value in meta.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, list(value))
    tokens = meta["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list)
    return len(tokens)


def write_gguf(
    model: Any, case: MoeCase, path: Path, dtype: GgufType, tokenizer: Path | None = None
) -> Path:
    """`model` (from `build_hf_model`) as a GGUF file of llama.cpp's `case.name` architecture
    (with the tokenizer and chat template of the GGUF file `tokenizer`, if given)."""
    import gguf

    arch, c = case.name, model.config
    gpt_oss = arch == "gpt-oss"
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
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    if tokenizer is not None:
        assert _copy_tokenizer(w, tokenizer) == c.vocab_size
    else:
        w.add_bos_token_id(c.bos_token_id)
        w.add_eos_token_id(c.eos_token_id)
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
    tensors: Arrays = {
        "token_embd.weight": state["model.embed_tokens.weight"].float().numpy(),
        "output_norm.weight": state["model.norm.weight"].float().numpy(),
        "output.weight": state["lm_head.weight"].float().numpy(),
    }
    for i in range(c.num_hidden_layers):
        tensors |= _layer_tensors(state, i, gpt_oss)
    for name, data in tensors.items():
        data = np.ascontiguousarray(data, dtype=np.float32)
        qtype = _block_type(name, data, dtype)
        if qtype in (gguf.GGMLQuantizationType.Q2_K, gguf.GGMLQuantizationType.Q3_K):  # issue 23
            from exo.modelgen.quants import quantize_rows

            blocks = quantize_rows(data.reshape(-1, data.shape[-1]), qtype)
            w.add_tensor(name, blocks.reshape(*data.shape[:-1], -1), raw_dtype=qtype)
        elif qtype is not None:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
