"""Reading a Hugging Face folder's config.json: the chat template, rotary parameters,
activation and special tokens, as every family needs them."""

import json
from pathlib import Path
from typing import Any, cast

from exo.worker.engines.config import Activation, RopeScaling

JsonDict = dict[str, Any]


def read_json(path: Path) -> JsonDict:
    return cast(JsonDict, json.loads(path.read_text(encoding="utf-8")))


def read_chat_template(folder: Path) -> str | None:
    """The chat template of a Hugging Face folder: chat_template.jinja or tokenizer_config.json."""
    jinja = folder / "chat_template.jinja"
    if jinja.exists():
        return jinja.read_text(encoding="utf-8")
    tok_config = folder / "tokenizer_config.json"
    if not tok_config.exists():
        return None
    template = read_json(tok_config).get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
        named = {str(t["name"]): str(t["template"]) for t in cast(list[JsonDict], template)}
        return named.get("default")
    return None


def rope_params(raw: JsonDict, layer_type: str) -> JsonDict | None:
    """The rotary parameters of one kind of layer (Gemma 3 keys them by layer type)."""
    params = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not isinstance(params, dict):
        return None
    p = cast(JsonDict, params)
    if isinstance(p.get(layer_type), dict):
        return cast(JsonDict, p[layer_type])
    if any(isinstance(v, dict) for v in p.values()):  # keyed by type, but not this one
        return None
    return p


def rope_scaling(raw: JsonDict) -> RopeScaling | None:
    p = rope_params(raw, "full_attention")
    if p is None:
        return None
    kind = p.get("rope_type", p.get("type", "default"))
    if kind in ("default", None):
        return None
    factor = float(p.get("factor", 1.0))
    if kind == "linear":
        return RopeScaling(kind="linear", factor=factor)
    if kind == "llama3":
        return RopeScaling(
            kind="llama3",
            factor=factor,
            low_freq_factor=float(p.get("low_freq_factor", 1.0)),
            high_freq_factor=float(p.get("high_freq_factor", 4.0)),
            original_context_length=int(p.get("original_max_position_embeddings", 8192)),
        )
    raise ValueError(f"rope scaling {kind!r} is not supported")


def rope_theta(raw: JsonDict, layer_type: str = "full_attention") -> float | None:
    if layer_type == "full_attention" and "rope_theta" in raw:
        return float(raw["rope_theta"])
    if layer_type == "sliding_attention" and "rope_local_base_freq" in raw:
        return float(raw["rope_local_base_freq"])
    params = rope_params(raw, layer_type)
    if params is not None and "rope_theta" in params:
        return float(params["rope_theta"])
    return None


_ACTIVATIONS: dict[str, Activation] = {
    "silu": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
}


def activation(raw: JsonDict) -> Activation:
    name = str(raw.get("hidden_activation") or raw.get("hidden_act") or "silu")
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not supported ({sorted(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def special_tokens(raw: JsonDict) -> tuple[int | None, tuple[int, ...]]:
    """(bos token id, eos token ids) of config.json."""
    eos = raw.get("eos_token_id")
    eos_ids = tuple(int(e) for e in cast(list[int], eos)) if isinstance(eos, list) else ()
    if isinstance(eos, int):
        eos_ids = (eos,)
    bos = raw.get("bos_token_id")
    return (bos if isinstance(bos, int) else None), eos_ids
