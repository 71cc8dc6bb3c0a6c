"""A layer range of a mixture-of-experts transformer: the model the MoE families build.

    h_0 = E[tokens]                                                 embed   (first shard only)
    for each block:
        x   = rmsnorm(h) * g_attn
        q, k, v = x Wq^T + bq, x Wk^T + bk, x Wv^T + bv     (biases: gpt-oss; per-head rmsnorm
                                                             of q and k: Qwen3-MoE)
        q, k = rotate(q, pos), rotate(k, pos)               (YaRN frequencies: gpt-oss)
        a   = attention(q, K, V) Wo^T + bo                  (sliding layers: the last W keys;
                                                             sinks: gpt-oss, `attention.py`)
        h   = h + allreduce(a)
        h   = moe(h)  | h + allreduce(mlp(rmsnorm(h) g))    (`moe.py`; dense layers: `mlp.py`)
    logits = (rmsnorm(h) * g_out) W_head^T                          head    (last shard only)

The families (`qwen3moe.py`, `gpt_oss.py`) read their files into `MoeLayer` records; this module
runs them. YaRN's attention factor (its scale of q and k) and any attention scale of the
config are folded into q, so attention runs at the standard 1 / sqrt(hd).
"""

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor

from exo.worker.engines.config import LlamaConfig, MoeConfig
from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.embedding import Embedding
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.kv_cache import KVCache, LayerCache, kv_cache_dtype
from exo.worker.engines.linear import Linear, Regroup, RmsNorm, WeightFormat, make_linear
from exo.worker.engines.materialise import TensorSource
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
    ShardModel,
    StepInputs,
)
from exo.worker.engines.models.dense import head_format
from exo.worker.engines.models.linears import LinearMaker
from exo.worker.engines.models.mlp import DenseMlp, build_dense_mlp
from exo.worker.engines.models.moe import (
    ClampedSwiGLU,
    MoeFeedForward,
    MoeWeights,
    bias_rows,
    cols_of,
    rows_of,
    slice_moe,
)
from exo.worker.engines.models.norms import residual
from exo.worker.engines.models.rotary import RotaryTables, yarn_attention_factor
from exo.worker.engines.models.router import RouterSpec
from exo.worker.engines.models.stages import ShardStages
from exo.worker.engines.qtensor import Weight
from exo.worker.engines.weights import ShardWeights


@dataclass(frozen=True)
class AttentionWeights:
    """One block's attention, canonical layout (q, k rows interleaved for rotation)."""

    norm: Tensor  # [D]
    wq: Weight  # [H*hd, D]
    wk: Weight  # [KV*hd, D]
    wv: Weight  # [KV*hd, D]
    wo: Weight  # [D, H*hd]
    bq: Tensor | None = None
    bk: Tensor | None = None
    bv: Tensor | None = None
    bo: Tensor | None = None  # [D]  (gpt-oss)
    q_norm: Tensor | None = None  # [hd]  (Qwen3-MoE)
    k_norm: Tensor | None = None
    sinks: Tensor | None = None  # [H]  (gpt-oss)


@dataclass(frozen=True)
class DenseFfn:
    """A dense layer's gated MLP (Qwen3-MoE's `mlp_only_layers`)."""

    gate: Weight  # [F, D]
    up: Weight  # [F, D]
    down: Weight  # [D, F]


@dataclass(frozen=True)
class MoeLayer:
    attention: AttentionWeights
    ffn_norm: Tensor  # [D]
    ffn: MoeWeights | DenseFfn


# --- tensor parallel -----------------------------------------------------------------------------


def slice_moe_layer(layer: MoeLayer, config: MoeConfig, rank: int, world: int) -> MoeLayer:
    """Rank `rank` of `world`'s share: whole heads (and their sinks), every expert's rows."""
    if config.heads % world or config.kv_heads % world:
        raise ValueError(
            f"heads ({config.heads}) and kv_heads ({config.kv_heads}) must divide by the "
            f"tensor-parallel world size ({world})"
        )
    a = layer.attention
    attention = replace(
        a,
        wq=rows_of(a.wq, rank, world),
        wk=rows_of(a.wk, rank, world),
        wv=rows_of(a.wv, rank, world),
        wo=cols_of(a.wo, rank, world),
        bq=bias_rows(a.bq, rank, world),
        bk=bias_rows(a.bk, rank, world),
        bv=bias_rows(a.bv, rank, world),
        bo=a.bo if rank == 0 else None,  # summed once by the all-reduce
        sinks=bias_rows(a.sinks, rank, world),
    )
    f = layer.ffn
    if isinstance(f, MoeWeights):
        ffn: MoeWeights | DenseFfn = slice_moe(f, rank, world)
    else:
        if f.gate.shape[0] % world:
            raise ValueError(f"ffn ({f.gate.shape[0]}) must divide by the world size ({world})")
        ffn = DenseFfn(rows_of(f.gate, rank, world), rows_of(f.up, rank, world),
                       cols_of(f.down, rank, world))  # fmt: skip
    return replace(layer, attention=attention, ffn=ffn)


# --- running -------------------------------------------------------------------------------------


