"""A GGUF model's image path: llama.cpp keeps a vision model's tower and projector in a
separate ``mmproj`` GGUF beside the text model's file (``gemma3_mmproj.find_mmproj``). The
projector type in that file (``clip.projector_type``) picks the loader; a type no loader reads
leaves the model without images (the runner then refuses them with a clear message)."""

from collections.abc import Callable
from pathlib import Path

import torch
from loguru import logger

from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.images import VisionEncoder
from exo.worker.engines.models.gemma3_mm import Gemma3Encoder
from exo.worker.engines.models.gemma3_mmproj import find_mmproj, load_mmproj
from exo.worker.engines.models.qwen_vl_mmproj import PROJECTORS, load_qwen_mmproj

# (mmproj file, text GGUF file, dtype) -> the encoder
MmprojLoader = Callable[[Path, Path, torch.dtype], VisionEncoder]

# Gemma 3's image markers as its GGUF vocabulary spells them
GEMMA3_MARKERS = {"boi": "<start_of_image>", "eoi": "<end_of_image>",
                  "image": "<image_soft_token>"}  # fmt: skip


def _gemma3(mmproj: Path, text: Path, dtype: torch.dtype) -> VisionEncoder:
    return Gemma3Encoder(load_mmproj(mmproj, text, dtype), GEMMA3_MARKERS)


MMPROJ_LOADERS: dict[str, MmprojLoader] = {"gemma3": _gemma3} | dict.fromkeys(
    PROJECTORS, load_qwen_mmproj
)


def projector_type(mmproj: Path) -> str:
    f = GGUFFile(mmproj)
    try:
        return str(f.metadata.get("clip.projector_type", ""))
    finally:
        f.close()


def load_gguf_vision(model: Path, dtype: torch.dtype = torch.float32) -> VisionEncoder | None:
    """The encoder of the mmproj file beside a GGUF model file (None: there is none, or no
    loader reads its projector type)."""
    mmproj = find_mmproj(model)
    if mmproj is None:
        return None
    kind = projector_type(mmproj)
    loader = MMPROJ_LOADERS.get(kind)
    if loader is None:
        logger.warning(f"{mmproj}: projector type {kind!r} is not supported: no images")
        return None
    return loader(mmproj, model, dtype)
