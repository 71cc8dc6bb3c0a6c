"""Multi-head Latent Attention (DeepSeek V2 / V3, Kimi K2) over a paged cache of latents.

    c_q    = rmsnorm(x Wqa^T) g_qa                     q LoRA (q = x Wq^T when q_lora_rank is null)
    q_h    = c_q Wqb_h^T = [q_nope_h | q_rope_h]        H heads of dn + dr
    c, k_r = x Wkva^T                                   latent [R] and one rotary key [dr]
    c      = rmsnorm(c) g_kva                           R = kv_lora_rank
    q_rope_h, k_r = rotate(q_rope_h, pos), rotate(k_r, pos)
    k_h    = [c Wuk_h^T | k_r],   v_h = c Wuv_h^T       Wkvb = per head [Wuk_h (dn x R); Wuv_h (dv x R)]
    a_h    = softmax(s (q_h . k_h)) v_h                 s = (dn + dr)^-1/2 * m^2  (YaRN: m = 1 + 0.1
                                                        mscale_all_dim ln factor; else m = 1)
    out    = [a_1 .. a_H] Wo^T

The cache keeps what a position contributes to every head, [c | k_r] (R + dr values, one
"head"), never the expanded keys and values: for DeepSeek V3 576 values a position and layer
instead of 128 heads x 320. Attention runs on the latents, with Wuk absorbed into the query and
Wuv applied after the weighted sum (both exact by associativity):

    q_h . k_h = (q_nope_h Wuk_h) . c + q_rope_h . k_r        a_h = (softmax(..) [c]) Wuv_h^T

so a step reads each cached position once for all heads and never expands the cache (the
expansion would cost H (dn + dv) R multiply-adds per cached position per step; absorption costs
H (dn + dv) R per new token). Prefill absorbs too: one code path for every step shape. Where the
compiled kernels run, Wuk_h and Wuv_h are held as Q8_0 linears, one per head, run in one C call
(`moe_kernels.HeadLinears`): a quarter of the float32 bytes each step would read.

The latent is stored in the paged `KVCache` as one kv head of (R + dr) / 2 values in the key
half and the rest in the value half of a page, so a page holds exactly the latent, nothing else.
Rotary pairs are interleaved, as DeepSeek's checkpoints and llama.cpp's files hold them.
"""

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import quantize
from torch import Tensor

from exo.worker.engines.config import RopeScaling
from exo.worker.engines.kv_cache import LayerCache
from exo.worker.engines.linear import Linear, QuantLinear, RmsNorm
from exo.worker.engines.models.attention import StepTensors
from exo.worker.engines.models.linears import LinearMaker
from exo.worker.engines.models.norms import rms_norm
from exo.worker.engines.moe_kernels import HeadLinears
from exo.worker.engines.qtensor import QuantTensor, Weight
from exo.worker.engines.rope import apply_rope


