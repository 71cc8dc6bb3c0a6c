"""Qwen2.5-VL's and Qwen3-VL's vision transformer: dynamic resolution, 2-D rotary positions,
window attention (Qwen2.5-VL), learned positions and DeepStack mergers (Qwen3-VL).

    x_0     = patches Wp^T (+ bp, Qwen3)                   patches: `qwen_vl_processor`  [N, Dv]
    x_0    += bilinear(P, gh x gw)[patch]                  Qwen3: a learned side x side table
    (r, c)  = each patch's row and column in its image's grid (merge blocks consecutive)
    rotate  q, k of every head: the half-split pairs (i, i + hd/2) turn by angle
            [r w_0 .. r w_{hd/4-1}, c w_0 .. c w_{hd/4-1}]_i,  w_k = theta^(-4k / hd)
    block:  x += attn(norm1(x)) Wo^T;  x += mlp(norm2(x))
            norm = RMSNorm (Qwen2.5) | LayerNorm (Qwen3);  mlp = SwiGLU with biases (Qwen2.5)
            | fc2(gelu_tanh(fc1 x)) (Qwen3)
            attention within one image (full blocks) or within one window of
            `window_size / patch` patches a side (Qwen2.5's other blocks), never across
    merge:  each merge x merge block of patches -> one token of the text width:
            y = fc2(gelu(fc1(concat(norm(x_p) for p in block))))      (the main merger)
            DeepStack (Qwen3): after block `deepstack_visual_indexes[j]`, merger j (its norm
            over the concatenation) gives feature j, added to the hidden states of the image's
            tokens after text decoder layer j.

Weights by Hugging Face name under ``visual.`` or ``model.visual.``.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor

Grid = tuple[int, int, int]  # (t, gh, gw) patches
VisionKind = Literal["qwen2_5_vl", "qwen3_vl"]
Weights = Callable[[str], Tensor]  # a tower tensor by its name under the prefix
Pair = tuple[Tensor, Tensor | None]  # a linear's weight and bias
_EPS = 1e-6


@dataclass(frozen=True)
class QwenVisionConfig:
    kind: VisionKind
    depth: int
    hidden: int  # Dv
    intermediate: int
    heads: int
    out_hidden: int  # the text width
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    channels: int = 3
    rope_theta: float = 10000.0
    window_size: int = 112  # Qwen2.5: a window's side in pixels
    full_attention_blocks: tuple[int, ...] = ()  # Qwen2.5: blocks that see the whole image
    position_embeddings: int = 0  # Qwen3: learned positions, a square table
    deepstack_blocks: tuple[int, ...] = ()  # Qwen3: blocks whose output feeds a DeepStack merger

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @classmethod
    def from_hf(cls, kind: VisionKind, raw: dict[str, Any]) -> "QwenVisionConfig":
        def ints(key: str) -> tuple[int, ...]:
            return tuple(int(v) for v in cast(list[int], raw.get(key) or []))

        act = str(raw.get("hidden_act", "silu" if kind == "qwen2_5_vl" else "gelu_pytorch_tanh"))
        if act != ("silu" if kind == "qwen2_5_vl" else "gelu_pytorch_tanh"):
            raise ValueError(f"vision_config.hidden_act {act!r} is not supported for {kind}")
        rope = cast(dict[str, Any], raw.get("rope_parameters") or {})
        return cls(
            kind=kind,
            depth=int(raw["depth"]),
            hidden=int(raw["hidden_size"]),
            intermediate=int(raw["intermediate_size"]),
            heads=int(raw["num_heads"]),
            out_hidden=int(raw.get("out_hidden_size") or raw["hidden_size"]),
            patch_size=int(raw.get("patch_size", 14)),
            merge_size=int(raw.get("spatial_merge_size", 2)),
            temporal_patch_size=int(raw.get("temporal_patch_size", 2)),
            channels=int(raw.get("in_channels", 3)),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            window_size=int(raw.get("window_size", 112)),
            full_attention_blocks=ints("fullatt_block_indexes"),
            position_embeddings=int(raw.get("num_position_embeddings", 0)),
            deepstack_blocks=ints("deepstack_visual_indexes"),
        )


def tokens_of(grid: Grid, merge: int) -> int:
    """How many text tokens an image of this patch grid becomes."""
    t, h, w = grid
    return t * (h // merge) * (w // merge)


@dataclass(frozen=True)
class VisionOutput:
    """The images' tokens in the text width, all images concatenated in order: ``embeds``
    [n, D] and one [n, D] per DeepStack layer (Qwen3; the first len(deepstack) decoder layers)."""

    embeds: Tensor
    deepstack: tuple[Tensor, ...]
    grids: tuple[Grid, ...]


@dataclass(frozen=True)
class _Block:
    norm1: Pair  # RMSNorm: (gain, None); LayerNorm: (gain, bias)
    norm2: Pair
    qkv: Pair
    proj: Pair
    mlp: tuple[Pair, ...]  # Qwen2.5: gate, up, down; Qwen3: fc1, fc2


@dataclass(frozen=True)
class _Merger:
    norm: Pair
    fc1: Pair
    fc2: Pair
    after_shuffle: bool  # the norm runs over the concatenated block (DeepStack's)


class QwenVisionTower:
    """Patches of one or more images -> their text-width tokens (and DeepStack features)."""

    def __init__(self, config: QwenVisionConfig, weights: Weights,
                 dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
        self.config = config
        self.dtype = dtype
        c = config
        qwen3 = c.kind == "qwen3_vl"

        def w(name: str) -> Tensor:
            return weights(name).to(dtype)

        def pair(name: str, bias: bool = True) -> Pair:
            return w(f"{name}.weight"), w(f"{name}.bias") if bias else None

        patch = w("patch_embed.proj.weight")  # [Dv, C, T, P, P]
        bias = w("patch_embed.proj.bias") if qwen3 else None
        self.patch: Pair = (patch.reshape(patch.shape[0], -1), bias)
        self.positions = w("pos_embed.weight") if qwen3 else None  # [side^2, Dv]
        mlp = ("linear_fc1", "linear_fc2") if qwen3 else ("gate_proj", "up_proj", "down_proj")
        self.blocks = [
            _Block(
                norm1=pair(f"blocks.{i}.norm1", qwen3),
                norm2=pair(f"blocks.{i}.norm2", qwen3),
                qkv=pair(f"blocks.{i}.attn.qkv"),
                proj=pair(f"blocks.{i}.attn.proj"),
                mlp=tuple(pair(f"blocks.{i}.mlp.{m}") for m in mlp),
            )
            for i in range(c.depth)
        ]
        if qwen3:
            self.merger = _Merger(pair("merger.norm"), pair("merger.linear_fc1"),
                                  pair("merger.linear_fc2"), False)  # fmt: skip
        else:
            self.merger = _Merger(pair("merger.ln_q", False), pair("merger.mlp.0"),
                                  pair("merger.mlp.2"), False)  # fmt: skip
        self.deepstack = [
            _Merger(
                pair(f"deepstack_merger_list.{j}.norm"),
                pair(f"deepstack_merger_list.{j}.linear_fc1"),
                pair(f"deepstack_merger_list.{j}.linear_fc2"),
                True,
            )
            for j in range(len(c.deepstack_blocks))
        ]
        hd4 = c.head_dim // 4  # frequencies per axis
        self.inv_freq = c.rope_theta ** (-torch.arange(hd4, dtype=torch.float32) / hd4)

    @torch.inference_mode()
    def __call__(self, patches: Tensor, grids: Sequence[Grid]) -> VisionOutput:
        """patches [N, C T P P] of the images (`qwen_vl_processor.image_patches`, concatenated)
        and their grids -> their tokens."""
        c = self.config
        n = sum(t * h * w for t, h, w in grids)
        if patches.shape != (n, c.channels * c.temporal_patch_size * c.patch_size**2):
            raise ValueError(f"patches {list(patches.shape)} do not match grids {list(grids)}")
        x = F.linear(patches.to(self.dtype), *self.patch)  # [N, Dv]
        if self.positions is not None:
            x = x + self.learned_positions(grids)
        cos, sin = self.rotation(grids)
        whole = _segments([t * h * w for t, h, w in grids])
        windows, order = whole, None
        if c.kind == "qwen2_5_vl":
            order, lengths = window_order(grids, c)
            x, cos, sin = x[order], cos[order], sin[order]
            windows = _segments(lengths)
        features: list[Tensor] = []
        for i, block in enumerate(self.blocks):
            full = c.kind == "qwen3_vl" or i in c.full_attention_blocks
            # (a full block after the window permutation: still whole images, each contiguous)
            x = self._block(block, x, cos, sin, whole if full else windows)
            if i in c.deepstack_blocks:
                features.append(self._merge(self.deepstack[c.deepstack_blocks.index(i)], x))
        embeds = self._merge(self.merger, x)
        if order is not None:  # back to the merge blocks' raster order
            inverse = torch.argsort(order[:: c.merge_size**2] // c.merge_size**2)
            embeds = embeds[inverse]
        return VisionOutput(embeds, tuple(features), tuple(grids))

    def learned_positions(self, grids: Sequence[Grid]) -> Tensor:
        """Qwen3: the square table bilinearly resized (corners aligned) to each grid, in the
        patches' order: [N, Dv]."""
        assert self.positions is not None
        side = round(self.positions.shape[0] ** 0.5)
        table = self.positions.T.reshape(1, -1, side, side)
        out: list[Tensor] = []
        for t, h, w in grids:
            grid = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=True)[0]
            out.append(_merge_order(grid.permute(1, 2, 0), self.config.merge_size).repeat(t, 1))
        return torch.cat(out)

    def rotation(self, grids: Sequence[Grid]) -> tuple[Tensor, Tensor]:
        """cos, sin [N, hd] of each patch's 2-D rotary angles (half-split layout)."""
        rows: list[Tensor] = []
        for t, h, w in grids:
            r = torch.arange(h).view(h, 1).expand(h, w)
            col = torch.arange(w).view(1, w).expand(h, w)
            rc = torch.stack([r, col], dim=-1)  # [h, w, 2]
            rows.append(_merge_order(rc, self.config.merge_size).repeat(t, 1))
        rc = torch.cat(rows).float()  # [N, 2]
        angles = (rc[:, :, None] * self.inv_freq).flatten(1)  # [N, hd/2]: rows', then columns'
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    def _block(self, b: _Block, x: Tensor, cos: Tensor, sin: Tensor,
               segments: list[Tensor]) -> Tensor:  # fmt: skip
        x = x + self._attention(b, self._norm(b.norm1, x), cos, sin, segments)
        h = self._norm(b.norm2, x)
        if self.config.kind == "qwen2_5_vl":
            gate, up, down = b.mlp
            return x + F.linear(F.silu(F.linear(h, *gate)) * F.linear(h, *up), *down)
        fc1, fc2 = b.mlp
        return x + F.linear(F.gelu(F.linear(h, *fc1), approximate="tanh"), *fc2)

    def _attention(self, b: _Block, x: Tensor, cos: Tensor, sin: Tensor,
                   segments: list[Tensor]) -> Tensor:  # fmt: skip
        n, heads, hd = x.shape[0], self.config.heads, self.config.head_dim
        q, k, v = F.linear(x, *b.qkv).view(n, 3, heads, hd).unbind(1)  # [N, H, hd] each
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        out = torch.empty_like(q)
        for index in segments:  # [S, L]: S segments of L patches each
            qs, ks, vs = (t[index].transpose(1, 2) for t in (q, k, v))  # [S, H, L, hd]
            out[index] = F.scaled_dot_product_attention(qs, ks, vs).transpose(1, 2)
        return F.linear(out.reshape(n, heads * hd), *b.proj)

    def _norm(self, norm: Pair, x: Tensor) -> Tensor:
        gain, bias = norm
        if bias is None:
            return F.rms_norm(x.float(), (x.shape[-1],), None, _EPS).to(x.dtype) * gain
        return F.layer_norm(x, (x.shape[-1],), gain, bias, _EPS)

    def _merge(self, m: _Merger, x: Tensor) -> Tensor:
        width = x.shape[-1] * self.config.merge_size**2
        x = self._norm(m.norm, x.reshape(-1, width)) if m.after_shuffle else self._norm(m.norm, x)
        return F.linear(F.gelu(F.linear(x.reshape(-1, width), *m.fc1)), *m.fc2)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [N, H, hd] turned pairwise (i, i + hd/2) by the angles of cos, sin [N, hd]."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    out = x.float() * cos[:, None] + turned.float() * sin[:, None]
    return out.to(x.dtype)


