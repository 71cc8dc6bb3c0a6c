"""Causal self-attention over the paged cache, grouped-query, with optional sliding windows.

    q, k = rotate(q, pos), rotate(k, pos)          (after a per-head rmsnorm, Qwen3 / Gemma)
    a    = softmax(q K^T / sqrt(hd) + mask) V      K, V: this row's cached keys and values

A step's tensors (rotations, mask, lengths) are built once per step and per kind of layer
(global or sliding, `step_tensors`) and shared by every layer of that kind. With the compiled
CPU kernels a decode step's rotation, cache write and attention are one call per layer,
sliding windows and gpt-oss's sinks included (`QKernels.decode_attention`, set up once a step for
the step's pages: `with_decode`); prefill runs in torch.
"""

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from exo.worker.engines.cpu_kernels import DecodeAttention, QKernels
from exo.worker.engines.images import block_mask
from exo.worker.engines.kv_cache import KVCache, LayerCache
from exo.worker.engines.models.base import StepInputs
from exo.worker.engines.rope import apply_rope


@dataclass(frozen=True)
class StepTensors:
    """`StepInputs` turned into tensors once per step, shared by every layer of one kind."""

    use_kernel: bool  # the compiled decode attention runs (it sees every cached position)
    rope: Tensor  # [P, hd/2] complex: the rotary table of these layers
    rotation: Tensor | None  # [B, T, 1, hd/2] complex: the rotation of each new position
    kv_len: int  # L: cache positions that any row attends to
    mask: Tensor | None  # [B, 1, T, L] bool (True = attend); None = all L (decode) / causal
    is_causal: bool  # prefill of one row from position 0: plain causal attention
    pos_index: Tensor  # [B] long: position of the new token (used when n_new == 1)
    window: int | None = None  # compiled decode: the keys a query sees, when not all of them
    key_lo: int = 0  # the first cache position read: earlier keys are outside every window
    # a sliding layer's masked prompt chunk in query blocks: (first, end) query rows and the
    # (first, end) keys (from key_lo) that they can see; None: one call over the whole mask
    spans: tuple[tuple[int, int, int, int], ...] | None = None
    # the compiled decode attention set up for the step's pages (`with_decode`), or None
    decode: DecodeAttention | None = None


QUERY_BLOCK = 64  # a masked prompt chunk's queries per call on sliding layers (`query_spans`)


def step_tensors(
    step: StepInputs,
    rope: Tensor,
    window: int | None,
    device: torch.device,
    compiled: bool,
) -> StepTensors:
    """The step's tensors for layers with rotary table `rope` and sliding `window` (None:
    global). `compiled`: the compiled decode attention is available."""
    bsz, n_new = len(step.slots), step.n_new
    blocks = () if step.images is None else step.images.blocks(step.starts[0])
    ends = [s + n_new for s in step.starts]
    kv_len = max(ends)
    if kv_len > rope.shape[0]:
        raise ValueError(f"position {kv_len - 1} is beyond the rotary table")
    sees_all = window is None or kv_len <= window  # no key has left the window yet
    starts = torch.tensor(step.starts, device=device)
    if n_new == 1 and compiled and not blocks:  # the compiled decode (it applies the window)
        return StepTensors(
            True, rope, None, kv_len, None, False, starts, None if sees_all else window
        )
    positions = starts[:, None] + torch.arange(n_new, device=device)  # [B, T]
    rotation = rope[positions].unsqueeze(2)  # [B, T, 1, hd/2]
    is_causal = bsz == 1 and step.starts[0] == 0 and n_new > 1 and sees_all and not blocks
    # A prompt chunk on a sliding layer reads only the keys its first query can see (decode
    # rows read them all, so a row's sums do not depend on the batch's other rows; a chunk
    # shares its start with every row of its forward).
    key_lo = 0 if window is None or n_new == 1 else max(0, min(step.starts) - window + 1)
    mask = None
    if blocks or not (is_causal or (bsz == 1 and n_new == 1 and sees_all)):
        # key j is visible to the query at position p iff j <= p or both are in one image
        # (bidirectional images) (and p - j < window).
        keys = torch.arange(key_lo, kv_len, device=device)
        mask = keys <= positions[:, :, None]  # [B, T, L]
        if blocks:
            mask = mask | block_mask(positions, kv_len, blocks)[..., key_lo:]
        if window is not None:
            mask = mask & (keys > positions[:, :, None] - window)
        mask = mask.unsqueeze(1)  # [B, 1, T, L]
    spans = None if mask is None or blocks else query_spans(step, window, key_lo)
    return StepTensors(
        use_kernel=False,
        rope=rope,
        rotation=rotation,
        kv_len=kv_len,
        mask=mask,
        is_causal=is_causal,
        pos_index=starts,
        key_lo=key_lo,
        spans=spans,
    )


