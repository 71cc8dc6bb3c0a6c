"""The dense family's files: its config from GGUF / config.json metadata, and its tensor names.

GGUF (llama.cpp's names)             Hugging Face                          canonical (`LayerWeights`)
blk.i.attn_norm                      model.layers.i.input_layernorm         attn_norm
blk.i.attn_{q,k,v} | attn_qkv        self_attn.{q,k,v}_proj | qkv_proj      wq, wk, wv (q, k interleaved)
blk.i.attn_output                    self_attn.o_proj                       wo
blk.i.attn_{q,k}_norm                self_attn.{q,k}_norm                   q_norm, k_norm
blk.i.ffn_norm                       post_attention_layernorm | pre_feedforward_layernorm   ffn_norm
blk.i.ffn_{gate,up} | ffn_up (both)  mlp.{gate,up}_proj | gate_up_proj      w_gate, w_up
blk.i.ffn_down                       mlp.down_proj                          w_down
blk.i.post_attention_norm            post_attention_layernorm (Gemma)       post_attn_norm
blk.i.post_ffw_norm                  post_feedforward_layernorm (Gemma)     post_ffn_norm

Gemma's Hugging Face norms store gain - 1 (llama.cpp's converter stores the gain itself).
"""

from dataclasses import replace
from pathlib import Path
from typing import cast

from torch import Tensor

from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import hf_meta
from exo.worker.engines.models.gguf_meta import (
    Meta,
    base_fields,
    get,
    meta_float,
    meta_int,
    rope_scaling,
)
from exo.worker.engines.qtensor import Weight
from exo.worker.engines.weights import LayerWeights, halves_to_pairs, split_rows

GGUF_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3")
HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3")
# llama.cpp's converter permutes q/k of these into the interleaved rotary layout; the others
# (NEOX rotary in llama.cpp) keep the Hugging Face half-split layout, which we permute on load.
_INTERLEAVED_IN_FILE = ("llama", "mistral")
# Gemma's RMSNorm multiplies by (1 + w): its stored norm weights are offsets from one.
_NORM_OFFSET = {"gemma3_text": 1.0}


# --- GGUF ----------------------------------------------------------------------------------------


def _with_gemma3(c: LlamaConfig, meta: Meta) -> LlamaConfig:
    """What llama.cpp fixes for Gemma 3 rather than storing it: every 6th layer global, local
    rotary base 10000, attention scale 1/sqrt(head_dim) (1/sqrt(hidden/heads) for the 27B)."""
    pattern = meta_int(meta, "gemma3.attention.sliding_window_pattern", 6)
    window = meta.get("gemma3.attention.sliding_window")
    softcap = meta.get("gemma3.final_logit_softcapping")
    scale_dim = c.hidden // c.heads if c.n_layers == 62 else c.head_dim
    return replace(
        c,
        activation="gelu_tanh",
        embed_scale=c.hidden**0.5,
        attn_scale=scale_dim**-0.5,
        sliding_window=window if isinstance(window, int) else None,
        sliding_layers=tuple((i + 1) % pattern != 0 for i in range(c.n_layers)),
        rope_theta_local=meta_float(meta, "gemma3.rope.freq_base_swa", 10000.0),
        final_softcap=float(softcap) if isinstance(softcap, int | float) else None,
    )


