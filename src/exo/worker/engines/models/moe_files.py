"""Tensor names the MoE families share: attention, experts and dense MLPs, in both file formats.

GGUF (llama.cpp's names)                 Hugging Face                          canonical
blk.i.attn_norm                          model.layers.i.input_layernorm         attention.norm
blk.i.attn_{q,k,v,output}(.bias)         self_attn.{q,k,v,o}_proj(.bias)        wq.. wo, bq.. bo
blk.i.attn_{q,k}_norm                    self_attn.{q,k}_norm                   q_norm, k_norm
blk.i.attn_sinks                         self_attn.sinks                        sinks
blk.i.ffn_gate_inp(.bias)                mlp.gate | mlp.router (.bias)          router(_bias)
blk.i.exp_probs_b.bias                   mlp.gate.e_score_correction_bias       correction_bias
blk.i.ffn_{gate,up,down}_exps(.bias)     mlp.experts.{e}.{gate,up,down}_proj    experts
blk.i.ffn_{gate,up,down}_shexp           mlp.shared_experts.{gate,up,down}_proj shared
blk.i.ffn_{gate,up,down}                 mlp.{gate,up,down}_proj                dense layers

q and k rows are permuted from the half-split rotary layout (these families' files, GGUF and
Hugging Face alike) to the interleaved one the engine rotates (`weights.halves_to_pairs`).
Routers, expert biases and sinks are read as float32 tensors whatever the plan keeps matrices
in: they are small, and routing decides which weights are read at all.
"""

from dataclasses import fields

import torch
from torch import Tensor

from exo.worker.engines.config import LlamaConfig, MoeConfig, RopeScaling
from exo.worker.engines.materialise import StoragePlan, TensorSource, materialise
from exo.worker.engines.models import hf_meta
from exo.worker.engines.models.base import JsonDict
from exo.worker.engines.models.gguf_meta import Meta, meta_float, meta_int
from exo.worker.engines.models.moe import (
    ExpertWeights,
    MoeWeights,
    SharedExpert,
    split_experts,
    stacked_experts,
)
from exo.worker.engines.models.moe_model import AttentionWeights, DenseFfn
from exo.worker.engines.qtensor import Weight
from exo.worker.engines.weights import halves_to_pairs

FLOAT32 = StoragePlan(dtype=torch.float32)


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


def float_tensor(src: TensorSource, name: str) -> Tensor:
    """A tensor as plain float32, whatever the plan does with matrices."""
    w = materialise(src.stored(name), FLOAT32)
    assert isinstance(w, Tensor)
    return w


def maybe_float(src: TensorSource, name: str) -> Tensor | None:
    return float_tensor(src, name) if src.has(name) else None


def _qk(w: Tensor | None, n_heads: int) -> Tensor | None:
    return None if w is None else halves_to_pairs(w, n_heads)


def gguf_attention(src: TensorSource, config: LlamaConfig, i: int) -> AttentionWeights:
    p = f"blk.{i}."
    wq, wk = src.get(p + "attn_q.weight"), src.get(p + "attn_k.weight")
    return AttentionWeights(
        norm=src.vector(p + "attn_norm.weight"),
        wq=halves_to_pairs(wq, config.heads),
        wk=halves_to_pairs(wk, config.kv_heads),
        wv=src.get(p + "attn_v.weight"),
        wo=src.get(p + "attn_output.weight"),
        bq=_qk(src.maybe_vector(p + "attn_q.bias"), config.heads),
        bk=_qk(src.maybe_vector(p + "attn_k.bias"), config.kv_heads),
        bv=src.maybe_vector(p + "attn_v.bias"),
        bo=src.maybe_vector(p + "attn_output.bias"),
        q_norm=_qk(src.maybe_vector(p + "attn_q_norm.weight"), 1),
        k_norm=_qk(src.maybe_vector(p + "attn_k_norm.weight"), 1),
        sinks=maybe_float(src, p + "attn_sinks.weight"),
    )


def hf_attention(src: TensorSource, config: LlamaConfig, i: int) -> AttentionWeights:
    p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
    wq, wk = src.get(a + "q_proj.weight"), src.get(a + "k_proj.weight")
    return AttentionWeights(
        norm=src.vector(p + "input_layernorm.weight"),
        wq=halves_to_pairs(wq, config.heads),
        wk=halves_to_pairs(wk, config.kv_heads),
        wv=src.get(a + "v_proj.weight"),
        wo=src.get(a + "o_proj.weight"),
        bq=_qk(src.maybe_vector(a + "q_proj.bias"), config.heads),
        bk=_qk(src.maybe_vector(a + "k_proj.bias"), config.kv_heads),
        bv=src.maybe_vector(a + "v_proj.bias"),
        bo=src.maybe_vector(a + "o_proj.bias"),
        q_norm=_qk(src.maybe_vector(a + "q_norm.weight"), 1),
        k_norm=_qk(src.maybe_vector(a + "k_norm.weight"), 1),
        sinks=maybe_float(src, a + "sinks"),
    )


def gguf_moe(src: TensorSource, config: MoeConfig, i: int) -> MoeWeights:
    """Layer i's router and experts from llama.cpp's merged 3-D tensors (views per expert)."""
    p, e = f"blk.{i}.", config.n_experts
    shared = None
    if src.has(p + "ffn_gate_shexp.weight"):
        shared = SharedExpert(
            *(src.get(p + f"ffn_{x}_shexp.weight") for x in ("gate", "up", "down"))
        )
    experts = ExpertWeights(
        gate=stacked_experts(src, p + "ffn_gate_exps.weight", e),
        up=stacked_experts(src, p + "ffn_up_exps.weight", e),
        down=stacked_experts(src, p + "ffn_down_exps.weight", e),
        gate_bias=maybe_float(src, p + "ffn_gate_exps.bias"),
        up_bias=maybe_float(src, p + "ffn_up_exps.bias"),
        down_bias=maybe_float(src, p + "ffn_down_exps.bias"),
    )
    return MoeWeights(
        router=float_tensor(src, p + "ffn_gate_inp.weight"),
        experts=experts,
        router_bias=maybe_float(src, p + "ffn_gate_inp.bias"),
        correction_bias=maybe_float(src, p + "exp_probs_b.bias"),
        shared=shared,
    )


def gguf_dense_ffn(src: TensorSource, i: int) -> DenseFfn:
    p = f"blk.{i}."
    return DenseFfn(*(src.get(p + f"ffn_{x}.weight") for x in ("gate", "up", "down")))


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


def hf_dense_ffn(src: TensorSource, i: int) -> DenseFfn:
    p = f"model.layers.{i}.mlp."
    return DenseFfn(*(src.get(p + f"{x}_proj.weight") for x in ("gate", "up", "down")))
