"""The engine's own q4 / q8 weight blocks (GGUF's Q4_1 / Q8_0 layouts), made from float weights.

Plain float matrices run by the compiled kernels are quantised to these once, at load
(`linear.py`); the embedding table shares a tied q8 head's blocks (`embedding.py`).
"""

import torch
from torch import Tensor

QUANT_BLOCK = 32


def _f16_bytes(t: Tensor) -> Tensor:
    """float values [..] -> their float16 bytes [.., 2]."""
    return t.to(torch.float16).contiguous().view(torch.uint8).reshape(*t.shape, 2)


def quantize_q4(weight: Tensor) -> Tensor:
    """[N, K] -> q4 blocks uint8 [N, K/32, 20]: {f16 d, f16 m, 16 bytes of nibbles}.

    w = d q + m with q in 0..15 (d, m from the block's min and max, like GGUF's Q4_1);
    byte j of a block holds element j in its low nibble and element j + 16 in its high one.
    """
    n, k = weight.shape
    blocks = weight.float().reshape(n, k // QUANT_BLOCK, QUANT_BLOCK)
    lo = blocks.amin(-1).half().float()
    scale = ((blocks.amax(-1) - lo) / 15).half().float()
    inv = torch.where(scale > 0, 1 / scale, 0.0)
    q = torch.round((blocks - lo[..., None]) * inv[..., None]).clamp(0, 15).to(torch.uint8)
    half = QUANT_BLOCK // 2
    nibbles = q[..., :half] | (q[..., half:] << 4)
    return torch.cat([_f16_bytes(scale), _f16_bytes(lo), nibbles], dim=-1).contiguous()


def quantize_q8(weight: Tensor) -> Tensor:
    """[N, K] -> q8 blocks uint8 [N, K/32, 34]: {f16 d, 32 x int8}; w = d q, |q| <= 127."""
    n, k = weight.shape
    blocks = weight.float().reshape(n, k // QUANT_BLOCK, QUANT_BLOCK)
    scale = (blocks.abs().amax(-1) / 127).half().float()
    inv = torch.where(scale > 0, 1 / scale, 0.0)
    q = torch.round(blocks * inv[..., None]).clamp(-127, 127).to(torch.int8).view(torch.uint8)
    return torch.cat([_f16_bytes(scale), q], dim=-1).contiguous()


def unpack_q4(blocks: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q4 blocks [..., nb, 20] -> (q uint8 [..., nb, 32] in element order, d and m float32
    [..., nb, 1]): w = d q + m."""
    scale = blocks[..., 0:2].contiguous().view(torch.float16).float()
    minimum = blocks[..., 2:4].contiguous().view(torch.float16).float()
    nibbles = blocks[..., 4:]
    return torch.cat([nibbles & 15, nibbles >> 4], dim=-1), scale, minimum


def dequantize_blocks(blocks: Tensor, bits: int) -> Tensor:
    """q4 / q8 blocks [..., K/32, 20 or 34] -> float32 [..., K]."""
    if bits == 4:
        q, scale, minimum = unpack_q4(blocks)
        return (q.float() * scale + minimum).flatten(-2)
    scale = blocks[..., 0:2].contiguous().view(torch.float16).float()  # [..., nb, 1]
    q = blocks[..., 2:].contiguous().view(torch.int8).float()
    return (q * scale).flatten(-2)
