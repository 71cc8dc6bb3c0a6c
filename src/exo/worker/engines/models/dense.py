"""The dense Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3, Gemma 3, Phi-3), a layer range.

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
(with Gemma's norm before the add, unless an all-reduce comes between them; see `linear.py`); q,
k, v are one matmul with the rows stacked, gate and up another; q and k rotate together in one
complex multiply; attention is `scaled_dot_product_attention` over the paged cache
(`attention.py`, `kv_cache.py`). A model-specific attention scale is folded into q (its
per-head norm's gain, its float weights, or, for weights kept in a file's blocks, a multiply of
q after the matmul), so every attention runs at the standard 1/sqrt(hd). With the compiled CPU
kernels a block is five calls per decode step.

Tensor parallelism: build the model from `weights.slice_shard(...)` and pass the all-reduce as
`all_reduce` (identity by default); head counts are read from the (sliced) weight shapes.
"""

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.cpu_kernels import QKernels, load_kernels
from exo.worker.engines.embedding import Embedding
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.images import add_deepstack, merge_chunk
from exo.worker.engines.kv_cache import KVCache, LayerCache, kv_cache_dtype
from exo.worker.engines.linear import Linear, Regroup, RmsNorm, WeightFormat, make_linear
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import dense_files
from exo.worker.engines.models.attention import (
    AttentionShape,
    StepTensors,
    attend,
    check_step,
    step_tensors,
    with_decode,
)
from exo.worker.engines.models.base import (
    AllReduce,
    BuildOptions,
    JsonDict,
    ModelFamily,
    ShardModel,
    StepInputs,
    no_all_reduce,
)
from exo.worker.engines.models.linears import LinearMaker
from exo.worker.engines.models.mlp import DenseMlp, build_dense_mlp
from exo.worker.engines.models.norms import residual
from exo.worker.engines.models.rotary import RotaryTables
from exo.worker.engines.models.stages import ShardStages
from exo.worker.engines.weights import LayerWeights, ShardWeights, slice_layer


@dataclass(frozen=True)
class Block:
    """One transformer block's weights in compute form (norms fused into the linears)."""

    qkv: Linear  # h [.., D] -> rmsnorm(h) g_attn [Wq | Wk | Wv]^T: [.., (H + 2KV) * hd]
    o: Linear  # [.., H*hd] -> [.., D]
    mlp: DenseMlp
    attention: AttentionShape  # heads local to this TP rank; per-head q/k norm gains
    q_scale: float  # q *= q_scale after the matmul (1.0 unless it could not be folded in)
    post_attn_norm: Tensor | None  # [D]  Gemma 3: norm of the attention output (unless fused)
    sliding: bool  # attends to the last `config.sliding_window` positions only

    @property
    def gate_up(self) -> Linear:
        return self.mlp.gate_up

    @property
    def down(self) -> Linear:
        return self.mlp.down


def _q_scale(config: LlamaConfig) -> float:
    """attn_scale / (1 / sqrt(hd)): what q is multiplied by so attention uses 1 / sqrt(hd)."""
    return 1.0 if config.attn_scale is None else config.attn_scale * math.sqrt(config.head_dim)


def build_block(layer: LayerWeights, config: LlamaConfig, index: int, make: LinearMaker) -> Block:
    """Block `index` (a global layer number) in compute form."""
    hd, eps = config.head_dim, config.rms_eps
    heads, kv_heads = layer.wq.shape[0] // hd, layer.wk.shape[0] // hd
    wq, bq, q_scale = layer.wq, layer.bq, _q_scale(config)
    qk_norm = None
    if layer.q_norm is not None and layer.k_norm is not None:
        # q is normalised per head, so its scale goes into the norm's gain, not into Wq
        q_gain = layer.q_norm.float() * q_scale
        qk_norm = torch.cat([q_gain.expand(heads, hd), layer.k_norm.expand(kv_heads, hd)]).to(
            device=make.device, dtype=make.dtype
        )
        q_scale = 1.0
    elif q_scale != 1.0 and isinstance(wq, Tensor):  # float weights: fold it into them
        wq, bq = wq * q_scale, None if bq is None else bq * q_scale
        q_scale = 1.0
    # (else Wq is a file's blocks, which a scale would re-round: q is scaled after the matmul)
    bias = None  # [(H + 2KV) * hd]  (Qwen2)
    if bq is not None and layer.bk is not None and layer.bv is not None:
        bias = torch.cat([bq, layer.bk, layer.bv])
    return Block(
        qkv=make([wq, layer.wk, layer.wv], bias, RmsNorm(layer.attn_norm, eps)),
        o=make(layer.wo, post=layer.post_attn_norm),
        mlp=build_dense_mlp(
            make,
            layer.ffn_norm,
            layer.w_gate,
            layer.w_up,
            layer.w_down,
            config.activation,
            layer.post_ffn_norm,
        ),
        attention=AttentionShape(heads, kv_heads, hd, qk_norm, eps),
        q_scale=q_scale,
        post_attn_norm=make.unfused(layer.post_attn_norm),
        sliding=config.is_sliding(index),
    )


def head_format(fmt: WeightFormat) -> WeightFormat:
    """The head keeps 8 bits under q4: logits are sensitive and it was Q8_0 in GGUF files."""
    return "q8" if fmt == "q4" else fmt


