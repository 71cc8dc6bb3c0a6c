"""IQ4_NL and IQ4_XS quantisers (numpy, every block of a chunk at once; gguf 0.19 only reads them).

Both map 4-bit codes through llama.cpp's non-linear table of 16 integers (-127 .. 113):

    IQ4_NL  18 bytes / 32 values: f16 d, 16 bytes of codes; value = d * NL[code]
    IQ4_XS 136 bytes / 256 values: f16 d, u16 scales_h, u8 scales_l[4], 128 bytes of codes;
            sub-block j (32 values) has scale d * (ls_j - 32), ls_j a 6-bit number (its low 4 bits
            a nibble of scales_l[j / 2], its high 2 bits bits 2j, 2j + 1 of scales_h)

In every 16 bytes of codes, byte i holds value i (low nibble) and value i + 16 (high nibble).

A block's scale: the table's longest side (-127) first put on the value of largest magnitude,
then 15 scales around that one tried (as llama.cpp's search does, without its importance
weights), each with its codes' least-squares scale; the best kept. IQ4_XS then puts its largest
sub-block scale on ls = 0 (-32 d) and rounds the others to 6-bit multiples of d; every code is
chosen last, against the scale the file stores (the f16 d, times ls - 32), as the nearest entry.
"""

from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]

NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                     dtype=np.float32)  # fmt: skip
_MIDPOINTS = (NL_VALUES[1:] + NL_VALUES[:-1]) / 2  # all multiples of 0.5
_TRIES = 7  # scales tried each side of the first
# the nearest entry's index for y in [b / 2, b / 2 + 1/2), b = -256 .. 256 (a midpoint is never
# inside such a bin: a value on one goes up, the same distance from both)
_BINS = np.searchsorted(_MIDPOINTS, np.arange(-256, 257) / 2, side="right").astype(np.uint8)


def _nearest(y: Array) -> Array:
    """The index of the table entry nearest each value (a lookup by half-units: a binary
    search per value was 10x slower)."""
    half_units = np.clip(np.floor(y * 2), -256, 256).astype(np.int16) + 256
    return _BINS[half_units]


def _codes(x: Array, scale: Array) -> Array:
    """x [..., 32], scale [...] -> the nearest codes of x / scale (0 where the scale is 0)."""
    s = scale[..., None]
    return _nearest(np.where(s != 0, x / np.where(s != 0, s, 1), 0))


def _best_scales(x: Array) -> Array:
    """x [..., 32] float32 -> each block's float scale (signed; 0 for a block of zeros)."""
    idx = np.abs(x).argmax(-1)[..., None]
    biggest = np.take_along_axis(x, idx, -1)[..., 0]
    best = biggest / NL_VALUES[0]  # biggest on -127
    best_score = np.full(best.shape, -1.0, dtype=np.float32)
    for t in range(-_TRIES, _TRIES + 1):
        values = NL_VALUES[_codes(x, biggest / (NL_VALUES[0] + t))]
        sum_qx = np.einsum("...i,...i->...", values, x)  # faster than sum(-1) over 32
        sum_q2 = np.einsum("...i,...i->...", values, values)
        score = sum_qx * sum_qx / sum_q2  # sum_q2 >= 32: the table holds no 0
        better = score > best_score
        best = np.where(better, sum_qx / sum_q2, best)
        best_score = np.where(better, score, best_score)
    return best.astype(np.float32)


def _pack_codes(codes: Array) -> Array:
    """[..., 32] codes -> [..., 16] bytes: value i low nibble, value i + 16 high."""
    return codes[..., :16] | (codes[..., 16:] << 4)


def _f16(x: Array) -> Array:
    return x.astype(np.float16)


def quantize_iq4_nl(x: Array) -> Array:
    """float [rows, K] (K % 32 == 0) -> uint8 [rows, K / 32 * 18]."""
    rows = x.shape[0]
    blocks = x.astype(np.float32, copy=False).reshape(rows, -1, 32)
    d = _f16(_best_scales(blocks))
    codes = _codes(blocks, d.astype(np.float32))
    out = np.concatenate([d[..., None].view(np.uint8), _pack_codes(codes)], axis=-1)
    return out.reshape(rows, -1)


def quantize_iq4_xs(x: Array) -> Array:
    """float [rows, K] (K % 256 == 0) -> uint8 [rows, K / 256 * 136]."""
    rows = x.shape[0]
    sub = x.astype(np.float32, copy=False).reshape(rows, -1, 8, 32)
    scales = _best_scales(sub)  # [rows, nb, 8]
    idx = np.abs(scales).argmax(-1)[..., None]
    d = _f16(np.take_along_axis(scales, idx, -1)[..., 0] / -32)  # [rows, nb]
    d32 = d.astype(np.float32)[..., None]
    ls = np.clip(np.rint(np.where(d32 != 0, scales / np.where(d32 != 0, d32, 1), 0)), -32, 31)
    codes = _codes(sub, d32 * ls.astype(np.float32))
    level = (ls + 32).astype(np.uint16)  # [rows, nb, 8], 0..63
    scales_l = ((level[..., 0::2] & 15) | ((level[..., 1::2] & 15) << 4)).astype(np.uint8)
    high = (level >> 4) << (2 * np.arange(8, dtype=np.uint16))
    scales_h = np.bitwise_or.reduce(high, axis=-1).astype(np.uint16)
    out = np.concatenate(
        [
            d[..., None].view(np.uint8),
            scales_h[..., None].view(np.uint8),
            scales_l,
            _pack_codes(codes).reshape(rows, -1, 128),
        ],
        axis=-1,
    )
    return out.reshape(rows, -1)
