"""Generated GGUFs with broken weights: one row of an F32 tensor set to NaN. A NaN row of
``token_embd.weight`` breaks the prompts (or outputs) that hold that token; a NaN row of
``output.weight`` makes every step's logits non-finite."""

from pathlib import Path

import numpy as np
from gguf import GGUFReader


def poison_row(path: Path, tensor: str, row: int) -> Path:
    """Set row ``row`` of the F32 tensor ``tensor`` of the GGUF at ``path`` to NaN (in
    place); returns ``path``."""
    reader = GGUFReader(path, "r+")
    (found,) = [t for t in reader.tensors if t.name == tensor]
    data = found.data
    if data.dtype != np.float32:
        raise ValueError(f"{tensor} of {path} is {data.dtype}, not float32")
    data[row] = np.nan
    reader.data.flush()
    return path


def poison_token_embedding(path: Path, token: int) -> Path:
    return poison_row(path, "token_embd.weight", token)
