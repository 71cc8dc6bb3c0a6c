"""Tiny random Gemma 3 vision checkpoints and test pictures for the image tests: a
Gemma3ForConditionalGeneration saved as safetensors (every tower and projector tensor random),
the vocabulary of a text GGUF, random pictures and Gemma-style image prompts."""

import io
from pathlib import Path
from typing import Any

import gguf
import torch
from PIL import Image

from exo.api.images import decode_image
from exo.shared.types.text_generation import InputImage

IMAGE_TOKEN = 260
TOKENS = 4  # soft tokens per image: a 4x4 patch grid pooled to 2x2
BOI, EOI, IMAGE = 258, 259, 260


def tiny_gemma3_folder(out: Path, seed: int = 1) -> Path:
    import transformers

    torch.manual_seed(seed)
    config: Any = transformers.Gemma3Config(
        text_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                     "vocab_size": 300, "sliding_window": 16, "max_position_embeddings": 512},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": 64, "patch_size": 16},
        mm_tokens_per_image=4, image_token_index=IMAGE_TOKEN, boi_token_index=258,
        eoi_token_index=259,
    )  # fmt: skip
    model: Any = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # random, not the initialiser's zeros and ones: every tensor counts
        for p in model.model.multi_modal_projector.parameters():
            p.normal_(0.0, 0.5)
        for name, p in model.model.vision_tower.named_parameters():
            if "norm" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
    model.save_pretrained(out)
    return out


def text_gguf(path: Path) -> Path:
    """A text GGUF's vocabulary (all the mmproj loader reads from it): <image_soft_token> at
    IMAGE_TOKEN."""
    w = gguf.GGUFWriter(str(path), "gemma3")
    tokens = [f"t{i}" for i in range(300)]
    tokens[IMAGE_TOKEN] = "<image_soft_token>"
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


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
