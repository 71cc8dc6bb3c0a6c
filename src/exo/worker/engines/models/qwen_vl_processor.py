"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL's image processor (dynamic resolution), as transformers'
Pillow one (`Qwen2VLImageProcessorPil`) does it:

    rgb     = the first frame, transparency composited onto white
    H', W'  = round(H / f) f, round(W / f) f          f = patch * merge
              (scaled by sqrt(H W / max_pixels) down, floored, or sqrt(min_pixels / (H W)) up,
              ceiled, when H' W' leaves [min_pixels, max_pixels])
    x       = (bicubic_resize(rgb, H', W') / 255 - mean) / std            [3, H', W']
    patches = x cut into patch x patch squares, ordered merge block by merge block (each
              merge x merge block of patches consecutive, blocks in raster order), each square
              repeated `temporal` times (a still image is a clip of identical frames) and
              flattened in (channel, time, row, column) order: [gh gw, 3 temporal patch^2]
    grid    = (1, gh, gw) = (1, H' / patch, W' / patch)

The tower turns each merge x merge block into one token: an image gives gh gw / merge^2.
"""

import io
import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from exo.shared.types.text_generation import InputImage

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_MAX_ASPECT = 200  # transformers refuses images longer than 200 times their width


@dataclass(frozen=True)
class QwenImageProcessing:
    """The processor's settings (preprocessor_config.json, the tower's patch sizes)."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    mean: tuple[float, float, float] = CLIP_MEAN
    std: tuple[float, float, float] = CLIP_STD

    @classmethod
    def from_json(cls, raw: dict[str, Any], vision: dict[str, Any]) -> "QwenImageProcessing":
        """From preprocessor_config.json (`raw`; {} when absent) and the config's vision part."""
        size = cast(dict[str, Any], raw.get("size") or {})
        patch = int(vision.get("patch_size", raw.get("patch_size", 14)))
        return cls(
            patch_size=patch,
            merge_size=int(vision.get("spatial_merge_size", raw.get("merge_size", 2))),
            temporal_patch_size=int(
                vision.get("temporal_patch_size", raw.get("temporal_patch_size", 2))
            ),
            min_pixels=int(raw.get("min_pixels") or size.get("shortest_edge") or 56 * 56),
            max_pixels=int(raw.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280),
            mean=_triple(raw.get("image_mean"), CLIP_MEAN),
            std=_triple(raw.get("image_std"), CLIP_STD),
        )


def _triple(value: object, default: tuple[float, float, float]) -> tuple[float, float, float]:
    if not isinstance(value, list) or len(cast(list[float], value)) != 3:
        return default
    a, b, c = (float(v) for v in cast(list[float], value))
    return a, b, c


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int
                 ) -> tuple[int, int]:  # fmt: skip
    """The resized (height, width): multiples of `factor`, within [min_pixels, max_pixels],
    the aspect ratio kept as closely as that allows."""
    if max(height, width) / min(height, width) > _MAX_ASPECT:
        raise ValueError(
            f"image of {width}x{height} pixels: the aspect ratio must be under {_MAX_ASPECT}"
        )
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def rgb(image: InputImage) -> Image.Image:
    """The image's first frame as RGB, transparency composited onto white."""
    with Image.open(io.BytesIO(image.data)) as file:
        if "A" in file.getbands() or file.info.get("transparency") is not None:
            rgba = file.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, rgba).convert("RGB")
        return file.convert("RGB")


def grid_of(width: int, height: int, p: QwenImageProcessing) -> tuple[int, int, int]:
    """(t, gh, gw): the patch grid an image of this size is cut into."""
    h, w = smart_resize(height, width, p.patch_size * p.merge_size, p.min_pixels, p.max_pixels)
    return 1, h // p.patch_size, w // p.patch_size


def image_patches(image: InputImage, p: QwenImageProcessing) -> tuple[Tensor, tuple[int, int, int]]:
    """An image's flattened patches [gh gw, 3 temporal patch^2] (float32) and its grid."""
    picture = rgb(image)
    _, gh, gw = grid_of(picture.width, picture.height, p)
    size = (gw * p.patch_size, gh * p.patch_size)
    resized = np.asarray(picture.resize(size, Image.Resampling.BICUBIC), dtype=np.float32)
    x = (resized / np.float32(255.0) - np.array(p.mean, np.float32)) / np.array(p.std, np.float32)
    return patchify(torch.from_numpy(x).permute(2, 0, 1), p), (1, gh, gw)


def patchify(x: Tensor, p: QwenImageProcessing) -> Tensor:
    """[3, H, W] -> [gh gw, 3 temporal patch^2], merge blocks consecutive (see above)."""
    c, height, width = x.shape
    ps, m = p.patch_size, p.merge_size
    gh, gw = height // ps, width // ps
    blocks = x.reshape(c, gh // m, m, ps, gw // m, m, ps)
    blocks = blocks.permute(1, 4, 2, 5, 0, 3, 6)  # [gh/m, gw/m, m, m, C, ps, ps]
    frames = blocks.unsqueeze(5).expand(*blocks.shape[:5], p.temporal_patch_size, ps, ps)
    return frames.reshape(gh * gw, c * p.temporal_patch_size * ps * ps).contiguous()
