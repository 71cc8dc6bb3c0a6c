"""Test files that take a real tokenizer: the `tokenizer.*` metadata of a GGUF file (SmolLM2's,
the embedded model) copied into a GGUF being written."""

from pathlib import Path

from gguf import GGUFWriter

from exo.worker.engines.gguf_reader import GGUFFile


def copy_tokenizer(w: GGUFWriter, source: Path, skip: tuple[str, ...] = ()) -> int:
    """Copy the `tokenizer.*` metadata of the GGUF file `source` (but the keys in `skip`) into
    `w`; returns its vocabulary size."""
    f = GGUFFile(source)
    try:
        meta = {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.") and k not in skip}
    finally:
        f.close()
    for key, value in meta.items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, list(value))
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        raise ValueError(f"{source} has no tokenizer.ggml.tokens")
    return len(tokens)
