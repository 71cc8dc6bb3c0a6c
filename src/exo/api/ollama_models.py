"""Ollama's model listings: ``/api/tags``, ``/api/show`` and ``/api/ps`` entries."""

import hashlib
import re
from typing import Any

from exo.shared.models.model_cards import ModelCard


def digest(card: ModelCard) -> str:
    return hashlib.sha256(card.model_id.encode()).hexdigest()


def parameter_size(card: ModelCard) -> str:
    """Roughly: the weights are held in 16 bits."""
    params = card.storage_size.in_bytes / 2
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if params >= scale:
            return f"{params / scale:.1f}{unit}"
    return str(int(params))


def details(card: ModelCard) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf" if _is_gguf(card) else "safetensors",
        "family": card.architecture,
        "families": [card.architecture],
        "parameter_size": parameter_size(card),
        "quantization_level": quantization_level(card),
    }


_QUANT = re.compile(r"(?:^|[-_.])(I?Q\d(?:_[A-Z0-9]+)*|F16|BF16|F32)(?:[-_.]|$)", re.IGNORECASE)


def _is_gguf(card: ModelCard) -> bool:
    return card.source.endswith(".gguf") or (
        card.hub is not None and card.hub.gguf_quant is not None
    )


def quantization_level(card: ModelCard) -> str:
    """The hub quant a GGUF card pinned, or the GGUF file's name (``...Q4_K_M.gguf``);
    safetensors folders hold BF16."""
    if card.hub is not None and card.hub.gguf_quant:
        return card.hub.gguf_quant.upper()
    if card.source.endswith(".gguf"):
        match = _QUANT.search(card.source.rsplit("/", 1)[-1].removesuffix(".gguf"))
        return match.group(1).upper() if match else "unknown"
    return "BF16"


def tag_entry(card: ModelCard, modified_at: str) -> dict[str, Any]:
    return {
        "name": card.model_id,
        "model": card.model_id,
        "modified_at": modified_at,
        "size": card.storage_size.in_bytes,
        "digest": digest(card),
        "details": details(card),
    }


def show_entry(card: ModelCard, modified_at: str) -> dict[str, Any]:
    arch = card.architecture
    return {
        "modelfile": f"FROM {card.model_id}\n",
        "parameters": "",
        "template": card.chat_template or "",
        "details": details(card),
        "model_info": {
            "general.architecture": arch,
            "general.basename": card.model_id,
            f"{arch}.context_length": card.context_length,
            f"{arch}.block_count": card.n_layers,
            f"{arch}.embedding_length": card.hidden_size,
            f"{arch}.attention.head_count": card.num_heads,
            f"{arch}.attention.head_count_kv": card.num_kv_heads,
        },
        "capabilities": ["completion"],
        "modified_at": modified_at,
    }


def ps_entry(card: ModelCard, expires_at: str) -> dict[str, Any]:
    return {
        "name": card.model_id,
        "model": card.model_id,
        "size": card.storage_size.in_bytes,
        "digest": digest(card),
        "details": details(card),
        "expires_at": expires_at,
        "size_vram": 0,
        "context_length": card.context_length,
    }
