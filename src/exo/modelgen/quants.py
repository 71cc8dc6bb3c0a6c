"""Weight quantisers: float32 rows -> the bytes of one GGML type, a row chunk at a time.

`gguf.quants` quantises the legacy block types (Q4_0 .. Q8_0), MXFP4 and BF16; the K-quants (Q4_K,
Q5_K, Q6_K), which gguf 0.19 can only read, are packed here with numpy over every block of a
chunk at once. Our K-quant packing is plain round-to-nearest with per-sub-block scales (no
search for the best scales as llama.cpp's quantiser does): checked against gguf's dequantiser.

Q4_K / Q5_K, 256 values: f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min) pairs, then
(Q5_K only) 32 bytes holding each value's fifth bit, then 128 bytes of low nibbles;
value = d * sc_j * q - dmin * m_j in sub-block j (32 values), q in 0..15 (0..31).
Q6_K, 256 values in 210 bytes: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8
scales, f16 d; value = d * sc_j * (q - 32) in sub-block j (16 values), q in 0..63.
"""

from collections.abc import Callable
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize

from exo.modelgen.iq4_quants import quantize_iq4_nl, quantize_iq4_xs

Array = np.ndarray[Any, Any]
T = GGMLQuantizationType


def _f16_bytes(x: Array) -> Array:
    return x.astype(np.float16).view(np.uint8).reshape(*x.shape, 2)


def _safe(x: Array) -> Array:
    return np.where(x > 0, x, np.float32(1))


