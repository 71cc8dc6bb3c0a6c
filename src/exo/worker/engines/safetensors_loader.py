"""Hugging Face model folders (config.json + *.safetensors) to `LlamaConfig` and `ShardWeights`.

Only the tensors of the requested layer range are read, one at a time, into the form a
`StoragePlan` asks for (`materialise.py`).
q/k rows are permuted from Hugging Face's half-split rotary layout to our interleaved one.
"""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from exo.worker.engines.config import Activation, LlamaConfig, RopeScaling, check_layer_range
from exo.worker.engines.file_rows import SafetensorsFile
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

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "phi3")
# Gemma's RMSNorm multiplies by (1 + w): its stored norm weights are offsets from one.
_NORM_OFFSET = {"gemma3_text": 1.0}

JsonDict = dict[str, Any]


def _read_json(path: Path) -> JsonDict:
    return cast(JsonDict, json.loads(path.read_text(encoding="utf-8")))


def read_chat_template(folder: Path) -> str | None:
    """The chat template of a Hugging Face folder: chat_template.jinja or tokenizer_config.json."""
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    tok_config = folder / "tokenizer_config.json"
    if not tok_config.exists():
        return None
    template = _read_json(tok_config).get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {str(t["name"]): str(t["template"]) for t in cast(list[JsonDict], template)}
        return named.get("default")
    return None


def _rope_params(raw: JsonDict, layer_type: str) -> JsonDict | None:
    """The rotary parameters of one kind of layer (Gemma 3 keys them by layer type)."""
    params = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not isinstance(params, dict):
        return None
    p = cast(JsonDict, params)
    if isinstance(p.get(layer_type), dict):
        return cast(JsonDict, p[layer_type])
    if any(isinstance(v, dict) for v in p.values()):  # keyed by type, but not this one
        return None
    return p


def _rope_scaling(raw: JsonDict) -> RopeScaling | None:
    p = _rope_params(raw, "full_attention")
    if p is None:
        return None
    kind = p.get("rope_type", p.get("type", "default"))
    if kind in ("default", None):
        return None
    factor = float(p.get("factor", 1.0))
    if kind == "linear":
        return RopeScaling(kind="linear", factor=factor)
    if kind == "llama3":
        return RopeScaling(
            kind="llama3",
            factor=factor,
            low_freq_factor=float(p.get("low_freq_factor", 1.0)),
            high_freq_factor=float(p.get("high_freq_factor", 4.0)),
            original_context_length=int(p.get("original_max_position_embeddings", 8192)),
        )
    raise ValueError(f"rope scaling {kind!r} is not supported")


def _rope_theta(raw: JsonDict, layer_type: str = "full_attention") -> float | None:
    if layer_type == "full_attention" and "rope_theta" in raw:
        return float(raw["rope_theta"])
    if layer_type == "sliding_attention" and "rope_local_base_freq" in raw:
        return float(raw["rope_local_base_freq"])
    params = _rope_params(raw, layer_type)
    if params is not None and "rope_theta" in params:
        return float(params["rope_theta"])
    return None


_ACTIVATIONS: dict[str, Activation] = {
    "silu": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
}