class DenseModel(ShardStages):
    """Layers [start_layer, end_layer) of a dense Llama-family model, plus embedding / head if
    held."""

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
        self.kv_dtype = kv_cache_dtype(dtype, self.device)  # the cache's elements (kv_cache.py)
        self.all_reduce = all_reduce
        self.eps = c.rms_eps
        if weight_format in ("q4", "q8") and kernels is None:
            kernels = load_kernels()
        self.weight_format: WeightFormat = weight_format
        # The compiled decode attention runs whenever the kernels are loaded (float32 CPU).
        self._kernels = kernels if dtype == torch.float32 and self.device.type == "cpu" else None
        regroup: Regroup = "in_place" if own_weights else "copy"
        make = LinearMaker(
            weight_format, dtype, self.device, kernels, c.rms_eps,
            fuse_post_norms=all_reduce is no_all_reduce, regroup=regroup,
        )  # fmt: skip
        self.blocks = [
            build_block(w, c, weights.start_layer + i, make) for i, w in enumerate(weights.layers)
        ]
        self.kv_heads = self.blocks[0].attention.kv_heads if self.blocks else c.kv_heads
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
            self.embedding = Embedding(
                weights.embed, weight_format, dtype, self.device, head, kernels
            )
        # sized by the context served, not the file's claim (grown by `new_cache` on demand)
        self.rotary = RotaryTables(c, self.device, weights.rope_freq_factors)

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
        check_step(step, cache)
        per_kind = {s: self._step_tensors(step, s) for s in {b.sliding for b in self.blocks}}
        cache.prepare(step.slots, step.starts, step.n_new)  # pages for the new positions
        per_kind = {s: with_decode(t, self._kernels, cache) for s, t in per_kind.items()}
        for i, block in enumerate(self.blocks):
            hidden = self._block(block, hidden, per_kind[block.sliding], cache.layer(i))
            hidden = add_deepstack(hidden, step.images, self.start_layer + i)
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
        hidden = merge_chunk(self.embed(tokens), step.images)  # (images: first stage only)
        hidden = self.forward_layers(hidden, step, cache)
        return self.head(hidden if every_position else hidden[:, -1])

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        self.rotary.ensure(max_seq)  # beyond the served context: extend the tables
        return KVCache(
            len(self.blocks),
            max_batch,
            max_seq,
            self.kv_heads,
            self.config.head_dim,
            dtype=self.kv_dtype,
            device=self.device,
        )

    def kv_bytes_per_position(self) -> int:
        return 2 * len(self.blocks) * self.kv_heads * self.config.head_dim * self.kv_dtype.itemsize

    def kernels_used(self) -> dict[str, int]:
        kernels: Counter[str] = Counter()
        for b in self.blocks:
            for name, linear in (("qkv", b.qkv), ("o", b.o), ("gate_up", b.gate_up),
                                 ("down", b.down)):  # fmt: skip
                kernels[f"{name}: {linear.kernel}"] += 1
        if self.lm_head is not None:
            kernels[f"head: {self.lm_head.kernel}"] += 1
        return dict(kernels)

    # --- inside a block --------------------------------------------------------------------

    def _block(self, b: Block, h: Tensor, t: StepTensors, layer_cache: LayerCache) -> Tensor:
        attn = self._attention(b, h, t, layer_cache)
        h = residual(h, b.o, attn, b.post_attn_norm, self.all_reduce, self.eps)
        x = b.mlp.gate_up(h)  # [B, T, 2F]   (norm fused in; the gating is down's prologue)
        return residual(h, b.mlp.down, x, b.mlp.post_norm, self.all_reduce, self.eps)

    def _attention(self, b: Block, h: Tensor, t: StepTensors, layer_cache: LayerCache) -> Tensor:
        """h [B, T, D] -> attention output [B, T, H*hd], the new k, v stored in the cache."""
        qkv = b.qkv(h)  # [B, T, (H + 2KV) * hd]   (input norm fused in)
        if b.q_scale != 1.0:
            qkv[..., : b.attention.heads * b.attention.head_dim] *= b.q_scale
        return attend(qkv, b.attention, t, layer_cache, self._kernels)

    def _step_tensors(self, step: StepInputs, sliding: bool) -> StepTensors:
        """The step's tensors for global (sliding=False) or sliding-window layers."""
        window = self.config.sliding_window if sliding else None
        rope = self.rotary.table(sliding)
        return step_tensors(step, rope, window, self.device, self._kernels is not None)


class DenseFamily:
    """The dense family behind the model interface (`base.ModelFamily`)."""

    name = "dense"
    gguf_architectures = dense_files.GGUF_ARCHITECTURES
    hf_model_types = dense_files.HF_MODEL_TYPES

    def gguf_config(self, f: GGUFFile) -> LlamaConfig:
        return dense_files.gguf_config(f)

    def hf_config(self, raw: JsonDict, folder: Path) -> LlamaConfig:
        return dense_files.hf_config(raw, folder)

    def gguf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> LayerWeights:
        return dense_files.gguf_layer(src, config, i)

    def hf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> LayerWeights:
        return dense_files.hf_layer(src, config, i)

    def hf_final_norm(self, src: TensorSource, config: LlamaConfig) -> Tensor:
        return dense_files.hf_norm(src, config, "model.norm.weight")

    def slice_layer(
        self, layer: LayerWeights, config: LlamaConfig, rank: int, world: int
    ) -> LayerWeights:
        return slice_layer(layer, config, rank, world)

    def build(self, weights: ShardWeights, options: BuildOptions) -> ShardModel:
        return DenseModel(
            weights,
            weight_format=options.weight_format,
            dtype=options.dtype,
            device=options.device,
            all_reduce=options.all_reduce,
            kernels=options.kernels,
            own_weights=options.own_weights,
        )


DENSE: ModelFamily[LayerWeights] = DenseFamily()