def _affine_sub_blocks(x: Array, levels: int) -> tuple[Array, Array, Array, Array]:
    """Q4_K / Q5_K: per 32-value sub-block scale and min, as 6-bit multiples of the block's
    f16 d and dmin; returns (d, dmin, packed 12-byte scales, q [rows, nb, 8, 32])."""
    rows = x.shape[0]
    sub = x.astype(np.float32, copy=False).reshape(rows, -1, 8, 32)
    lo = np.minimum(sub.min(-1), 0.0)
    scale = (sub.max(-1) - lo) / levels
    d = (scale.max(-1) / 63).astype(np.float16).astype(np.float32)  # [rows, nb]
    dmin = ((-lo).max(-1) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale / _safe(d)[..., None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(-lo / _safe(dmin)[..., None]), 0, 63).astype(np.uint8)
    step = (d[..., None] * sc)[..., None]  # [rows, nb, 8, 1]
    offset = (dmin[..., None] * mn)[..., None]
    q = np.clip(np.rint((sub + offset) / _safe(step)), 0, levels).astype(np.uint8)
    packed = np.empty((*sc.shape[:-1], 12), dtype=np.uint8)
    packed[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    packed[..., 4:8] = (mn[..., :4] & 63) | ((mn[..., 4:] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)
    return d, dmin, packed, q


def _nibbles(q: Array) -> Array:
    """[rows, nb, 8, 32] 4-bit values -> [rows, nb, 128]: sub-blocks 2c and 2c+1 share bytes."""
    q = q.reshape(q.shape[0], -1, 4, 2, 32)
    return ((q[..., 0, :] & 15) | ((q[..., 1, :] & 15) << 4)).reshape(q.shape[0], -1, 128)


def quantize_q4_k(x: Array) -> Array:
    """float [rows, K] (K % 256 == 0) -> uint8 [rows, K / 256 * 144]."""
    d, dmin, packed, q = _affine_sub_blocks(x, 15)
    block = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed, _nibbles(q)], axis=-1)
    return block.reshape(x.shape[0], -1)


def quantize_q5_k(x: Array) -> Array:
    """float [rows, K] (K % 256 == 0) -> uint8 [rows, K / 256 * 176]."""
    d, dmin, packed, q = _affine_sub_blocks(x, 31)
    bit = (q >> 4).astype(np.uint8)  # [rows, nb, 8, 32]: sub-block j is bit j of qh[l]
    qh = np.zeros((*bit.shape[:2], 32), dtype=np.uint8)
    for j in range(8):
        qh |= bit[..., j, :] << j
    parts = [_f16_bytes(d), _f16_bytes(dmin), packed, qh, _nibbles(q)]
    return np.concatenate(parts, axis=-1).reshape(x.shape[0], -1)


def quantize_q6_k(x: Array) -> Array:
    """float [rows, K] (K % 256 == 0) -> uint8 [rows, K / 256 * 210]."""
    rows = x.shape[0]
    sub = x.astype(np.float32, copy=False).reshape(rows, -1, 16, 16)
    scale = np.abs(sub).max(-1) / 31
    d = (scale.max(-1) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale / _safe(d)[..., None]), 0, 127).astype(np.int8)
    step = (d[..., None] * sc)[..., None]
    q = (np.clip(np.rint(sub / _safe(step)), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(rows, -1, 2, 4, 32)  # [.., half n, quarter k, l]
    ql = np.concatenate(
        [
            q[..., 0, :] & 15 | (q[..., 2, :] & 15) << 4,
            q[..., 1, :] & 15 | (q[..., 3, :] & 15) << 4,
        ],
        axis=-1,
    )  # [rows, nb, 2, 64]
    qh = (q[..., 0, :] >> 4) | (q[..., 1, :] >> 4) << 2 | (q[..., 2, :] >> 4) << 4
    qh = qh | (q[..., 3, :] >> 4) << 6  # [rows, nb, 2, 32]
    block = np.concatenate(
        [ql.reshape(rows, -1, 128), qh.reshape(rows, -1, 64), sc.view(np.uint8), _f16_bytes(d)],
        axis=-1,
    )
    return block.reshape(rows, -1)


def _with_gguf(qtype: GGMLQuantizationType) -> Callable[[Array], Array]:
    def run(x: Array) -> Array:
        out: Array = gguf_quantize(x.astype(np.float32, copy=False), qtype)
        return out.view(np.uint8).reshape(x.shape[0], -1)

    return run


QUANTISERS: dict[GGMLQuantizationType, Callable[[Array], Array]] = {
    T.Q4_K: quantize_q4_k,
    T.Q5_K: quantize_q5_k,
    T.Q6_K: quantize_q6_k,
    **{
        t: _with_gguf(t)
        for t in (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4)
    },
    # IQ4_NL, IQ4_XS (iq4_quants.py)
    T.IQ4_NL: quantize_iq4_nl,
    T.IQ4_XS: quantize_iq4_xs,
}
"""Every type the generator writes, float32 [rows, K] -> uint8 [rows, row bytes]."""


def row_bytes(qtype: GGMLQuantizationType, k: int) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    return k // block * size


def check_width(qtype: GGMLQuantizationType, k: int) -> str | None:
    """Why rows of `k` values cannot be stored as `qtype` (None: they can)."""
    block = GGML_QUANT_SIZES[qtype][0]
    if k % block:
        return f"{qtype.name} stores rows in blocks of {block} values; {k} is not a multiple"
    return None


def quantize_rows(x: Array, qtype: GGMLQuantizationType) -> Array:
    """float32 [rows, K] -> uint8 [rows, row_bytes(qtype, K)]."""
    quantiser = QUANTISERS.get(qtype)
    if quantiser is None:
        raise ValueError(f"the generator cannot quantise to {qtype.name}")
    return quantiser(x)


# --- random valid blocks (kernel tests of the types we do not quantise) ------------------------

# Byte offsets of the float16 scale fields (d, and dmin / m) inside one block of each type.
SCALE_FIELDS: dict[GGMLQuantizationType, tuple[int, ...]] = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    # MXFP4 (its scale is an exponent byte: random_blocks sets it), IQ4_NL, IQ4_XS
    T.MXFP4: (),
    T.IQ4_NL: (0,),
    T.IQ4_XS: (0,),
}


def random_blocks(qtype: GGMLQuantizationType, rows: int, k: int, seed: int = 0) -> Array:
    """uint8 [rows, row bytes] of valid random `qtype` blocks: random bytes with every float16
    scale field a small positive value (float types: N(0, 0.05) values)."""
    rng = np.random.default_rng(seed)
    if qtype in (T.F32, T.F16, T.BF16):
        return quantize_rows(rng.standard_normal((rows, k), dtype=np.float32) * 0.05, qtype)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, k // block, size), dtype=np.uint8)
    for offset in SCALE_FIELDS[qtype]:
        scale = rng.uniform(0.002, 0.02, size=(rows, k // block)).astype(np.float16)
        raw[..., offset : offset + 2] = scale.view(np.uint8).reshape(rows, k // block, 2)
    if qtype == T.MXFP4:  # E8M0 scales 2^(e - 128) of 2^-10 .. 2^-5
        raw[..., 0] = rng.integers(118, 124, size=(rows, k // block), dtype=np.uint8)
    return raw.reshape(rows, -1)
