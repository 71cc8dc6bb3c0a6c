"""What the tiny MoE test models share (`moe_models`, `deepseek_models`, `glm_models`): peaked
random weights over transformers' init, and a GGUF file written from a model's state dict the
way llama.cpp's converter writes it (its tensor names, merged 3-D expert tensors, the metadata
every family carries, the block type llama-quantize gives each tensor)."""

from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from .arch_models import LAYER_NAMES as DENSE_NAMES

# MXFP4: experts in MXFP4, other matrices Q8_0; Q2_K / Q3_K (issue 23): rows of a multiple of
# 256 values in that type, others Q8_0
GgufType = Literal["F32", "Q8_0", "MXFP4", "Q2_K", "Q3_K"]
Arrays = dict[str, np.ndarray[Any, Any]]

# A layer's tensors (after `model.layers.i.`) under llama.cpp's names (the dense families' and
# the MoE ones'); the MLP's pre-norm is the family's own (`ffn_norm` or `post_attention_norm`),
# the experts are merged (`merged_experts`).
LAYER_NAMES = {
    **DENSE_NAMES,
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}


# The tiny DeepSeek V3's and GLM-4.5's experts (config.json keys): 8 routed in 4 groups, 2 of
# them chosen from 2 groups, a shared expert, routed scaling, a dense first layer.
GROUPED_ROUTER: dict[str, Any] = {
    "n_shared_experts": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "first_k_dense_replace": 1,
}


def peak(model: Any, *, bias: float = 0.1, router: float | None = None, half: bool = False) -> None:
    """Make transformers' init matter: norm gains around 1, biases and sinks of scale `bias`,
    routers of scale `router` (routing by clear margins; None: as initialised), the expert-score
    correction of scale 0.5; `half`: every parameter rounded to float16 (each copy the same)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # ones at init
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias") or name.endswith("sinks"):
                p.copy_(bias * torch.randn_like(p))
            elif router is not None and ("router" in name or name.endswith("mlp.gate.weight")):
                p.copy_(router * torch.randn_like(p))
            if half:
                p.copy_(p.half().float())
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # zeros at init
                b.copy_(0.5 * torch.randn_like(b))


def head_tensors(state: dict[str, torch.Tensor]) -> Arrays:
    """The embedding, the final norm and the output matrix."""
    return {
        "token_embd.weight": state["model.embed_tokens.weight"].float().numpy(),
        "output_norm.weight": state["model.norm.weight"].float().numpy(),
        "output.weight": state["lm_head.weight"].float().numpy(),
    }


def layer_tensors(
    state: dict[str, torch.Tensor], i: int, names: dict[str, str], block: int | None = None
) -> Arrays:
    """Layer i's tensors that `names` names, as GGUF block `block` (default i)."""
    p, b = f"model.layers.{i}.", i if block is None else block
    return {
        f"blk.{b}.{names[k[len(p) :]]}": t.float().numpy()
        for k, t in state.items()
        if k.startswith(p) and k[len(p) :] in names
    }


def merged_experts(state: dict[str, torch.Tensor], i: int, block: int | None = None) -> Arrays:
    """Layer i's experts as llama.cpp's merged [E, rows, cols] tensors, from transformers 5's
    fused gate_up [E, 2F, D] and down [E, D, F], or one matrix per expert; none in a dense layer."""
    x, b = f"model.layers.{i}.mlp.experts.", f"blk.{i if block is None else block}."
    if x + "gate_up_proj" in state:
        gate, up = state[x + "gate_up_proj"].float().chunk(2, dim=1)
        down = state[x + "down_proj"].float()
        return {b + "ffn_gate_exps.weight": gate.contiguous().numpy(),
                b + "ffn_up_exps.weight": up.contiguous().numpy(),
                b + "ffn_down_exps.weight": down.numpy()}  # fmt: skip
    if x + "0.gate_proj.weight" not in state:
        return {}
    n = 1 + max(int(k[len(x) :].split(".")[0]) for k in state if k.startswith(x))
    return {
        f"{b}ffn_{name}_exps.weight": torch.stack(
            [state[f"{x}{e}.{name}_proj.weight"] for e in range(n)]
        )
        .float()
        .numpy()
        for name in ("gate", "up", "down")
    }


def add_base_meta(w: Any, c: Any, blocks: int, tokenizer: Path | None) -> None:
    """The metadata every family's file has (`blocks`: its block count), and the tokenizer of
    the GGUF file `tokenizer` (its tokens, special ids and chat template) or bare bos/eos ids."""
    from .gguf_tokens import copy_tokenizer

    w.add_block_count(blocks)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    if tokenizer is not None:
        assert copy_tokenizer(w, tokenizer) == c.vocab_size
    else:
        w.add_bos_token_id(c.bos_token_id)
        w.add_eos_token_id(c.eos_token_id)


def add_grouped_router_meta(w: Any, c: Any) -> None:
    """DeepSeek V3's and GLM-4.5's experts: dense first layers, a shared expert, sigmoid scores
    with group-limited choice, routed scaling."""
    import gguf

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


def block_type(name: str, data: np.ndarray[Any, Any], dtype: GgufType) -> Any:
    """The block type llama-quantize gives a tensor (None: kept F32): matrices whose rows are
    whole blocks only, never norms, routers or biases; MXFP4 files hold their experts in MXFP4."""
    import gguf

    if dtype == "F32" or data.ndim < 2 or "ffn_gate_inp" in name or not name.endswith("weight"):
        return None
    if data.shape[-1] % 32:
        return None
    if dtype == "MXFP4" and "_exps." in name:
        return gguf.GGMLQuantizationType.MXFP4
    if dtype in ("Q2_K", "Q3_K") and data.shape[-1] % 256 == 0:  # issue 23
        return gguf.GGMLQuantizationType[dtype]
    return gguf.GGMLQuantizationType.Q8_0


def write_tensors(w: Any, tensors: Arrays, dtype: GgufType) -> None:
    """Add `tensors` in their block types to the writer `w` (metadata added), write and close."""
    import gguf

    from exo.modelgen.quants import quantize_rows

    k_quants = (gguf.GGMLQuantizationType.Q2_K, gguf.GGMLQuantizationType.Q3_K)
    for name, data in tensors.items():
        data = np.ascontiguousarray(data, dtype=np.float32)
        qtype = block_type(name, data, dtype)
        if qtype in k_quants:  # gguf.quants dequantises them only: ours quantise
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
