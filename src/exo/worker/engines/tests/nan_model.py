"""A generated GGUF with broken weights: one token's embedding row set to NaN, so every
prompt (or output) holding that token drives the model to non-finite logits, and the rest
of the model still answers."""

from pathlib import Path

import numpy as np
from gguf import GGUFReader


def poison_token_embedding(path: Path, token: int) -> Path:
    """Set row ``token`` of the F32 ``token_embd.weight`` of the GGUF at ``path`` to NaN
    (in place); returns ``path``."""
    reader = GGUFReader(path, "r+")
    (tensor,) = [t for t in reader.tensors if t.name == "token_embd.weight"]
    data = tensor.data
    if data.dtype != np.float32:
        raise ValueError(f"token_embd.weight of {path} is {data.dtype}, not float32")
    data[token] = np.nan
    reader.data.flush()
    return path
