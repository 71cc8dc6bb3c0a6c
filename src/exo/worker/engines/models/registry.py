"""The architecture families the engine runs, keyed by GGUF `general.architecture` and Hugging
Face `model_type`. A new family is one module providing a `ModelFamily`, listed here."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from exo.worker.engines.images import VisionEncoder
from exo.worker.engines.models.base import ModelFamily
from exo.worker.engines.models.deepseek2 import DEEPSEEK2
from exo.worker.engines.models.dense import DENSE
from exo.worker.engines.models.gemma3_mm import GEMMA3_VISION, Gemma3Encoder
from exo.worker.engines.models.glm4moe import GLM4MOE
from exo.worker.engines.models.gpt_oss import GPT_OSS
from exo.worker.engines.models.qwen3moe import QWEN3MOE
from exo.worker.engines.models.qwen_vl import QWEN_VL
from exo.worker.engines.models.qwen_vl_encoder import QwenVLEncoder

Family = ModelFamily[Any]  # each family has its own layer record

# Families that take images come last, each on its own line (branches add theirs).
FAMILIES: tuple[Family, ...] = (
    DENSE, QWEN3MOE, GPT_OSS, DEEPSEEK2, GLM4MOE,
    GEMMA3_VISION,  # gemma3 vision (issue 25)
    QWEN_VL,  # qwen-vl (issue 25)
)  # fmt: skip

VisionLoader = Callable[[Path, torch.dtype], VisionEncoder]
# A vision family's name -> the loader of its image path (a folder in, the encoder out).
VISION_LOADERS: dict[str, VisionLoader] = {}
# gemma3 vision (issue 25)
VISION_LOADERS[GEMMA3_VISION.name] = Gemma3Encoder.load
# qwen-vl (issue 25)
VISION_LOADERS[QWEN_VL.name] = QwenVLEncoder.load


def supported_gguf_architectures() -> tuple[str, ...]:
    return tuple(a for f in FAMILIES for a in f.gguf_architectures)


def supported_hf_model_types() -> tuple[str, ...]:
    return tuple(t for f in FAMILIES for t in f.hf_model_types)


def family_for_gguf(architecture: str) -> Family:
    """The family of a GGUF file's `general.architecture`; ValueError naming it and the
    supported ones otherwise."""
    for family in FAMILIES:
        if architecture in family.gguf_architectures:
            return family
    raise ValueError(
        f"architecture {architecture!r} is not supported (supported GGUF architectures: "
        f"{', '.join(supported_gguf_architectures())})"
    )


def family_for_hf(model_type: str) -> Family:
    """The family of a Hugging Face `model_type`; ValueError naming it and the supported ones."""
    for family in FAMILIES:
        if model_type in family.hf_model_types:
            return family
    raise ValueError(
        f"model_type {model_type!r} is not supported (supported Hugging Face model types: "
        f"{', '.join(supported_hf_model_types())})"
    )
