"""Qwen2.5-VL and Qwen3-VL (dense): the vision tower's tokens in a Qwen2 / Qwen3 text model
that rotates by M-RoPE positions and adds DeepStack features.

    h_0         = E[tokens];  h_0[image placeholders] = the images' tokens, in order
    for block l (the dense family's block, `dense.py`), q, k turned by M-RoPE (`mrope.py`):
        h       = block_l(h)
        h[image positions] += deepstack_l        Qwen3-VL, for l < number of DeepStack mergers
    logits      = head(h)

The text model is the dense family's Qwen2 (q, k, v biases) or Qwen3 (per-head q, k norms);
its config.json part is `text_config` (transformers 5) or the top level (the hub's Qwen2.5-VL).
The tower (`qwen_vl_vision.py`) runs where the first pipeline stage runs; its DeepStack
features travel with the activations (`DeepStack`: flat rows of the step and one feature per
layer, applied by whichever stage holds that layer).
"""

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open
from torch import Tensor

from exo.shared.types.text_generation import InputImage
from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import dense_files
from exo.worker.engines.models.attention import StepTensors, check_step, step_tensors
from exo.worker.engines.models.base import (
    BuildOptions,
    JsonDict,
    ModelFamily,
    ShardModel,
    StepInputs,
)
from exo.worker.engines.models.dense import DenseModel
from exo.worker.engines.models.hf_meta import read_json
from exo.worker.engines.models.mrope import MRope, mrope_rotation
from exo.worker.engines.models.qwen_vl_processor import QwenImageProcessing, grid_of, image_patches
from exo.worker.engines.models.qwen_vl_vision import (
    QwenVisionConfig,
    QwenVisionTower,
    VisionOutput,
)
from exo.worker.engines.weights import LayerWeights, ShardWeights, slice_layer

HF_MODEL_TYPES = ("qwen2_5_vl", "qwen3_vl")
_TEXT_FAMILY = {"qwen2_5_vl": "qwen2", "qwen3_vl": "qwen3"}


@dataclass(frozen=True)
class QwenVLConfig(LlamaConfig):
    """The text model's shape plus what the images need."""

    mrope_sections: tuple[int, int, int] = (0, 0, 0)  # pairs turning with t, h, w
    mrope_interleaved: bool = False  # Qwen3-VL's t h w t h w .. order of the pairs
    image_token_id: int = 151655
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    deepstack_layers: int = 0  # decoder layers 0 .. n-1 receive DeepStack features

    @property
    def mrope(self) -> MRope:
        return MRope(self.mrope_sections, self.mrope_interleaved)


def _text_part(raw: JsonDict) -> JsonDict:
    """config.json's text model keys (nested `text_config` over the top level's)."""
    nested = raw.get("text_config")
    return {**raw, **cast(JsonDict, nested)} if isinstance(nested, dict) else dict(raw)


def hf_config(raw: JsonDict, folder: Path) -> QwenVLConfig:
    model_type = str(raw.get("model_type", ""))
    if model_type not in HF_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not a Qwen VL model")
    text = _text_part(raw)
    rope = cast(JsonDict, text.get("rope_parameters") or text.get("rope_scaling") or {})
    sections = cast(list[int], rope.get("mrope_section") or [])
    head_dim = int(
        text.get("head_dim") or int(text["hidden_size"]) // int(text["num_attention_heads"])
    )
    if len(sections) != 3 or sum(sections) != head_dim // 2:
        raise ValueError(f"mrope_section {sections} must be 3 sections of {head_dim // 2} pairs")
    theta = text.get(
        "rope_theta", rope.get("rope_theta", 10000.0 if model_type == "qwen2_5_vl" else 5e6)
    )
    plain = {k: v for k, v in text.items() if k not in ("rope_scaling", "rope_parameters")}
    plain |= {"model_type": _TEXT_FAMILY[model_type], "rope_theta": float(theta),
              "tie_word_embeddings": bool(raw.get("tie_word_embeddings", False))}  # fmt: skip
    base = dense_files.hf_config(plain, folder)
    values: dict[str, Any] = {f.name: getattr(base, f.name) for f in fields(LlamaConfig)}
    values["architecture"] = model_type
    vision = cast(JsonDict, raw.get("vision_config") or {})
    return QwenVLConfig(
        **values,
        mrope_sections=(int(sections[0]), int(sections[1]), int(sections[2])),
        mrope_interleaved=model_type == "qwen3_vl" or bool(rope.get("mrope_interleaved", False)),
        image_token_id=int(raw.get("image_token_id", 151655)),
        vision_start_token_id=int(raw.get("vision_start_token_id", 151652)),
        vision_end_token_id=int(raw.get("vision_end_token_id", 151653)),
        deepstack_layers=len(cast(list[int], vision.get("deepstack_visual_indexes") or [])),
    )


# --- the step's image data ---------------------------------------------------------------------


