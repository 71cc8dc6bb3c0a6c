"""A tiny DeepSeek V3 built by transformers' own `DeepseekV3ForCausalLM`, saved as safetensors
and written as a GGUF file the way llama.cpp's converter writes a `deepseek2` model.

The tiny config keeps every feature of the family: q and kv LoRA ranks, split rotary dims,
YaRN (with its softmax-scale mscale), a dense first layer, group-limited sigmoid routing
(n_group > 1, topk_group), the expert-bias correction, routed scaling and a shared expert.
GGUF: llama.cpp's tensor names and metadata; `split_kv_b` writes the newer layout (attn_k_b
[H, R, dn] transposed, attn_v_b [H, dv, R], key/value lengths of the latent plus the `_mla`
per-head ones), otherwise the older attn_kv_b. Q8_0 quantises every matrix whose rows are whole
blocks (llama.cpp keeps the router and the norms in F32 too).
"""

from pathlib import Path
from typing import Any

import torch

from . import moe_writer as mw

CONFIG: dict[str, Any] = {
    "vocab_size": 160,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    **mw.GROUPED_ROUTER,
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.1,  # peaked next-token distributions: greedy is no coin toss
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "beta_fast": 32,
        "beta_slow": 1,
    },
}


_NAMES = {
    **mw.LAYER_NAMES,
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
}


def build_deepseek(folder: Path, seed: int = 0, v2: bool = False, **overrides: Any) -> Any:
    """A random tiny DeepSeek V3 (`v2`: V2, softmax routing) saved to `folder` (safetensors),
    in eval mode."""
    import transformers

    classes: tuple[Any, Any] = (
        (transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM)
        if v2
        else (transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM)
    )
    torch.manual_seed(seed)
    model = classes[1](classes[0](**{**CONFIG, **overrides})).eval()
    mw.peak(model)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def _tensors(model: Any, split_kv_b: bool) -> mw.Arrays:
    """The model's tensors under llama.cpp's names (experts merged into 3-D tensors)."""
    c = model.config
    state = model.state_dict()
    out = mw.head_tensors(state)
    for i in range(c.num_hidden_layers):
        out |= mw.layer_tensors(state, i, _NAMES)
        kv_b = out.pop(f"blk.{i}.attn_kv_b.weight")
        if split_kv_b:  # llama.cpp's newer layout: Wuk transposed and Wuv per head
            w = torch.from_numpy(kv_b).unflatten(0, (c.num_attention_heads, -1))
            out[f"blk.{i}.attn_k_b.weight"] = (
                w[:, : c.qk_nope_head_dim].transpose(1, 2).contiguous().numpy()
            )
            out[f"blk.{i}.attn_v_b.weight"] = w[:, c.qk_nope_head_dim :].contiguous().numpy()
        else:
            out[f"blk.{i}.attn_kv_b.weight"] = kv_b
        out |= mw.merged_experts(state, i)
    return out


def _metadata(w: Any, c: Any, split_kv_b: bool, tokenizer: Path | None) -> None:
    import gguf

    rope = c.rope_parameters
    mw.add_base_meta(w, c, c.num_hidden_layers, tokenizer)
    w.add_q_lora_rank(c.q_lora_rank)
    w.add_kv_lora_rank(c.kv_lora_rank)
    w.add_rope_dimension_count(c.qk_rope_head_dim)
    if split_kv_b:
        w.add_head_count_kv(1)
        w.add_key_length(c.kv_lora_rank + c.qk_rope_head_dim)
        w.add_value_length(c.kv_lora_rank)
        w.add_key_length_mla(c.qk_nope_head_dim + c.qk_rope_head_dim)
        w.add_value_length_mla(c.v_head_dim)
    else:
        w.add_head_count_kv(c.num_attention_heads)
        w.add_key_length(c.qk_nope_head_dim + c.qk_rope_head_dim)
        w.add_value_length(c.v_head_dim)
    mw.add_grouped_router_meta(w, c)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def write_deepseek_gguf(
    model: Any,
    path: Path,
    dtype: mw.GgufType = "F32",
    *,
    split_kv_b: bool = True,
    tokenizer: Path | None = None,
) -> Path:
    """`model` (from `build_deepseek`) as a llama.cpp `deepseek2` GGUF file, F32 or Q8_0
    (with the tokenizer and chat template of the GGUF file `tokenizer`, if given: the model's
    vocabulary must be that size)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "deepseek2")
    _metadata(w, model.config, split_kv_b, tokenizer)
    mw.write_tensors(w, _tensors(model, split_kv_b), dtype)
    return path
