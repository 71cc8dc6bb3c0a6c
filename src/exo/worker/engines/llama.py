"""The Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3), one layer range of it.

    h_0 = E[tokens]                                          embed        (first shard only)
    for each block:
        x   = rmsnorm(h) * g_attn
        q, k, v = x Wq^T, x Wk^T, x Wv^T     (+ bias, Qwen2; per-head rmsnorm of q, k, Qwen3)
        q, k = rotate(q, pos), rotate(k, pos)
        h   = h + allreduce(attention(q, K_cache, V_cache) Wo^T)
        x   = rmsnorm(h) * g_ffn
        h   = h + allreduce((silu(x Wg^T) * (x Wu^T)) Wd^T)
    logits = (rmsnorm(h) * g_out) W_head^T                   head         (last shard only)

Implementation choices, all for fewer and cheaper operations per token: each linear layer fuses
the operation before it (RMSNorm with its gain, or SwiGLU) and the residual add after it (see
`linear.py`); q, k, v are one matmul with the rows stacked, gate and up another; q and k rotate
together in one complex multiply; attention is `scaled_dot_product_attention` over the paged
cache (`kv_cache.py`). With the compiled CPU kernels (`cpu_kernels.py`), a decode step's
rotation, cache write and attention are one call per layer, so a block is five calls.

Tensor parallelism: build the model from `weights.slice_shard(...)` and pass the all-reduce as
`all_reduce` (identity by default); head counts are read from the (sliced) weight shapes.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.cpu_kernels import QKernels, load_kernels
from exo.worker.engines.embedding import Embedding
from exo.worker.engines.kv_cache import KVCache, LayerCache
from exo.worker.engines.linear import Linear, Prologue, RmsNorm, SwiGLU, WeightFormat, make_linear
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

    rotation: Tensor | None  # [B, T, 1, hd/2] complex: the rotation of each new position
    kv_len: int  # L: cache positions that any row attends to
    mask: Tensor | None  # [B, 1, T, L] bool (True = attend); None = all L (decode) / causal
    is_causal: bool  # prefill of one row from position 0: plain causal attention
    slot_rows: slice | None  # the slots as a slice of the cache when they are contiguous
    slot_index: Tensor  # [B] long
    pos_index: Tensor  # [B] long: position of the new token (used when n_new == 1)


@dataclass(frozen=True)
class Block:
    """One transformer block's weights in compute form (norms fused into the linears)."""

    qkv: Linear  # h [.., D] -> rmsnorm(h) g_attn [Wq | Wk | Wv]^T: [.., (H + 2KV) * hd]
    o: Linear  # [.., H*hd] -> [.., D]
    gate_up: Linear  # h [.., D] -> rmsnorm(h) g_ffn [Wg | Wu]^T: [.., 2F]
    down: Linear  # [.., 2F] -> silu(gate) * up Wd^T: [.., D]
    heads: int  # H (local to this TP rank)
    kv_heads: int  # KV
    qk_norm: Tensor | None  # [H + KV, hd]  Qwen3's per-head norm weights, q heads then k heads


def _stack_bias(layer: LayerWeights) -> Tensor | None:
    if layer.bq is None or layer.bk is None or layer.bv is None:
        return None
    return torch.cat([layer.bq, layer.bk, layer.bv])


