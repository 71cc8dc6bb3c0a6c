"""Gemma 3's image path: the processor (resize to the tower's square, scale to [-1, 1]), the
SigLIP tower, and the multimodal projector (average-pool the patch grid to
``mm_tokens_per_image`` soft tokens, Gemma's RMSNorm, a projection to the text width).

Loaded from a Gemma3ForConditionalGeneration safetensors folder: the tower's tensors under
``vision_tower.vision_model.`` (the hub's layout) or ``vision_tower.`` (transformers 5's), the
projector's under ``multi_modal_projector.`` (either optionally under ``model.``).
"""

import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors import safe_open
from torch import Tensor

from exo.shared.types.text_generation import InputImage
from exo.worker.engines.images import chunk_end, placeholder_runs
from exo.worker.engines.models.siglip import SiglipConfig, SiglipEncoder

__all__ = ["Gemma3Vision", "Gemma3VisionConfig", "chunk_end", "image_attention_mask",
           "image_spans", "merge_images", "pixel_values"]  # fmt: skip

_TOWER = ("model.vision_tower.vision_model.", "vision_tower.vision_model.", "model.vision_tower.",
          "vision_tower.")  # fmt: skip
_PROJECTOR = ("model.multi_modal_projector.", "multi_modal_projector.")


@dataclass(frozen=True)
class Gemma3VisionConfig:
    tower: SiglipConfig
    text_hidden: int
    tokens_per_image: int
    image_token: int
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @classmethod
    def from_folder(cls, folder: Path) -> "Gemma3VisionConfig":
        raw = cast(dict[str, Any], json.loads((folder / "config.json").read_text()))
        vision = raw.get("vision_config")
        if not isinstance(vision, dict):
            raise ValueError(f"{folder}: config.json has no vision_config")
        text = cast(dict[str, Any], raw.get("text_config") or {})
        mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
        pre = folder / "preprocessor_config.json"
        if pre.exists():
            p = cast(dict[str, Any], json.loads(pre.read_text()))
            mean = cast(tuple[float, float, float], tuple(p.get("image_mean", mean)))
            std = cast(tuple[float, float, float], tuple(p.get("image_std", std)))
        return cls(
            tower=SiglipConfig.from_hf(cast(dict[str, object], vision)),
            text_hidden=int(text.get("hidden_size", 2560)),
            tokens_per_image=int(raw.get("mm_tokens_per_image", 256)),
            image_token=int(raw.get("image_token_index", 262144)),
            mean=mean,
            std=std,
        )


def pixel_values(image: InputImage, config: Gemma3VisionConfig) -> Tensor:
    """As transformers' Gemma 3 image processor: RGB, bilinear resize to the tower's square,
    scaled to [0, 1], normalised by the mean and std: ``[3, S, S]`` float32."""
    size = config.tower.image_size
    with Image.open(io.BytesIO(image.data)) as file:  # the first frame
        resized = file.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
    x = torch.from_numpy(np.asarray(resized, dtype=np.float32) / 255.0).permute(2, 0, 1)
    mean = torch.tensor(config.mean).view(3, 1, 1)
    std = torch.tensor(config.std).view(3, 1, 1)
    return (x - mean) / std


class Gemma3Vision:
    """Images -> their soft tokens ``[n_images, tokens_per_image, text_hidden]``."""

    def __init__(self, config: Gemma3VisionConfig, tensors: dict[str, Tensor],
                 dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
        self.config = config
        self.dtype = dtype
        tower = _under(tensors, _TOWER, "embeddings.patch_embedding.weight")
        projector = _under(tensors, _PROJECTOR, "mm_input_projection_weight")
        self.tower = SiglipEncoder(config.tower, lambda name: tower[name], dtype)
        self.projection = projector["mm_input_projection_weight"].to(dtype)  # [Dv, Dt]
        self.norm = projector["mm_soft_emb_norm.weight"].to(torch.float32)
        side = config.tower.patches_per_side
        per_side = math.isqrt(config.tokens_per_image)
        if per_side * per_side != config.tokens_per_image or side % per_side:
            raise ValueError(
                f"mm_tokens_per_image {config.tokens_per_image} does not pool a "
                f"{side}x{side} patch grid"
            )
        self.kernel = side // per_side

    @classmethod
    def load(cls, folder: Path, dtype: torch.dtype = torch.float32) -> "Gemma3Vision":
        config = Gemma3VisionConfig.from_folder(folder)
        tensors: dict[str, Tensor] = {}
        for path in sorted(folder.glob("*.safetensors")):
            with safe_open(str(path), "pt") as f:
                names: list[str] = list(f.keys())
                for name in names:
                    if name.startswith(_TOWER + _PROJECTOR):
                        tensors[name] = f.get_tensor(name)
        return cls(config, tensors, dtype)

    @torch.inference_mode()
    def __call__(self, images: list[InputImage]) -> Tensor:
        pixels = torch.stack([pixel_values(im, self.config) for im in images]).to(self.dtype)
        return self.project(self.tower(pixels))

    def project(self, patches: Tensor) -> Tensor:
        b, _, d = patches.shape
        side = self.config.tower.patches_per_side
        grid = patches.transpose(1, 2).reshape(b, d, side, side)
        pooled = F.avg_pool2d(grid, self.kernel, self.kernel).flatten(2).transpose(1, 2)
        x = pooled.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.tower.eps)
        x = (x * (1.0 + self.norm)).to(self.dtype)
        return x @ self.projection


def _under(tensors: dict[str, Tensor], prefixes: tuple[str, ...], probe: str) -> dict[str, Tensor]:
    """The tensors under the first prefix that holds ``probe``, the prefix removed."""
    for prefix in prefixes:
        if prefix + probe in tensors:
            return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    raise ValueError(f"the checkpoint has no {probe} under {' or '.join(prefixes)}")


image_spans = placeholder_runs  # each run of image placeholders in a prompt: (start, length)


def merge_images(hidden: Tensor, ids: Tensor, embeds: Tensor, image_token: int) -> Tensor:
    """The prompt's hidden states ``[T, D]`` (the token embeddings, already scaled) with its
    image placeholder positions replaced, in order, by the images' soft tokens ``[n, N, D]``
    (not scaled: Gemma scales text embeddings only)."""
    where = ids == image_token
    flat = embeds.reshape(-1, embeds.shape[-1]).to(hidden.dtype)
    if int(where.sum()) != flat.shape[0]:
        raise ValueError(
            f"the prompt has {int(where.sum())} image positions for {flat.shape[0]} soft tokens"
        )
    out = hidden.clone()
    out[where] = flat
    return out


def image_attention_mask(
    n: int, spans: Sequence[tuple[int, int]], window: int | None = None
) -> Tensor:
    """Gemma 3's prefill mask ``[n, n]`` (True: attend): causal, and every position of an
    image sees the whole image (bidirectional within it); a sliding layer's ``window`` also
    limits how far back a position sees."""
    q = torch.arange(n).view(-1, 1)
    k = torch.arange(n).view(1, -1)
    block = torch.full((n,), -1)
    for i, (start, length) in enumerate(spans):
        block[start : start + length] = i
    same_image = (block.view(-1, 1) == block.view(1, -1)) & (block.view(-1, 1) >= 0)
    mask = (k <= q) | same_image
    if window is not None:
        mask &= q - k < window
    return mask