def with_decode(t: StepTensors, kernels: QKernels | None, cache: KVCache) -> StepTensors:
    """`t` with the compiled decode attention set up once for the step's layers of its kind
    (after `cache.prepare`: the step's pages), where `t` runs it."""
    if not t.use_kernel or kernels is None:
        return t
    paged = cache.layer(0).paged()
    return replace(t, decode=kernels.decode_attention(t.rope, paged, t.pos_index, t.window))


def query_spans(
    step: StepInputs, window: int | None, key_lo: int
) -> tuple[tuple[int, int, int, int], ...] | None:
    """A masked prompt chunk of a sliding-window layer in blocks of QUERY_BLOCK queries, each
    with the keys its queries can see: from its first query's window to its last query. torch's
    attention computes a mask's every entry: a 512-token chunk past a window of 512 holds ~1,000
    keys, a 64-query block ~575 (measured, Gemma 3 270M's heads, 2 threads: 1.42-1.47x faster
    than one call; 128-query blocks 1.28-1.34x). Global layers keep one call: their blocks
    skip less (the keys after each query only) and re-read the keys once per block (measured
    0.87x at 4,096 keys of 256 dimensions, 1.00-1.11x at 1,536 keys of 64). None when not a
    sliding layer or the chunk fits one block. Images never get here: a query may see an
    image's keys that come after it."""
    n_new = step.n_new
    if window is None or n_new <= QUERY_BLOCK:
        return None
    first, last = min(step.starts), max(step.starts)
    spans: list[tuple[int, int, int, int]] = []
    for q0 in range(0, n_new, QUERY_BLOCK):
        q1 = min(n_new, q0 + QUERY_BLOCK)
        k0 = max(key_lo, first + q0 - window + 1) - key_lo  # key_lo >= 0
        spans.append((q0, q1, k0, last + q1 - key_lo))
    return tuple(spans)


@dataclass(frozen=True)
class AttentionShape:
    heads: int  # H (local to this TP rank)
    kv_heads: int  # KV
    head_dim: int  # hd
    qk_norm: Tensor | None  # [H + KV, hd]  per-head norm gains, q heads then k
    eps: float


