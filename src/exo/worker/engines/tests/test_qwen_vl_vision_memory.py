"""A Qwen2.5-VL / Qwen3-VL card's tower memory: the bytes in the card are the bytes the loaded
tower holds (tiny folders written by transformers), the largest image is the preprocessor's
max_pixels, and the hub configs of Qwen2.5-VL-7B and Qwen3-VL-8B give the parameter count of
transformers' own vision model (built on the meta device: no memory)."""

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from exo.shared.models.qwen_vision_memory import (
    DEFAULT_MAX_PIXELS,
    QwenTowerShape,
    qwen_activation_bytes,
    qwen_tower_params,
)
from exo.worker.download.vision_card import config_vision_fields, local_vision_fields
from exo.worker.engines.models.qwen_vl_encoder import QwenVision
from exo.worker.engines.models.qwen_vl_vision import QwenVisionTower
from exo.worker.engines.tests.qwen_vl_models import qwen3_config, qwen25_config, write_model

transformers = pytest.importorskip("transformers")


def _tensors(value: object) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]  # pyright: ignore[reportUnknownVariableType]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in _tensors(getattr(value, f.name))]
    return []


def _held_bytes(tower: QwenVisionTower) -> int:
    """Every weight the loaded tower keeps (not its rotary frequencies: computed, not loaded)."""
    held = _tensors([tower.patch, tower.positions, tower.blocks, tower.merger, tower.deepstack])
    return sum(x.numel() * x.element_size() for x in held)


@pytest.mark.parametrize("make", [qwen25_config, qwen3_config], ids=["qwen2.5-vl", "qwen3-vl"])
def test_card_counts_the_towers_actual_bytes(make: Any, tmp_path: Path) -> None:
    folder = write_model(make(), tmp_path / "vl")
    vision = QwenVision.load(folder)
    fields = local_vision_fields(folder)
    assert fields["vision_bytes"] == _held_bytes(vision.tower) > 0
    config = json.loads((folder / "config.json").read_text())
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    shape = QwenTowerShape.from_config(config, pre)
    assert shape is not None and shape.max_pixels == vision.processing.max_pixels
    assert fields["vision_activation_bytes"] == qwen_activation_bytes(shape) > 0
    # without the preprocessor (a hub repo that lists none): the processor's default limit
    bigger = config_vision_fields(config)
    assert QwenTowerShape.from_config(config) == dataclasses.replace(
        shape, max_pixels=DEFAULT_MAX_PIXELS
    )
    assert bigger["vision_bytes"] == fields["vision_bytes"]
    assert bigger["vision_activation_bytes"] > fields["vision_activation_bytes"]


QWEN25_7B = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
             "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
             "temporal_patch_size": 2, "window_size": 112, "in_chans": 3,
             "fullatt_block_indexes": [7, 15, 23, 31], "hidden_act": "silu"}  # fmt: skip
QWEN3_8B = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
            "out_hidden_size": 4096, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "num_position_embeddings": 2304, "in_channels": 3,
            "deepstack_visual_indexes": [8, 16, 24], "hidden_act": "gelu_pytorch_tanh"}  # fmt: skip


def _meta_tower_params(config: Any) -> int:
    cls = (
        transformers.Qwen3VLForConditionalGeneration
        if config.model_type == "qwen3_vl"
        else transformers.Qwen2_5_VLForConditionalGeneration
    )
    with torch.device("meta"):
        model = cls(config)
    return sum(p.numel() for p in model.model.visual.parameters())


@pytest.mark.parametrize(
    ("name", "vision", "text_hidden"),
    [("qwen2_5_vl", QWEN25_7B, 3584), ("qwen3_vl", QWEN3_8B, 4096)],
    ids=["qwen2.5-vl-7b", "qwen3-vl-8b"],
)
def test_real_towers_parameter_count(name: str, vision: dict[str, Any], text_hidden: int) -> None:
    text = {"hidden_size": text_hidden, "num_hidden_layers": 1, "vocab_size": 8,
            "intermediate_size": 16, "num_attention_heads": 4, "num_key_value_heads": 4}  # fmt: skip
    cls = transformers.Qwen3VLConfig if name == "qwen3_vl" else transformers.Qwen2_5_VLConfig
    config = cls(text_config=text, vision_config=vision)
    hub_style = {"model_type": name, "vision_config": vision, **text}
    shape = QwenTowerShape.from_config(hub_style)
    assert shape is not None
    assert qwen_tower_params(shape) == _meta_tower_params(config)
    fields = config_vision_fields(hub_style)
    assert fields["vision_bytes"] == qwen_tower_params(shape) * 4
    # the default limit (1280 tokens an image): a few GiB at most, never nothing
    assert 2**20 < fields["vision_activation_bytes"] < 8 * 2**30
