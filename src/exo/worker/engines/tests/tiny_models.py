"""Tiny random Hugging Face models written to a folder, for loader and sharding tests."""

from pathlib import Path
from typing import Any

import torch

TINY: dict[str, Any] = {
    "vocab_size": 160,
    "hidden_size": 96,
    "intermediate_size": 192,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def write_tiny_model(folder: Path, model_type: str, seed: int = 0) -> Any:
    """Save a random `model_type` (llama, qwen2, qwen3) model with safetensors; return it."""
    import transformers

    classes: dict[str, tuple[Any, Any]] = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
    }
    config_cls, model_cls = classes[model_type]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**TINY)).eval()
    with torch.no_grad():  # norms are ones at init: make them matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    return model
