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
the first rotary_dim rows of every head are permuted to interleaved pairs on load.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from exo.worker.engines.config import LlamaConfig, MoeConfig
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import hf_meta
from exo.worker.engines.models.gguf_meta import base_fields, meta_int, moe_fields
from exo.worker.engines.models.moe import ExpertWeights, MoeWeights, stacked_experts
from exo.worker.engines.qtensor import QuantTensor, Weight
from exo.worker.engines.weights import LayerWeights

GGUF_ARCHITECTURES = ("glm4moe",)
HF_MODEL_TYPES = ("glm4_moe",)
_GATE_UP_DOWN = ("gate", "up", "down")


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
    return _check(GlmConfig(
        **base,
        **moe_fields(meta, arch, norm_topk_prob=True),
        qkv_bias="blk.0.attn_q.bias" in shapes,
        qk_norm="blk.0.attn_q_norm.weight" in shapes,
        rotary_dim=meta_int(meta, f"{arch}.rope.dimension_count", base["head_dim"]),
        router="sigmoid",
    ))


def gguf_layer(src: TensorSource, c: GlmConfig, i: int) -> GlmLayer:
    p = f"blk.{i}."
    moe = None
    if c.is_moe(i):
        gate, up, down = (
            stacked_experts(src, f"{p}ffn_{x}_exps.weight", c.n_experts) for x in _GATE_UP_DOWN
        )
        moe = MoeWeights(
            router=_dense(src.get(p + "ffn_gate_inp.weight")),
            experts=ExpertWeights(gate, up, down),
            correction_bias=src.maybe_vector(p + "exp_probs_b.bias"),
        )
        mlp = tuple(src.get(f"{p}ffn_{x}_shexp.weight") for x in _GATE_UP_DOWN)
    else:
        mlp = tuple(src.get(f"{p}ffn_{x}.weight") for x in _GATE_UP_DOWN)
    attention = {x: src.get(f"{p}attn_{x}.weight") for x in "qkv"}
    bias = {x: src.maybe_vector(f"{p}attn_{x}.bias") for x in "qkv"}
    dense = LayerWeights(
        attn_norm=src.vector(p + "attn_norm.weight"),
        wq=_pairs(attention["q"], c, c.heads),
        wk=_pairs(attention["k"], c, c.kv_heads),
        wv=attention["v"],
        wo=src.get(p + "attn_output.weight"),
        ffn_norm=src.vector(p + "post_attention_norm.weight"),
        w_gate=mlp[0],
        w_up=mlp[1],
        w_down=mlp[2],
        bq=_maybe_pairs(bias["q"], c, c.heads),
        bk=_maybe_pairs(bias["k"], c, c.kv_heads),
        bv=bias["v"],
        q_norm=_maybe_pairs(src.maybe_vector(p + "attn_q_norm.weight"), c, 1),
        k_norm=_maybe_pairs(src.maybe_vector(p + "attn_k_norm.weight"), c, 1),
    )
    return GlmLayer(dense, moe)


# --- Hugging Face --------------------------------------------------------------------------------


