"""One MoE layer's tensors read by name, the names being data: a `LayerNames` per file format.

GGUF (llama.cpp's names)                 Hugging Face                          canonical
blk.i.attn_norm                          model.layers.i.input_layernorm         attention.norm
blk.i.attn_{q,k,v,output}(.bias)         self_attn.{q,k,v,o}_proj(.bias)        wq.. wo, bq.. bo
blk.i.attn_{q,k}_norm                    self_attn.{q,k}_norm                   q_norm, k_norm
blk.i.attn_sinks                         self_attn.sinks                        sinks
blk.i.ffn_norm                           post_attention_layernorm               ffn_norm
blk.i.ffn_gate_inp(.bias)                mlp.gate (.bias)                       router(_bias)
blk.i.exp_probs_b.bias                   mlp.gate.e_score_correction_bias       correction_bias
blk.i.ffn_{gate,up,down}_exps(.bias)     mlp.experts.{e}.{gate,up,down}_proj    experts
blk.i.ffn_{gate,up,down}_shexp           mlp.shared_experts.{gate,up,down}_proj shared
blk.i.ffn_{gate,up,down}                 mlp.{gate,up,down}_proj                dense layers

A family whose files differ names its own (`dataclasses.replace` of `GGUF` or `HF`): GLM's
GGUF keeps the MLP's pre-norm as `post_attention_norm`. q and k rows (weights, biases, norm
gains) are permuted from the half-split rotary layout of these files to the interleaved one the
engine rotates; with partial rotary (`config.rotary_dim`, GLM) only each head's first
rotary_dim rows move. Routers, expert biases and sinks are read as float32 tensors whatever the
plan keeps matrices in: they are small, and routing decides which weights are read at all.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from exo.worker.engines.config import LlamaConfig, MoeConfig
from exo.worker.engines.materialise import StoragePlan, TensorSource, materialise
from exo.worker.engines.models.moe import (
    ExpertWeights,
    MoeWeights,
    SharedExpert,
    split_experts,
    stacked_experts,
)
from exo.worker.engines.models.moe_model import AttentionWeights, DenseFfn
from exo.worker.engines.qtensor import QuantTensor, Weight
from exo.worker.engines.weights import halves_to_pairs

FLOAT32 = StoragePlan(dtype=torch.float32)
GATE_UP_DOWN = ("gate", "up", "down")


@dataclass(frozen=True)
class LayerNames:
    """Where one file format keeps layer i's tensors. Each name follows `layer` (which holds
    {i}); {x} stands for q, k, v (attention) or gate, up, down (MLPs); a `stem` takes
    `.weight` and `.bias`. Merged experts are 3-D tensors `experts.format(x=x) + ".weight"`;
    the others live under the `experts` prefix one matrix each or fused (`hf_experts`)."""

    layer: str
    attn_norm: str
    qkv_stem: str
    out_stem: str
    qk_norm: str
    sinks: str
    ffn_norm: str
    router_stem: str
    correction_bias: str
    dense: str
    shared: str
    experts: str
    merged_experts: bool

    def at(self, i: int, name: str, x: str = "") -> str:
        return self.layer.format(i=i) + name.format(x=x)


GGUF = LayerNames(
    layer="blk.{i}.",
    attn_norm="attn_norm.weight",
    qkv_stem="attn_{x}",
    out_stem="attn_output",
    qk_norm="attn_{x}_norm.weight",
    sinks="attn_sinks.weight",
    ffn_norm="ffn_norm.weight",
    router_stem="ffn_gate_inp",
    correction_bias="exp_probs_b.bias",
    dense="ffn_{x}.weight",
    shared="ffn_{x}_shexp.weight",
    experts="ffn_{x}_exps",
    merged_experts=True,
)

HF = LayerNames(
    layer="model.layers.{i}.",
    attn_norm="input_layernorm.weight",
    qkv_stem="self_attn.{x}_proj",
    out_stem="self_attn.o_proj",
    qk_norm="self_attn.{x}_norm.weight",
    sinks="self_attn.sinks",
    ffn_norm="post_attention_layernorm.weight",
    router_stem="mlp.gate",
    correction_bias="mlp.gate.e_score_correction_bias",
    dense="mlp.{x}_proj.weight",
    shared="mlp.shared_experts.{x}_proj.weight",
    experts="mlp.experts.",
    merged_experts=False,
)


def float_tensor(src: TensorSource, name: str) -> Tensor:
    """A tensor as plain float32, whatever the plan does with matrices."""
    w = materialise(src.stored(name), FLOAT32)
    assert isinstance(w, Tensor)
    return w


def maybe_float(src: TensorSource, name: str) -> Tensor | None:
    return float_tensor(src, name) if src.has(name) else None


# --- attention -----------------------------------------------------------------------------------


def pairs_order(heads: int, head_dim: int, rotary_dim: int) -> Tensor:
    """Row order taking each head's first `rotary_dim` rows from half-split (i, i + r/2) to
    interleaved pairs (2i, 2i + 1); the other rows stay."""
    half = rotary_dim // 2
    within = [j // 2 + (j % 2) * half for j in range(rotary_dim)] + list(
        range(rotary_dim, head_dim)
    )
    return torch.tensor([h * head_dim + j for h in range(heads) for j in within])


def to_pairs(w: Weight, config: LlamaConfig, heads: int) -> Weight:
    """q or k rows of `heads` heads (a weight, a bias, or one head's norm gain) to the
    interleaved rotary layout."""
    rotary = config.rotary_dim or config.head_dim
    if rotary == config.head_dim:
        return halves_to_pairs(w, heads)
    order = pairs_order(heads, config.head_dim, rotary)
    return w.take_rows(order) if isinstance(w, QuantTensor) else w[order].contiguous()


def _maybe_pairs(w: Tensor | None, config: LlamaConfig, heads: int) -> Tensor | None:
    if w is None:
        return None
    out = to_pairs(w, config, heads)
    assert isinstance(out, Tensor)
    return out


def attention(
    src: TensorSource, names: LayerNames, config: LlamaConfig, i: int
) -> AttentionWeights:
    """Layer i's attention: its pre-norm, q/k/v/o with their optional biases, the optional
    per-head q/k norms and sinks."""

    def stem(x: str) -> str:
        return names.at(i, names.qkv_stem, x)

    out = names.at(i, names.out_stem)
    return AttentionWeights(
        norm=src.vector(names.at(i, names.attn_norm)),
        wq=to_pairs(src.get(stem("q") + ".weight"), config, config.heads),
        wk=to_pairs(src.get(stem("k") + ".weight"), config, config.kv_heads),
        wv=src.get(stem("v") + ".weight"),
        wo=src.get(out + ".weight"),
        bq=_maybe_pairs(src.maybe_vector(stem("q") + ".bias"), config, config.heads),
        bk=_maybe_pairs(src.maybe_vector(stem("k") + ".bias"), config, config.kv_heads),
        bv=src.maybe_vector(stem("v") + ".bias"),
        bo=src.maybe_vector(out + ".bias"),
        q_norm=_maybe_pairs(src.maybe_vector(names.at(i, names.qk_norm, "q")), config, 1),
        k_norm=_maybe_pairs(src.maybe_vector(names.at(i, names.qk_norm, "k")), config, 1),
        sinks=maybe_float(src, names.at(i, names.sinks)),
    )


# --- feed-forward --------------------------------------------------------------------------------


def ffn_norm(src: TensorSource, names: LayerNames, i: int) -> Tensor:
    return src.vector(names.at(i, names.ffn_norm))


def mlp(src: TensorSource, names: LayerNames, i: int) -> tuple[Weight, Weight, Weight]:
    """A dense layer's gate, up and down matrices."""
    gate, up, down = (src.get(names.at(i, names.dense, x)) for x in GATE_UP_DOWN)
    return gate, up, down


def dense_ffn(src: TensorSource, names: LayerNames, i: int) -> DenseFfn:
    return DenseFfn(*mlp(src, names, i))


def shared_expert(src: TensorSource, names: LayerNames, i: int) -> SharedExpert | None:
    if not src.has(names.at(i, names.shared, "gate")):
        return None
    return SharedExpert(*(src.get(names.at(i, names.shared, x)) for x in GATE_UP_DOWN))


def hf_experts(src: TensorSource, prefix: str, n_experts: int) -> ExpertWeights:
    """Experts stored one matrix each (`experts.{e}.gate_proj.weight`), or fused 3-D as
    transformers 5 holds them (`experts.gate_up_proj` [E, 2F, D], `experts.down_proj` [E, D, F])."""
    if src.has(prefix + "gate_up_proj"):
        gate_up = stacked_experts(src, prefix + "gate_up_proj", n_experts)
        halves = [split_experts(g, 2) for g in gate_up]
        return ExpertWeights(
            gate=[h[0] for h in halves],
            up=[h[1] for h in halves],
            down=stacked_experts(src, prefix + "down_proj", n_experts),
        )

    def each(name: str) -> list[Weight]:
        return [src.get(f"{prefix}{x}.{name}_proj.weight") for x in range(n_experts)]

    return ExpertWeights(gate=each("gate"), up=each("up"), down=each("down"))


def _merged_experts(src: TensorSource, names: LayerNames, i: int, n: int) -> ExpertWeights:
    """llama.cpp's merged 3-D expert tensors, as views per expert, with their optional biases."""
    gate, up, down = (names.at(i, names.experts, x) for x in GATE_UP_DOWN)
    return ExpertWeights(
        gate=stacked_experts(src, gate + ".weight", n),
        up=stacked_experts(src, up + ".weight", n),
        down=stacked_experts(src, down + ".weight", n),
        gate_bias=maybe_float(src, gate + ".bias"),
        up_bias=maybe_float(src, up + ".bias"),
        down_bias=maybe_float(src, down + ".bias"),
    )


def moe(src: TensorSource, names: LayerNames, config: MoeConfig, i: int) -> MoeWeights:
    """Layer i's router (its bias and expert-score correction when the file has them), routed
    experts and shared experts (when the file has them)."""
    if names.merged_experts:
        experts = _merged_experts(src, names, i, config.n_experts)
    else:
        experts = hf_experts(src, names.at(i, names.experts), config.n_experts)
    router = names.at(i, names.router_stem)
    return MoeWeights(
        router=float_tensor(src, router + ".weight"),
        experts=experts,
        router_bias=maybe_float(src, router + ".bias"),
        correction_bias=maybe_float(src, names.at(i, names.correction_bias)),
        shared=shared_expert(src, names, i),
    )