@dataclass(frozen=True)
class DeepStack:
    """Qwen3-VL's features for one step: ``features[l]`` [M, D] is added after decoder layer
    l to the step's hidden states at ``rows`` [M] (flat b T + t indices of image tokens)."""

    rows: Tensor
    features: Tensor  # [n_layers, M, D]


@dataclass(frozen=True)
class VisionStep:
    """What a step of a vision model carries beyond its tokens: the new tokens' M-RoPE
    positions [3, B, T] (None: every row plain, (p, p, p)) and DeepStack features."""

    positions: Tensor | None = None
    deepstack: DeepStack | None = None


# --- the model ---------------------------------------------------------------------------------


class QwenVLModel(DenseModel):
    """A layer range of the text model, rotating by M-RoPE positions when a step gives them."""

    def __init__(self, weights: ShardWeights, options: BuildOptions) -> None:
        super().__init__(
            weights,
            weight_format=options.weight_format,
            dtype=options.dtype,
            device=options.device,
            all_reduce=options.all_reduce,
            kernels=options.kernels,
            own_weights=options.own_weights,
        )
        config = weights.config
        if not isinstance(config, QwenVLConfig):
            raise TypeError("a Qwen VL model needs a QwenVLConfig")
        self.vl_config = config
        self.axes = config.mrope.axes().to(self.device)  # [hd/2]: each pair's axis

    def forward_layers(
        self, hidden: Tensor, step: StepInputs, cache: KVCache, vision: VisionStep | None = None
    ) -> Tensor:
        """hidden [B, T, D] through this shard's blocks (see `DenseModel.forward_layers`),
        turned by `vision.positions` when given, DeepStack features added after their layers."""
        check_step(step, cache)
        t = self._mrope_step(step, vision.positions if vision else None)
        cache.prepare(step.slots, step.starts, step.n_new)
        deepstack = vision.deepstack if vision else None
        for i, block in enumerate(self.blocks):
            hidden = self._block(block, hidden, t, cache.layer(i))
            layer = self.start_layer + i
            if deepstack is not None and layer < deepstack.features.shape[0]:
                flat = hidden.view(-1, hidden.shape[-1])
                flat[deepstack.rows] += deepstack.features[layer].to(hidden.dtype)
        return hidden

    def _mrope_step(self, step: StepInputs, positions: Tensor | None) -> StepTensors:
        if positions is None:  # every row plain text: the dense path (compiled decode too)
            return self._step_tensors(step, False)
        bsz, n_new = len(step.slots), step.n_new
        if positions.shape != (3, bsz, n_new):
            raise ValueError(
                f"M-RoPE positions {list(positions.shape)} for a step of {bsz}x{n_new}"
            )
        rope = self.rotary.table(False)
        t = step_tensors(step, rope, None, self.device, compiled=False)
        return replace(t, rotation=mrope_rotation(rope, positions.to(self.device), self.axes))


# --- the family ----------------------------------------------------------------------------------


class QwenVLFamily:
    """Qwen2.5-VL and Qwen3-VL's text model behind the model interface (`base.ModelFamily`)."""

    name = "qwen_vl"
    gguf_architectures: tuple[str, ...] = ()
    hf_model_types = HF_MODEL_TYPES

    def gguf_config(self, f: GGUFFile) -> LlamaConfig:
        raise ValueError("Qwen VL models are read from safetensors folders only")

    def hf_config(self, raw: JsonDict, folder: Path) -> LlamaConfig:
        return hf_config(raw, folder)

    def gguf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> LayerWeights:
        raise ValueError("Qwen VL models are read from safetensors folders only")

    def hf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> LayerWeights:
        return dense_files.hf_layer(src, config, i)

    def hf_final_norm(self, src: TensorSource, config: LlamaConfig) -> Tensor:
        return dense_files.hf_norm(src, config, "model.norm.weight")

    def slice_layer(
        self, layer: LayerWeights, config: LlamaConfig, rank: int, world: int
    ) -> LayerWeights:
        return slice_layer(layer, config, rank, world)

    def build(self, weights: ShardWeights, options: BuildOptions) -> ShardModel:
        return QwenVLModel(weights, options)


QWEN_VL: ModelFamily[LayerWeights] = QwenVLFamily()


def prompt_step(ids: Tensor, embeds: Tensor, deepstack: tuple[Tensor, ...], image_token: int
                ) -> tuple[Tensor, DeepStack | None]:  # fmt: skip
    """A one-row prompt's image rows: ids [T], the images' tokens [n, D] and DeepStack
    features (each [n, D]) -> the rows' flat indices' DeepStack (None without features)."""
    rows = (ids == image_token).nonzero().flatten()
    if rows.numel() != embeds.shape[0]:
        raise ValueError(
            f"the prompt has {rows.numel()} image positions for {embeds.shape[0]} tokens"
        )
    if not deepstack:
        return rows, None
    return rows, DeepStack(rows, torch.stack(deepstack))


# --- the tower, loaded ---------------------------------------------------------------------------

_TOWER_PREFIXES = ("model.visual.", "visual.")


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
