"""Qwen2.5-VL / Qwen3-VL's image path behind the engine's `images.VisionEncoder`:

prompt:  the chat template writes <|vision_start|><|image_pad|><|vision_end|> per image;
         the pad becomes the image's token count of pads, (gh / 2) (gw / 2) for its
         resized patch grid (`qwen_vl_processor.grid_of`), as Qwen's processor does
encode:  the tower's tokens go where the pads are; the prompt's M-RoPE positions and
         decode delta (`mrope.mrope_positions`) and, Qwen3-VL, DeepStack feature j for
         decoder layer j ride with them (`images.ImageSpans`)
"""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open
from torch import Tensor

from exo.shared.types.text_generation import InputImage
from exo.worker.engines.images import ImageSpan, ImageSpans, placeholder_runs
from exo.worker.engines.models.hf_meta import JsonDict, read_json
from exo.worker.engines.models.mrope import mrope_positions
from exo.worker.engines.models.qwen_vl import HF_MODEL_TYPES
from exo.worker.engines.models.qwen_vl_processor import QwenImageProcessing, grid_of, image_patches
from exo.worker.engines.models.qwen_vl_vision import QwenVisionConfig, QwenVisionTower, VisionOutput

_TOWER_PREFIXES = ("model.visual.", "visual.")
# Qwen's own strings of the vision tokens (the folder's tokenizer.json says, where it has them)
_TEXTS = {"start": "<|vision_start|>", "end": "<|vision_end|>", "pad": "<|image_pad|>"}


class QwenVision:
    """A Qwen VL folder's image path: processor settings and tower."""

    def __init__(self, config: QwenVisionConfig, processing: QwenImageProcessing,
                 tower: QwenVisionTower) -> None:  # fmt: skip
        self.config = config
        self.processing = processing
        self.tower = tower

    @classmethod
    def load(cls, folder: Path, dtype: torch.dtype = torch.float32) -> "QwenVision":
        raw = read_json(folder / "config.json")
        kind = str(raw.get("model_type", ""))
        if kind not in HF_MODEL_TYPES:
            raise ValueError(f"{folder}: model_type {kind!r} is not a Qwen VL model")
        vision = cast(JsonDict, raw.get("vision_config") or {})
        config = QwenVisionConfig.from_hf(kind, vision)
        pre = folder / "preprocessor_config.json"
        processing = QwenImageProcessing.from_json(read_json(pre) if pre.exists() else {}, vision)
        tensors: dict[str, Tensor] = {}
        for path in sorted(folder.glob("*.safetensors")):
            with safe_open(str(path), "pt") as f:
                names: list[str] = list(f.keys())
                for name in names:
                    prefix = next((p for p in _TOWER_PREFIXES if name.startswith(p)), None)
                    if prefix is not None:
                        tensors[name[len(prefix) :]] = f.get_tensor(name)
        if "patch_embed.proj.weight" not in tensors:
            raise ValueError(f"{folder}: no vision tower under {' or '.join(_TOWER_PREFIXES)}")
        return cls(config, processing, QwenVisionTower(config, tensors.__getitem__, dtype))

    def encode(self, images: Sequence[InputImage]) -> VisionOutput:
        """The images' tokens (all of them, in order) and DeepStack features."""
        cut = [image_patches(image, self.processing) for image in images]
        return self.tower(torch.cat([p for p, _ in cut]), [g for _, g in cut])

    def tokens(self, image: InputImage) -> int:
        """How many placeholders an image takes in the prompt."""
        _, gh, gw = grid_of(image.width, image.height, self.processing)
        return (gh // self.processing.merge_size) * (gw // self.processing.merge_size)


def _token_texts(folder: Path, ids: dict[str, int]) -> dict[str, str]:
    """The vision tokens' text (by their config ids) in the folder's tokenizer.json."""
    path = folder / "tokenizer.json"
    if not path.exists():
        return dict(_TEXTS)
    added = cast(list[dict[str, Any]], json.loads(path.read_text()).get("added_tokens") or [])
    by_id = {int(t["id"]): str(t["content"]) for t in added}
    return {k: by_id.get(ids[k], v) for k, v in _TEXTS.items()}


class QwenVLEncoder:
    """Qwen VL's `images.VisionEncoder`: placeholder expansion, tower, M-RoPE positions."""

    def __init__(self, vision: QwenVision, image_token: int, texts: dict[str, str]) -> None:
        self.vision = vision
        self._image_token = image_token
        self._pad = texts["pad"]
        self.marker = texts["start"] + texts["pad"] + texts["end"]

    @classmethod
    def load(cls, folder: Path, dtype: torch.dtype = torch.float32) -> "QwenVLEncoder":
        raw = read_json(folder / "config.json")
        ids = {
            "start": int(raw.get("vision_start_token_id", 151652)),
            "end": int(raw.get("vision_end_token_id", 151653)),
            "pad": int(raw.get("image_token_id", 151655)),
        }
        return cls(QwenVision.load(folder, dtype), ids["pad"], _token_texts(folder, ids))

    @property
    def image_token(self) -> int:
        return self._image_token

    def tokens_for(self, image: InputImage) -> int:
        return self.vision.tokens(image)

    def expand(self, text: str, images: Sequence[InputImage]) -> str:
        parts = text.split(self.marker)
        if len(parts) - 1 != len(images):
            raise ValueError(
                f"the rendered prompt has {len(parts) - 1} image markers ({self.marker}) for "
                f"{len(images)} images"
            )
        out = [parts[0]]
        for image, rest in zip(images, parts[1:], strict=True):
            pads = self._pad * self.vision.tokens(image)
            out.append(self.marker.replace(self._pad, pads) + rest)
        return "".join(out)

    def encode(self, ids: Sequence[int], images: Sequence[InputImage]) -> ImageSpans:
        runs = placeholder_runs(ids, self.image_token)
        wanted = [self.vision.tokens(image) for image in images]
        if [n for _, n in runs] != wanted:
            raise ValueError(
                f"the prompt holds image placeholder runs of {[n for _, n in runs]} tokens "
                f"for images of {wanted}"
            )
        if not images:
            return ImageSpans((), torch.zeros(0, 0))
        out = self.vision.encode(images)
        merge = self.vision.processing.merge_size
        positions, delta = mrope_positions(ids, self.image_token, out.grids, merge)
        spans = tuple(
            ImageSpan(start, n, image.sha256)
            for (start, n), image in zip(runs, images, strict=True)
        )
        return ImageSpans(spans, out.embeds, positions=positions, rope_delta=delta,
                          deepstack=tuple(enumerate(out.deepstack)))  # fmt: skip
