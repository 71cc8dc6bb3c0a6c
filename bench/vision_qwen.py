"""Qwen2.5-VL's tower for bench/vision.py: the generator's `tiny` tower and the real-layer
Qwen2.5-VL-7B one (32 blocks of width 1280, 16 heads, SwiGLU 3420, 14-pixel patches, windows of
112 pixels with blocks 7, 15, 23, 31 full, 2x2 merge to width 3584), random weights in the
generator's scales, behind the engine's processor and tower (`qwen_vl_encoder.QwenVision`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from exo.modelgen.families.qwen_vl import QWEN25_SHAPES, VLShape, tower_tensors
from exo.worker.engines.models.qwen_vl_encoder import QwenVision
from exo.worker.engines.models.qwen_vl_processor import QwenImageProcessing
from exo.worker.engines.models.qwen_vl_vision import QwenVisionConfig, QwenVisionTower

MERGE = 2


def qwen25_config(shape: VLShape) -> QwenVisionConfig:
    t = shape.tower
    return QwenVisionConfig(kind="qwen2_5_vl", depth=t.depth, hidden=t.hidden,
                            intermediate=t.ffn, heads=t.heads, out_hidden=shape.text.hidden,
                            patch_size=t.patch, merge_size=MERGE, window_size=t.window,
                            full_attention_blocks=t.full_blocks)  # fmt: skip


def random_qwen25(shape_name: str, seed: int = 0) -> QwenVision:
    """The shape's tower with random weights (norms 1) and its processor (the shape's largest
    image: ``max_tokens`` merged tokens)."""
    shape = QWEN25_SHAPES[shape_name]
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for spec in tower_tensors("", shape.tower, shape.text.hidden, qwen3=False):
        if spec.std == 0:
            tensors[spec.hf_name] = torch.ones(spec.shape)
        else:
            tensors[spec.hf_name] = torch.randn(spec.shape, generator=g) * spec.std
    config = qwen25_config(shape)
    unit = config.patch_size * MERGE
    processing = QwenImageProcessing(patch_size=config.patch_size, merge_size=MERGE,
                                     max_pixels=shape.tower.max_tokens * unit * unit)  # fmt: skip
    return QwenVision(config, processing, QwenVisionTower(config, tensors.__getitem__))


def label(name: str, vision: QwenVision) -> str:
    """The row's name: the generator's `8b` shape is the Qwen2.5-VL-7B tower."""
    c = vision.config
    shown = "7B-shaped" if name == "8b" else name
    return (f"Qwen2.5-VL {shown} tower ({c.depth} blocks of width {c.hidden}, "
            f"-> {c.out_hidden})")  # fmt: skip
