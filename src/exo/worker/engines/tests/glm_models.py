"""A tiny GLM-4.5 built by transformers' own `Glm4MoeForCausalLM`, saved as safetensors and
written as a GGUF file the way llama.cpp's converter writes a `glm4moe` model.

The tiny config keeps every feature of the family: partial rotary (half of each head), QK-norm,
attention biases, a dense first layer, group-limited sigmoid routing with the expert bias,
routed scaling and a shared expert. The GGUF file also holds the multi-token-prediction block
llama.cpp's files carry (`nextn_predict_layers`, one block more than the model's layers).
"""

from pathlib import Path
from typing import Any

import numpy as np
import torch

CONFIG: dict[str, Any] = {
    "vocab_size": 160,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "first_k_dense_replace": 1,
    "use_qk_norm": True,
    "attention_bias": True,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "initializer_range": 0.1,  # peaked next-token distributions: greedy is no coin toss
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
    },
}

_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}


def build_glm(folder: Path, seed: int = 0, **overrides: Any) -> Any:
    """A random tiny GLM-4.5 saved to `folder` (safetensors), in eval mode."""
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    torch.manual_seed(seed)
    model = Glm4MoeForCausalLM(Glm4MoeConfig(**{**CONFIG, **overrides})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # ones at init: make them matter
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.5 * torch.randn_like(b))
    model.save_pretrained(folder, safe_serialization=True)
    return model


def _tensors(model: Any) -> dict[str, np.ndarray[Any, Any]]:
    c = model.config
    state = {k: v.float() for k, v in model.state_dict().items()}
    out = {
        "token_embd.weight": state["model.embed_tokens.weight"].numpy(),
        "output_norm.weight": state["model.norm.weight"].numpy(),
        "output.weight": state["lm_head.weight"].numpy(),
    }
    n = c.num_hidden_layers
    for i in range(n + 1):  # block n: the multi-token-prediction block (a copy of the last)
        p = f"model.layers.{min(i, n - 1)}."
        for name, t in state.items():
            if name.startswith(p) and name[len(p) :] in _NAMES:
                out[f"blk.{i}.{_NAMES[name[len(p) :]]}"] = t.numpy()
        if min(i, n - 1) >= c.first_k_dense_replace:
            gate_up = state[p + "mlp.experts.gate_up_proj"]  # [E, 2F, D]
            f = gate_up.shape[1] // 2
            out[f"blk.{i}.ffn_gate_exps.weight"] = gate_up[:, :f].contiguous().numpy()
            out[f"blk.{i}.ffn_up_exps.weight"] = gate_up[:, f:].contiguous().numpy()
            out[f"blk.{i}.ffn_down_exps.weight"] = state[p + "mlp.experts.down_proj"].numpy()
    return out


def write_glm_gguf(
    model: Any, path: Path, dtype: str = "F32", tokenizer: Path | None = None
) -> Path:
    """`model` (from `build_glm`) as a llama.cpp `glm4moe` GGUF file, F32 or Q8_0 (with the
    tokenizer and chat template of the GGUF file `tokenizer`, if given)."""
    import gguf

    from .gguf_tokens import copy_tokenizer

    c = model.config
    rope = c.rope_parameters
    w = gguf.GGUFWriter(str(path), "glm4moe")
    w.add_block_count(c.num_hidden_layers + 1)
    w.add_uint32("glm4moe.nextn_predict_layers", 1)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_dimension_count(int(c.head_dim * rope["partial_rotary_factor"]))
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    if tokenizer is not None:
        assert copy_tokenizer(w, tokenizer) == c.vocab_size
    else:
        w.add_bos_token_id(c.bos_token_id)
        w.add_eos_token_id(c.eos_token_id)
    w.add_leading_dense_block_count(c.first_k_dense_replace)
    w.add_expert_count(c.n_routed_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_shared_count(c.n_shared_experts)
    w.add_expert_feed_forward_length(c.moe_intermediate_size)
    w.add_expert_weights_scale(c.routed_scaling_factor)
    w.add_expert_weights_norm(c.norm_topk_prob)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_group_count(c.n_group)
    w.add_expert_group_used_count(c.topk_group)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for name, data in _tensors(model).items():
        data = np.ascontiguousarray(data, dtype=np.float32)
        blocks = data.ndim >= 2 and data.shape[-1] % 32 == 0 and "ffn_gate_inp" not in name
        if dtype == "Q8_0" and blocks:
            w.add_tensor(name, gguf.quants.quantize(data, q8), raw_dtype=q8)
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