@dataclass(frozen=True)
class MlaDims:
    """The shape of one MLA layer; `heads` is local to a tensor-parallel rank."""

    heads: int  # H
    q_lora_rank: int | None  # None: q = x Wq^T (DeepSeek V2-Lite)
    kv_lora_rank: int  # R
    qk_nope: int  # dn
    qk_rope: int  # dr
    v_head_dim: int  # dv

    @property
    def latent(self) -> int:
        """Values a position caches per layer: R + dr."""
        return self.kv_lora_rank + self.qk_rope

    @property
    def cache_half(self) -> int:
        """The latent's share of a page's key (and value) half: ceil((R + dr) / 2)."""
        return -(-self.latent // 2)


def mla_softmax_scale(dims: MlaDims, scaling: RopeScaling | None, mscale_all_dim: float) -> float:
    """s = (dn + dr)^-1/2, times m^2 under YaRN (m = 1 + 0.1 mscale_all_dim ln factor)."""
    scale = (dims.qk_nope + dims.qk_rope) ** -0.5
    if scaling is not None and scaling.kind == "yarn" and mscale_all_dim and scaling.factor > 1:
        m = 1.0 + 0.1 * mscale_all_dim * math.log(scaling.factor)
        scale *= m * m
    return scale


def kv_bytes_per_token(n_layers: int, dims: MlaDims, dtype_bytes: int) -> int:
    """Cache bytes of one position over `n_layers` MLA layers (pages hold 2 * cache_half)."""
    return n_layers * 2 * dims.cache_half * dtype_bytes


@dataclass(frozen=True)
class MlaWeights:
    """One layer's attention weights in the canonical layout (rotary pairs interleaved)."""

    wq_a: Weight | None  # [q_lora, D]         (None without q LoRA)
    q_a_norm: Tensor | None  # [q_lora]
    wq_b: Weight  # [H * (dn + dr), q_lora]  (Wq [H * (dn + dr), D] without q LoRA)
    wkv_a: Weight  # [R + dr, D]
    kv_a_norm: Tensor  # [R]
    wk_b: Tensor  # [H, R, dn]   Wuk_h^T: q_nope_h -> its latent query
    wv_b: Tensor  # [H, dv, R]   Wuv_h
    wo: Weight  # [D, H * dv]


def split_kv_b(kv_b: Weight, heads: int, dn: int, dv: int) -> tuple[Tensor, Tensor]:
    """Wkvb [H * (dn + dv), R] -> (Wuk^T [H, R, dn], Wuv [H, dv, R]) as llama.cpp's newer
    files store them (`attn_k_b`, `attn_v_b`)."""
    w = dense(kv_b).unflatten(0, (heads, dn + dv))
    return w[:, :dn].transpose(1, 2).contiguous(), w[:, dn:].contiguous()


def dense(w: Weight) -> Tensor:
    """A weight as a float tensor (a file's blocks dequantised)."""
    return w.dequantize() if isinstance(w, QuantTensor) else w


def _head_rows(w: Weight, heads: int, rank: int, world: int) -> Weight:
    per = w.shape[0] // heads * (heads // world)
    a, b = rank * per, (rank + 1) * per
    return w.rows(a, b) if isinstance(w, QuantTensor) else w[a:b].contiguous()


def slice_mla(w: MlaWeights, heads: int, rank: int, world: int) -> MlaWeights:
    """Rank `rank`'s heads of an MLA layer: q_b rows, Wuk / Wuv and Wo's columns by head; the
    down projections and their norms (shared by every head) replicated."""
    if heads % world:
        raise ValueError(f"heads ({heads}) must divide by the tensor-parallel world ({world})")
    n = heads // world
    wo = dense(w.wo)
    cols = wo.shape[1] // heads * n
    return replace(
        w,
        wq_b=_head_rows(w.wq_b, heads, rank, world),
        wk_b=w.wk_b[rank * n : (rank + 1) * n].contiguous(),
        wv_b=w.wv_b[rank * n : (rank + 1) * n].contiguous(),
        wo=wo[:, rank * cols : (rank + 1) * cols].contiguous(),
    )


@dataclass(frozen=True)
class MlaAttention:
    """One MLA layer in compute form (the input norm fused into the down projection)."""

    down: Linear  # h -> rmsnorm(h) g_attn [Wqa | Wkva]^T  ([Wq | Wkva] without q LoRA)
    q_up: Linear | None  # c_q -> rmsnorm(c_q) g_qa Wqb^T
    kv_a_norm: Tensor  # [R]
    wk_b: Tensor | None  # [H, R, dn]  (None: k_heads holds it, quantised)
    wv_b: Tensor | None  # [H, dv, R]
    o: Linear  # [.., H * dv] -> [.., D]
    dims: MlaDims
    scale: float
    eps: float
    k_heads: HeadLinears | None = None  # Wuk_h, Wuv_h as Q8_0 per-head linears (the kernels)
    v_heads: HeadLinears | None = None


def _head_linears(w: Tensor, make: LinearMaker) -> HeadLinears | None:
    """w [H, rows, K] float -> one Q8_0 linear per head in one C call, where the kernels run
    (a quarter of the float bytes a step reads; activations are 8-bit blocks as elsewhere)."""
    heads, rows, k = w.shape
    cpu = make.device.type == "cpu" and make.dtype == torch.float32
    if make.kernels is None or make.fmt not in ("q4", "q8") or not cpu or k % 32 or rows % 8:
        return None
    raw = quantize(w.reshape(heads * rows, k).float().numpy(), GGMLQuantizationType.Q8_0)
    q8 = QuantTensor(GGMLQuantizationType.Q8_0, torch.from_numpy(raw), k)
    linears = [make(q8.rows(h * rows, (h + 1) * rows)) for h in range(heads)]
    native = [x.native for x in linears if isinstance(x, QuantLinear)]
    if len(native) != heads or any(kern is not make.kernels for kern, _ in native):
        return None
    return HeadLinears(make.kernels, [q for _, q in native])


def build_mla(
    w: MlaWeights, attn_norm: Tensor, dims: MlaDims, scale: float, make: LinearMaker
) -> MlaAttention:
    norm = RmsNorm(attn_norm, make.eps)
    q_up = None
    if w.wq_a is not None:
        assert w.q_a_norm is not None
        down = make([w.wq_a, w.wkv_a], None, norm)
        q_up = make(w.wq_b, None, RmsNorm(w.q_a_norm, make.eps))
    else:
        down = make([w.wq_b, w.wkv_a], None, norm)

    def to(t: Tensor) -> Tensor:
        return t.to(device=make.device, dtype=make.dtype)

    k_heads, v_heads = _head_linears(w.wk_b, make), _head_linears(w.wv_b, make)
    quantised = k_heads is not None and v_heads is not None
    return MlaAttention(
        down=down,
        q_up=q_up,
        kv_a_norm=to(w.kv_a_norm),
        wk_b=None if quantised else to(w.wk_b),
        wv_b=None if quantised else to(w.wv_b),
        o=make(w.wo),
        dims=dims,
        scale=scale,
        eps=make.eps,
        k_heads=k_heads if quantised else None,
        v_heads=v_heads if quantised else None,
    )


def mla_attend(a: MlaAttention, h: Tensor, t: StepTensors, layer_cache: LayerCache) -> Tensor:
    """h [B, T, D] -> attention output [B, T, H * dv] (before Wo); the new latents cached."""
    d = a.dims
    heads, dn, r = d.heads, d.qk_nope, d.kv_lora_rank
    x = a.down(h)  # [B, T, q_part + R + dr]
    q_part = x.shape[-1] - d.latent
    q = x[..., :q_part] if a.q_up is None else a.q_up(x[..., :q_part].contiguous())
    q = q.unflatten(-1, (heads, dn + d.qk_rope))  # [B, T, H, dn + dr]
    assert t.rotation is not None
    q_rope = apply_rope(q[..., dn:].contiguous(), t.rotation)
    k_rope = apply_rope(x[..., q_part + r :].unsqueeze(2).contiguous(), t.rotation)
    latent = rms_norm(x[..., q_part : q_part + r], a.kv_a_norm, a.eps).unsqueeze(2)
    cached = _write_and_read(torch.cat([latent, k_rope], -1), d, layer_cache, t.kv_len)
    q_latent = _per_head(q[..., :dn], a.k_heads, a.wk_b, "bthn,hrn->bthr")  # Wuk absorbed
    query = torch.cat([q_latent, q_rope], -1)  # [B, T, H, R + dr]
    out = _attend_latent(query, cached, r, t, a.scale)  # [B, T, H, R]
    out = _per_head(out, a.v_heads, a.wv_b, "bthr,hvr->bthv")  # Wuv applied after the sum
    return out.flatten(2)


def _per_head(x: Tensor, heads: HeadLinears | None, w: Tensor | None, equation: str) -> Tensor:
    """x [B, T, H, K] -> [B, T, H, N] through each head's matrix (kernels, else an einsum)."""
    if heads is not None and x.dtype == torch.float32 and x.is_cpu:
        return heads(x)
    assert w is not None  # (kept in float where the kernels do not run)
    return torch.einsum(equation, x, w)


def _write_and_read(latent: Tensor, d: MlaDims, cache: LayerCache, kv_len: int) -> Tensor:
    """Store latents [B, T, 1, R + dr]; every row's cached latents [B, 1, L, R + dr]."""
    half = d.cache_half
    if 2 * half != d.latent:  # an odd latent: one value of padding
        latent = F.pad(latent, (0, 1))
    keys, values = cache.write_and_read(latent[..., :half], latent[..., half:], kv_len)
    return torch.cat([keys, values], -1)[..., : d.latent]


def _attend_latent(query: Tensor, cached: Tensor, r: int, t: StepTensors, scale: float) -> Tensor:
    """query [B, T, H, R + dr] over cached [B, 1, L, R + dr] (values: its first R) ->
    [B, T, H, R]. Every head of a row attends to the same latents, so the heads are folded
    into the query axis (T * H queries, position-major) over the one cached "head": the cache
    is never expanded per head."""
    bsz, n_new, heads, _ = query.shape
    mask = t.mask  # [B, 1, T, L] or None (decode of one row; or a causal prefill from 0)
    if mask is None and n_new > 1:  # causal from position 0: query t sees keys 0..t
        keys = torch.arange(cached.shape[2], device=query.device)
        mask = (keys <= torch.arange(n_new, device=query.device)[:, None])[None, None]
    if mask is not None:
        mask = mask.repeat_interleave(heads, dim=2)  # [B, 1, T * H, L]
    out = F.scaled_dot_product_attention(
        query.reshape(bsz, 1, n_new * heads, -1),
        cached,
        cached[..., :r],
        attn_mask=mask,
        scale=scale,
    )  # [B, 1, T * H, R]
    return out.reshape(bsz, n_new, heads, r)
