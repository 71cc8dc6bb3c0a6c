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


# --- issue 23: Q2_K and Q3_K ---------------------------------------------------------------------
# Q2_K, 256 values in 84 bytes: 16 bytes of (4-bit scale | 4-bit min << 4), one per 16-value
# sub-block, 64 bytes of 2-bit values, f16 d, f16 dmin; value = d * sc * q - dmin * m, q in 0..3.
# Q3_K, 256 values in 110 bytes: 32 bytes hmask, 64 bytes of 2-bit values, 12 bytes of sixteen
# 6-bit scales, f16 d; value = d * (sc - 32) * q, q in -4..3 (low 2 bits in qs, q + 4's bit 2 in
# hmask). Value 128n + 32j + l of a super-block is bits 2j of qs[32n + l] (bit 4n + j of hmask[l]).
# Each sub-block's integer scale (and min) is chosen among its rounded value and the neighbours
# by the squared error of the values it then gives.


def _two_bit_planes(q: Array) -> Array:
    """[rows, nb, 256] values whose low 2 bits are stored -> [rows, nb, 64] bytes."""
    planes = (q.reshape(*q.shape[:2], 2, 4, 32) & 3).astype(np.uint8)
    packed = planes[:, :, :, 0] | planes[:, :, :, 1] << 2 | planes[:, :, :, 2] << 4
    return (packed | planes[:, :, :, 3] << 6).reshape(*q.shape[:2], 64)


