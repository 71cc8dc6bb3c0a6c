"""A vision model card's memory fields (``vision_bytes``, ``vision_activation_bytes``) from
what a card builder has: a local folder's config, the mmproj GGUF beside a local file, or a hub
repo's listing. Gemma 3's tower (`vision_memory`) and Qwen2.5-VL / Qwen3-VL's
(`qwen_vision_memory`); other vision families leave them 0 for now."""

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from exo.shared.models.model_cards import HubFile, is_mmproj
from exo.shared.models.qwen_vision_memory import QwenTowerShape, qwen_vision_fields
from exo.shared.models.vision_memory import (
    VisionFields,
    VisionShape,
    card_vision_fields,
    gemma3_tower,
)
from exo.worker.engines.gguf_reader import GGUFFile


def config_vision_fields(
    config: Mapping[str, object], preprocessor: Mapping[str, object] | None = None
) -> VisionFields:
    """From a transformers ``config.json`` (Gemma 3's, Qwen2.5-VL's or Qwen3-VL's model type)
    and, for Qwen's largest image, its preprocessor_config.json when there is one."""
    qwen = QwenTowerShape.from_config(config, preprocessor)
    if qwen is not None:
        return qwen_vision_fields(qwen)
    if config.get("model_type") != "gemma3":
        return card_vision_fields(None)
    return card_vision_fields(VisionShape.from_config(config))


def _json_object(path: Path) -> dict[str, object] | None:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return cast(dict[str, object], raw) if isinstance(raw, dict) else None


def local_vision_fields(path: Path) -> VisionFields:
    """A safetensors folder's config, or the first mmproj GGUF beside a GGUF file."""
    if path.is_dir():
        raw = _json_object(path / "config.json")
        if raw is None:
            return card_vision_fields(None)
        return config_vision_fields(raw, _json_object(path / "preprocessor_config.json"))
    found = sorted(p for p in path.parent.glob("*.gguf") if p != path and is_mmproj(p.name))
    if not found:
        return card_vision_fields(None)
    f = GGUFFile(found[0])
    try:
        meta = dict(f.metadata)
        positions = f.model_shapes.get("v.position_embd.weight", (0,))[0]
    finally:
        f.close()
    qwen = QwenTowerShape.from_mmproj(meta, positions)
    if qwen is not None:
        return qwen_vision_fields(qwen)
    if meta.get("clip.projector_type") != "gemma3":
        return card_vision_fields(None)
    return card_vision_fields(VisionShape.from_mmproj(meta))


def hub_gguf_vision_fields(
    files: Sequence[HubFile], architecture: str, text_hidden: int
) -> VisionFields:
    """A hub GGUF repo with an mmproj file: Gemma 3's repos all carry the same tower."""
    if architecture != "gemma3" or not any(is_mmproj(f.path) for f in files):
        return card_vision_fields(None)
    return card_vision_fields(gemma3_tower(text_hidden))
