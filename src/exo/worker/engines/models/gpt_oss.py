"""gpt-oss (gpt-oss-20b, gpt-oss-120b), a layer range.

    h_0 = E[tokens]
    for each block i (even i: sliding window of 128 keys; odd i: every key):
        x   = rmsnorm(h) * g_attn
        q, k, v = x Wq^T + bq, x Wk^T + bk, x Wv^T + bv
        q, k = rotate(q, pos), rotate(k, pos)                YaRN frequencies; q, k scaled by
                                                             m = 0.1 ln(factor) + 1
        p   = softmax([q K^T / sqrt(hd) + mask, s_h])[:L]    s_h: the head's sink logit
        h   = h + (p V) Wo^T + bo
        x   = rmsnorm(h) * g_ffn
        l   = x Wr^T + br;  e = top_k(l);  w = softmax(l[e])           router: softmax of the chosen
        g_r = min(x Wg_{e_r}^T + bg, 7);  u_r = clamp(x Wu_{e_r}^T + bu, -7, 7)
        h   = h + sum_r w_r (((u_r + 1) * g_r * sigmoid(1.702 g_r)) Wd_{e_r}^T + bd)
    logits = (rmsnorm(h) * g_out) W_head^T

GGUF: llama.cpp's `gpt-oss` (gate and up stored apart, `attn_sinks`, the pre-FFN norm named
`post_attention_norm`). Hugging Face: `gpt_oss`, experts as float `gate_up_proj` [E, D, 2F]
(input-major, gate and up interleaved) or as MXFP4 `_blocks` / `_scales` (the released
checkpoints), which are re-laid into GGUF's MXFP4 blocks, bytes only, and run dequantised a few
rows at a time (`linear.StreamingLinear`) until a native MXFP4 kernel exists.
"""

from pathlib import Path
from typing import cast

from exo.worker.engines.config import LlamaConfig, MoeConfig
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import hf_meta, moe_files
from exo.worker.engines.models.base import JsonDict, ModelFamily
from exo.worker.engines.models.gguf_meta import base_fields, get, meta_int
from exo.worker.engines.models.moe import ExpertWeights, MoeWeights
from exo.worker.engines.models.moe_model import MoeFamily, MoeLayer
from exo.worker.engines.models.mxfp4 import hf_mxfp4_experts

_MOE = {"router": "softmax_selected", "expert_activation": "swiglu_oai",
        "attention_sinks": True, "attention_out_bias": True, "qkv_bias": True}  # fmt: skip


def _moe(config: LlamaConfig) -> MoeConfig:
    if not isinstance(config, MoeConfig):
        raise TypeError("gpt-oss layers need an MoeConfig")
    return config


# --- GGUF ----------------------------------------------------------------------------------------


def gguf_config(f: GGUFFile) -> MoeConfig:
    meta, arch = f.metadata, "gpt-oss"
    fields = base_fields(
        f, arch, rope_theta=150000.0, context_length=131072, ffn_required=False
    )
    fields["architecture"] = str(get(meta, "general.architecture"))
    fields["ffn"] = meta_int(meta, f"{arch}.expert_feed_forward_length")
    n_layers = fields["n_layers"]
    base = LlamaConfig(
        **fields,
        rope_scaling=moe_files.gguf_yarn(meta, arch, truncate=False),  # as the config says
        sliding_window=meta_int(meta, f"{arch}.attention.sliding_window", 128),
        sliding_layers=tuple(i % 2 == 0 for i in range(n_layers)),
    )
    return moe_files.moe_config(
        base,
        n_experts=meta_int(meta, f"{arch}.expert_count"),
        experts_per_token=meta_int(meta, f"{arch}.expert_used_count"),
        expert_ffn=base.ffn,
        **_MOE,
    )


def gguf_layer(src: TensorSource, config: LlamaConfig, i: int) -> MoeLayer:
    c = _moe(config)
    return MoeLayer(
        moe_files.gguf_attention(src, c, i),
        src.vector(f"blk.{i}.post_attention_norm.weight"),
        moe_files.gguf_moe(src, c, i),
    )


# --- Hugging Face --------------------------------------------------------------------------------


def hf_config(raw: JsonDict, folder: Path) -> MoeConfig:
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    n_layers = int(raw["num_hidden_layers"])
    types = cast(list[str], raw.get("layer_types") or [])
    sliding = tuple(t == "sliding_attention" for t in types) or tuple(
        i % 2 == 0 for i in range(n_layers)
    )
    bos, eos = hf_meta.special_tokens(raw)
    base = LlamaConfig(
        architecture="gpt_oss",
        n_layers=n_layers,
        hidden=hidden,
        ffn=int(raw["intermediate_size"]),
        heads=heads,
        kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rope_theta=hf_meta.rope_theta(raw) or 150000.0,
        rms_eps=float(raw.get("rms_norm_eps", 1e-5)),
        vocab=int(raw["vocab_size"]),
        context_length=int(raw.get("max_position_embeddings", 131072)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        bos_token_id=bos,
        eos_token_ids=eos,
        chat_template=hf_meta.read_chat_template(folder),
        rope_scaling=moe_files.hf_yarn(raw),
        sliding_window=int(raw.get("sliding_window") or 128),
        sliding_layers=sliding,
    )
    return moe_files.moe_config(
        base,
        n_experts=int(raw["num_local_experts"]),
        experts_per_token=int(raw["num_experts_per_tok"]),
        expert_ffn=base.ffn,
        swiglu_alpha=float(raw.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(raw.get("swiglu_limit", 7.0)),
        **_MOE,
    )


def _hf_float_experts(src: TensorSource, prefix: str, n: int) -> ExpertWeights:
    """Float experts as transformers holds them: gate_up [E, D, 2F] (gate, up interleaved),
    down [E, F, D]: turned to [F, D] and [D, F] matrices."""
    gate_up = moe_files.float_tensor(src, prefix + "gate_up_proj")
    down = moe_files.float_tensor(src, prefix + "down_proj")
    bias = moe_files.float_tensor(src, prefix + "gate_up_proj_bias")
    return ExpertWeights(
        gate=[gate_up[e, :, 0::2].T.contiguous() for e in range(n)],
        up=[gate_up[e, :, 1::2].T.contiguous() for e in range(n)],
        down=[down[e].T.contiguous() for e in range(n)],
        gate_bias=bias[:, 0::2].contiguous(),
        up_bias=bias[:, 1::2].contiguous(),
        down_bias=moe_files.float_tensor(src, prefix + "down_proj_bias"),
    )


def hf_layer(src: TensorSource, config: LlamaConfig, i: int) -> MoeLayer:
    c, p = _moe(config), f"model.layers.{i}."
    prefix = p + "mlp.experts."
    if src.has(prefix + "gate_up_proj_blocks"):
        experts = hf_mxfp4_experts(src, prefix, c.n_experts)
    else:
        experts = _hf_float_experts(src, prefix, c.n_experts)
    moe = MoeWeights(
        router=moe_files.float_tensor(src, p + "mlp.router.weight"),
        experts=experts,
        router_bias=moe_files.float_tensor(src, p + "mlp.router.bias"),
    )
    return MoeLayer(
        moe_files.hf_attention(src, c, i), src.vector(p + "post_attention_layernorm.weight"), moe
    )


GPT_OSS: ModelFamily[MoeLayer] = MoeFamily(
    "gpt-oss", ("gpt-oss",), ("gpt_oss",), gguf_config, hf_config, gguf_layer, hf_layer
)