def _merge_order(grid: Tensor, merge: int) -> Tensor:
    """[h, w, C] -> [h w, C] with each merge x merge block of patches consecutive."""
    h, w, ch = grid.shape
    blocks = grid.reshape(h // merge, merge, w // merge, merge, ch).permute(0, 2, 1, 3, 4)
    return blocks.reshape(h * w, ch)


def window_order(grids: Sequence[Grid], c: QwenVisionConfig) -> tuple[Tensor, list[int]]:
    """Qwen2.5-VL's windows: the patch order that makes each window contiguous (windows of
    `window_size / (patch merge)` merged tokens a side, raster order within and between them,
    image after image) and each window's length in patches."""
    side = c.window_size // c.merge_size // c.patch_size
    unit = c.merge_size**2
    order: list[Tensor] = []
    lengths: list[int] = []
    first = 0
    for t, h, w in grids:
        lh, lw = h // c.merge_size, w // c.merge_size
        r = torch.arange(lh).view(lh, 1).expand(lh, lw)
        col = torch.arange(lw).view(1, lw).expand(lh, lw)
        window = ((r // side) * -(-lw // side) + col // side).flatten()  # [lh lw]
        for frame in range(t):
            units = torch.argsort(window, stable=True) + first + frame * lh * lw
            order.append((units[:, None] * unit + torch.arange(unit)).flatten())
            lengths += [int(n) * unit for n in torch.bincount(window).tolist() if n]
        first += t * lh * lw
    return torch.cat(order), lengths


def _segments(lengths: Sequence[int]) -> list[Tensor]:
    """Index tensors [S, L] of consecutive segments of the given lengths, those of one length
    together (one attention call each)."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    by_length: dict[int, list[int]] = {}
    for start, n in zip(starts, lengths, strict=False):
        by_length.setdefault(n, []).append(start)
    return [torch.tensor(s)[:, None] + torch.arange(n) for n, s in by_length.items()]
