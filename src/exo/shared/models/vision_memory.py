"""What a vision model's image path adds to the runner that holds the first pipeline stage
(where the tower runs): pure arithmetic from the tower's shape, no files, no torch.

* weights: the SigLIP tower and Gemma's projector as the runner holds them, float32 (the
  tower is loaded dequantised whatever the file keeps: safetensors BF16 or an mmproj's F16);
* activations while one image is encoded: the patch sequence's hidden state, its norm, the
  stacked q/k/v and attention output and the MLP's intermediate (attention runs blockwise:
  no patches x patches score matrix is kept), and the image's soft tokens at the text width.

The image tokens' KV entries are positions of the request's context, which the KV estimate
already counts at the runner's maximum context.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypedDict

FLOAT32 = 4


@dataclass(frozen=True)
class VisionShape:
    hidden: int
    intermediate: int
    layers: int
    image_size: int
    patch_size: int
    text_hidden: int
    tokens_per_image: int
    channels: int = 3

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> "VisionShape | None":
        """From a transformers Gemma 3 ``config.json`` (None without a ``vision_config``)."""
        vision = config.get("vision_config")
        text = config.get("text_config")
        if not isinstance(vision, dict):
            return None
        v: Mapping[str, object] = vision  # pyright: ignore[reportUnknownVariableType]
        t: Mapping[str, object] = text if isinstance(text, dict) else {}  # pyright: ignore[reportUnknownVariableType]
        return cls(
            hidden=_int(v, "hidden_size", 768),
            intermediate=_int(v, "intermediate_size", 3072),
            layers=_int(v, "num_hidden_layers", 12),
            image_size=_int(v, "image_size", 224),
            patch_size=_int(v, "patch_size", 16),
            text_hidden=_int(t, "hidden_size", 2560),
            tokens_per_image=_int(config, "mm_tokens_per_image", 256),
            channels=_int(v, "num_channels", 3),
        )

    @classmethod
    def from_mmproj(cls, meta: Mapping[str, object]) -> "VisionShape":
        """From an mmproj GGUF's ``clip.vision.*`` metadata (llama.cpp's keys)."""
        image_size = _int(meta, "clip.vision.image_size", 224)
        patch_size = _int(meta, "clip.vision.patch_size", 16)
        per_side = image_size // patch_size // _int(meta, "clip.vision.projector.scale_factor", 4)
        return cls(
            hidden=_int(meta, "clip.vision.embedding_length", 768),
            intermediate=_int(meta, "clip.vision.feed_forward_length", 3072),
            layers=_int(meta, "clip.vision.block_count", 12),
            image_size=image_size,
            patch_size=patch_size,
            text_hidden=_int(meta, "clip.vision.projection_dim", 2560),
            tokens_per_image=per_side * per_side,
        )


def _int(raw: Mapping[str, object], key: str, default: int) -> int:
    value = raw.get(key, default)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def vision_params(s: VisionShape) -> int:
    """Values in the tower (patch embedding, positions, layers, final norm) and projector."""
    d, i = s.hidden, s.intermediate
    patch = d * s.channels * s.patch_size**2 + d
    layer = 4 * (d * d + d) + 2 * (2 * d) + (d * i + i) + (i * d + d)
    return patch + s.patches * d + s.layers * layer + 2 * d + d * s.text_hidden + d


def vision_weight_bytes(s: VisionShape) -> int:
    return vision_params(s) * FLOAT32


def vision_activation_bytes(s: VisionShape) -> int:
    """Peak working memory of encoding one image (see the module's note)."""
    n, d = s.patches, s.hidden
    tower = n * (6 * d + 2 * s.intermediate)
    return (tower + 2 * s.tokens_per_image * s.text_hidden) * FLOAT32


def gemma3_tower(text_hidden: int) -> VisionShape:
    """The tower every Gemma 3 vision model (4B, 12B, 27B) ships: SigLIP so400m at 896 px,
    patches of 14, 27 layers of width 1152, pooled to 256 soft tokens."""
    return VisionShape(hidden=1152, intermediate=4304, layers=27, image_size=896, patch_size=14,
                       text_hidden=text_hidden, tokens_per_image=256)  # fmt: skip


class VisionFields(TypedDict):
    vision_bytes: int
    vision_activation_bytes: int


def card_vision_fields(shape: VisionShape | None) -> VisionFields:
    """The model card's ``vision_bytes`` and ``vision_activation_bytes`` (both 0 without a
    tower this module knows)."""
    if shape is None:
        return {"vision_bytes": 0, "vision_activation_bytes": 0}
    return {
        "vision_bytes": vision_weight_bytes(shape),
        "vision_activation_bytes": vision_activation_bytes(shape),
    }