def _search(
    sub: Array, grid: list[tuple[Array, Array]], dequant: Callable[[Array, Array], Array]
) -> tuple[Array, Array]:
    """Per sub-block ([..., 16] values of `sub`), the (scale, min) pair of `grid` whose values
    (`dequant(scale, min)`, shaped like `sub`) are nearest in squared error."""
    best_err = np.full(sub.shape[:-1], np.inf, dtype=np.float32)
    best_a, best_b = grid[0]
    for a, b in grid:
        err = np.square(dequant(a, b) - sub).sum(-1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_a, best_b = np.where(better, a, best_a), np.where(better, b, best_b)
    return best_a, best_b


def _q2_k_values(sub: Array, d: Array, dmin: Array, sc: Array, mn: Array) -> tuple[Array, Array]:
    """(q, values) of sub-blocks `sub` [rows, nb, 16, 16] at integer scales sc and mins mn."""
    step, offset = (d * sc)[..., None], (dmin * mn)[..., None]
    q = np.clip(np.rint((sub + offset) / _safe(step)), 0, 3)
    return q, step * q - offset


def quantize_q2_k(x: Array) -> Array:
    """float [rows, K] (K % 256 == 0) -> uint8 [rows, K / 256 * 84]."""
    rows = x.shape[0]
    sub = x.astype(np.float32, copy=False).reshape(rows, -1, 16, 16)
    lo = np.minimum(sub.min(-1), 0.0)
    scale = (sub.max(-1) - lo) / 3
    d = (scale.max(-1) / 15).astype(np.float16).astype(np.float32)[..., None]  # [rows, nb, 1]
    dmin = ((-lo).max(-1) / 15).astype(np.float16).astype(np.float32)[..., None]
    sc0, mn0 = np.rint(scale / _safe(d)), np.rint(-lo / _safe(dmin))
    grid = [
        (np.clip(sc0 + i, 0, 15), np.clip(mn0 + j, 0, 15)) for i in (-1, 0, 1) for j in (-1, 0, 1)
    ]
    sc, mn = _search(sub, grid, lambda a, b: _q2_k_values(sub, d, dmin, a, b)[1])
    q = _q2_k_values(sub, d, dmin, sc, mn)[0].astype(np.uint8).reshape(rows, -1, 256)
    scales = (sc.astype(np.uint8) | mn.astype(np.uint8) << 4).reshape(rows, -1, 16)
    parts = [scales, _two_bit_planes(q), _f16_bytes(d[..., 0]), _f16_bytes(dmin[..., 0])]
    return np.concatenate(parts, axis=-1).reshape(rows, -1)


def _q3_k_values(sub: Array, d: Array, sc: Array) -> tuple[Array, Array]:
    """(q, values) of sub-blocks `sub` [rows, nb, 16, 16] at signed integer scales sc."""
    step = (d * sc)[..., None]
    safe = np.where(step != 0, step, np.float32(1))
    q = np.clip(np.rint(sub / safe), -4, 3)
    return q, step * q


def quantize_q3_k(x: Array) -> Array:
    """float [rows, K] (K % 256 == 0) -> uint8 [rows, K / 256 * 110]."""
    rows = x.shape[0]
    sub = x.astype(np.float32, copy=False).reshape(rows, -1, 16, 16)
    # the value of largest magnitude goes to q = -4 (the one level without a mirror)
    peak = np.take_along_axis(sub, np.abs(sub).argmax(-1)[..., None], -1)[..., 0]
    scale = -peak / 4  # [rows, nb, 16], signed
    top = np.take_along_axis(scale, np.abs(scale).argmax(-1)[..., None], -1)  # [rows, nb, 1]
    d = (-top / 32).astype(np.float16).astype(np.float32)  # top's scale is -32
    sc0 = np.rint(scale / np.where(d != 0, d, np.float32(1)))
    grid = [(np.clip(sc0 + i, -32, 31), sc0) for i in (-2, -1, 0, 1, 2)]
    sc, _ = _search(sub, grid, lambda a, _b: _q3_k_values(sub, d, a)[1])
    q = (_q3_k_values(sub, d, sc)[0] + 4).astype(np.uint8).reshape(rows, -1, 256)
    high = (q >> 2).reshape(rows, -1, 8, 32)  # bit g of hmask[l]: value 32g + l has q + 4 >= 4
    hmask = np.zeros((*high.shape[:2], 32), dtype=np.uint8)
    for g in range(8):
        hmask |= high[:, :, g] << g
    u = (sc + 32).astype(np.uint8).reshape(rows, -1, 16)
    packed = np.empty((*u.shape[:2], 12), dtype=np.uint8)
    packed[..., :8] = (u[..., :8] & 15) | (u[..., 8:] & 15) << 4
    hi = u >> 4  # scale i's top bits at bits 2 (i / 4) of byte 8 + i % 4
    packed[..., 8:] = hi[..., 0:4] | hi[..., 4:8] << 2 | hi[..., 8:12] << 4 | hi[..., 12:16] << 6
    parts = [hmask, _two_bit_planes(q), packed, _f16_bytes(d[..., 0])]
    return np.concatenate(parts, axis=-1).reshape(rows, -1)


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
    # issue 23
    T.Q2_K: quantize_q2_k,
    T.Q3_K: quantize_q3_k,
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


_E2M1 = np.array([0, 1, 2, 3, 4, 6, 8, 12], dtype=np.float32)  # doubled, as ggml holds them
_E2M1_MIDPOINTS = (_E2M1[1:] + _E2M1[:-1]) / 2


def mxfp4_round(x: Array) -> Array:
    """float32 [rows, K] rounded to the values MXFP4 blocks hold, as ggml's quantiser rounds
    them (a block's scale 2^(floor(log2 max|x|) - 3); nearest code, ties to the smaller; the
    largest codes clipped), in float arithmetic: many times faster than quantising and
    dequantising, and the same values (quantising them again is exact)."""
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        scale = np.exp2(np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 3).astype(np.float32)
    magnitudes = np.abs(blocks) / scale  # [0, 16)
    index = np.zeros(blocks.shape, dtype=np.uint8)
    for midpoint in _E2M1_MIDPOINTS:  # a tie stays below
        index += magnitudes > midpoint
    codes = _E2M1[index]
    return (np.copysign(codes, blocks) * scale).reshape(x.shape).astype(np.float32)


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
