"""The deepseek2 family's files (DeepSeek V2 / V3, Kimi K2): its config and its tensor names.

GGUF (llama.cpp's `deepseek2`)          Hugging Face (`deepseek_v2`, `deepseek_v3`)     canonical
blk.i.attn_norm                         model.layers.i.input_layernorm                  attn_norm
blk.i.attn_q_a | attn_q                 self_attn.q_a_proj | q_proj                      wq_a | wq_b
blk.i.attn_q_a_norm                     self_attn.q_a_layernorm                         q_a_norm
blk.i.attn_q_b                          self_attn.q_b_proj                              wq_b
blk.i.attn_kv_a_mqa                     self_attn.kv_a_proj_with_mqa                    wkv_a
blk.i.attn_kv_a_norm                    self_attn.kv_a_layernorm                        kv_a_norm
blk.i.attn_kv_b | attn_k_b + attn_v_b   self_attn.kv_b_proj                             wk_b, wv_b
blk.i.attn_output                       self_attn.o_proj                                wo
blk.i.ffn_norm                          post_attention_layernorm                        ffn_norm
blk.i.ffn_{gate,up,down}                mlp.{gate,up,down}_proj   (dense first layers)  mlp

Newer llama.cpp files split kv_b into attn_k_b [H, R, dn] (Wuk transposed) and attn_v_b
[H, dv, R], and store key_length = R + dr, value_length = R with the per-head sizes in
key_length_mla / value_length_mla; older ones keep attn_kv_b and per-head key/value lengths.
Both are read. Rotary pairs are interleaved in both formats (Hugging Face's `rope_interleave`,
the default); a checkpoint without it has its rotary rows permuted on load.

DeepSeek V3 / Kimi K2 safetensors ship as FP8 blocks (`weight_scale_inv`) and Kimi's tokenizer
is tiktoken's: both are refused with a message naming the GGUF route (this round).
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from exo.worker.engines.config import MoeConfig, RopeScaling
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import hf_meta, moe_files
from exo.worker.engines.models.gguf_meta import Meta, base_fields, meta_float, meta_int, moe_fields
from exo.worker.engines.models.mla import MlaDims, MlaWeights, split_kv_b
from exo.worker.engines.qtensor import QuantTensor, Weight

GGUF_ARCHITECTURES = ("deepseek2",)
HF_MODEL_TYPES = ("deepseek_v3", "deepseek_v2", "kimi_k2")


@dataclass(frozen=True)
class DeepseekConfig(MoeConfig):
    """MoeConfig's fields (head_dim: the rotary dims dr; kv_heads = heads; ffn: the dense
    layers' width; router "sigmoid" for V3 with the expert bias, "softmax" for V2) plus MLA's
    ranks and the number of dense first layers."""

    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    mscale_all_dim: float = 0.0  # YaRN's softmax-scale multiplier (m = 1 + 0.1 this ln factor)
    first_k_dense_replace: int = 0  # layers [0, this) are dense, the rest mixtures of experts
    rope_interleave: bool = True  # Hugging Face: rotary pairs adjacent (else half-split rows)

    def mla_dims(self, heads: int | None = None) -> MlaDims:
        return MlaDims(
            heads=self.heads if heads is None else heads,
            q_lora_rank=self.q_lora_rank,
            kv_lora_rank=self.kv_lora_rank,
            qk_nope=self.qk_nope_head_dim,
            qk_rope=self.head_dim,
            v_head_dim=self.v_head_dim,
        )

    def is_moe(self, layer: int) -> bool:
        return self.n_experts > 0 and layer >= self.first_k_dense_replace


# --- GGUF ----------------------------------------------------------------------------------------


def _gguf_yarn(meta: Meta, arch: str) -> tuple[RopeScaling | None, float]:
    """(rotary scaling, mscale_all_dim) of a deepseek2 file; llama.cpp stores YaRN's log
    multiplier 0.1 * mscale_all_dim (and assumes mscale = mscale_all_dim: magnitude 1)."""
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta_float(meta, f"{arch}.rope.scaling.factor", 1.0)
    if kind in (None, "none") or factor == 1.0:
        return None, 0.0
    if kind != "yarn":
        raise ValueError(f"rope scaling {kind!r} is not supported for deepseek2 files")
    scaling = RopeScaling(
        kind="yarn",
        factor=factor,
        original_context_length=meta_int(meta, f"{arch}.rope.scaling.original_context_length"),
        beta_fast=meta_float(meta, f"{arch}.rope.scaling.yarn_beta_fast", 32.0),
        beta_slow=meta_float(meta, f"{arch}.rope.scaling.yarn_beta_slow", 1.0),
        attention_factor=1.0,
    )
    return scaling, meta_float(meta, f"{arch}.rope.scaling.yarn_log_multiplier", 0.0) / 0.1


def gguf_config(f: GGUFFile) -> DeepseekConfig:
    meta, arch = f.metadata, "deepseek2"
    base = base_fields(f, arch, rms_eps=1e-6)
    rope = meta_int(meta, f"{arch}.rope.dimension_count")
    split_kv = f"{arch}.attention.key_length_mla" in meta
    key_len = meta_int(
        meta, f"{arch}.attention.key_length_mla" if split_kv else f"{arch}.attention.key_length"
    )
    value_len = meta_int(
        meta, f"{arch}.attention.value_length_mla" if split_kv else f"{arch}.attention.value_length"
    )
    q_lora = meta_int(meta, f"{arch}.attention.q_lora_rank", 0)
    scaling, mscale_all_dim = _gguf_yarn(meta, arch)
    gating = meta_int(meta, f"{arch}.expert_gating_func", 1)  # llama.cpp: 1 softmax, 2 sigmoid
    base["kv_heads"], base["head_dim"] = base["heads"], rope  # MLA: one latent, rotary dims
    return DeepseekConfig(
        **base,
        **moe_fields(meta, arch, norm_topk_prob=False),
        rope_scaling=scaling,
        q_lora_rank=q_lora or None,
        kv_lora_rank=meta_int(meta, f"{arch}.attention.kv_lora_rank"),
        qk_nope_head_dim=key_len - rope,
        v_head_dim=value_len,
        mscale_all_dim=mscale_all_dim,
        router="sigmoid" if gating == 2 else "softmax",
    )


def gguf_attention(src: TensorSource, c: DeepseekConfig, i: int) -> MlaWeights:
    p = f"blk.{i}."
    has_lora = src.has(p + "attn_q_a.weight")
    if src.has(p + "attn_k_b.weight"):
        wk_b = _dense(src.get(p + "attn_k_b.weight")).reshape(c.heads, c.kv_lora_rank, -1)
        wv_b = _dense(src.get(p + "attn_v_b.weight")).reshape(c.heads, c.v_head_dim, -1)
    else:
        wk_b, wv_b = split_kv_b(
            src.get(p + "attn_kv_b.weight"), c.heads, c.qk_nope_head_dim, c.v_head_dim
        )
    return MlaWeights(
        wq_a=src.get(p + "attn_q_a.weight") if has_lora else None,
        q_a_norm=src.vector(p + "attn_q_a_norm.weight") if has_lora else None,
        wq_b=src.get(p + ("attn_q_b.weight" if has_lora else "attn_q.weight")),
        wkv_a=src.get(p + "attn_kv_a_mqa.weight"),
        kv_a_norm=src.vector(p + "attn_kv_a_norm.weight"),
        wk_b=wk_b.contiguous(),
        wv_b=wv_b.contiguous(),
        wo=src.get(p + "attn_output.weight"),
    )


def _dense(w: Weight) -> Tensor:
    return w.dequantize() if isinstance(w, QuantTensor) else w


# --- Hugging Face --------------------------------------------------------------------------------


def refuse_unsupported(raw: hf_meta.JsonDict, folder: Path) -> None:
    """FP8 checkpoints and tiktoken tokenizers are refused with the route that works."""
    quant = raw.get("quantization_config")
    if isinstance(quant, dict) and str(quant.get("quant_method", "")).lower() == "fp8":  # pyright: ignore[reportUnknownMemberType]
        raise ValueError(
            "DeepSeek V3 / Kimi K2 FP8 safetensors (weight_scale_inv blocks) are not supported "
            "yet: use a GGUF file of the model (e.g. a Q4_K_M or Q2_K quant)"
        )
    if (folder / "tiktoken.model").exists() or str(raw.get("model_type")) == "kimi_k2":
        raise ValueError(
            "Kimi K2's tiktoken tokenizer is not supported yet: use a GGUF file of the model"
        )


def _yarn(raw: hf_meta.JsonDict) -> tuple[RopeScaling | None, float]:
    p = hf_meta.rope_params(raw, "full_attention") or {}
    if p.get("rope_type", p.get("type")) != "yarn":
        return hf_meta.rope_scaling(raw), 0.0
    factor = float(p["factor"])
    mscale, mscale_all_dim = float(p.get("mscale") or 0), float(p.get("mscale_all_dim") or 0)

    def m(scale: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * scale * torch.log(torch.tensor(factor)).item() + 1.0

    magnitude = p.get("attention_factor")
    if magnitude is None:
        magnitude = m(mscale) / m(mscale_all_dim) if mscale and mscale_all_dim else m(1.0)
    scaling = RopeScaling(
        kind="yarn",
        factor=factor,
        original_context_length=int(p["original_max_position_embeddings"]),
        beta_fast=float(p.get("beta_fast") or 32),
        beta_slow=float(p.get("beta_slow") or 1),
        truncate=bool(p.get("truncate", True)),
        attention_factor=float(magnitude),
    )
    return scaling, mscale_all_dim


def hf_config(raw: hf_meta.JsonDict, folder: Path) -> DeepseekConfig:
    refuse_unsupported(raw, folder)
    if raw.get("attention_bias"):
        raise ValueError("deepseek attention biases (attention_bias: true) are not supported")
    base = moe_files.hf_base_fields(raw, folder, rms_eps=1e-6)
    base["kv_heads"], base["head_dim"] = base["heads"], int(raw["qk_rope_head_dim"])  # MLA
    scaling, mscale_all_dim = _yarn(raw)
    q_lora = raw.get("q_lora_rank")
    topk = str(raw.get("topk_method", "noaux_tc"))
    scoring = str(raw.get("scoring_func", "sigmoid" if topk == "noaux_tc" else "softmax"))
    return DeepseekConfig(
        **base,
        **moe_files.hf_moe_fields(raw, norm_topk_prob=False),
        rope_scaling=scaling,
        q_lora_rank=int(q_lora) if isinstance(q_lora, int) and q_lora > 0 else None,
        kv_lora_rank=int(raw["kv_lora_rank"]),
        qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
        v_head_dim=int(raw["v_head_dim"]),
        mscale_all_dim=mscale_all_dim,
        first_k_dense_replace=int(raw.get("first_k_dense_replace") or 0),
        router="sigmoid" if scoring == "sigmoid" else "softmax",
        rope_interleave=bool(raw.get("rope_interleave", True)),
    )


def _rope_rows_to_pairs(w: Weight, groups: int, keep: int, rope: int) -> Weight:
    """Within each of `groups` row groups of keep + rope rows, the last `rope` rows from the
    half-split rotary layout to interleaved pairs."""
    order: list[int] = []
    for g in range(groups):
        base = g * (keep + rope)
        order += [base + j for j in range(keep)]
        order += [base + keep + (j // 2) + (j % 2) * (rope // 2) for j in range(rope)]
    index = torch.tensor(order)
    return w.take_rows(index) if isinstance(w, QuantTensor) else w[index].contiguous()


def hf_attention(src: TensorSource, c: DeepseekConfig, i: int, interleaved: bool) -> MlaWeights:
    a = f"model.layers.{i}.self_attn."
    has_lora = src.has(a + "q_a_proj.weight")
    wq_b = src.get(a + ("q_b_proj.weight" if has_lora else "q_proj.weight"))
    wkv_a = src.get(a + "kv_a_proj_with_mqa.weight")
    if not interleaved:  # half-split rotary rows (rope_interleave: false) -> interleaved pairs
        wq_b = _rope_rows_to_pairs(wq_b, c.heads, c.qk_nope_head_dim, c.head_dim)
        wkv_a = _rope_rows_to_pairs(wkv_a, 1, c.kv_lora_rank, c.head_dim)
    wk_b, wv_b = split_kv_b(
        src.get(a + "kv_b_proj.weight"), c.heads, c.qk_nope_head_dim, c.v_head_dim
    )
    return MlaWeights(
        wq_a=src.get(a + "q_a_proj.weight") if has_lora else None,
        q_a_norm=src.vector(a + "q_a_layernorm.weight") if has_lora else None,
        wq_b=wq_b,
        wkv_a=wkv_a,
        kv_a_norm=src.vector(a + "kv_a_layernorm.weight"),
        wk_b=wk_b,
        wv_b=wv_b,
        wo=src.get(a + "o_proj.weight"),
    )