def attend(
    qkv: Tensor,
    s: AttentionShape,
    t: StepTensors,
    layer_cache: LayerCache,
    kernels: QKernels | None,
    sinks: Tensor | None = None,
) -> Tensor:
    """qkv [B, T, (H + 2KV) * hd] -> attention output [B, T, H*hd]; the new k, v are stored.
    sinks [H] float32: gpt-oss's sink logits (`attend_with_sinks`)."""
    bsz, n_new, _ = qkv.shape
    hd, heads, kvh = s.head_dim, s.heads, s.kv_heads
    if t.decode is not None:  # rotate, cache, attend: one compiled call
        return t.decode(qkv, heads, kvh, hd, s.qk_norm, s.eps, layer_cache.offset, sinks)
    if t.use_kernel and kernels is not None:  # (the same, set up for this layer alone)
        return kernels.attend_decode(
            qkv, heads, kvh, hd, t.rope, s.qk_norm, s.eps, layer_cache.paged(), t.pos_index,
            sinks=sinks, window=t.window,
        )  # fmt: skip
    if sinks is not None:
        return attend_with_sinks(qkv, s, t, layer_cache, sinks)
    q, keys, values = _rotate_and_cache(qkv, s, t, layer_cache)
    if n_new == 1:
        # One query per row: fold the query heads of each kv group into the query axis.
        q1 = q.reshape(bsz, kvh, heads // kvh, hd)  # [B, KV, G, hd]
        out = F.scaled_dot_product_attention(q1, keys, values, attn_mask=t.mask)
        return out.reshape(bsz, 1, heads * hd)
    qt = q.transpose(1, 2)  # [B, H, T, hd]
    if t.spans is not None and t.mask is not None:  # each query block over its keys only
        out = torch.cat([
            F.scaled_dot_product_attention(
                qt[:, :, q0:q1], keys[:, :, k0:k1], values[:, :, k0:k1],
                attn_mask=t.mask[:, :, q0:q1, k0:k1], enable_gqa=heads != kvh,
            )
            for q0, q1, k0, k1 in t.spans
        ], dim=2)  # fmt: skip
    else:
        out = F.scaled_dot_product_attention(
            qt, keys, values, attn_mask=t.mask, is_causal=t.is_causal, enable_gqa=heads != kvh
        )  # [B, H, T, hd]
    return out.transpose(1, 2).reshape(bsz, n_new, heads * hd)


def _rotate_and_cache(
    qkv: Tensor, s: AttentionShape, t: StepTensors, layer_cache: LayerCache
) -> tuple[Tensor, Tensor, Tensor]:
    """qkv [B, T, (H + 2KV) * hd] -> q [B, T, H, hd] rotated, and this row's cached keys and
    values at positions [lo, L) [B, KV, L - lo, hd] with the new ones written."""
    hd, heads, kvh = s.head_dim, s.heads, s.kv_heads
    qk = qkv[..., : (heads + kvh) * hd].unflatten(-1, (heads + kvh, hd))  # [B, T, H+KV, hd]
    if s.qk_norm is not None:
        qk = F.rms_norm(qk, (hd,), None, s.eps) * s.qk_norm
    assert t.rotation is not None
    qk = apply_rope(qk, t.rotation)  # q and k heads rotated together
    q, k = qk[:, :, :heads], qk[:, :, heads:]  # [B, T, H, hd], [B, T, KV, hd]
    v = qkv[..., (heads + kvh) * hd :].unflatten(-1, (kvh, hd))  # [B, T, KV, hd]
    keys, values = layer_cache.write_and_read(k, v, t.kv_len, t.key_lo)  # [B, KV, L - lo, hd]
    return q, keys, values


def attend_with_sinks(
    qkv: Tensor, s: AttentionShape, t: StepTensors, layer_cache: LayerCache, sinks: Tensor
) -> Tensor:
    """Attention with a learned logit per head that takes part in the softmax and attends to
    nothing (gpt-oss's sinks: a head may give most of its weight to no position):

        p = softmax([q K^T / sqrt(hd) + mask, sink_h])[:L];  a = p V

    qkv [B, T, (H + 2KV) * hd], sinks [H] -> [B, T, H*hd]; the new k, v are stored. (`t` is
    built for the torch path: `attend` runs the compiled decode.)"""
    bsz, n_new, _ = qkv.shape
    heads, group = s.heads, s.heads // s.kv_heads
    q, keys, values = _rotate_and_cache(qkv, s, t, layer_cache)
    mask = t.mask
    if mask is None and t.is_causal:
        mask = torch.ones(n_new, t.kv_len, dtype=torch.bool, device=qkv.device).tril()
    rows: list[Tensor] = []
    for b in range(bsz):  # each row over its own keys only: the same sums alone or batched
        n_keys = int(t.pos_index[b]) + n_new - t.key_lo  # keys from position lo
        k = keys[b, :, :n_keys].repeat_interleave(group, 0).float()  # [H, L_b, hd]
        v = values[b, :, :n_keys].repeat_interleave(group, 0)
        scores = (q[b].transpose(0, 1).float() @ k.transpose(-1, -2)) / s.head_dim**0.5
        if mask is not None:  # [B, 1, T, L] or the causal [T, L]
            row_mask = mask[b] if mask.dim() == 4 else mask
            scores = scores.masked_fill(~row_mask[..., :n_keys], float("-inf"))
        sink = sinks.float().view(heads, 1, 1).expand(heads, n_new, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        rows.append((probs.to(v.dtype) @ v).transpose(0, 1).reshape(n_new, -1))  # [T, H*hd]
    return torch.stack(rows)


def check_step(step: StepInputs, cache: KVCache) -> None:
    n = len(step.slots)
    if n == 0 or n != len(step.starts) or step.n_new < 1:
        raise ValueError(f"bad step: {step}")
    if len(set(step.slots)) != n or not all(0 <= s < cache.max_batch for s in step.slots):
        raise ValueError(f"slots {step.slots} invalid for a cache of {cache.max_batch} slots")
    if any(s < 0 or s + step.n_new > cache.max_seq for s in step.starts):
        raise ValueError(f"positions beyond the cache length {cache.max_seq}")