def hf_config(raw: hf_meta.JsonDict, folder: Path) -> GlmConfig:
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or hidden // heads)
    params = hf_meta.rope_params(raw, "full_attention") or {}
    partial = float(raw.get("partial_rotary_factor", params.get("partial_rotary_factor", 0.5)))
    bos, eos_ids = hf_meta.special_tokens(raw)
    return _check(GlmConfig(
        architecture=str(raw.get("model_type")),
        n_layers=int(raw["num_hidden_layers"]),
        hidden=hidden,
        ffn=int(raw["intermediate_size"]),
        heads=heads,
        kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rope_theta=hf_meta.rope_theta(raw) or 10000.0,
        rms_eps=float(raw.get("rms_norm_eps", 1e-5)),
        vocab=int(raw["vocab_size"]),
        context_length=int(raw.get("max_position_embeddings", 4096)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        chat_template=hf_meta.read_chat_template(folder),
        qkv_bias=bool(raw.get("attention_bias", False)),
        qk_norm=bool(raw.get("use_qk_norm", False)),
        rope_scaling=hf_meta.rope_scaling(raw),
        activation=hf_meta.activation(raw),
        rotary_dim=int(head_dim * partial),
        first_k_dense_replace=int(raw.get("first_k_dense_replace") or 0),
        n_experts=int(raw.get("n_routed_experts") or 0),
        experts_per_token=int(raw.get("num_experts_per_tok") or 0),
        n_shared_experts=int(raw.get("n_shared_experts") or 0),
        expert_ffn=int(raw.get("moe_intermediate_size") or 0),
        n_group=int(raw.get("n_group") or 1),
        topk_group=int(raw.get("topk_group") or 1),
        routed_scaling=float(raw.get("routed_scaling_factor") or 1.0),
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        router="sigmoid",
        shared_ffn=int(raw.get("n_shared_experts") or 0) * int(raw.get("moe_intermediate_size") or 0),
    ))  # fmt: skip


def _mlp(src: TensorSource, prefix: str) -> tuple[Weight, Weight, Weight]:
    gate, up, down = (src.get(f"{prefix}{x}_proj.weight") for x in _GATE_UP_DOWN)
    return gate, up, down


def hf_layer(src: TensorSource, c: GlmConfig, i: int) -> GlmLayer:
    p = f"model.layers.{i}."
    a, m = p + "self_attn.", p + "mlp."
    moe = None
    if c.is_moe(i):
        experts = [_mlp(src, f"{m}experts.{e}.") for e in range(c.n_experts)]
        moe = MoeWeights(
            router=_dense(src.get(m + "gate.weight")),
            experts=ExpertWeights(
                [e[0] for e in experts], [e[1] for e in experts], [e[2] for e in experts]
            ),
            correction_bias=src.maybe_vector(m + "gate.e_score_correction_bias"),
        )
        mlp = _mlp(src, m + "shared_experts.")
    else:
        mlp = _mlp(src, m)
    dense = LayerWeights(
        attn_norm=src.vector(p + "input_layernorm.weight"),
        wq=_pairs(src.get(a + "q_proj.weight"), c, c.heads),
        wk=_pairs(src.get(a + "k_proj.weight"), c, c.kv_heads),
        wv=src.get(a + "v_proj.weight"),
        wo=src.get(a + "o_proj.weight"),
        ffn_norm=src.vector(p + "post_attention_layernorm.weight"),
        w_gate=mlp[0],
        w_up=mlp[1],
        w_down=mlp[2],
        bq=_maybe_pairs(src.maybe_vector(a + "q_proj.bias"), c, c.heads),
        bk=_maybe_pairs(src.maybe_vector(a + "k_proj.bias"), c, c.kv_heads),
        bv=src.maybe_vector(a + "v_proj.bias"),
        q_norm=_maybe_pairs(src.maybe_vector(a + "q_norm.weight"), c, 1),
        k_norm=_maybe_pairs(src.maybe_vector(a + "k_norm.weight"), c, 1),
    )
    return GlmLayer(dense, moe)


# --- shared ----------------------------------------------------------------------------------------


def _dense(w: Weight) -> Tensor:
    return w.dequantize() if isinstance(w, QuantTensor) else w


def partial_pairs_order(heads: int, head_dim: int, rotary_dim: int) -> Tensor:
    """Row order taking each head's first `rotary_dim` rows from half-split (i, i + r/2) to
    interleaved pairs (2i, 2i + 1); the other rows stay."""
    half = rotary_dim // 2
    within = [j // 2 + (j % 2) * half for j in range(rotary_dim)] + list(
        range(rotary_dim, head_dim)
    )
    return torch.tensor([h * head_dim + j for h in range(heads) for j in within])


def _pairs(w: Weight, c: LlamaConfig, heads: int) -> Weight:
    order = partial_pairs_order(heads, c.head_dim, c.rotary_dim or c.head_dim)
    return w.take_rows(order) if isinstance(w, QuantTensor) else w[order].contiguous()


def _maybe_pairs(w: Tensor | None, c: LlamaConfig, heads: int) -> Tensor | None:
    if w is None:
        return None
    order = partial_pairs_order(heads, c.head_dim, c.rotary_dim or c.head_dim)
    return w[order].contiguous()
