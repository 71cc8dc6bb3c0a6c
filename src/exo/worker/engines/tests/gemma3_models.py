"""Tiny random Gemma3ForConditionalGeneration folders (transformers' own model, saved as
safetensors) and test pictures, for the image tests."""

import io
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from exo.api.images import decode_image
from exo.shared.types.text_generation import InputImage

TOKENS = 4  # soft tokens per image: a 4x4 patch grid pooled to 2x2
BOI, EOI, IMAGE = 258, 259, 260


def save_tiny_gemma3(transformers: Any, out: Path) -> Path:
    """A 2-block Gemma 3 (one sliding-window block of 8, one global; an untied head) with a
    2-block SigLIP tower over 64x64 images; every weight random (not the initialiser's zeros
    and ones)."""
    torch.manual_seed(0)
    config = transformers.Gemma3Config(
        text_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                     "vocab_size": 300, "sliding_window": 8, "max_position_embeddings": 512,
                     "layer_types": ["sliding_attention", "full_attention"],
                     "tie_word_embeddings": False},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": 64, "patch_size": 16},
        mm_tokens_per_image=TOKENS, image_token_index=IMAGE, boi_token_index=BOI,
        eoi_token_index=EOI, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
            elif "multi_modal_projector" in name:
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.15)
    model.save_pretrained(out)
    return out


def png(size: tuple[int, int], seed: int, poke: tuple[int, int] | None = None) -> InputImage:
    """A random picture of `size` (width, height); `poke`: that pixel changed by one."""
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 255, (size[1], size[0], 3), generator=g, dtype=torch.uint8)
    if poke is not None:
        data[poke[1], poke[0], 0] += 1
    out = io.BytesIO()
    Image.fromarray(data.numpy()).save(out, format="PNG")
    return decode_image(out.getvalue())


def prompt(*texts: list[int]) -> list[int]:
    """Text runs joined by images, as Gemma's processor writes each: <start_of_image>, the
    soft tokens, <end_of_image>."""
    ids = list(texts[0])
    for text in texts[1:]:
        ids += [BOI, *[IMAGE] * TOKENS, EOI, *text]
    return ids
