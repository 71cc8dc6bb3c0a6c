"""The Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3, Gemma 3), a layer range.

    h_0 = E[tokens] (* sqrt(D), Gemma)                       embed        (first shard only)
    for each block:
        x   = rmsnorm(h) * g_attn
        q, k, v = x Wq^T, x Wk^T, x Wv^T     (+ bias, Qwen2; per-head rmsnorm of q, k, Qwen3/Gemma)
        q, k = rotate(q, pos), rotate(k, pos)       (sliding layers: their own rotary base)
        a   = attention(q, K_cache, V_cache) Wo^T   (sliding layers: only the last W keys)
        h   = h + allreduce(a)                      (Gemma: h + rmsnorm(allreduce(a)) * g_post_attn)
        x   = rmsnorm(h) * g_ffn
        m   = (act(x Wg^T) * (x Wu^T)) Wd^T         act = silu (gelu-tanh, Gemma)
        h   = h + allreduce(m)                      (Gemma: h + rmsnorm(allreduce(m)) * g_post_ffn)
    logits = (rmsnorm(h) * g_out) W_head^T                   head         (last shard only)
    logits = cap * tanh(logits / cap)                        (if the config caps them)

Implementation choices, all for fewer and cheaper operations per token: each linear layer fuses
the operation before it (RMSNorm with its gain, or SwiGLU / GeGLU) and the residual add after it
(with Gemma's norm before the add, unless an all-reduce comes between them; see `linear.py`); q, k, v are one matmul with the rows stacked, gate and up another; q and k rotate
together in one complex multiply; attention is `scaled_dot_product_attention` over the paged
cache (`kv_cache.py`), sliding-window layers masking by position. A model-specific attention
scale is folded into q (its per-head norm's gain, its float weights, or, for weights kept in a
file's blocks, a multiply of q after the matmul), so every attention runs at the standard
1/sqrt(hd). With the compiled CPU kernels (`cpu_kernels.py`), a decode step's rotation, cache
write and attention are one call per layer, so a block is five calls (a sliding layer whose
window no longer holds every cached position runs the torch path with a mask instead).

Tensor parallelism: build the model from `weights.slice_shard(...)` and pass the all-reduce as
`all_reduce` (identity by default); head counts are read from the (sliced) weight shapes.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.cpu_kernels import QKernels, load_kernels
from exo.worker.engines.embedding import Embedding
from exo.worker.engines.kv_cache import KVCache, LayerCache
from exo.worker.engines.linear import (
    GeGLU,
    Linear,
    Prologue,
    Regroup,
    RmsNorm,
    SwiGLU,
    WeightFormat,
    make_linear,
)
from exo.worker.engines.qtensor import Weight
from exo.worker.engines.rope import apply_rope, rope_frequencies, rope_table
from exo.worker.engines.weights import LayerWeights, ShardWeights

AllReduce = Callable[[Tensor], Tensor]


def no_all_reduce(x: Tensor) -> Tensor:
    return x


@dataclass(frozen=True)
class StepInputs:
    """Where a step's new tokens go, as plain values (pipeline stages each get the same).

    Row b of the batch writes `n_new` tokens to cache slot `slots[b]`, at positions
    starts[b] .. starts[b] + n_new - 1 (its first `starts[b]` positions are already cached).
    """

    slots: tuple[int, ...]
    starts: tuple[int, ...]
    n_new: int

    @staticmethod
    def single(slot: int, start: int, n_new: int) -> "StepInputs":
        return StepInputs((slot,), (start,), n_new)


@dataclass(frozen=True)
class _StepTensors:
    """`StepInputs` turned into tensors once per step, shared by every layer."""

    use_kernel: bool  # the compiled decode attention runs (it sees every cached position)
    rope: Tensor  # [P, hd/2] complex: the rotary table of these layers
    rotation: Tensor | None  # [B, T, 1, hd/2] complex: the rotation of each new position
    kv_len: int  # L: cache positions that any row attends to
    mask: Tensor | None  # [B, 1, T, L] bool (True = attend); None = all L (decode) / causal
    is_causal: bool  # prefill of one row from position 0: plain causal attention
    pos_index: Tensor  # [B] long: position of the new token (used when n_new == 1)


@dataclass(frozen=True)
class Block:
    """One transformer block's weights in compute form (norms fused into the linears)."""

    qkv: Linear  # h [.., D] -> rmsnorm(h) g_attn [Wq | Wk | Wv]^T: [.., (H + 2KV) * hd]
    o: Linear  # [.., H*hd] -> [.., D]
    gate_up: Linear  # h [.., D] -> rmsnorm(h) g_ffn [Wg | Wu]^T: [.., 2F]
    down: Linear  # [.., 2F] -> silu(gate) * up Wd^T (SiLU), or [.., F] -> x Wd^T (GELU-tanh)
    heads: int  # H (local to this TP rank)
    kv_heads: int  # KV
    qk_norm: Tensor | None  # [H + KV, hd]  per-head norm gains (Qwen3, Gemma), q heads then k
    q_scale: float  # q *= q_scale after the matmul (1.0 unless it could not be folded in)
    post_attn_norm: Tensor | None  # [D]  Gemma 3: norm of the attention output (unless fused)
    post_ffn_norm: Tensor | None  # [D]  Gemma 3: norm of the MLP output (unless fused)
    sliding: bool  # attends to the last `config.sliding_window` positions only


