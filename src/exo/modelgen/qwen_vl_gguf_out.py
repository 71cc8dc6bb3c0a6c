"""Qwen2.5-VL and Qwen3-VL as llama.cpp ships them, written from a safetensors folder
(``config.json``, its weights, ``preprocessor_config.json`` when present): the text model as a
``qwen2vl`` / ``qwen3vl`` GGUF and the vision tower as its ``mmproj`` GGUF, in the layout
`exo.worker.engines.models.qwen_vl_mmproj` reads (and llama.cpp's multimodal tools load).
Float types only (F32, F16: the matrices; norms, biases and the patch frames stay F32).
"""

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from safetensors import safe_open

from exo.worker.engines.models.qwen_vl_mmproj import DEFAULT_WINDOW, PROJECTORS, tensor_names
from exo.worker.engines.models.qwen_vl_processor import QwenImageProcessing
from exo.worker.engines.models.qwen_vl_vision import QwenVisionConfig, VisionKind
from exo.worker.engines.safetensors_loader import canonical_name

MatrixType = Literal["F32", "F16"]
_TOWER_PREFIXES = ("model.visual.", "visual.")
# Hugging Face name under model.layers.N. -> llama.cpp's under blk.N.
_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}  # fmt: skip
_PROJECTOR = {kind: name for name, kind in PROJECTORS.items()}
_TEXT_ARCH: dict[VisionKind, str] = {"qwen2_5_vl": "qwen2vl", "qwen3_vl": "qwen3vl"}
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}  # fmt: skip


def _all_tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in cast(list[str], list(f.keys())):
                out[key] = f.get_tensor(key).to(torch.float32)
    return out


def _config(folder: Path) -> tuple[VisionKind, dict[str, Any]]:
    raw = cast(dict[str, Any], json.loads((folder / "config.json").read_text()))
    kind = raw.get("model_type")
    if kind == "qwen2_5_vl" or kind == "qwen3_vl":
        return kind, raw
    raise ValueError(f"{folder}: model_type {kind!r} is not qwen2_5_vl or qwen3_vl")


def _add(w: GGUFWriter, name: str, t: torch.Tensor, matrices: MatrixType) -> None:
    if t.dim() == 2 and matrices == "F16":
        w.add_tensor(name, t.numpy().astype(np.float16), raw_dtype=GGMLQuantizationType.F16)
    else:
        w.add_tensor(name, np.ascontiguousarray(t.numpy()))


