"""Gemma 3 with images (Gemma3ForConditionalGeneration safetensors folders, `model_type`
"gemma3"): the text model is the dense family's Gemma 3 (its config under `text_config`, its
tensors under the language model's prefix, read by their text names), and the image path is
`gemma3_vision.Gemma3Vision` behind the engine's `images.VisionEncoder`:

    prompt:  each <start_of_image> the chat template writes becomes, as Gemma's processor
             writes it, "\\n\\n<start_of_image>" + mm_tokens_per_image x <image_soft_token>
             + "<end_of_image>\\n\\n"
    encode:  the soft tokens [n, 256, D] go where the placeholders are; an image's positions
             attend to each other both ways in prefill (causal elsewhere)

GGUF Gemma 3 with an mmproj file is read by another module (the mmproj loader).
"""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from exo.shared.types.text_generation import InputImage
from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.images import ImageSpan, ImageSpans, placeholder_runs
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import dense_files
from exo.worker.engines.models.base import BuildOptions, JsonDict, ModelFamily, ShardModel
from exo.worker.engines.models.dense import DENSE
from exo.worker.engines.models.gemma3_vision import Gemma3Vision
from exo.worker.engines.weights import LayerWeights, ShardWeights

_MARKERS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")


def text_config(raw: JsonDict) -> JsonDict:
    """config.json's text model as a gemma3_text config (the top level's shared keys filled
    in where the text config lacks them)."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ValueError("a gemma3 config.json needs a text_config")
    merged = {**cast(JsonDict, text), "model_type": "gemma3_text"}
    for key in ("tie_word_embeddings", "eos_token_id", "bos_token_id"):
        if key not in merged and key in raw:
            merged[key] = raw[key]
    return merged


class Gemma3VisionFamily:
    """Gemma3ForConditionalGeneration's text model behind the model interface."""

    name = "gemma3-vision"
    gguf_architectures: tuple[str, ...] = ()
    hf_model_types = ("gemma3",)

    def gguf_config(self, f: GGUFFile) -> LlamaConfig:
        raise ValueError("a gemma3 GGUF file is read by the dense family")

    def hf_config(self, raw: JsonDict, folder: Path) -> LlamaConfig:
        return dense_files.hf_config(text_config(raw), folder)

    def gguf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> LayerWeights:
        raise ValueError("a gemma3 GGUF file is read by the dense family")

    def hf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> LayerWeights:
        return DENSE.hf_layer(src, config, i)

    def hf_final_norm(self, src: TensorSource, config: LlamaConfig) -> Tensor:
        return DENSE.hf_final_norm(src, config)

    def slice_layer(
        self, layer: LayerWeights, config: LlamaConfig, rank: int, world: int
    ) -> LayerWeights:
        return DENSE.slice_layer(layer, config, rank, world)

    def build(self, weights: ShardWeights[LayerWeights], options: BuildOptions) -> ShardModel:
        return DENSE.build(weights, options)


GEMMA3_VISION: ModelFamily[LayerWeights] = Gemma3VisionFamily()


def _token_texts(folder: Path, ids: dict[str, int]) -> dict[str, str]:
    """The text of the image tokens (by their config ids) in the folder's tokenizer.json;
    Gemma 3's own strings where it does not say."""
    texts: dict[str, str] = dict(zip(("boi", "eoi", "image"), _MARKERS, strict=True))
    path = folder / "tokenizer.json"
    if not path.exists():
        return texts
    added = cast(list[dict[str, Any]], json.loads(path.read_text()).get("added_tokens") or [])
    by_id = {int(t["id"]): str(t["content"]) for t in added}
    return {k: by_id.get(ids[k], v) for k, v in texts.items()}


class Gemma3Encoder:
    """Gemma 3's `images.VisionEncoder`: the marker expansion and the tower."""

    def __init__(self, vision: Gemma3Vision, texts: dict[str, str]) -> None:
        self.vision = vision
        self.marker = texts["boi"]
        n = vision.config.tokens_per_image
        self._expansion = f"\n\n{texts['boi']}{texts['image'] * n}{texts['eoi']}\n\n"

    @classmethod
    def load(cls, folder: Path, dtype: torch.dtype = torch.float32) -> "Gemma3Encoder":
        raw = cast(JsonDict, json.loads((folder / "config.json").read_text()))
        ids = {
            "boi": int(raw.get("boi_token_index", 255999)),
            "eoi": int(raw.get("eoi_token_index", 256000)),
            "image": int(raw.get("image_token_index", 262144)),
        }
        return cls(Gemma3Vision.load(folder, dtype), _token_texts(folder, ids))

    @property
    def image_token(self) -> int:
        return self.vision.config.image_token

    def tokens_for(self, image: InputImage) -> int:
        return self.vision.config.tokens_per_image  # every picture: one square, pooled

    def expand(self, text: str, images: Sequence[InputImage]) -> str:
        found = text.count(self.marker)
        if found != len(images):
            raise ValueError(
                f"the rendered prompt has {found} image markers ({self.marker}) for "
                f"{len(images)} images"
            )
        return text.replace(self.marker, self._expansion)

    def encode(self, ids: Sequence[int], images: Sequence[InputImage]) -> ImageSpans:
        runs = placeholder_runs(ids, self.image_token)
        n = self.vision.config.tokens_per_image
        if len(runs) != len(images) or any(length != n for _, length in runs):
            raise ValueError(
                f"the prompt holds {[length for _, length in runs]} image tokens for "
                f"{len(images)} images of {n} tokens each"
            )
        if not images:
            return ImageSpans((), torch.zeros(0, self.vision.config.text_hidden))
        embeddings = self.vision(list(images))  # [images, n, D]
        spans = tuple(
            ImageSpan(start, length, image.sha256)
            for (start, length), image in zip(runs, images, strict=True)
        )
        return ImageSpans(spans, embeddings.reshape(len(runs) * n, -1), bidirectional=True)
