"""What the MoE families' files share besides their layers' tensors (`moe_reader` reads those
by name): YaRN rotary scaling in both formats, the config fields config.json files spell alike,
and `moe_config`. The per-format readers below are `moe_reader`'s with its GGUF or Hugging Face
names, kept under the names the family modules call.
"""

from dataclasses import fields
from pathlib import Path
from typing import Any

from exo.worker.engines.config import LlamaConfig, MoeConfig, RopeScaling
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import hf_meta
from exo.worker.engines.models import moe_reader as reader
from exo.worker.engines.models.base import JsonDict
from exo.worker.engines.models.gguf_meta import Meta, meta_float, meta_int
from exo.worker.engines.models.moe import MoeWeights
from exo.worker.engines.models.moe_model import AttentionWeights, DenseFfn
from exo.worker.engines.models.moe_reader import FLOAT32, float_tensor, hf_experts, maybe_float

__all__ = ["FLOAT32", "float_tensor", "hf_experts", "maybe_float"]


def hf_yarn(raw: JsonDict) -> RopeScaling | None:
    """YaRN rotary scaling of config.json (None without scaling; ValueError for other kinds)."""
    p = hf_meta.rope_params(raw, "full_attention")
    if p is None or p.get("rope_type", p.get("type")) in (None, "default"):
        return None
    if p.get("rope_type", p.get("type")) != "yarn":
        raise ValueError(f"rope scaling {p.get('rope_type')!r} is not supported")
    factor = p.get("attention_factor")
    return RopeScaling(
        kind="yarn",
        factor=float(p["factor"]),
        original_context_length=int(p["original_max_position_embeddings"]),
        beta_fast=float(p.get("beta_fast") or 32.0),
        beta_slow=float(p.get("beta_slow") or 1.0),
        truncate=bool(p.get("truncate", True)),
        attention_factor=float(factor) if isinstance(factor, int | float) else None,
    )


def gguf_yarn(meta: Meta, arch: str, truncate: bool = True) -> RopeScaling | None:
    """YaRN rotary scaling of a GGUF file's metadata (None when the file has none)."""
    if meta.get(f"{arch}.rope.scaling.type") != "yarn":
        return None
    return RopeScaling(
        kind="yarn",
        factor=meta_float(meta, f"{arch}.rope.scaling.factor", 1.0),
        original_context_length=meta_int(meta, f"{arch}.rope.scaling.original_context_length"),
        beta_fast=meta_float(meta, f"{arch}.rope.scaling.yarn_beta_fast", 32.0),
        beta_slow=meta_float(meta, f"{arch}.rope.scaling.yarn_beta_slow", 1.0),
        truncate=truncate,
    )


def moe_config(base: LlamaConfig, **extra: object) -> MoeConfig:
    """`base` with the MoE fields of `extra` (every other field as `base` has it)."""
    values: dict[str, object] = {f.name: getattr(base, f.name) for f in fields(LlamaConfig)}
    return MoeConfig(**{**values, **extra})  # type: ignore[arg-type]


def gguf_attention(src: TensorSource, config: LlamaConfig, i: int) -> AttentionWeights:
    return reader.attention(src, reader.GGUF, config, i)


def hf_attention(src: TensorSource, config: LlamaConfig, i: int) -> AttentionWeights:
    return reader.attention(src, reader.HF, config, i)


def gguf_moe(src: TensorSource, config: MoeConfig, i: int) -> MoeWeights:
    """Layer i's router and experts from llama.cpp's merged 3-D tensors (views per expert)."""
    return reader.moe(src, reader.GGUF, config, i)


def gguf_dense_ffn(src: TensorSource, i: int) -> DenseFfn:
    return reader.dense_ffn(src, reader.GGUF, i)


def hf_dense_ffn(src: TensorSource, i: int) -> DenseFfn:
    return reader.dense_ffn(src, reader.HF, i)


# --- config.json ---------------------------------------------------------------------------------


def hf_base_fields(raw: JsonDict, folder: Path, rms_eps: float) -> dict[str, Any]:
    """LlamaConfig's fields every MoE family's config.json spells alike (`rms_eps`: the
    family's default); the family adds the rest."""
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    bos, eos_ids = hf_meta.special_tokens(raw)
    return {
        "architecture": str(raw.get("model_type")),
        "n_layers": int(raw["num_hidden_layers"]),
        "hidden": hidden,
        "ffn": int(raw["intermediate_size"]),
        "heads": heads,
        "kv_heads": int(raw.get("num_key_value_heads") or heads),
        "head_dim": int(raw.get("head_dim") or hidden // heads),
        "rope_theta": hf_meta.rope_theta(raw) or 10000.0,
        "rms_eps": float(raw.get("rms_norm_eps", rms_eps)),
        "vocab": int(raw["vocab_size"]),
        "context_length": int(raw.get("max_position_embeddings", 4096)),
        "tie_embeddings": bool(raw.get("tie_word_embeddings", False)),
        "bos_token_id": bos,
        "eos_token_ids": eos_ids,
        "chat_template": hf_meta.read_chat_template(folder),
        "activation": hf_meta.activation(raw),
    }


def hf_moe_fields(raw: JsonDict, norm_topk_prob: bool) -> dict[str, Any]:
    """MoeConfig's expert fields as DeepSeek-style config.json files name them (DeepSeek,
    GLM): routed and shared experts, group-limited routing, the routed scaling factor."""
    shared, width = (
        int(raw.get("n_shared_experts") or 0),
        int(raw.get("moe_intermediate_size") or 0),
    )
    return {
        "n_experts": int(raw.get("n_routed_experts") or 0),
        "experts_per_token": int(raw.get("num_experts_per_tok") or 0),
        "n_shared_experts": shared,
        "expert_ffn": width,
        "n_group": int(raw.get("n_group") or 1),
        "topk_group": int(raw.get("topk_group") or 1),
        "routed_scaling": float(raw.get("routed_scaling_factor") or 1.0),
        "norm_topk_prob": bool(raw.get("norm_topk_prob", norm_topk_prob)),
        "shared_ffn": shared * width,
    }