def _finish(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# --- the mmproj ----------------------------------------------------------------------------------


def _tower(folder: Path) -> dict[str, torch.Tensor]:
    found = _all_tensors(folder)
    for prefix in _TOWER_PREFIXES:
        if f"{prefix}patch_embed.proj.weight" in found:
            return {k[len(prefix) :]: t for k, t in found.items() if k.startswith(prefix)}
    raise ValueError(f"{folder}: no Qwen VL vision tower in the safetensors files")


def _add_vision_metadata(w: GGUFWriter, raw: dict[str, Any], c: QwenVisionConfig,
                         pre: dict[str, Any]) -> None:  # fmt: skip
    v = cast(dict[str, Any], raw["vision_config"])
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(_PROJECTOR[c.kind])
    if c.kind == "qwen2_5_vl":
        full = list(c.full_attention_blocks)
        pattern = full[0] + 1 if full else 0
        if any(b - a != pattern for a, b in itertools.pairwise(full)):
            raise ValueError(f"fullatt_block_indexes {full} are not evenly spaced (n_wa_pattern)")
        w.add_vision_use_silu(True)
        w.add_vision_n_wa_pattern(pattern)
        if c.window_size != DEFAULT_WINDOW:
            w.add_vision_window_size(c.window_size)
        w.add_vision_image_size(int(v.get("image_size", 560)))
    else:
        w.add_vision_use_gelu(True)
        w.add_vision_is_deepstack_layers([i in c.deepstack_blocks for i in range(c.depth)])
        w.add_vision_image_size(round(c.position_embeddings**0.5) * c.patch_size)
    w.add_vision_patch_size(c.patch_size)
    w.add_vision_spatial_merge_size(c.merge_size)
    w.add_vision_embedding_length(c.hidden)
    w.add_vision_feed_forward_length(c.intermediate)
    w.add_vision_block_count(c.depth)
    w.add_vision_head_count(c.heads)
    w.add_vision_attention_layernorm_eps(1e-6)
    w.add_vision_projection_dim(c.out_hidden)
    p = QwenImageProcessing.from_json(pre, v)
    w.add_vision_min_pixels(p.min_pixels)
    w.add_vision_max_pixels(p.max_pixels)
    w.add_vision_image_mean(list(p.mean))
    w.add_vision_image_std(list(p.std))


def write_qwen_vl_mmproj(folder: Path, out: Path, matrices: MatrixType = "F32") -> Path:
    """Write ``out`` (an mmproj GGUF) from the Qwen2.5-VL or Qwen3-VL checkpoint in
    ``folder``."""
    kind, raw = _config(folder)
    pre_path = folder / "preprocessor_config.json"
    pre = cast(dict[str, Any], json.loads(pre_path.read_text())) if pre_path.exists() else {}
    config = QwenVisionConfig.from_hf(kind, cast(dict[str, Any], raw["vision_config"]))
    tower = _tower(folder)
    patch = tower["patch_embed.proj.weight"]  # [Dv, C, 2, P, P]
    if patch.shape[2] != 2:
        raise ValueError("llama.cpp's mmproj holds a temporal patch of 2 frames only")
    w = GGUFWriter(str(out), "clip")
    _add_vision_metadata(w, raw, config, pre)
    _add(w, "v.patch_embd.weight", patch[:, :, 0].contiguous(), "F32")
    _add(w, "v.patch_embd.weight.1", patch[:, :, 1].contiguous(), "F32")
    for i in range(config.depth if kind == "qwen2_5_vl" else 0):  # q, k, v apart
        for k in ("weight", "bias"):
            for x, part in zip("qkv", tower[f"blocks.{i}.attn.qkv.{k}"].chunk(3), strict=True):
                _add(w, f"v.blk.{i}.attn_{x}.{k}", part.contiguous(), matrices)
    for ours, theirs in tensor_names(config).items():
        _add(w, ours, tower[theirs], "F32" if ours == "v.position_embd.weight" else matrices)
    _finish(w)
    return out


# --- the text model ------------------------------------------------------------------------------


def text_gguf_name(hf: str) -> str | None:
    """A text tensor's llama.cpp name (None: not the text model's)."""
    hf = canonical_name(hf)
    if hf in _TOP:
        return _TOP[hf]
    if not hf.startswith("model.layers."):
        return None
    n, rest = hf.removeprefix("model.layers.").split(".", 1)
    module, kind = rest.rsplit(".", 1)
    if module not in _LAYER:
        raise ValueError(f"no GGUF name for the text tensor {hf}")
    return f"blk.{n}.{_LAYER[module]}.{kind}"


def write_qwen_vl_text_gguf(folder: Path, out: Path, vocab: Callable[[GGUFWriter], None],
                            matrices: MatrixType = "F32") -> Path:  # fmt: skip
    """Write the text model of the Qwen2.5-VL / Qwen3-VL checkpoint in ``folder`` as a
    ``qwen2vl`` / ``qwen3vl`` GGUF; ``vocab`` adds the tokenizer's keys (it must hold the vision
    tokens)."""
    kind, raw = _config(folder)
    c = cast(dict[str, Any], raw.get("text_config") or raw)
    rope = cast(dict[str, Any], c.get("rope_parameters") or c.get("rope_scaling") or {})
    sections = [int(s) for s in cast(list[int], rope["mrope_section"])]
    heads = int(c["num_attention_heads"])
    w = GGUFWriter(str(out), _TEXT_ARCH[kind])
    if c.get("head_dim"):
        w.add_key_length(int(c["head_dim"]))
        w.add_value_length(int(c["head_dim"]))
    if kind == "qwen3_vl":
        v = cast(dict[str, Any], raw["vision_config"])
        w.add_num_deepstack_layers(len(cast(list[int], v.get("deepstack_visual_indexes") or [])))
    w.add_type("model")
    w.add_context_length(int(c["max_position_embeddings"]))
    w.add_embedding_length(int(c["hidden_size"]))
    w.add_block_count(int(c["num_hidden_layers"]))
    w.add_feed_forward_length(int(c["intermediate_size"]))
    w.add_head_count(heads)
    w.add_head_count_kv(int(c.get("num_key_value_heads", heads)))
    w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
    w.add_rope_freq_base(float(c.get("rope_theta", rope.get("rope_theta", 10000.0))))
    w.add_rope_dimension_sections([*sections, 0])
    vocab(w)
    for hf, t in _all_tensors(folder).items():
        name = text_gguf_name(hf)
        if name is not None:
            _add(w, name, t, matrices)
    _finish(w)
    return out
