"""Ollama's model listings: ``/api/tags``, ``/api/show`` and ``/api/ps`` entries."""

import hashlib
import re
from typing import Any

from exo.api.tool_models import supports_thinking
from exo.shared.models.chat_fallback import FALLBACK_TEMPLATE
from exo.shared.models.model_cards import ModelCard


def digest(card: ModelCard) -> str:
    return hashlib.sha256(card.model_id.encode()).hexdigest()


# Bits per weight of each storage format (a GGUF block type, a quant label, a float dtype).
_BITS_PER_WEIGHT: dict[str, float] = {
    "F32": 32, "F16": 16, "BF16": 16, "Q8_0": 8.5, "Q6_K": 6.5625, "Q5_0": 5.5, "Q5_1": 6,
    "Q5_K": 5.5, "Q5_K_M": 5.7, "Q5_K_S": 5.5, "Q4_0": 4.5, "Q4_1": 5, "Q4_K": 4.5,
    "Q4_K_M": 4.85, "Q4_K_S": 4.6, "Q3_K": 3.4375, "Q3_K_M": 3.9, "Q3_K_S": 3.5, "Q3_K_L": 4.3,
    "Q2_K": 2.625,
}


def parameter_count(card: ModelCard) -> float:
    """From the weights' bytes and their format; the embedding and head (when the card
    knows their bytes) counted as 8-bit blocks, as quantised files usually keep them."""
    bits = _BITS_PER_WEIGHT.get(card.weight_format.upper(), 16)
    ends = card.embedding_bytes + card.head_bytes
    if bits >= 16:
        return card.storage_size.in_bytes * 8 / bits
    return max(card.storage_size.in_bytes - ends, 0) * 8 / bits + ends * 8 / 8.5


def parameter_size(card: ModelCard) -> str:
    params = parameter_count(card)
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


# The modelfile's note on a model whose files carry no chat template.
NO_TEMPLATE_NOTE = (
    "# This model has no chat template: conversations are rendered plainly, "
    "one 'User: ...' / 'Assistant: ...' line per message.\n"
)


def capabilities(card: ModelCard) -> list[str]:
    """Ollama's capability names: every model completes and calls tools (a template
    that does not know tools is taught them), a thinking template thinks, a vision model
    sees."""
    thinks = ["thinking"] if supports_thinking(card.chat_template) else []
    return ["completion", "tools", *thinks, *(["vision"] if card.vision else [])]


def show_entry(card: ModelCard, modified_at: str) -> dict[str, Any]:
    arch = card.architecture
    template = card.chat_template
    return {
        "modelfile": (NO_TEMPLATE_NOTE if template is None else "") + f"FROM {card.model_id}\n",
        "parameters": "",
        "template": FALLBACK_TEMPLATE if template is None else template,
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
        "capabilities": capabilities(card),
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
