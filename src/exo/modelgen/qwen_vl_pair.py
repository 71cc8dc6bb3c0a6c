"""Qwen2.5-VL / Qwen3-VL with images as llama.cpp ships them: the text model as a ``qwen2vl``
/ ``qwen3vl`` GGUF and the vision tower as its ``mmproj`` GGUF beside it, both written from
the safetensors folder of the same seed (`qwen_vl_gguf_out`), so the pair and the folder hold
one model. Float types only (F32, F16: the matrices; norms stay F32)."""

import tempfile
from pathlib import Path

from gguf import GGMLQuantizationType, GGUFWriter

from exo.modelgen.blueprint import Blueprint
from exo.modelgen.gemma3_pair import PAIR_QUANTS, pair_paths
from exo.modelgen.qwen_vl_gguf_out import write_qwen_vl_mmproj, write_qwen_vl_text_gguf
from exo.modelgen.recipes import Recipe
from exo.modelgen.safetensors_out import write_safetensors
from exo.modelgen.vocab import Vocabulary, gguf_arrays, gguf_items


def write_qwen_vl_pair(
    out: Path, bp: Blueprint, r: Recipe, vocab: Vocabulary, *, name: str, seed: int
) -> Path:
    """Write the pair for ``bp`` (a qwen2.5-vl / qwen3-vl blueprint); returns the text GGUF's
    path."""
    from exo.modelgen.families import family  # (the family registers on import)

    if r.name not in PAIR_QUANTS:
        raise ValueError(f"the GGUF and mmproj pair is written in {' or '.join(PAIR_QUANTS)}, "
                         f"not {r.name}")  # fmt: skip
    text, mmproj = pair_paths(out, name)
    text.parent.mkdir(parents=True, exist_ok=True)
    matrices = "F16" if r.name == "F16" else "F32"

    def add_vocab(w: GGUFWriter) -> None:
        w.add_name(name)
        w.add_file_type(int(r.file_type))
        for item in gguf_items(vocab):
            w.add_key_value(item.key, item.value, item.vtype)
        for key, values in gguf_arrays(vocab).items():
            w.add_array(key, values)

    with tempfile.TemporaryDirectory(dir=text.parent, prefix=".exo-gen-") as tmp:
        folder = write_safetensors(Path(tmp) / "st", bp, GGMLQuantizationType.F32, vocab,
                                   seed=seed)  # fmt: skip
        family(bp.arch).write_extra(folder)
        write_qwen_vl_text_gguf(folder, text, add_vocab, matrices)
        write_qwen_vl_mmproj(folder, mmproj, matrices)
    return text
