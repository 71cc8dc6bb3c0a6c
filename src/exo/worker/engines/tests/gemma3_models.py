"""Tiny random Gemma 3 vision checkpoints for tests: a Gemma3ForConditionalGeneration saved as
safetensors (every tower and projector tensor random), and the vocabulary of a text GGUF."""

from pathlib import Path
from typing import Any

import gguf
import torch

IMAGE_TOKEN = 260


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