def _q_scale(config: LlamaConfig) -> float:
    """attn_scale / (1 / sqrt(hd)): what q is multiplied by so attention uses 1 / sqrt(hd)."""
    return 1.0 if config.attn_scale is None else config.attn_scale * math.sqrt(config.head_dim)


def build_block(
    layer: LayerWeights,
    config: LlamaConfig,
    index: int,
    fmt: WeightFormat,
    dtype: torch.dtype,
    device: torch.device,
    kernels: QKernels | None,
    fuse_post_norms: bool = True,
    regroup: Regroup = "copy",
) -> Block:
    """Block `index` (a global layer number) in compute form. `fuse_post_norms`: Gemma's norms
    after attention / MLP run inside o / down (not with tensor parallelism: the all-reduce comes
    between the layer and its norm). `regroup`: what its linears may do with the layer's blocks
    (`Regroup`)."""
    hd, eps = config.head_dim, config.rms_eps
    heads, kv_heads = layer.wq.shape[0] // hd, layer.wk.shape[0] // hd
    wq, bq, q_scale = layer.wq, layer.bq, _q_scale(config)
    qk_norm = None
    if layer.q_norm is not None and layer.k_norm is not None:
        # q is normalised per head, so its scale goes into the norm's gain, not into Wq
        q_gain = layer.q_norm.float() * q_scale
        qk_norm = torch.cat([q_gain.expand(heads, hd), layer.k_norm.expand(kv_heads, hd)]).to(
            device=device, dtype=dtype
        )
        q_scale = 1.0
    elif q_scale != 1.0 and isinstance(wq, Tensor):  # float weights: fold it into them
        wq, bq = wq * q_scale, None if bq is None else bq * q_scale
        q_scale = 1.0
    # (else Wq is a file's blocks, which a scale would re-round: q is scaled after the matmul)

    def to_dev(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.to(device=device, dtype=dtype)

    def linear(
        w: Weight | list[Weight],
        bias: Tensor | None = None,
        prologue: Prologue = None,
        post: Tensor | None = None,
    ) -> Linear:
        post_norm = RmsNorm(post.to(device), eps) if post is not None and fuse_post_norms else None
        return make_linear(
            w,
            bias,
            fmt,
            prologue=prologue,
            dtype=dtype,
            device=device,
            kernels=kernels,
            post_norm=post_norm,
            regroup=regroup,
        )

    def unfused(norm: Tensor | None) -> Tensor | None:
        return None if fuse_post_norms else to_dev(norm)

    bias = None  # [(H + 2KV) * hd]  (Qwen2)
    if bq is not None and layer.bk is not None and layer.bv is not None:
        bias = torch.cat([bq, layer.bk, layer.bv])
    return Block(
        qkv=linear([wq, layer.wk, layer.wv], bias, RmsNorm(layer.attn_norm, eps)),
        o=linear(layer.wo, post=layer.post_attn_norm),
        gate_up=linear([layer.w_gate, layer.w_up], None, RmsNorm(layer.ffn_norm, eps)),
        # the gating (SiLU or GELU-tanh) is fused into the down projection
        down=linear(
            layer.w_down,
            None,
            SwiGLU() if config.activation == "silu" else GeGLU(),
            post=layer.post_ffn_norm,
        ),
        heads=heads,
        kv_heads=kv_heads,
        qk_norm=qk_norm,
        q_scale=q_scale,
        post_attn_norm=unfused(layer.post_attn_norm),
        post_ffn_norm=unfused(layer.post_ffn_norm),
        sliding=config.is_sliding(index),
    )


def head_format(fmt: WeightFormat) -> WeightFormat:
    """The head keeps 8 bits under q4: logits are sensitive and it was Q8_0 in GGUF files."""
    return "q8" if fmt == "q4" else fmt


class LlamaModel:
    """Layers [start_layer, end_layer) of a Llama-family model, plus embedding / head if held."""

    def __init__(
        self,
        weights: ShardWeights,
        *,
        weight_format: WeightFormat = "dense",
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        all_reduce: AllReduce = no_all_reduce,
        kernels: QKernels | None = None,
        own_weights: bool = False,
    ) -> None:
        """`own_weights`: the model may overwrite the blocks of `weights` (re-laid for the
        kernels in place, `Regroup`): its loader hands them over. Otherwise they are copied
        where re-laid, and `weights` stays as it was."""
        c = weights.config
        self.config: LlamaConfig = c
        self.start_layer = weights.start_layer
        self.end_layer = weights.end_layer
        self.dtype = dtype
        self.device = torch.device(device)
        self.all_reduce = all_reduce
        self.eps = c.rms_eps
        hd = c.head_dim
        if weight_format in ("q4", "q8") and kernels is None:
            kernels = load_kernels()
        self.weight_format: WeightFormat = weight_format
        # The compiled decode attention runs whenever the kernels are loaded (float32 CPU).
        self._kernels = kernels if dtype == torch.float32 and self.device.type == "cpu" else None
        fuse = all_reduce is no_all_reduce
        regroup: Regroup = "in_place" if own_weights else "copy"
        self.blocks = [
            build_block(
                w, c, weights.start_layer + i, weight_format, dtype, self.device, kernels, fuse,
                regroup,
            )
            for i, w in enumerate(weights.layers)
        ]
        self.kv_heads = self.blocks[0].kv_heads if self.blocks else c.kv_heads
        self.lm_head: Linear | None = None  # h -> rmsnorm(h) g_out W_head^T
        # The final norm's gain on its own (the head folds it in): for hidden states.
        self.final_norm: Tensor | None = None
        if weights.final_norm is not None:
            self.final_norm = weights.final_norm.to(device=self.device, dtype=dtype)
        if weights.lm_head is not None and weights.final_norm is not None:
            self.lm_head = make_linear(
                weights.lm_head,
                None,
                head_format(weight_format),
                prologue=RmsNorm(weights.final_norm, c.rms_eps),
                dtype=dtype,
                device=self.device,
                kernels=kernels,
                # (a tied head's blocks are also the embedding's rows: it reads them back)
                regroup=regroup,
            )
        # The embedding table in its running format (shared with a tied q8 head).
        self.embedding: Embedding | None = None
        if weights.embed is not None:
            tied = weights.embed is weights.lm_head
            head = self.lm_head if tied else None
            self.embedding = Embedding(weights.embed, weight_format, dtype, self.device, head)
        # Rotary tables [P, hd/2] of global (False) and sliding (True) layers: the same table
        # unless sliding layers have a rotary base of their own (Gemma 3).
        global_freqs = rope_frequencies(hd, c.rope_theta, c.rope_scaling, weights.rope_freq_factors)
        local_freqs = global_freqs
        if c.rope_theta_local is not None:
            local_freqs = rope_frequencies(hd, c.rope_theta_local)
        self._freqs = {False: global_freqs, True: local_freqs}
        self._ropes: dict[bool, Tensor] = {}
        self._build_rope_tables(c.context_length)

    def _build_rope_tables(self, n_positions: int) -> None:
        table = rope_table(n_positions, self._freqs[False], self.device)
        local = self._freqs[True]
        same = local is self._freqs[False]
        self._ropes = {
            False: table,
            True: table if same else rope_table(n_positions, local, self.device),
        }

    # --- the three stages ------------------------------------------------------------------

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> hidden [B, T, D]."""
        if self.embedding is None:
            raise RuntimeError("this shard does not hold the embedding (start_layer > 0)")
        hidden = self.embedding(tokens.to(self.device))
        scale = self.config.embed_scale
        return hidden if scale is None else hidden * torch.tensor(scale, dtype=hidden.dtype)

    def forward_layers(self, hidden: Tensor, step: StepInputs, cache: KVCache) -> Tensor:
        """hidden [B, T, D] through this shard's blocks; writes their keys/values to `cache`."""
        _check_step(step, cache)
        per_kind = {s: self._step_tensors(step, s) for s in {b.sliding for b in self.blocks}}
        cache.prepare(step.slots, step.starts, step.n_new)  # pages for the new positions
        for i, block in enumerate(self.blocks):
            hidden = self._block(block, hidden, per_kind[block.sliding], cache.layer(i))
        return hidden

    def head(self, hidden: Tensor) -> Tensor:
        """hidden [..., D] -> logits [..., V] (float32)."""
        if self.lm_head is None:
            raise RuntimeError("this shard does not hold the head (end_layer < n_layers)")
        logits = self.lm_head(hidden).float()
        cap = self.config.final_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def forward(
        self, tokens: Tensor, step: StepInputs, cache: KVCache, every_position: bool = False
    ) -> Tensor:
        """Whole model (single shard): tokens [B, T] -> logits of the last position [B, V]
        (of every position [B, T, V] with ``every_position``: a prompt's log-probabilities)."""
        hidden = self.forward_layers(self.embed(tokens), step, cache)
        return self.head(hidden if every_position else hidden[:, -1])

    def final_hidden(self, tokens: Tensor) -> Tensor:
        """Whole model (single shard): tokens [1, T] -> final hidden states [T, D] after the
        final norm (float32), on a scratch cache of T positions."""
        if self.final_norm is None:
            raise RuntimeError("this shard does not hold the final norm (end_layer < n_layers)")
        n = int(tokens.shape[1])
        hidden = self.forward_layers(
            self.embed(tokens), StepInputs.single(0, 0, n), self.new_cache(1, n)
        )
        normed = F.rms_norm(hidden[0], (hidden.shape[-1],), self.final_norm, self.eps)
        return normed.float()

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        if max_seq > self._ropes[False].shape[0]:  # beyond the trained context: extend the tables
            self._build_rope_tables(max_seq)
        return KVCache(
            len(self.blocks),
            max_batch,
            max_seq,
            self.kv_heads,
            self.config.head_dim,
            dtype=self.dtype,
            device=self.device,
        )

    # --- inside a block --------------------------------------------------------------------

    def _block(self, b: Block, h: Tensor, t: _StepTensors, layer_cache: LayerCache) -> Tensor:
        h = self._residual(h, b.o, self._attention(b, h, t, layer_cache), b.post_attn_norm)
        x = b.gate_up(h)  # [B, T, 2F]   (norm fused in; the gating is down's prologue)
        return self._residual(h, b.down, x, b.post_ffn_norm)

    def _residual(self, h: Tensor, layer: Linear, x: Tensor, post_norm: Tensor | None) -> Tensor:
        """h + [rmsnorm](allreduce(layer(x))); without TP the norm and the add are fused."""
        if self.all_reduce is no_all_reduce and post_norm is None:
            return layer(x, residual=h)
        y = self.all_reduce(layer(x))
        if post_norm is not None:
            y = F.rms_norm(y, (y.shape[-1],), post_norm, self.eps)
        return h + y

    def _attention(self, b: Block, h: Tensor, t: _StepTensors, layer_cache: LayerCache) -> Tensor:
        """h [B, T, D] -> attention output [B, T, H*hd], the new k, v stored in the cache."""
        bsz, n_new, _ = h.shape
        hd, heads, kvh = self.config.head_dim, b.heads, b.kv_heads
        qkv = b.qkv(h)  # [B, T, (H + 2KV) * hd]   (input norm fused in)
        if b.q_scale != 1.0:
            qkv[..., : heads * hd] *= b.q_scale
        if t.use_kernel and self._kernels is not None:  # rotate, cache, attend: one compiled call
            return self._kernels.attend_decode(
                qkv, heads, kvh, hd, t.rope, b.qk_norm, self.eps,
                layer_cache.paged(), t.pos_index,
            )  # fmt: skip
        qk = qkv[..., : (heads + kvh) * hd].unflatten(-1, (heads + kvh, hd))  # [B, T, H+KV, hd]
        if b.qk_norm is not None:
            qk = F.rms_norm(qk, (hd,), None, self.eps) * b.qk_norm
        assert t.rotation is not None
        qk = apply_rope(qk, t.rotation)  # q and k heads rotated together
        q, k = qk[:, :, :heads], qk[:, :, heads:]  # [B, T, H, hd], [B, T, KV, hd]
        v = qkv[..., (heads + kvh) * hd :].unflatten(-1, (kvh, hd))  # [B, T, KV, hd]
        keys, values = layer_cache.write_and_read(k, v, t.kv_len)  # [B, KV, L, hd]
        if n_new == 1:
            # One query per row: fold the query heads of each kv group into the query axis.
            q1 = q.reshape(bsz, kvh, heads // kvh, hd)  # [B, KV, G, hd]
            out = F.scaled_dot_product_attention(q1, keys, values, attn_mask=t.mask)
            return out.reshape(bsz, 1, heads * hd)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),  # [B, H, T, hd]
            keys,
            values,
            attn_mask=t.mask,
            is_causal=t.is_causal,
            enable_gqa=heads != kvh,
        )  # [B, H, T, hd]
        return out.transpose(1, 2).reshape(bsz, n_new, heads * hd)

    # --- per-step tensors ------------------------------------------------------------------

    def _step_tensors(self, step: StepInputs, sliding: bool) -> _StepTensors:
        """The step's tensors for global (sliding=False) or sliding-window layers."""
        bsz, n_new = len(step.slots), step.n_new
        ends = [s + n_new for s in step.starts]
        kv_len = max(ends)
        rope = self._ropes[sliding]
        if kv_len > rope.shape[0]:
            raise ValueError(f"position {kv_len - 1} is beyond the rotary table")
        window = self.config.sliding_window if sliding else None
        sees_all = window is None or kv_len <= window  # no key has left the window yet
        dev = self.device
        starts = torch.tensor(step.starts, device=dev)
        if n_new == 1 and self._kernels is not None and sees_all:  # the compiled decode
            return _StepTensors(True, rope, None, kv_len, None, False, starts)
        positions = starts[:, None] + torch.arange(n_new, device=dev)  # [B, T]
        rotation = rope[positions].unsqueeze(2)  # [B, T, 1, hd/2]
        is_causal = bsz == 1 and step.starts[0] == 0 and n_new > 1 and sees_all
        mask = None
        if not is_causal and not (bsz == 1 and n_new == 1 and sees_all):
            # key j is visible to the query at position p iff j <= p (and p - j < window).
            keys = torch.arange(kv_len, device=dev)
            mask = keys <= positions[:, :, None]  # [B, T, L]
            if window is not None:
                mask = mask & (keys > positions[:, :, None] - window)
            mask = mask.unsqueeze(1)  # [B, 1, T, L]
        return _StepTensors(
            use_kernel=False,
            rope=rope,
            rotation=rotation,
            kv_len=kv_len,
            mask=mask,
            is_causal=is_causal,
            pos_index=starts,
        )


def _check_step(step: StepInputs, cache: KVCache) -> None:
    n = len(step.slots)
    if n == 0 or n != len(step.starts) or step.n_new < 1:
        raise ValueError(f"bad step: {step}")
    if len(set(step.slots)) != n or not all(0 <= s < cache.max_batch for s in step.slots):
        raise ValueError(f"slots {step.slots} invalid for a cache of {cache.max_batch} slots")
    if any(s < 0 or s + step.n_new > cache.max_seq for s in step.starts):
        raise ValueError(f"positions beyond the cache length {cache.max_seq}")
