"""What Qwen2.5-VL's and Qwen3-VL's image path adds to the runner of the first pipeline stage
(where the tower runs): pure arithmetic from the ``vision_config``, no files, no torch.

* weights: the vision transformer as the runner holds it, float32 (`qwen_vl_vision`): patch
  embedding (a bias on Qwen3), Qwen3's learned position table, ``depth`` blocks (two norms,
  q/k/v, output, the MLP: Qwen2.5 SwiGLU with biases, Qwen3 fc1/fc2), the main merger
  (``merge^2`` patches -> one token of ``out_hidden_size``) and Qwen3's DeepStack mergers;
* activations while the largest image is encoded: the processor never lets an image exceed
  ``max_pixels`` (preprocessor_config.json; the processor's default ``28 * 28 * 1280`` when
  the card builder has no such file), so at most ``max_pixels / patch^2`` patches. Per patch:
  the input patch, the hidden state, its norm, q/k/v, the rotated q and k, the attention
  output, the 2-D rotary cos and sin, the MLP's intermediates (three of width
  ``intermediate`` for SwiGLU, two for fc1 + GELU); attention runs fused (no score matrix).
  Then the image's tokens at the text width and Qwen3's DeepStack features.
"""

from collections.abc import Mapping
from dataclasses import dataclass

from exo.shared.models.vision_memory import FLOAT32, VisionFields

QWEN_VL_TYPES = ("qwen2_5_vl", "qwen3_vl")
DEFAULT_MAX_PIXELS = 28 * 28 * 1280  # the processor's own default (1280 tokens an image)


MMPROJ_TYPES = ("qwen2.5vl_merger", "qwen3vl_merger")  # llama.cpp's projector types


@dataclass(frozen=True)
class QwenTowerShape:
    qwen3: bool
    depth: int
    hidden: int
    intermediate: int
    heads: int
    out_hidden: int
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    position_embeddings: int
    deepstack_mergers: int
    max_pixels: int = DEFAULT_MAX_PIXELS
    channels: int = 3

    @classmethod
    def from_config(
        cls, config: Mapping[str, object], preprocessor: Mapping[str, object] | None = None
    ) -> "QwenTowerShape | None":
        """From a Qwen2.5-VL / Qwen3-VL ``config.json`` (None for any other model type or
        without a ``vision_config``) and its preprocessor_config.json, when known."""
        kind = config.get("model_type")
        vision = config.get("vision_config")
        if kind not in QWEN_VL_TYPES or not isinstance(vision, dict):
            return None
        v: Mapping[str, object] = vision  # pyright: ignore[reportUnknownVariableType]
        qwen3 = kind == "qwen3_vl"
        hidden = _int(v, "hidden_size", 1280)
        deepstack = v.get("deepstack_visual_indexes")
        return cls(
            qwen3=qwen3,
            depth=_int(v, "depth", 32),
            hidden=hidden,
            intermediate=_int(v, "intermediate_size", 3420),
            heads=_int(v, "num_heads", 16),
            out_hidden=_int(v, "out_hidden_size", hidden),
            patch_size=_int(v, "patch_size", 14),
            merge_size=_int(v, "spatial_merge_size", 2),
            temporal_patch_size=_int(v, "temporal_patch_size", 2),
            position_embeddings=_int(v, "num_position_embeddings", 0) if qwen3 else 0,
            deepstack_mergers=len(deepstack) if qwen3 and isinstance(deepstack, list) else 0,  # pyright: ignore[reportUnknownArgumentType]
            max_pixels=_max_pixels(preprocessor or {}),
            channels=_int(v, "in_channels", 3),
        )

    @classmethod
    def from_mmproj(
        cls, meta: Mapping[str, object], position_rows: int = 0
    ) -> "QwenTowerShape | None":
        """From a llama.cpp mmproj GGUF's ``clip.*`` metadata (None for another projector);
        `position_rows`: the rows of its ``v.position_embd.weight`` (Qwen3-VL), 0 if none."""
        projector = meta.get("clip.projector_type")
        if projector not in MMPROJ_TYPES:
            return None
        qwen3 = projector == "qwen3vl_merger"
        flags = meta.get("clip.vision.is_deepstack_layers")
        deepstack = sum(1 for f in flags if f) if isinstance(flags, list) else 0  # pyright: ignore[reportUnknownVariableType]
        hidden = _int(meta, "clip.vision.embedding_length", 1280)
        return cls(
            qwen3=qwen3,
            depth=_int(meta, "clip.vision.block_count", 32),
            hidden=hidden,
            intermediate=_int(meta, "clip.vision.feed_forward_length", 3420),
            heads=_int(meta, "clip.vision.attention.head_count", 16),
            out_hidden=_int(meta, "clip.vision.projection_dim", hidden),
            patch_size=_int(meta, "clip.vision.patch_size", 14),
            merge_size=_int(meta, "clip.vision.spatial_merge_size", 2),
            temporal_patch_size=2,
            position_embeddings=position_rows if qwen3 else 0,
            deepstack_mergers=deepstack if qwen3 else 0,
            max_pixels=_int(meta, "clip.vision.image_max_pixels", DEFAULT_MAX_PIXELS),
        )

    @property
    def max_patches(self) -> int:
        return self.max_pixels // self.patch_size**2


def _int(raw: Mapping[str, object], key: str, default: int) -> int:
    value = raw.get(key, default)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _max_pixels(pre: Mapping[str, object]) -> int:
    """As the engine's processor reads it (`qwen_vl_processor.QwenImageProcessing`)."""
    size = pre.get("size")
    longest = _int(size, "longest_edge", 0) if isinstance(size, dict) else 0  # pyright: ignore[reportUnknownArgumentType]
    return _int(pre, "max_pixels", 0) or longest or DEFAULT_MAX_PIXELS


def qwen_tower_params(s: QwenTowerShape) -> int:
    """Values the tower holds (see the module's note)."""
    d, i = s.hidden, s.intermediate
    patch = d * s.channels * s.temporal_patch_size * s.patch_size**2 + (d if s.qwen3 else 0)
    norms = 2 * (2 * d if s.qwen3 else d)
    attention = (3 * d * d + 3 * d) + (d * d + d)
    mlp = 2 * (d * i + i) + (i * d + d) if not s.qwen3 else (d * i + i) + (i * d + d)
    block = norms + attention + mlp
    width = d * s.merge_size**2
    merger_mlp = (width * width + width) + (width * s.out_hidden + s.out_hidden)
    merger = (2 * d if s.qwen3 else d) + merger_mlp
    deepstack = s.deepstack_mergers * (2 * width + merger_mlp)
    return patch + s.position_embeddings * d + s.depth * block + merger + deepstack


def qwen_activation_bytes(s: QwenTowerShape) -> int:
    """Peak working memory of encoding the largest image (see the module's note)."""
    n, d = s.max_patches, s.hidden
    patch_in = s.channels * s.temporal_patch_size * s.patch_size**2
    per_patch = patch_in + 8 * d + 2 * (d // s.heads) + (2 if s.qwen3 else 3) * s.intermediate
    tokens = n // s.merge_size**2
    return (n * per_patch + (1 + s.deepstack_mergers) * tokens * s.out_hidden) * FLOAT32


def qwen_vision_fields(shape: QwenTowerShape) -> VisionFields:
    return {
        "vision_bytes": qwen_tower_params(shape) * FLOAT32,
        "vision_activation_bytes": qwen_activation_bytes(shape),
    }