def build_block(
    layer: LayerWeights,
    config: LlamaConfig,
    fmt: WeightFormat,
    dtype: torch.dtype,
    device: torch.device,
    kernels: QKernels | None,
) -> Block:
    hd, eps = config.head_dim, config.rms_eps
    heads, kv_heads = layer.wq.shape[0] // hd, layer.wk.shape[0] // hd
    qk_norm = None
    if layer.q_norm is not None and layer.k_norm is not None:
        qk_norm = torch.cat([layer.q_norm.expand(heads, hd), layer.k_norm.expand(kv_heads, hd)]).to(
            device=device, dtype=dtype
        )

    def linear(
        w: Weight | list[Weight], bias: Tensor | None = None, prologue: Prologue = None
    ) -> Linear:
        return make_linear(
            w, bias, fmt, prologue=prologue, dtype=dtype, device=device, kernels=kernels
        )

    return Block(
        qkv=linear(
            [layer.wq, layer.wk, layer.wv],
            _stack_bias(layer),
            RmsNorm(layer.attn_norm, eps),
        ),
        o=linear(layer.wo),
        gate_up=linear([layer.w_gate, layer.w_up], None, RmsNorm(layer.ffn_norm, eps)),
        down=linear(layer.w_down, None, SwiGLU()),
        heads=heads,
        kv_heads=kv_heads,
        qk_norm=qk_norm,
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
    ) -> None:
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
        self.blocks = [
            build_block(w, c, weight_format, dtype, self.device, kernels) for w in weights.layers
        ]
        self.kv_heads = self.blocks[0].kv_heads if self.blocks else c.kv_heads
        self.lm_head: Linear | None = None  # h -> rmsnorm(h) g_out W_head^T
        if weights.lm_head is not None and weights.final_norm is not None:
            self.lm_head = make_linear(
                weights.lm_head,
                None,
                head_format(weight_format),
                prologue=RmsNorm(weights.final_norm, c.rms_eps),
                dtype=dtype,
                device=self.device,
                kernels=kernels,
            )
        # The embedding table in its running format (shared with a tied q8 head).
        self.embedding: Embedding | None = None
        if weights.embed is not None:
            tied = weights.embed is weights.lm_head
            head = self.lm_head if tied else None
            self.embedding = Embedding(weights.embed, weight_format, dtype, self.device, head)
        self._freqs = rope_frequencies(hd, c.rope_theta, c.rope_scaling, weights.rope_freq_factors)
        self._rope = rope_table(c.context_length, self._freqs, self.device)  # [P, hd/2]

    # --- the three stages ------------------------------------------------------------------

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> hidden [B, T, D]."""
        if self.embedding is None:
            raise RuntimeError("this shard does not hold the embedding (start_layer > 0)")
        return self.embedding(tokens.to(self.device))

    def forward_layers(self, hidden: Tensor, step: StepInputs, cache: KVCache) -> Tensor:
        """hidden [B, T, D] through this shard's blocks; writes their keys/values to `cache`."""
        t = self._step_tensors(step, cache)
        cache.prepare(step.slots, step.starts, step.n_new)  # pages for the new positions
        for i, block in enumerate(self.blocks):
            hidden = self._block(block, hidden, t, cache.layer(i))
        return hidden

    def head(self, hidden: Tensor) -> Tensor:
        """hidden [..., D] -> logits [..., V] (float32)."""
        if self.lm_head is None:
            raise RuntimeError("this shard does not hold the head (end_layer < n_layers)")
        return self.lm_head(hidden).float()

    def forward(self, tokens: Tensor, step: StepInputs, cache: KVCache) -> Tensor:
        """Whole model (single shard): tokens [B, T] -> logits of the last position [B, V]."""
        hidden = self.forward_layers(self.embed(tokens), step, cache)
        return self.head(hidden[:, -1])

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        if max_seq > self._rope.shape[0]:  # beyond the trained context: extend the table
            self._rope = rope_table(max_seq, self._freqs, self.device)
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
        h = self._residual(h, b.o, self._attention(b, h, t, layer_cache))
        return self._residual(h, b.down, b.gate_up(h))

    def _residual(self, h: Tensor, layer: Linear, x: Tensor) -> Tensor:
        """h + allreduce(layer(x)); without tensor parallelism the add is fused into the layer."""
        if self.all_reduce is no_all_reduce:
            return layer(x, residual=h)
        return h + self.all_reduce(layer(x))

    def _attention(self, b: Block, h: Tensor, t: _StepTensors, layer_cache: LayerCache) -> Tensor:
        """h [B, T, D] -> attention output [B, T, H*hd], the new k, v stored in the cache."""
        bsz, n_new, _ = h.shape
        hd, heads, kvh = self.config.head_dim, b.heads, b.kv_heads
        qkv = b.qkv(h)  # [B, T, (H + 2KV) * hd]   (input norm fused in)
        if n_new == 1 and self._kernels is not None:  # rotate, cache, attend: one compiled call
            return self._kernels.attend_decode(
                qkv, heads, kvh, hd, self._rope, b.qk_norm, self.eps,
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

    def _step_tensors(self, step: StepInputs, cache: KVCache) -> _StepTensors:
        bsz, n_new = len(step.slots), step.n_new
        _check_step(step, cache)
        ends = [s + n_new for s in step.starts]
        kv_len = max(ends)
        if kv_len > self._rope.shape[0]:
            raise ValueError(f"position {kv_len - 1} is beyond the rotary table")
        dev = self.device
        starts = torch.tensor(step.starts, device=dev)
        first = step.slots[0]
        contiguous = list(step.slots) == list(range(first, first + bsz))
        slot_index = torch.tensor(step.slots, device=dev)
        if n_new == 1 and self._kernels is not None:  # the compiled decode needs no more
            return _StepTensors(None, kv_len, None, False, None, slot_index, starts)
        positions = starts[:, None] + torch.arange(n_new, device=dev)  # [B, T]
        rotation = self._rope[positions].unsqueeze(2)  # [B, T, 1, hd/2]
        is_causal = bsz == 1 and step.starts[0] == 0 and n_new > 1
        mask = None
        if not is_causal and not (bsz == 1 and n_new == 1):
            # key j is visible to the query at position p iff j <= p.
            mask = torch.arange(kv_len, device=dev) <= positions[:, :, None]  # [B, T, L]
            mask = mask.unsqueeze(1)  # [B, 1, T, L]
        return _StepTensors(
            rotation=rotation,
            kv_len=kv_len,
            mask=mask,
            is_causal=is_causal,
            slot_rows=slice(first, first + bsz) if contiguous else None,
            slot_index=slot_index,
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
