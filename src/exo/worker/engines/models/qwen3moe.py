"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-480B), a layer range.

    h_0 = E[tokens]
    for each block i:
        x   = rmsnorm(h) * g_attn
        q, k, v = x Wq^T, x Wk^T, x Wv^T
        q, k = rmsnorm_head(q) * g_q, rmsnorm_head(k) * g_k          QK-norm, per head
        q, k = rotate(q, pos), rotate(k, pos)
        h   = h + attention(q, K, V) Wo^T
        x   = rmsnorm(h) * g_ffn
        p   = softmax(x Wr^T);  e = top_k(p);  w = p[e]  (/ sum(w) with norm_topk_prob)
        h   = h + sum_r w_r (silu(x Wg_{e_r}^T) * (x Wu_{e_r}^T)) Wd_{e_r}^T
              (a dense SwiGLU MLP instead in `mlp_only_layers` and, with decoder_sparse_step
               s > 1, in every layer i with (i + 1) % s != 0)
    logits = (rmsnorm(h) * g_out) W_head^T

GGUF: llama.cpp's `qwen3moe` architecture (`{arch}.expert_count`, `expert_used_count`,
`expert_feed_forward_length`; it always renormalises the chosen weights unless
`expert_weights_norm` says otherwise). Hugging Face: `qwen3_moe`.
"""

from dataclasses import replace
from pathlib import Path
from typing import cast

from exo.worker.engines.config import LlamaConfig, MoeConfig
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import dense_files, hf_meta, moe_files
from exo.worker.engines.models.base import JsonDict, ModelFamily
from exo.worker.engines.models.gguf_meta import meta_int
from exo.worker.engines.models.moe import MoeWeights
from exo.worker.engines.models.moe_model import MoeFamily, MoeLayer


def _moe(config: LlamaConfig) -> MoeConfig:
    if not isinstance(config, MoeConfig):
        raise TypeError("Qwen3-MoE layers need an MoeConfig")
    return config


def gguf_config(f: GGUFFile) -> MoeConfig:
    meta = f.metadata
    arch = str(meta["general.architecture"])
    base = dense_files.gguf_config(f)  # (YaRN GGUF files are refused there, naming it)
    norm = meta.get(f"{arch}.expert_weights_norm", True)
    n_layers = base.n_layers
    return moe_config_with_layers(
        base,
        n_experts=meta_int(meta, f"{arch}.expert_count"),
        experts_per_token=meta_int(meta, f"{arch}.expert_used_count"),
        expert_ffn=meta_int(meta, f"{arch}.expert_feed_forward_length"),
        norm_topk_prob=bool(norm),
        moe_layers=tuple(f"blk.{i}.ffn_gate_inp.weight" in f.model_shapes for i in range(n_layers)),
    )


def moe_config_with_layers(base: LlamaConfig, **extra: object) -> MoeConfig:
    return moe_files.moe_config(base, router="softmax", qk_norm=True, **extra)


def _sparse_layers(raw: JsonDict, n_layers: int) -> tuple[bool, ...]:
    step = int(raw.get("decoder_sparse_step") or 1)
    dense = set(cast(list[int], raw.get("mlp_only_layers") or []))
    return tuple(i not in dense and (i + 1) % step == 0 for i in range(n_layers))


def hf_config(raw: JsonDict, folder: Path) -> MoeConfig:
    yarn = moe_files.hf_yarn(raw)
    plain = raw
    if yarn is not None:  # the dense reader knows linear and llama3 scaling only
        theta = hf_meta.rope_theta(raw) or 10000.0
        plain = {**raw, "rope_scaling": None, "rope_parameters": {"rope_theta": theta}}
    base = dense_files.hf_config(plain, folder)
    if yarn is not None:
        base = replace(base, rope_scaling=yarn)
    return moe_config_with_layers(
        base,
        n_experts=int(raw.get("num_experts") or raw["num_local_experts"]),
        experts_per_token=int(raw["num_experts_per_tok"]),
        expert_ffn=int(raw["moe_intermediate_size"]),
        norm_topk_prob=bool(raw.get("norm_topk_prob", False)),
        moe_layers=_sparse_layers(raw, base.n_layers),
    )


def gguf_layer(src: TensorSource, config: LlamaConfig, i: int) -> MoeLayer:
    c = _moe(config)
    ffn = moe_files.gguf_moe(src, c, i) if c.is_moe(i) else moe_files.gguf_dense_ffn(src, i)
    return MoeLayer(
        moe_files.gguf_attention(src, c, i), src.vector(f"blk.{i}.ffn_norm.weight"), ffn
    )


def hf_layer(src: TensorSource, config: LlamaConfig, i: int) -> MoeLayer:
    c, p = _moe(config), f"model.layers.{i}."
    if c.is_moe(i):
        experts = moe_files.hf_experts(src, p + "mlp.experts.", c.n_experts)
        ffn = MoeWeights(moe_files.float_tensor(src, p + "mlp.gate.weight"), experts)
    else:
        ffn = moe_files.hf_dense_ffn(src, i)
    return MoeLayer(
        moe_files.hf_attention(src, c, i), src.vector(p + "post_attention_layernorm.weight"), ffn
    )


QWEN3MOE: ModelFamily[MoeLayer] = MoeFamily(
    "qwen3moe", ("qwen3moe",), ("qwen3_moe",), gguf_config, hf_config, gguf_layer, hf_layer
)