def _activation(raw: JsonDict) -> Activation:
    name = str(raw.get("hidden_activation") or raw.get("hidden_act") or "silu")
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not supported ({sorted(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def _sliding(raw: JsonDict, model_type: str, n_layers: int) -> tuple[int | None, tuple[bool, ...]]:
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


def hf_config(folder: Path) -> LlamaConfig:
    """The model shape described by a Hugging Face folder's config.json."""
    raw = _read_json(folder / "config.json")
    model_type = str(raw.get("model_type", ""))
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported ({SUPPORTED_MODEL_TYPES})")
    hidden, heads = int(raw["hidden_size"]), int(raw["num_attention_heads"])
    eos = raw.get("eos_token_id")
    eos_ids = tuple(int(e) for e in cast(list[int], eos)) if isinstance(eos, list) else ()
    if isinstance(eos, int):
        eos_ids = (eos,)
    bos = raw.get("bos_token_id")
    qkv_bias = model_type == "qwen2" or bool(raw.get("attention_bias", False))
    gemma = model_type == "gemma3_text"
    partial = (_rope_params(raw, "full_attention") or {}).get("partial_rotary_factor", 1.0)
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
        rope_theta=_rope_theta(raw) or (1_000_000.0 if gemma else 10000.0),
        rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
        vocab=int(raw["vocab_size"]),
        context_length=int(raw.get("max_position_embeddings", 4096)),
        tie_embeddings=bool(raw.get("tie_word_embeddings", gemma)),
        bos_token_id=bos if isinstance(bos, int) else None,
        eos_token_ids=eos_ids,
        chat_template=read_chat_template(folder),
        qkv_bias=qkv_bias,
        qk_norm=model_type in ("qwen3", "gemma3_text"),
        rope_scaling=_rope_scaling(raw),
        activation=_activation(raw),
        embed_scale=hidden**0.5 if gemma else None,
        attn_scale=float(scalar) ** -0.5 if isinstance(scalar, int | float) else None,
        sliding_window=window,
        sliding_layers=sliding_layers,
        rope_theta_local=(_rope_theta(raw, "sliding_attention") or 10000.0) if gemma else None,
        final_softcap=float(softcap) if isinstance(softcap, int | float) else None,
    )


class _TensorSource(TensorSource):
    """Tensor name -> the safetensors file holding it; each tensor read when asked for."""

    def __init__(self, folder: Path, plan: StoragePlan) -> None:
        super().__init__(plan)
        self.where: dict[str, SafetensorsFile] = {}
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise ValueError(f"no *.safetensors file in {folder}")
        self.files = [SafetensorsFile(file) for file in files]
        for st in self.files:
            for key in st.tensors:
                self.where[key] = st

    def close(self) -> None:
        for st in self.files:
            st.close()

    def has(self, name: str) -> bool:
        return name in self.where

    def stored(self, name: str) -> StoredTensor:
        if name not in self.where:
            raise ValueError(f"tensor {name!r} not found in the safetensors files")
        info = self.where[name].tensors[name]
        return StoredTensor(self.where[name], name, info.dtype, info.shape)

    def stored_dtype(self, name: str) -> str:
        """The file's dtype of a tensor, upper case ("BF16", "F16", "F32")."""
        return self.where[name].tensors[name].dtype.upper()


def _norm(src: _TensorSource, config: LlamaConfig, name: str) -> Tensor:
    """A norm's gain (Gemma stores gain - 1)."""
    return src.vector(name) + _NORM_OFFSET.get(config.architecture, 0.0)


def _layer(src: _TensorSource, config: LlamaConfig, i: int) -> LayerWeights:
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
        return halves_to_pairs(_norm(src, config, a + name), 1) if src.has(a + name) else None

    wq, wk = qk("q_proj.weight", config.heads), qk("k_proj.weight", config.kv_heads)
    if wq is None or wk is None:
        raise ValueError(f"layer {i}: q_proj / k_proj missing")
    # Gemma 3 norms both sides of attention and MLP; Llama's "post_attention" is the pre-MLP one.
    sandwich = src.has(p + "pre_feedforward_layernorm.weight")
    pre_ffn = "pre_feedforward_layernorm" if sandwich else "post_attention_layernorm"
    return LayerWeights(
        attn_norm=_norm(src, config, p + "input_layernorm.weight"),
        wq=wq,
        wk=wk,
        wv=get(a, "v_proj.weight"),
        wo=src.get(a + "o_proj.weight"),
        ffn_norm=_norm(src, config, p + pre_ffn + ".weight"),
        w_gate=get(p + "mlp.", "gate_proj.weight"),
        w_up=get(p + "mlp.", "up_proj.weight"),
        w_down=src.get(p + "mlp.down_proj.weight"),
        bq=qk_vector("q_proj.bias", config.heads),
        bk=qk_vector("k_proj.bias", config.kv_heads),
        bv=src.maybe_vector(a + "v_proj.bias"),
        q_norm=qk_norm("q_norm.weight"),
        k_norm=qk_norm("k_norm.weight"),
        post_attn_norm=_norm(src, config, p + "post_attention_layernorm.weight")
        if sandwich
        else None,
        post_ffn_norm=_norm(src, config, p + "post_feedforward_layernorm.weight")
        if sandwich
        else None,
    )


def load_hf_shard(
    folder: Path,
    start_layer: int,
    end_layer: int,
    *,
    dtype: torch.dtype = torch.float32,
    progress: ProgressCallback | None = None,
    plan: StoragePlan | None = None,
    tensor_parallel: TensorParallel | None = None,
) -> ShardWeights:
    """Layers [start_layer, end_layer) of a Hugging Face safetensors model, held as `plan` says
    (default: plain tensors in `dtype`); with `tensor_parallel`, each layer is sliced as it
    loads."""
    config = hf_config(folder)
    check_layer_range(config, start_layer, end_layer)
    src = _TensorSource(folder, plan or replace(DENSE_PLAN, dtype=dtype))
    try:
        return _load(src, config, start_layer, end_layer, progress, tensor_parallel)
    finally:
        src.close()


def _load(
    src: _TensorSource,
    config: LlamaConfig,
    start_layer: int,
    end_layer: int,
    progress: ProgressCallback | None,
    tensor_parallel: TensorParallel | None,
) -> ShardWeights:
    def head(embed: Weight | None) -> Weight:
        if config.tie_embeddings or not src.has("lm_head.weight"):
            return embed if embed is not None else src.get("model.embed_tokens.weight")
        return src.get("lm_head.weight")

    return assemble_shard(
        config,
        start_layer,
        end_layer,
        layer=lambda i: _layer(src, config, i),
        embedding=lambda: src.get("model.embed_tokens.weight"),
        head=head,
        final_norm=lambda: _norm(src, config, "model.norm.weight"),
        source_format=src.stored_dtype(f"model.layers.{start_layer}.mlp.down_proj.weight"),
        progress=progress,
        tensor_parallel=tensor_parallel,
    )