class _DenseFeedForward:
    """h -> h + allreduce(mlp(rmsnorm(h) g)), the dense layers of an MoE model."""

    def __init__(self, mlp: DenseMlp, all_reduce: AllReduce, eps: float) -> None:
        self.mlp = mlp
        self.all_reduce = all_reduce
        self.eps = eps

    def __call__(self, h: Tensor) -> Tensor:
        return residual(h, self.mlp.down, self.mlp.gate_up(h), None, self.all_reduce, self.eps)

    def kernels(self) -> list[tuple[str, Linear]]:
        return [("gate_up", self.mlp.gate_up), ("down", self.mlp.down)]


@dataclass(frozen=True)
class MoeBlock:
    qkv: Linear  # h -> rmsnorm(h) g [Wq | Wk | Wv]^T + b
    o: Linear  # [.., H*hd] -> [.., D] (+ bo)
    attention: AttentionShape
    q_scale: float  # q *= q_scale after the matmul (1.0 when folded in)
    sinks: Tensor | None  # [H]
    sliding: bool
    ffn: MoeFeedForward | _DenseFeedForward


def q_scale_of(config: MoeConfig) -> float:
    """What q is multiplied by so that attention runs at 1 / sqrt(hd): the config's own scale
    and YaRN's attention factor (it scales q and k, so the logits by its square)."""
    scale = 1.0 if config.attn_scale is None else config.attn_scale * math.sqrt(config.head_dim)
    s = config.rope_scaling
    if s is not None and s.kind == "yarn":
        scale *= yarn_attention_factor(s) ** 2
    return scale


def router_spec(config: MoeConfig) -> RouterSpec:
    return RouterSpec(
        config.router,
        config.n_experts,
        config.experts_per_token,
        normalize=config.norm_topk_prob,
        n_group=config.n_group,
        topk_group=config.topk_group,
        scaling=config.routed_scaling,
    )


def build_moe_block(
    layer: MoeLayer, config: MoeConfig, index: int, make: LinearMaker, options: BuildOptions
) -> MoeBlock:
    a, hd = layer.attention, config.head_dim
    heads, kv_heads = a.wq.shape[0] // hd, a.wk.shape[0] // hd
    wq, bq, q_scale = a.wq, a.bq, q_scale_of(config)
    qk_norm = None
    if a.q_norm is not None and a.k_norm is not None:
        q_gain = a.q_norm.float() * q_scale  # q is normalised per head: the scale goes here
        qk_norm = torch.cat([q_gain.expand(heads, hd), a.k_norm.expand(kv_heads, hd)]).to(
            device=make.device, dtype=make.dtype
        )
        q_scale = 1.0
    elif q_scale != 1.0 and isinstance(wq, Tensor):
        wq, bq = wq * q_scale, None if bq is None else bq * q_scale
        q_scale = 1.0
    bias = None
    if bq is not None and a.bk is not None and a.bv is not None:
        bias = torch.cat([bq, a.bk, a.bv])
    ffn: MoeFeedForward | _DenseFeedForward
    if isinstance(layer.ffn, MoeWeights):
        clamp = ClampedSwiGLU(config.swiglu_alpha, config.swiglu_limit)
        ffn = MoeFeedForward(layer.ffn_norm, layer.ffn, router_spec(config), make,
                             activation=config.expert_activation, clamp=clamp,
                             all_reduce=options.all_reduce)  # fmt: skip
    else:
        d = layer.ffn
        mlp = build_dense_mlp(make, layer.ffn_norm, d.gate, d.up, d.down, config.activation)
        ffn = _DenseFeedForward(mlp, options.all_reduce, config.rms_eps)
    return MoeBlock(
        qkv=make([wq, a.wk, a.wv], bias, RmsNorm(a.norm, config.rms_eps)),
        o=make(a.wo, a.bo),
        attention=AttentionShape(heads, kv_heads, hd, qk_norm, config.rms_eps),
        q_scale=q_scale,
        sinks=None if a.sinks is None else a.sinks.to(device=make.device, dtype=torch.float32),
        sliding=config.is_sliding(index),
        ffn=ffn,
    )


