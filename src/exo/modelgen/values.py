"""A tensor's random values, a chunk of rows at a time (float32; never the whole tensor).

Each tensor draws from its own generator, seeded by the model's seed and the tensor's name, so
a tensor's values do not depend on which other tensors the file holds or their order. Values
are standard normal through a table of 65536 quantiles indexed by random 16-bit words (five
times faster than numpy's normal sampler, which would dominate writing a 5 GB file), scaled by
the tensor's std; a tensor with a `grid` has them rounded to that block type's values.
"""

import functools
import zlib
from collections.abc import Iterator
from statistics import NormalDist
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from exo.modelgen.blueprint import Role, TensorSpec
from exo.modelgen.quants import mxfp4_round

Array = np.ndarray[Any, Any]

CHUNK_VALUES = 1 << 22
"""Values per chunk by default (16 MiB of float32)."""


@functools.cache
def _normal_quantiles() -> Array:
    normal = NormalDist()
    return np.array([normal.inv_cdf((i + 0.5) / 65536) for i in range(65536)], dtype=np.float32)


def rows_per_chunk(t: TensorSpec, chunk_values: int) -> int:
    """Rows per chunk: whole heads where rows are reordered per head (`rope_head_dim`)."""
    unit = max(1, t.rope_head_dim)
    return max(1, chunk_values // t.k // unit) * unit


def value_chunks(t: TensorSpec, seed: int, chunk_values: int = CHUNK_VALUES) -> Iterator[Array]:
    """float32 [n, K] chunks covering the tensor's rows in order (norms: one row of ones; the
    final norm: random signs)."""
    if t.role is Role.NORM:
        yield np.ones((t.rows, t.k), dtype=np.float32)
        return
    rng = np.random.default_rng([seed, zlib.crc32(t.gguf_name.encode())])
    if t.role is Role.OUTPUT_NORM:
        yield np.where(rng.random((t.rows, t.k)) < 0.5, -1.0, 1.0).astype(np.float32)
        return
    step = rows_per_chunk(t, chunk_values)
    table = _normal_quantiles() * np.float32(t.std)
    for start in range(0, t.rows, step):
        n = min(step, t.rows - start)
        words = np.frombuffer(rng.bytes(2 * n * t.k), dtype=np.uint16)
        values = table[words].reshape(n, t.k)
        yield values if t.grid is None else on_grid(values, t.grid)


def on_grid(values: Array, qtype: GGMLQuantizationType) -> Array:
    """`values` [n, K] rounded to what block type `qtype` holds (MXFP4 only, so far)."""
    if qtype != GGMLQuantizationType.MXFP4:
        raise ValueError(f"values on the grid of {qtype.name} are not offered (MXFP4 only)")
    return mxfp4_round(values)
