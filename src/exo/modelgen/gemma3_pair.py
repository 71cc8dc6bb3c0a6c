"""Gemma 3 with images as llama.cpp ships it: the text model as a ``gemma3`` GGUF and the
tower and projector as its ``mmproj`` GGUF beside it, both written from the safetensors folder
of the same seed (so the pair and the folder hold one model):

    text GGUF   llama.cpp's gemma3 names and keys (``gemma3.*``, ``blk.N.attn_q`` ...), the
                norms' gains stored whole (Hugging Face keeps gain - 1), q/k in the Hugging
                Face row order (llama.cpp's rotary for Gemma is the half-split one), the
                generator's vocabulary and chat template
    mmproj      `mmproj_out.write_gemma3_mmproj` (``mmproj-<model>.gguf``)

Float types only (F32, F16: the layer matrices; norms stay F32).
"""

import json
import tempfile
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from safetensors import safe_open

from exo.modelgen.blueprint import Blueprint
from exo.modelgen.mmproj_out import write_gemma3_mmproj
from exo.modelgen.recipes import Recipe
from exo.modelgen.safetensors_out import write_safetensors
from exo.modelgen.vocab import Vocabulary, gguf_arrays, gguf_items

PAIR_QUANTS = ("F32", "F16")
_TEXT = "language_model."
# Hugging Face name under model.layers.N. -> llama.cpp's under blk.N.
_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}  # fmt: skip
_TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight"}  # fmt: skip


def gguf_name(hf: str) -> str:
    """A text tensor's llama.cpp name (``hf`` without the language model's prefix)."""
    if hf in _TOP:
        return _TOP[hf]
    parts = hf.removeprefix("model.layers.").split(".", 1)
    module = parts[1].removesuffix(".weight")
    if len(parts) != 2 or module not in _LAYER:
        raise ValueError(f"no GGUF name for the text tensor {hf}")
    return f"blk.{parts[0]}.{_LAYER[module]}.weight"


def pair_paths(out: Path, name: str) -> tuple[Path, Path]:
    """(text GGUF, mmproj GGUF): in the folder ``out``, or ``out`` (a .gguf) and beside it."""
    text = out if out.suffix == ".gguf" else out / f"{name}.gguf"
    return text, text.with_name(f"mmproj-{name}.gguf")


def write_gemma3_pair(
    out: Path, bp: Blueprint, r: Recipe, vocab: Vocabulary, *, name: str, seed: int
) -> Path:
    """Write the pair for ``bp`` (the gemma3-vision family's blueprint); returns the text
    GGUF's path."""
    if r.name not in PAIR_QUANTS:
        raise ValueError(f"the GGUF and mmproj pair is written in {' or '.join(PAIR_QUANTS)}, "
                         f"not {r.name}")  # fmt: skip
    text, mmproj = pair_paths(out, name)
    text.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=text.parent, prefix=".exo-gen-") as tmp:
        folder = write_safetensors(Path(tmp) / "st", bp, GGMLQuantizationType.F32, vocab,
                                   seed=seed)  # fmt: skip
        _write_preprocessor(folder)
        _write_text_gguf(folder, text, r, vocab, name)
        write_gemma3_mmproj(folder, mmproj, "F16" if r.name == "F16" else "F32")
    return text


def _write_preprocessor(folder: Path) -> None:
    from exo.modelgen.families import family  # (the family registers on import)

    family("gemma3-vision").write_extra(folder)


def _text_tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for key in cast(list[str], list(f.keys())):
                if key.startswith(_TEXT):
                    out[key[len(_TEXT) :]] = f.get_tensor(key).to(torch.float32)
    return out


def _write_text_gguf(folder: Path, path: Path, r: Recipe, vocab: Vocabulary, name: str) -> None:
    raw = cast(dict[str, Any], json.loads((folder / "config.json").read_text()))
    w = GGUFWriter(str(path), "gemma3")
    w.add_name(name)
    w.add_type("model")
    w.add_file_type(int(r.file_type))
    _add_text_metadata(w, cast(dict[str, Any], raw["text_config"]))
    for item in gguf_items(vocab):
        w.add_key_value(item.key, item.value, item.vtype)
    for key, values in gguf_arrays(vocab).items():
        w.add_array(key, values)
    for hf, t in _text_tensors(folder).items():
        g = gguf_name(hf)
        if t.dim() == 1:  # Gemma's norms: gain - 1 in Hugging Face's files, the gain here
            w.add_tensor(g, (t + 1.0).numpy())
        elif r.name == "F16":
            w.add_tensor(g, t.numpy().astype(np.float16), raw_dtype=GGMLQuantizationType.F16)
        else:
            w.add_tensor(g, np.ascontiguousarray(t.numpy()))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_text_metadata(w: GGUFWriter, c: dict[str, Any]) -> None:
    layers = int(c["num_hidden_layers"])
    types = cast(list[str], c.get("layer_types") or [])
    pattern = next((i + 1 for i, t in enumerate(types) if t == "full_attention"), layers)
    w.add_context_length(int(c["max_position_embeddings"]))
    w.add_embedding_length(int(c["hidden_size"]))
    w.add_block_count(layers)
    w.add_feed_forward_length(int(c["intermediate_size"]))
    w.add_head_count(int(c["num_attention_heads"]))
    w.add_head_count_kv(int(c["num_key_value_heads"]))
    w.add_key_length(int(c["head_dim"]))
    w.add_value_length(int(c["head_dim"]))
    w.add_layer_norm_rms_eps(float(c["rms_norm_eps"]))
    w.add_rope_freq_base(float(c["rope_theta"]))
    w.add_rope_freq_base_swa(float(c.get("rope_local_base_freq", 10000.0)))
    w.add_sliding_window(int(c["sliding_window"]))
    # every `pattern`-th block attends globally (llama.cpp's Gemma 3 fixes 6; ours reads it)
    w.add_uint32("gemma3.attention.sliding_window_pattern", pattern)
