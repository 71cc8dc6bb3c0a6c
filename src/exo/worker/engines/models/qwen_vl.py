"""Qwen2.5-VL and Qwen3-VL (dense): the vision tower's tokens in a Qwen2 / Qwen3 text model
that rotates by M-RoPE positions and adds DeepStack features.

    h_0         = E[tokens];  h_0[image placeholders] = the images' tokens, in order
    for block l (the dense family's block, `dense.py`), q, k turned by M-RoPE (`mrope.py`):
        h       = block_l(h)
        h[image positions] += deepstack_l        Qwen3-VL, for l < number of DeepStack mergers
    logits      = head(h)

The text model is the dense family's Qwen2 (q, k, v biases) or Qwen3 (per-head q, k norms);
its config.json part is `text_config` (transformers 5) or the top level (the hub's Qwen2.5-VL).
The tower (`qwen_vl_vision.py`, behind `qwen_vl_encoder.QwenVLEncoder`) runs where the first
pipeline stage runs; a prefill chunk's M-RoPE positions and DeepStack features ride on the
step (`images.ChunkImages`, sent on to later stages with the activations: each stage adds the
features of the layers it holds), and a decode step carries each row's M-RoPE delta
(`StepInputs.rope_deltas`, in the pipeline's step header).
"""

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, cast

from torch import Tensor

from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import dense_files
from exo.worker.engines.models.attention import StepTensors, step_tensors
from exo.worker.engines.models.base import (
    BuildOptions,
    JsonDict,
    ModelFamily,
    ShardModel,
    StepInputs,
)
from exo.worker.engines.models.dense import DenseModel
from exo.worker.engines.models.mrope import MRope, decode_positions, mrope_rotation
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
              "tie_word_embeddings": bool(raw.get("tie_word_embeddings",
                                                      text.get("tie_word_embeddings", False)))}  # fmt: skip
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


# llama.cpp's text architectures of Qwen2-VL / Qwen2.5-VL and Qwen3-VL (the image tower: the
# mmproj file beside it)
GGUF_ARCHITECTURES = ("qwen2vl", "qwen3vl")
_VISION_TOKENS = {"image_token_id": "<|image_pad|>", "vision_start_token_id": "<|vision_start|>",
                  "vision_end_token_id": "<|vision_end|>"}  # fmt: skip


def gguf_config(f: GGUFFile) -> QwenVLConfig:
    """A qwen2vl / qwen3vl GGUF's shape: the dense family's plus the M-RoPE sections
    (``rope.dimension_sections``, t h w and a fourth llama.cpp pads with 0; interleaved for
    qwen3vl), Qwen3-VL's ``n_deepstack_layers`` and the vision tokens' ids from the
    vocabulary."""
    arch = str(f.metadata.get("general.architecture", ""))
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"architecture {arch!r} is not a Qwen VL text model")
    base = dense_files.gguf_config(f)
    raw = f.metadata.get(f"{arch}.rope.dimension_sections")
    sections = [int(v) for v in cast(list[int], raw)] if isinstance(raw, list) else []
    if len(sections) < 3 or any(sections[3:]) or sum(sections[:3]) != base.head_dim // 2:
        raise ValueError(f"{arch}.rope.dimension_sections {sections} must be 3 sections (and "
                         f"zeros) of {base.head_dim // 2} pairs")  # fmt: skip
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    vocab: list[object] = list(cast(list[object], tokens)) if isinstance(tokens, list) else []
    ids = {k: vocab.index(t) for k, t in _VISION_TOKENS.items() if t in vocab}
    values: dict[str, Any] = {x.name: getattr(base, x.name) for x in fields(LlamaConfig)}
    config = QwenVLConfig(
        **values,
        mrope_sections=(sections[0], sections[1], sections[2]),
        mrope_interleaved=arch == "qwen3vl",  # (llama.cpp's IMROPE)
        deepstack_layers=int(cast(int, f.metadata.get(f"{arch}.n_deepstack_layers", 0))),
    )
    return replace(config, **ids)


# --- the model ---------------------------------------------------------------------------------


class QwenVLModel(DenseModel):
    """A layer range of the text model, turning q and k by M-RoPE positions: a prefill chunk's
    own (`ChunkImages.positions`) or, decoding, each row's cache position plus its delta
    (`StepInputs.rope_deltas`). DeepStack features are added by the dense loop
    (`images.add_deepstack`); images are merged into the embeddings by the first stage."""

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

    def _step_tensors(self, step: StepInputs, sliding: bool) -> StepTensors:
        positions = mrope_step_positions(step)
        if positions is None:  # plain text rows: (p, p, p), the dense path (compiled decode)
            return super()._step_tensors(step, sliding)
        rope = self.rotary.table(sliding)
        window = self.config.sliding_window if sliding else None
        t = step_tensors(step, rope, window, self.device, compiled=False)
        if int(positions.max()) >= rope.shape[0]:
            raise ValueError(f"M-RoPE position {int(positions.max())} is beyond the rotary table")
        return replace(t, rotation=mrope_rotation(rope, positions.to(self.device), self.axes))


def mrope_step_positions(step: StepInputs) -> Tensor | None:
    """[3, B, T] M-RoPE positions of the step's new tokens; None when every row is plain."""
    if step.images is not None and step.images.positions is not None:
        if len(step.slots) != 1 or step.images.positions.shape != (3, step.n_new):
            raise ValueError("a prefill chunk's M-RoPE positions must be [3, n] of one row")
        return step.images.positions[:, None, :]
    if not any(step.rope_deltas):
        return None
    if len(step.rope_deltas) != len(step.slots):
        raise ValueError(f"{len(step.rope_deltas)} M-RoPE deltas for {len(step.slots)} rows")
    return decode_positions(step.starts, step.rope_deltas, step.n_new)


# --- the family ----------------------------------------------------------------------------------


class QwenVLFamily:
    """Qwen2.5-VL and Qwen3-VL's text model behind the model interface (`base.ModelFamily`)."""

    name = "qwen_vl"
    gguf_architectures: tuple[str, ...] = GGUF_ARCHITECTURES
    hf_model_types = HF_MODEL_TYPES

    def gguf_config(self, f: GGUFFile) -> LlamaConfig:
        return gguf_config(f)

    def hf_config(self, raw: JsonDict, folder: Path) -> LlamaConfig:
        return hf_config(raw, folder)

    def gguf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> LayerWeights:
        return dense_files.gguf_layer(src, config, i)

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
