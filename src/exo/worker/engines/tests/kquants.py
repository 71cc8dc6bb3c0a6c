"""Q4_K and Q6_K block packing (gguf 0.19 can dequantise these types but not quantise them).

Plain round-to-nearest with per-sub-block scales (no search for the best scales, as llama.cpp's
quantiser does): enough for generated test models, checked against gguf's dequantiser.

Q4_K, 256 values in 144 bytes: f16 d, f16 dmin, 12 bytes of eight 6-bit (scale, min) pairs,
128 bytes of nibbles; value = d * sc_j * q - dmin * m_j for sub-block j (32 values), q in 0..15.
Q6_K, 256 values in 210 bytes: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 int8
scales, f16 d; value = d * sc_j * (q - 32) for sub-block j (16 values), q in 0..63.
"""

from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


def _f16_bytes(x: Array) -> Array:
    return x.astype(np.float16).view(np.uint8).reshape(*x.shape, 2)


def quantize_q4_k(x: Array) -> Array:
    """float [rows, K] (K % 256 == 0) -> uint8 [rows, K / 256 * 144]."""
    rows = x.shape[0]
    sub = x.astype(np.float32).reshape(rows, -1, 8, 32)  # [rows, nb, 8 sub-blocks, 32]
    lo = np.minimum(sub.min(-1), 0.0)
    scale = (sub.max(-1) - lo) / 15
    d = (scale.max(-1) / 63).astype(np.float16).astype(np.float32)  # [rows, nb]
    dmin = ((-lo).max(-1) / 63).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d > 0, d, 1)[..., None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(-lo / np.where(dmin > 0, dmin, 1)[..., None]), 0, 63).astype(np.uint8)
    step = (d[..., None] * sc)[..., None]  # [rows, nb, 8, 1]
    offset = (dmin[..., None] * mn)[..., None]
    q = np.clip(np.round((sub + offset) / np.where(step > 0, step, 1)), 0, 15).astype(np.uint8)
    packed = np.zeros((*sc.shape[:-1], 12), dtype=np.uint8)
    packed[..., 0:4] = (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6)
    packed[..., 4:8] = (mn[..., :4] & 63) | ((mn[..., 4:] >> 4) << 6)
    packed[..., 8:12] = (sc[..., 4:] & 15) | ((mn[..., 4:] & 15) << 4)
    q = q.reshape(rows, -1, 4, 2, 32)  # 64-value chunks: low nibbles then high nibbles
    nibbles = (q[..., 0, :] | (q[..., 1, :] << 4)).reshape(rows, -1, 128)
    block = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed, nibbles], axis=-1)
    return block.reshape(rows, -1)


def quantize_q6_k(x: Array) -> Array:
    """float [rows, K] (K % 256 == 0) -> uint8 [rows, K / 256 * 210]."""
    rows = x.shape[0]
    sub = x.astype(np.float32).reshape(rows, -1, 16, 16)  # [rows, nb, 16 sub-blocks, 16]
    scale = np.abs(sub).max(-1) / 31
    d = (scale.max(-1) / 127).astype(np.float16).astype(np.float32)
    sc = np.clip(np.round(scale / np.where(d > 0, d, 1)[..., None]), 0, 127).astype(np.int8)
    step = (d[..., None] * sc)[..., None]
    q = np.clip(np.round(sub / np.where(step > 0, step, 1)), -32, 31).astype(np.int16) + 32
    q = q.astype(np.uint8).reshape(rows, -1, 2, 4, 32)  # [.., half n, quarter k, l]
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
