"""Tiny random-weight Qwen2.5-VL and Qwen3-VL folders written by transformers itself (the
reference the Qwen VL tests compare against): every feature on -- window attention with
partial windows and a full-attention block (Qwen2.5), learned positions resized and two
DeepStack mergers (Qwen3), M-RoPE sections (interleaved for Qwen3) -- and weights scaled so
that next-token distributions are peaked (greedy comparisons mean something)."""

import io
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from exo.api.images import decode_image
from exo.shared.types.text_generation import InputImage
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.models.base import BuildOptions, StepInputs
from exo.worker.engines.models.hf_meta import read_json
from exo.worker.engines.models.qwen_vl import QWEN_VL, QwenVLConfig, QwenVLModel
from exo.worker.engines.models.qwen_vl_encoder import QwenVLEncoder
from exo.worker.engines.safetensors_loader import load_hf_shard

IMAGE, VIDEO, START, END = 260, 261, 258, 259  # token ids of the tiny vocabulary
VOCAB = 300


def _text(layers: int, sections: list[int], **extra: Any) -> dict[str, Any]:
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections}
    return {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 1024, "rope_parameters": rope, "bos_token_id": 1,
            "eos_token_id": 2, **extra}  # fmt: skip


def qwen25_config() -> Any:
    import transformers

    return transformers.Qwen2_5_VLConfig(
        text_config=_text(2, [2, 3, 3]),
        vision_config={"depth": 3, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "window_size": 56, "out_hidden_size": 64, "fullatt_block_indexes": [1]},
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
        vision_end_token_id=END,
    )  # fmt: skip


def qwen3_config() -> Any:
    import transformers

    return transformers.Qwen3VLConfig(
        text_config=_text(3, [4, 2, 2], head_dim=16),
        vision_config={"depth": 3, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2,
                       "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "out_hidden_size": 64, "num_position_embeddings": 16,
                       "deepstack_visual_indexes": [0, 2]},
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
        vision_end_token_id=END,
    )  # fmt: skip


def processor(config: Any) -> Any:
    """transformers' Pillow image processor for the tiny model (small pixel limits)."""
    import transformers

    v = config.vision_config
    factor = v.patch_size * v.spatial_merge_size
    mean = [0.5] * 3 if config.model_type == "qwen3_vl" else [0.48145466, 0.4578275, 0.40821073]
    std = [0.5] * 3 if config.model_type == "qwen3_vl" else [0.26862954, 0.26130258, 0.27577711]
    return transformers.Qwen2VLImageProcessorPil(
        patch_size=v.patch_size, merge_size=v.spatial_merge_size,
        temporal_patch_size=v.temporal_patch_size, min_pixels=factor * factor,
        max_pixels=factor * factor * 64, image_mean=mean, image_std=std,
    )  # fmt: skip


def write_model(config: Any, out: Path, seed: int = 0) -> Path:
    """A random model of `config` saved (safetensors, processor settings) under `out`."""
    import transformers

    torch.manual_seed(seed)
    cls = (
        transformers.Qwen3VLForConditionalGeneration
        if config.model_type == "qwen3_vl"
        else transformers.Qwen2_5_VLForConditionalGeneration
    )
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_q" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p)) if name.endswith("weight") else p.normal_(
                    0, 0.1
                )
            elif p.dim() >= 2:
                p.normal_(0.0, 1.5 / p.shape[-1] ** 0.5 if p.dim() == 2 else 0.05)
            else:
                p.normal_(0.0, 0.1)
    model.save_pretrained(out)
    processor(config).save_pretrained(out)
    return out


def png(size: tuple[int, int], seed: int, mode: str = "RGB") -> InputImage:
    """A random picture of `size` (width, height) as the API hands it over."""
    g = torch.Generator().manual_seed(seed)
    channels = len(mode)
    data = torch.randint(0, 256, (size[1], size[0], channels), generator=g, dtype=torch.uint8)
    out = io.BytesIO()
    Image.fromarray(data.numpy()).save(out, format="PNG")
    return decode_image(out.getvalue())


def pil(image: InputImage) -> Image.Image:
    return Image.open(io.BytesIO(image.data))


def load_ours(folder: Path) -> QwenVLModel:
    config = QWEN_VL.hf_config(read_json(folder / "config.json"), folder)
    assert isinstance(config, QwenVLConfig)
    model = QWEN_VL.build(load_hf_shard(folder, 0, config.n_layers), BuildOptions())
    assert isinstance(model, QwenVLModel)
    return model


def greedy(model: QwenVLModel, encoder: QwenVLEncoder, ids: list[int],
           images: list[InputImage], n: int) -> tuple[torch.Tensor, list[int]]:  # fmt: skip
    """First logits [V] and `n` greedy tokens, one forward a token, as the batcher steps."""
    spans = encoder.encode(ids, images)
    cache: KVCache = model.new_cache(1, len(ids) + n)
    with torch.inference_mode():
        step = StepInputs.single(0, 0, len(ids), spans.chunk(0, len(ids)))
        first = model.forward(torch.tensor([ids]), step, cache)[0]
        generated = [int(first.argmax())]
        for i in range(n - 1):
            step = StepInputs((0,), (len(ids) + i,), 1, rope_deltas=(spans.rope_delta,))
            logits = model.forward(torch.tensor([[generated[-1]]]), step, cache)[0]
            generated.append(int(logits.argmax()))
    return first, generated
