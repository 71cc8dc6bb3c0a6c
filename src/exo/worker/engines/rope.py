"""Rotary position embeddings, interleaved layout, as complex numbers.

Pair i of a head (dims 2i, 2i+1) is the complex number x_{2i} + j x_{2i+1}; at position p it is
multiplied by exp(j p w_i) with w_i = theta^(-2i / head_dim) (divided by per-pair factors for
llama3-style context extension). One complex multiply rotates every pair of every head.
"""

import math

import torch
from torch import Tensor

from exo.worker.engines.config import RopeScaling


def rope_frequencies(
    head_dim: int,
    theta: float,
    scaling: RopeScaling | None = None,
    freq_factors: Tensor | None = None,
) -> Tensor:
    """Angular frequency of each rotating pair: [head_dim / 2], float64."""
    w = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if freq_factors is not None:  # GGUF `rope_freqs.weight` (llama3 scaling, precomputed)
        w = w / freq_factors.to(torch.float64)
    elif scaling is not None and scaling.kind == "linear":
        w = w / scaling.factor
    elif scaling is not None and scaling.kind == "llama3":
        w = _llama3_scaled(w, scaling)
    return w


def _llama3_scaled(w: Tensor, s: RopeScaling) -> Tensor:
    """Slow pairs (long wavelength) divided by `factor`, fast ones kept, a linear ramp between."""
    wavelength = 2 * math.pi / w
    low_wavelength = s.original_context_length / s.low_freq_factor
    high_wavelength = s.original_context_length / s.high_freq_factor
    ramp = (s.original_context_length / wavelength - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    blended = (1 - ramp) * w / s.factor + ramp * w
    out = torch.where(wavelength > low_wavelength, w / s.factor, blended)
    return torch.where(wavelength < high_wavelength, w, out)


def rope_table(max_positions: int, frequencies: Tensor, device: torch.device) -> Tensor:
    """exp(j p w_i) for every position p < max_positions: complex64 [max_positions, head_dim/2]."""
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), frequencies)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64).to(device)


def apply_rope(x: Tensor, rotation: Tensor) -> Tensor:
    """Rotate x [..., n_heads, head_dim] by rotation [..., 1, head_dim/2] (complex)."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))  # [..., n_heads, hd/2]
    return torch.view_as_real(pairs * rotation).flatten(-2).to(x.dtype)
