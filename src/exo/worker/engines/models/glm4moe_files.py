"""The glm4moe family's files (GLM-4.5 / 4.6 / 4.7): its config and its tensor names.

GGUF (llama.cpp's `glm4moe`)            Hugging Face (`glm4_moe`)                        canonical
blk.i.attn_norm                         model.layers.i.input_layernorm                   dense.attn_norm
blk.i.attn_{q,k,v}(.bias)               self_attn.{q,k,v}_proj(.bias)                    dense.wq, bq, ..
blk.i.attn_{q,k}_norm                   self_attn.{q,k}_norm                             dense.q_norm, k_norm
blk.i.attn_output                       self_attn.o_proj                                 dense.wo
blk.i.post_attention_norm               post_attention_layernorm   (the MLP's pre-norm)  dense.ffn_norm
blk.i.ffn_{gate,up,down}                mlp.{gate,up,down}_proj    (dense first layers)  dense.w_gate, ..
blk.i.ffn_{gate,up,down}_shexp          mlp.shared_experts.*_proj                        dense.w_gate, ..
blk.i.ffn_gate_inp, exp_probs_b.bias    mlp.gate.weight, e_score_correction_bias         moe.router, ..
blk.i.ffn_{gate,up,down}_exps           mlp.experts.e.{gate,up,down}_proj                moe.experts

q, k (and their biases and norm gains) hold each head's rotary part half-split in both formats:
the first rotary_dim rows of every head are permuted to interleaved pairs on load. The layers
are read by `moe_reader` with these names (`GGUF_NAMES`: its GGUF names, the MLP's pre-norm
`post_attention_norm`; Hugging Face's are its defaults).
"""

from dataclasses import dataclass, replace
from pathlib import Path

from exo.worker.engines.config import MoeConfig
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import hf_meta, moe_files
from exo.worker.engines.models import moe_reader as reader
from exo.worker.engines.models.gguf_meta import base_fields, meta_int, moe_fields
from exo.worker.engines.models.moe import MoeWeights
from exo.worker.engines.weights import LayerWeights

GGUF_ARCHITECTURES = ("glm4moe",)
HF_MODEL_TYPES = ("glm4_moe",)
GGUF_NAMES = replace(reader.GGUF, ffn_norm="post_attention_norm.weight")


@dataclass(frozen=True)
class GlmConfig(MoeConfig):
    """MoeConfig's fields (rotary_dim: the rotated dims of a head; ffn: the dense layers'
    width; the sigmoid router) plus the number of dense first layers."""

    first_k_dense_replace: int = 0

    def is_moe(self, layer: int) -> bool:
        return self.n_experts > 0 and layer >= self.first_k_dense_replace


@dataclass(frozen=True)
class GlmLayer:
    """Attention and the dense MLP (an MoE layer's shared expert) as the dense family holds
    them, and the routed experts of an MoE layer."""

    dense: LayerWeights
    moe: MoeWeights | None


def _check(c: GlmConfig) -> GlmConfig:
    if c.n_experts and c.n_shared_experts != 1:
        raise ValueError(f"glm4moe with {c.n_shared_experts} shared experts is not supported (1)")
    return c


# --- GGUF ----------------------------------------------------------------------------------------


def gguf_config(f: GGUFFile) -> GlmConfig:
    meta, arch = f.metadata, "glm4moe"
    base = base_fields(f, arch)
    base["n_layers"] -= meta_int(meta, f"{arch}.nextn_predict_layers", 0)  # MTP layers unused
    shapes = f.model_shapes
    return _check(
        GlmConfig(
            **base,
            **moe_fields(meta, arch, norm_topk_prob=True),
            qkv_bias="blk.0.attn_q.bias" in shapes,
            qk_norm="blk.0.attn_q_norm.weight" in shapes,
            rotary_dim=meta_int(meta, f"{arch}.rope.dimension_count", base["head_dim"]),
            router="sigmoid",
        )
    )


def gguf_layer(src: TensorSource, c: GlmConfig, i: int) -> GlmLayer:
    return layer(src, GGUF_NAMES, c, i)


# --- Hugging Face --------------------------------------------------------------------------------


def hf_config(raw: hf_meta.JsonDict, folder: Path) -> GlmConfig:
    base = moe_files.hf_base_fields(raw, folder, rms_eps=1e-5)
    params = hf_meta.rope_params(raw, "full_attention") or {}
    partial = float(raw.get("partial_rotary_factor", params.get("partial_rotary_factor", 0.5)))
    return _check(GlmConfig(
        **base,
        **moe_files.hf_moe_fields(raw, norm_topk_prob=True),
        qkv_bias=bool(raw.get("attention_bias", False)),
        qk_norm=bool(raw.get("use_qk_norm", False)),
        rope_scaling=hf_meta.rope_scaling(raw),
        rotary_dim=int(base["head_dim"] * partial),
        first_k_dense_replace=int(raw.get("first_k_dense_replace") or 0),
        router="sigmoid",
    ))  # fmt: skip


def hf_layer(src: TensorSource, c: GlmConfig, i: int) -> GlmLayer:
    return layer(src, reader.HF, c, i)


# --- both formats --------------------------------------------------------------------------------


def layer(src: TensorSource, names: reader.LayerNames, c: GlmConfig, i: int) -> GlmLayer:
    """Layer i as the dense family holds it (an MoE layer's shared expert as its MLP), and the
    routed experts of an MoE layer."""
    moe, mlp = None, None
    if c.is_moe(i):
        moe = reader.moe(src, names, c, i)
        mlp, moe = moe.shared, replace(moe, shared=None)
    if mlp is None:
        mlp = reader.dense_ffn(src, names, i)
    a = reader.attention(src, names, c, i)
    dense = LayerWeights(
        attn_norm=a.norm, wq=a.wq, wk=a.wk, wv=a.wv, wo=a.wo,
        ffn_norm=reader.ffn_norm(src, names, i),
        w_gate=mlp.gate, w_up=mlp.up, w_down=mlp.down,
        bq=a.bq, bk=a.bk, bv=a.bv, q_norm=a.q_norm, k_norm=a.k_norm,
    )  # fmt: skip
    return GlmLayer(dense, moe)
