"""GGUF files (llama.cpp's format) to `LlamaConfig` and `ShardWeights`.

Only the tensors of the requested layer range are read, one at a time, into the form a
`StoragePlan` asks for (`materialise.py`: the file's blocks, q8 blocks, or plain tensors).
"""

from dataclasses import replace
from pathlib import Path

import torch

from exo.worker.engines.config import LlamaConfig, RopeScaling, check_layer_range
from exo.worker.engines.gguf_reader import GGUFFile, MetadataValue, eos_token_ids
from exo.worker.engines.materialise import DENSE_PLAN, StoragePlan, StoredTensor, TensorSource
from exo.worker.engines.qtensor import Weight
from exo.worker.engines.weights import (
    LayerWeights,
    ProgressCallback,
    ShardWeights,
    TensorParallel,
    assemble_shard,
    halves_to_pairs,
    split_rows,
)

__all__ = ["LlamaConfig", "gguf_config", "load_gguf_config", "load_gguf_shard"]

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3")
# llama.cpp's converter permutes q/k of these into the interleaved rotary layout; the others
# (NEOX rotary in llama.cpp) keep the Hugging Face half-split layout, which we permute on load.
_INTERLEAVED_IN_FILE = ("llama", "mistral")


def _get(meta: dict[str, MetadataValue], key: str) -> MetadataValue:
    if key not in meta:
        raise ValueError(f"GGUF metadata lacks {key!r}")
    return meta[key]


def _int(meta: dict[str, MetadataValue], key: str, default: int | None = None) -> int:
    value = meta.get(key, default) if default is not None else _get(meta, key)
    if not isinstance(value, int):
        raise ValueError(f"GGUF metadata {key!r} should be an integer, got {value!r}")
    return value


def _float(meta: dict[str, MetadataValue], key: str, default: float) -> float:
    value = meta.get(key, default)
    if not isinstance(value, int | float):
        raise ValueError(f"GGUF metadata {key!r} should be a number, got {value!r}")
    return float(value)


def _rope_scaling(meta: dict[str, MetadataValue], arch: str) -> RopeScaling | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = _float(meta, f"{arch}.rope.scaling.factor", 1.0)
    if kind == "linear" and factor != 1.0:
        return RopeScaling(kind="linear", factor=factor)
    if kind not in (None, "none", "linear"):
        raise ValueError(f"rope scaling {kind!r} is not supported")
    return None  # llama3-style scaling ships as the `rope_freqs.weight` tensor instead


def _with_gemma3(c: LlamaConfig, meta: dict[str, MetadataValue]) -> LlamaConfig:
    """What llama.cpp fixes for Gemma 3 rather than storing it: every 6th layer global, local
    rotary base 10000, attention scale 1/sqrt(head_dim) (1/sqrt(hidden/heads) for the 27B)."""
    pattern = _int(meta, "gemma3.attention.sliding_window_pattern", 6)
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
        rope_theta_local=_float(meta, "gemma3.rope.freq_base_swa", 10000.0),
        final_softcap=float(softcap) if isinstance(softcap, int | float) else None,
    )


def gguf_config(f: GGUFFile) -> LlamaConfig:
    """The model shape described by an open GGUF file's metadata."""
    meta = f.metadata
    arch = _get(meta, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"architecture {arch!r} is not supported (only {SUPPORTED_ARCHITECTURES})")
    hidden = _int(meta, f"{arch}.embedding_length")
    heads = _int(meta, f"{arch}.attention.head_count")
    template = meta.get("tokenizer.chat_template")
    bos = meta.get("tokenizer.ggml.bos_token_id")
    n_layers = _int(meta, f"{arch}.block_count")
    head_dim = _int(meta, f"{arch}.attention.key_length", hidden // heads)
    if _int(meta, f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise ValueError("partial rotary embeddings are not supported")
    config = LlamaConfig(
        architecture=arch,
        n_layers=n_layers,
        hidden=hidden,
        ffn=_int(meta, f"{arch}.feed_forward_length"),
        heads=heads,
        kv_heads=_int(meta, f"{arch}.attention.head_count_kv", heads),
        head_dim=head_dim,
        rope_theta=_float(meta, f"{arch}.rope.freq_base", 10000.0),
        rms_eps=_float(meta, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
        vocab=f.tensors["token_embd.weight"].shape[0],
        context_length=_int(meta, f"{arch}.context_length", 4096),
        tie_embeddings="output.weight" not in f.tensors,
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_ids=eos_token_ids(meta),
        chat_template=template if isinstance(template, str) else None,
        qkv_bias="blk.0.attn_q.bias" in f.tensors,
        qk_norm="blk.0.attn_q_norm.weight" in f.tensors,
        rope_scaling=_rope_scaling(meta, arch),
    )
    window = meta.get(f"{arch}.attention.sliding_window")
    if arch == "phi3" and isinstance(window, int):  # every layer slides
        return replace(config, sliding_window=window, sliding_layers=(True,) * n_layers)
    return _with_gemma3(config, meta) if arch == "gemma3" else config


def load_gguf_config(path: Path) -> LlamaConfig:
    f = GGUFFile(path)
    try:
        return gguf_config(f)
    finally:
        f.close()


class _TensorSource(TensorSource):
    def __init__(self, f: GGUFFile, plan: StoragePlan) -> None:
        super().__init__(plan)
        self.f = f

    def has(self, name: str) -> bool:
        return name in self.f.tensors

    def stored(self, name: str) -> StoredTensor:
        if name not in self.f.tensors:
            raise ValueError(f"GGUF file lacks tensor {name!r}")
        info = self.f.tensors[name]
        return StoredTensor(self.f, name, info.qtype.name, info.shape)


def _layer(src: _TensorSource, config: LlamaConfig, i: int) -> LayerWeights:
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


def load_gguf_shard(
    path: Path,
    start_layer: int,
    end_layer: int,
    *,
    dtype: torch.dtype = torch.float32,
    progress: ProgressCallback | None = None,
    plan: StoragePlan | None = None,
    tensor_parallel: TensorParallel | None = None,
) -> ShardWeights:
    """Layers [start_layer, end_layer) of a GGUF model, held as `plan` says (default: every
    tensor dequantised to `dtype`); with `tensor_parallel`, each layer is sliced as it loads."""
    f = GGUFFile(path)
    try:
        config = gguf_config(f)
        check_layer_range(config, start_layer, end_layer)
        src = _TensorSource(f, plan or replace(DENSE_PLAN, dtype=dtype))

        def head(embed: Weight | None) -> Weight:
            if config.tie_embeddings:
                return embed if embed is not None else src.get("token_embd.weight")
            return src.get("output.weight")

        freq_factors = f.tensors.get("rope_freqs.weight")
        return assemble_shard(
            config,
            start_layer,
            end_layer,
            layer=lambda i: _layer(src, config, i),
            embedding=lambda: src.get("token_embd.weight"),
            head=head,
            final_norm=lambda: src.vector("output_norm.weight"),
            source_format=f.tensors[f"blk.{start_layer}.ffn_down.weight"].qtype.name,
            progress=progress,
            tensor_parallel=tensor_parallel,
            rope_freq_factors=None
            if freq_factors is None
            else torch.from_numpy(f.load(freq_factors.name)),
        )
    finally:
        f.close()