def gguf_config(f: GGUFFile) -> LlamaConfig:
    """The model shape described by an open GGUF file's metadata."""
    meta = f.metadata
    arch = str(get(meta, "general.architecture"))
    base = base_fields(f, arch)
    head_dim, n_layers = base["head_dim"], base["n_layers"]
    if meta_int(meta, f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise ValueError("partial rotary embeddings are not supported")
    config = LlamaConfig(
        **base,
        qkv_bias="blk.0.attn_q.bias" in f.model_shapes,
        qk_norm="blk.0.attn_q_norm.weight" in f.model_shapes,
        rope_scaling=rope_scaling(meta, arch),
    )
    window = meta.get(f"{arch}.attention.sliding_window")
    if arch == "phi3" and isinstance(window, int):  # every layer slides
        return replace(config, sliding_window=window, sliding_layers=(True,) * n_layers)
    return _with_gemma3(config, meta) if arch == "gemma3" else config


def gguf_layer(src: TensorSource, config: LlamaConfig, i: int) -> LayerWeights:
    p = f"blk.{i}."
    bq, bk, bv = (
        src.maybe_vector(p + "attn_q.bias"),
        src.maybe_vector(p + "attn_k.bias"),
        src.maybe_vector(p + "attn_v.bias"),
    )
    hd = config.head_dim
    if src.has(p + "attn_qkv.weight"):  # Phi-3: q|k|v in one matrix
        q_rows, kv_rows = config.heads * hd, config.kv_heads * hd
        wq, wk, wv = split_rows(src.get(p + "attn_qkv.weight"), [q_rows, kv_rows, kv_rows])
    else:
        wq, wk, wv = (src.get(p + f"attn_{x}.weight") for x in "qkv")
    if src.has(p + "ffn_gate.weight"):
        w_gate, w_up = src.get(p + "ffn_gate.weight"), src.get(p + "ffn_up.weight")
    else:  # Phi-3: gate|up in one matrix
        fused = src.get(p + "ffn_up.weight")
        w_gate, w_up = split_rows(fused, [fused.shape[0] // 2] * 2)
    q_norm = src.maybe_vector(p + "attn_q_norm.weight")
    k_norm = src.maybe_vector(p + "attn_k_norm.weight")
    # Gemma 3 norms both sides of attention and MLP ("ffn_norm" is the pre-MLP one everywhere);
    # llama.cpp's converter stores Gemma's norm gains whole (1 + w), as we use them.
    if config.architecture not in _INTERLEAVED_IN_FILE:
        wq, wk = halves_to_pairs(wq, config.heads), halves_to_pairs(wk, config.kv_heads)
        bq = None if bq is None else halves_to_pairs(bq, config.heads)
        bk = None if bk is None else halves_to_pairs(bk, config.kv_heads)
        q_norm = None if q_norm is None else halves_to_pairs(q_norm, 1)
        k_norm = None if k_norm is None else halves_to_pairs(k_norm, 1)
    return LayerWeights(
        attn_norm=src.vector(p + "attn_norm.weight"),
        wq=wq,
        wk=wk,
        wv=wv,
        wo=src.get(p + "attn_output.weight"),
        ffn_norm=src.vector(p + "ffn_norm.weight"),
        w_gate=w_gate,
        w_up=w_up,
        w_down=src.get(p + "ffn_down.weight"),
        bq=bq,
        bk=bk,
        bv=bv,
        q_norm=q_norm,
        k_norm=k_norm,
        post_attn_norm=src.maybe_vector(p + "post_attention_norm.weight"),
        post_ffn_norm=src.maybe_vector(p + "post_ffw_norm.weight"),
    )


# --- Hugging Face --------------------------------------------------------------------------------


def _sliding(
    raw: hf_meta.JsonDict, model_type: str, n_layers: int
) -> tuple[int | None, tuple[bool, ...]]:
    """(window, per-layer flags): Gemma 3 alternates (`layer_types`), Mistral slides everywhere."""
    window = raw.get("sliding_window")
    if not isinstance(window, int) or raw.get("use_sliding_window") is False:
        return None, ()
    types = raw.get("layer_types")
    if isinstance(types, list):
        flags = tuple(t == "sliding_attention" for t in cast(list[str], types))
        return window, flags
    if model_type == "gemma3_text":
        pattern = int(raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6)
        return window, tuple((i + 1) % pattern != 0 for i in range(n_layers))
    return window, (True,) * n_layers


def hf_config(raw: hf_meta.JsonDict, folder: Path) -> LlamaConfig:
    """The model shape described by a Hugging Face folder's config.json (`raw`)."""
    model_type = str(raw.get("model_type", ""))
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    bos, eos_ids = hf_meta.special_tokens(raw)
    qkv_bias = model_type == "qwen2" or bool(raw.get("attention_bias", False))
    gemma = model_type == "gemma3_text"
    partial = (hf_meta.rope_params(raw, "full_attention") or {}).get("partial_rotary_factor", 1.0)
    if float(raw.get("partial_rotary_factor", partial)) != 1.0:
        raise ValueError("partial rotary embeddings are not supported")
    n_layers = int(raw["num_hidden_layers"])
    window, sliding_layers = _sliding(raw, model_type, n_layers)
    scalar, softcap = raw.get("query_pre_attn_scalar"), raw.get("final_logit_softcapping")
    return LlamaConfig(
        architecture=model_type,
        n_layers=n_layers,
        hidden=hidden,
        ffn=int(raw["intermediate_size"]),
        heads=heads,
        kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rope_theta=hf_meta.rope_theta(raw) or (1_000_000.0 if gemma else 10000.0),
        rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
        vocab=int(raw["vocab_size"]),
        context_length=int(raw.get("max_position_embeddings", 4096)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", gemma)),
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        chat_template=hf_meta.read_chat_template(folder),
        qkv_bias=qkv_bias,
        qk_norm=model_type in ("qwen3", "gemma3_text"),
        rope_scaling=hf_meta.rope_scaling(raw),
        activation=hf_meta.activation(raw),
        embed_scale=hidden**0.5 if gemma else None,
        attn_scale=float(scalar) ** -0.5 if isinstance(scalar, int | float) else None,
        sliding_window=window,
        sliding_layers=sliding_layers,
        rope_theta_local=(hf_meta.rope_theta(raw, "sliding_attention") or 10000.0)
        if gemma
        else None,
        final_softcap=float(softcap) if isinstance(softcap, int | float) else None,
    )


def hf_norm(src: TensorSource, config: LlamaConfig, name: str) -> Tensor:
    """A norm's gain (Gemma stores gain - 1)."""
    return src.vector(name) + _NORM_OFFSET.get(config.architecture, 0.0)


def hf_layer(src: TensorSource, config: LlamaConfig, i: int) -> LayerWeights:
    p = f"model.layers.{i}."
    a = p + "self_attn."

    hd, heads, kvh = config.head_dim, config.heads, config.kv_heads
    fused: dict[str, Weight] = {}  # Phi-3 stores q|k|v and gate|up as one matrix each: split them
    if src.has(a + "qkv_proj.weight"):
        q, k, v = split_rows(src.get(a + "qkv_proj.weight"), [heads * hd, kvh * hd, kvh * hd])
        fused = {"q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v}
    if src.has(p + "mlp.gate_up_proj.weight"):
        gate_up = src.get(p + "mlp.gate_up_proj.weight")
        gate, up = split_rows(gate_up, [gate_up.shape[0] // 2] * 2)
        fused |= {"gate_proj.weight": gate, "up_proj.weight": up}

    def get(prefix: str, name: str) -> Weight:
        return fused[name] if name in fused else src.get(prefix + name)

    def qk(name: str, n_heads: int) -> Weight | None:
        t = fused.get(name, src.maybe(a + name))
        return None if t is None else halves_to_pairs(t, n_heads)

    def qk_vector(name: str, n_heads: int) -> Tensor | None:
        t = src.maybe_vector(a + name)
        return None if t is None else halves_to_pairs(t, n_heads)

    def qk_norm(name: str) -> Tensor | None:
        return halves_to_pairs(hf_norm(src, config, a + name), 1) if src.has(a + name) else None

    wq, wk = qk("q_proj.weight", config.heads), qk("k_proj.weight", config.kv_heads)
    if wq is None or wk is None:
        raise ValueError(f"layer {i}: q_proj / k_proj missing")
    # Gemma 3 norms both sides of attention and MLP; Llama's "post_attention" is the pre-MLP one.
    sandwich = src.has(p + "pre_feedforward_layernorm.weight")
    pre_ffn = "pre_feedforward_layernorm" if sandwich else "post_attention_layernorm"
    return LayerWeights(
        attn_norm=hf_norm(src, config, p + "input_layernorm.weight"),
        wq=wq,
        wk=wk,
        wv=get(a, "v_proj.weight"),
        wo=src.get(a + "o_proj.weight"),
        ffn_norm=hf_norm(src, config, p + pre_ffn + ".weight"),
        w_gate=get(p + "mlp.", "gate_proj.weight"),
        w_up=get(p + "mlp.", "up_proj.weight"),
        w_down=src.get(p + "mlp.down_proj.weight"),
        bq=qk_vector("q_proj.bias", config.heads),
        bk=qk_vector("k_proj.bias", config.kv_heads),
        bv=src.maybe_vector(a + "v_proj.bias"),
        q_norm=qk_norm("q_norm.weight"),
        k_norm=qk_norm("k_norm.weight"),
        post_attn_norm=hf_norm(src, config, p + "post_attention_layernorm.weight")
        if sandwich
        else None,
        post_ffn_norm=hf_norm(src, config, p + "post_feedforward_layernorm.weight")
        if sandwich
        else None,
    )
