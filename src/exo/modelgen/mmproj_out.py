"""Gemma 3's vision tower and projector written as llama.cpp's ``mmproj`` GGUF, from a
Gemma3ForConditionalGeneration safetensors folder (``config.json``, its weights and, when
present, ``preprocessor_config.json``). The layout is the one
`exo.worker.engines.models.gemma3_mmproj` reads (and llama.cpp's multimodal tools load):
``clip.*`` metadata, ``v.*`` tower tensors, ``mm.*`` projector tensors, the projector's norm
stored as ``1 + w``.
"""

import json
import math
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from safetensors import safe_open

from exo.worker.engines.models.gemma3_mmproj import DEFAULT_POOL, gguf_to_hf_names

# Where transformers keeps the tower and projector (hub layout first, then transformers 5's).
_LAYOUTS = (
    ("vision_tower.vision_model.", "multi_modal_projector."),
    ("model.vision_tower.vision_model.", "model.multi_modal_projector."),
    ("model.vision_tower.", "model.multi_modal_projector."),
    ("vision_tower.", "multi_modal_projector."),
)
MatrixType = Literal["F32", "F16"]


def _read_vision_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The tower and projector's tensors, renamed to the hub's layout."""
    found: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            names: list[str] = list(f.keys())
            for name in names:
                found[name] = f.get_tensor(name)
    for tower, projector in _LAYOUTS:
        if f"{tower}embeddings.patch_embedding.weight" in found:
            out: dict[str, torch.Tensor] = {}
            for name, t in found.items():
                if name.startswith(tower):
                    out["vision_tower.vision_model." + name[len(tower) :]] = t
                elif name.startswith(projector):
                    out["multi_modal_projector." + name[len(projector) :]] = t
            return out
    raise ValueError(f"{folder}: no Gemma 3 vision tower in the safetensors files")


def _config(folder: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    raw = cast(dict[str, Any], json.loads((folder / "config.json").read_text()))
    vision = raw.get("vision_config")
    if not isinstance(vision, dict):
        raise ValueError(f"{folder}: config.json has no vision_config")
    pre_path = folder / "preprocessor_config.json"
    pre = cast(dict[str, Any], json.loads(pre_path.read_text())) if pre_path.exists() else {}
    return raw, cast(dict[str, Any], vision), pre


def _add_metadata(w: GGUFWriter, raw: dict[str, Any], vision: dict[str, Any],
                  pre: dict[str, Any]) -> None:  # fmt: skip
    text = cast(dict[str, Any], raw.get("text_config") or {})
    image_size = int(vision.get("image_size", 224))
    patch_size = int(vision.get("patch_size", 16))
    per_side = math.isqrt(int(raw.get("mm_tokens_per_image", 256)))
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type("gemma3")
    w.add_vision_image_size(image_size)
    w.add_vision_patch_size(patch_size)
    w.add_vision_embedding_length(int(vision.get("hidden_size", 768)))
    w.add_vision_feed_forward_length(int(vision.get("intermediate_size", 3072)))
    w.add_vision_block_count(int(vision.get("num_hidden_layers", 12)))
    w.add_vision_head_count(int(vision.get("num_attention_heads", 12)))
    w.add_vision_attention_layernorm_eps(float(vision.get("layer_norm_eps", 1e-6)))
    w.add_vision_projection_dim(int(text.get("hidden_size", 2560)))
    w.add_vision_image_mean([float(v) for v in pre.get("image_mean", [0.5, 0.5, 0.5])])
    w.add_vision_image_std([float(v) for v in pre.get("image_std", [0.5, 0.5, 0.5])])
    w.add_vision_use_gelu(True)
    pool = (image_size // patch_size) // max(per_side, 1)
    if pool != DEFAULT_POOL:  # llama.cpp assumes 4 when the key is absent
        w.add_vision_projector_scale_factor(pool)


def write_gemma3_mmproj(folder: Path, out: Path, matrices: MatrixType = "F32") -> Path:
    """Write ``out`` (an mmproj GGUF) from the Gemma 3 checkpoint in ``folder``. ``matrices``:
    the type of the layer and projector matrices (norms, biases and embeddings stay F32)."""
    raw, vision, pre = _config(folder)
    tensors = _read_vision_tensors(folder)
    names = gguf_to_hf_names(int(vision.get("num_hidden_layers", 12)))
    w = GGUFWriter(str(out), "clip")
    _add_metadata(w, raw, vision, pre)
    for gguf_name, hf_name in names.items():
        t = tensors[hf_name].to(torch.float32)
        if gguf_name == "mm.soft_emb_norm.weight":
            t = t + 1.0  # llama.cpp multiplies by the stored scale directly
        matrix = t.dim() == 2 and not gguf_name.startswith("v.position_embd")
        if matrix and matrices == "F16":
            w.add_tensor(gguf_name, t.numpy().astype(np.float16),
                         raw_dtype=GGMLQuantizationType.F16)  # fmt: skip
        else:
            w.add_tensor(gguf_name, np.ascontiguousarray(t.numpy()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