class MoeModel(ShardStages):
    """Layers [start_layer, end_layer) of an MoE model, plus embedding / head if held."""

    def __init__(self, weights: ShardWeights[MoeLayer], options: BuildOptions) -> None:
        c = weights.config
        if not isinstance(c, MoeConfig):
            raise TypeError("an MoE model needs an MoeConfig")
        self.config: MoeConfig = c
        self.start_layer, self.end_layer = weights.start_layer, weights.end_layer
        self.dtype = options.dtype
        self.device = torch.device(options.device)
        self.kv_dtype = kv_cache_dtype(self.dtype, self.device)  # the cache's elements
        self.all_reduce = options.all_reduce
        self.eps = c.rms_eps
        self.weight_format: WeightFormat = options.weight_format
        kernels = options.kernels
        if options.weight_format in ("q4", "q8") and kernels is None:
            kernels = load_kernels()
        on_cpu = self.dtype == torch.float32 and self.device.type == "cpu"
        self._kernels = kernels if on_cpu else None  # the compiled decode attention
        regroup: Regroup = "in_place" if options.own_weights else "copy"
        make = LinearMaker(options.weight_format, self.dtype, self.device, kernels, c.rms_eps,
                           regroup=regroup)  # fmt: skip
        self.blocks = [
            build_moe_block(w, c, weights.start_layer + i, make, options)
            for i, w in enumerate(weights.layers)
        ]
        self.kv_heads = self.blocks[0].attention.kv_heads if self.blocks else c.kv_heads
        self.final_norm = None if weights.final_norm is None else weights.final_norm.to(
            device=self.device, dtype=self.dtype)  # fmt: skip
        self.lm_head: Linear | None = None
        if weights.lm_head is not None and weights.final_norm is not None:
            self.lm_head = make_linear(
                weights.lm_head, None, head_format(options.weight_format),
                prologue=RmsNorm(weights.final_norm, c.rms_eps), dtype=self.dtype,
                device=self.device, kernels=kernels, regroup=regroup,
            )  # fmt: skip
        self.embedding: Embedding | None = None
        if weights.embed is not None:
            head = self.lm_head if weights.embed is weights.lm_head else None
            self.embedding = Embedding(weights.embed, options.weight_format, self.dtype,
                                       self.device, head, kernels)  # fmt: skip
        self.rotary = RotaryTables(c, self.device, weights.rope_freq_factors)

    def forward_layers(self, hidden: Tensor, step: StepInputs, cache: KVCache) -> Tensor:
        check_step(step, cache)
        per_kind = {s: self._step_tensors(step, s) for s in {b.sliding for b in self.blocks}}
        cache.prepare(step.slots, step.starts, step.n_new)
        per_kind = {s: with_decode(t, self._kernels, cache) for s, t in per_kind.items()}
        for i, block in enumerate(self.blocks):
            hidden = self._block(block, hidden, per_kind[block.sliding], cache.layer(i))
        return hidden

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        self.rotary.ensure(max_seq)
        return KVCache(len(self.blocks), max_batch, max_seq, self.kv_heads, self.config.head_dim,
                       dtype=self.kv_dtype, device=self.device)  # fmt: skip

    def kv_bytes_per_position(self) -> int:
        return 2 * len(self.blocks) * self.kv_heads * self.config.head_dim * self.kv_dtype.itemsize

    def kernels_used(self) -> dict[str, int]:
        kernels: Counter[str] = Counter()
        for b in self.blocks:
            for name, linear in [("qkv", b.qkv), ("o", b.o), *b.ffn.kernels()]:
                kernels[f"{name}: {linear.kernel}"] += 1
        if self.lm_head is not None:
            kernels[f"head: {self.lm_head.kernel}"] += 1
        return dict(kernels)

    def _block(self, b: MoeBlock, h: Tensor, t: StepTensors, layer_cache: LayerCache) -> Tensor:
        qkv = b.qkv(h)
        if b.q_scale != 1.0:
            qkv[..., : b.attention.heads * b.attention.head_dim] *= b.q_scale
        attn = attend(qkv, b.attention, t, layer_cache, self._kernels, b.sinks)
        h = residual(h, b.o, attn, None, self.all_reduce, self.eps)
        return b.ffn(h)

    def _step_tensors(self, step: StepInputs, sliding: bool) -> StepTensors:
        window = self.config.sliding_window if sliding else None
        rope = self.rotary.table(sliding)
        return step_tensors(step, rope, window, self.device, self._kernels is not None)


@dataclass(frozen=True)
class MoeFamily:
    """An MoE family built on `MoeModel` behind the model interface (`base.ModelFamily`): its
    names and its config and layer readers; slicing and building are the same for all."""

    name: str
    gguf_architectures: tuple[str, ...]
    hf_model_types: tuple[str, ...]
    read_gguf_config: Callable[[GGUFFile], MoeConfig]
    read_hf_config: Callable[[JsonDict, Path], MoeConfig]
    read_gguf_layer: Callable[[TensorSource, LlamaConfig, int], MoeLayer]
    read_hf_layer: Callable[[TensorSource, LlamaConfig, int], MoeLayer]

    def gguf_config(self, f: GGUFFile) -> LlamaConfig:
        return self.read_gguf_config(f)

    def hf_config(self, raw: JsonDict, folder: Path) -> LlamaConfig:
        return self.read_hf_config(raw, folder)

    def gguf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> MoeLayer:
        return self.read_gguf_layer(src, config, i)

    def hf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> MoeLayer:
        return self.read_hf_layer(src, config, i)

    def hf_final_norm(self, src: TensorSource, config: LlamaConfig) -> Tensor:
        return src.vector("model.norm.weight")

    def slice_layer(self, layer: MoeLayer, config: LlamaConfig, rank: int, world: int) -> MoeLayer:
        if not isinstance(config, MoeConfig):
            raise TypeError(f"{self.name} layers need an MoeConfig")
        return slice_moe_layer(layer, config, rank, world)

    def build(self, weights: ShardWeights[MoeLayer], options: BuildOptions) -> ShardModel:
        return MoeModel(weights, options)
