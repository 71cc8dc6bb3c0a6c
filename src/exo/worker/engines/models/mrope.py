"""Multimodal rotary positions (M-RoPE), Qwen2-VL's and Qwen3-VL's: each position is a triple
(t, h, w), and each rotating pair of a head turns with one of the three.

    pos(token)  = (p, p, p)                          a text token, p its 1-D position
    pos(image)  = (s, s + i, s + j)                  merged token (i, j) of an image whose
                                                     tokens start at 1-D position s
    after an image of lh x lw merged tokens, text continues at s + max(lh, lw)
                                                     (= its largest position + 1)
    pair k (of hd/2) turns by  pos[axis(k)] * w_k,   w_k = theta^(-2k / hd)
    axis(k)     sections (St, Sh, Sw), St + Sh + Sw = hd/2:
                Qwen2.5-VL: the first St pairs t, the next Sh h, the last Sw w
                Qwen3-VL (interleaved): k = 1, 4, 7, .. < 3 Sh -> h; k = 2, 5, .. < 3 Sw -> w;
                            the rest t

A prompt's positions are fixed at prefill; a request then decodes at its cache position plus
`delta` = (largest position + 1) - prompt length (0 without images: plain RoPE), all three
axes equal. Pairs here are the engine's interleaved ones (pair k = dims 2k, 2k+1 after the
loader's half-to-pair permutation), so one gather per axis builds the step's rotations.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

Grid = tuple[int, int, int]  # (t, gh, gw) patches of one image


@dataclass(frozen=True)
class MRope:
    """Which axis (0 t, 1 h, 2 w) each rotating pair of a head turns with."""

    sections: tuple[int, int, int]
    interleaved: bool

    def axes(self) -> Tensor:
        """[hd/2] long: the axis of each pair."""
        st, sh, sw = self.sections
        n = st + sh + sw
        if not self.interleaved:
            return torch.cat([torch.full((s,), a) for a, s in enumerate(self.sections)])
        axes = torch.zeros(n, dtype=torch.long)
        axes[1 : 3 * sh : 3] = 1
        axes[2 : 3 * sw : 3] = 2
        return axes


def mrope_positions(
    ids: Sequence[int], image_token: int, grids: Sequence[Grid], merge: int
) -> tuple[Tensor, int]:
    """The prompt's positions [3, T] (long) and its decode delta. Each run of `image_token`
    is the next image of `grids` (its t (gh/merge) (gw/merge) tokens); ValueError when the
    runs and the grids disagree."""
    out: list[Tensor] = []
    images = iter(grids)
    pos, i, n = 0, 0, len(ids)
    while i < n:
        j = i
        image = ids[i] == image_token
        while j < n and (ids[j] == image_token) == image:
            j += 1
        if not image:
            out.append(torch.arange(pos, pos + j - i).expand(3, -1))
            pos += j - i
            i = j
            continue
        grid = next(images, None)
        if grid is None:
            raise ValueError("the prompt has more image placeholders than images")
        t, lh, lw = grid[0], grid[1] // merge, grid[2] // merge
        # (several images back to back are one run: take this image's share of it)
        if j - i < t * lh * lw:
            raise ValueError(f"image of {t * lh * lw} tokens has {j - i} placeholders")
        tt, hh, ww = torch.meshgrid(
            torch.arange(t), torch.arange(lh), torch.arange(lw), indexing="ij"
        )
        out.append(torch.stack([tt, hh, ww]).reshape(3, -1) + pos)
        pos += max(lh, lw)
        i += t * lh * lw
    if next(images, None) is not None:
        raise ValueError("the prompt has fewer image placeholders than images")
    positions = torch.cat(out, dim=1) if out else torch.zeros(3, 0, dtype=torch.long)
    delta = (int(positions.max()) + 1 - n) if n else 0
    return positions, delta


def mrope_rotation(table: Tensor, positions: Tensor, axes: Tensor) -> Tensor:
    """The rotation of each new position: table [P, hd/2] complex (exp(j p w_k)), positions
    [3, B, T] long, axes [hd/2] -> [B, T, 1, hd/2] with pair k at table[positions[axes[k]], k]."""
    by_axis = table[positions]  # [3, B, T, hd/2]
    pick = axes.to(table.device).view(1, 1, 1, -1).expand(1, *by_axis.shape[1:])
    return by_axis.gather(0, pick)[0].unsqueeze(2)


def decode_positions(starts: Sequence[int], deltas: Sequence[int], n_new: int) -> Tensor:
    """[3, B, T] positions of rows continuing at cache position `starts[b]` with `deltas[b]`."""
    base = torch.tensor([s + d for s, d in zip(starts, deltas, strict=True)])
    return (base[:, None] + torch.arange(n_new)).expand(3, -1, -1)
