"""A tensor's random values, a chunk of rows at a time (float32; never the whole tensor).

Each tensor draws from its own generator, seeded by the model's seed and the tensor's name, so
a tensor's values do not depend on which other tensors the file holds or their order.
"""

import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from exo.modelgen.blueprint import Role, TensorSpec

Array = np.ndarray[Any, Any]

CHUNK_VALUES = 1 << 22
"""Values per chunk by default (16 MiB of float32)."""


def rows_per_chunk(t: TensorSpec, chunk_values: int) -> int:
    return max(1, chunk_values // t.k)


def value_chunks(t: TensorSpec, seed: int, chunk_values: int = CHUNK_VALUES) -> Iterator[Array]:
    """float32 [n, K] chunks covering the tensor's rows in order (norms: one row of ones)."""
    if t.role is Role.NORM:
        yield np.ones((t.rows, t.k), dtype=np.float32)
        return
    rng = np.random.default_rng([seed, zlib.crc32(t.gguf_name.encode())])
    step = rows_per_chunk(t, chunk_values)
    scale = np.float32(t.std)
    for start in range(0, t.rows, step):
        chunk = rng.standard_normal((min(step, t.rows - start), t.k), dtype=np.float32)
        chunk *= scale
        yield chunk
