"""The deepseek2 family (DeepSeek V2 / V3 / R1, Kimi K2), a layer range.

    h_0 = E[tokens]                                          embed        (first shard only)
    for each block i:
        h = h + allreduce(mla(rmsnorm(h) g_attn))           `mla.py`: latent KV cache, YaRN
        x = rmsnorm(h) g_ffn
        i <  first_k_dense_replace:  m = (silu(x Wg^T) * (x Wu^T)) Wd^T          dense MLP
        i >= first_k_dense_replace:  m = sum_r w_r expert_{e_r}(x) + shared(x)    `moe.py`
              s = sigmoid(x Wr^T); choice = s + b_corr; top k of the topk_group best of n_group
              groups (group score: the sum of its two best choices); w = s[chosen], normalised
              (norm_topk_prob), times routed_scaling_factor   (V3; V2: softmax top-k,
              group-limited by each group's best probability when n_group > 1)
        h = h + allreduce(m)
    logits = (rmsnorm(h) g_out) W_head^T                     head         (last shard only)

Tensor parallelism splits attention by heads (`mla.slice_mla`) and every expert by its width
(`moe.slice_moe`); the router, the latent down projections and the norms are replicated.
"""

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import torch
from torch import Tensor

from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.embedding import Embedding
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.linear import Linear, Regroup, RmsNorm, WeightFormat, make_linear
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import deepseek2_files as files
from exo.worker.engines.models import moe_reader as reader
from exo.worker.engines.models.attention import check_step, step_tensors
from exo.worker.engines.models.base import (
    BuildOptions,
    JsonDict,
    ModelFamily,
    ShardModel,
    StepInputs,
)
from exo.worker.engines.models.deepseek2_files import DeepseekConfig
from exo.worker.engines.models.dense import head_format
from exo.worker.engines.models.linears import LinearMaker
from exo.worker.engines.models.mla import (
    MlaAttention,
    MlaWeights,
    build_mla,
    kv_bytes_per_token,
    mla_attend,
    mla_softmax_scale,
    slice_mla,
)
from exo.worker.engines.models.mlp import DenseMlp, build_dense_mlp
from exo.worker.engines.models.moe import (
    MoeFeedForward,
    MoeWeights,
    slice_moe,
)
from exo.worker.engines.models.norms import residual
from exo.worker.engines.models.rotary import RotaryTables, yarn_attention_factor
from exo.worker.engines.models.router import RouterSpec
from exo.worker.engines.models.stages import ShardStages
from exo.worker.engines.qtensor import QuantTensor, Weight
from exo.worker.engines.weights import ShardWeights


@dataclass(frozen=True)
class DenseFfn:
    """A dense first layer's MLP weights."""

    w_gate: Weight  # [F, D]
    w_up: Weight  # [F, D]
    w_down: Weight  # [D, F]


@dataclass(frozen=True)
class DeepseekLayer:
    attn_norm: Tensor  # [D]
    attention: MlaWeights
    ffn_norm: Tensor  # [D]
    ffn: DenseFfn | MoeWeights


def _config(config: LlamaConfig) -> DeepseekConfig:
    if not isinstance(config, DeepseekConfig):
        raise TypeError(f"a deepseek2 model needs a DeepseekConfig, got {type(config).__name__}")
    return config


def router_spec(c: DeepseekConfig) -> RouterSpec:
    return RouterSpec(
        kind=c.router,
        n_experts=c.n_experts,
        top_k=c.experts_per_token,
        normalize=c.norm_topk_prob,
        n_group=c.n_group,
        topk_group=c.topk_group,
        scaling=c.routed_scaling,
    )


# --- the files' tensors --------------------------------------------------------------------------


def gguf_layer(src: TensorSource, config: LlamaConfig, i: int) -> DeepseekLayer:
    c, p = _config(config), f"blk.{i}."
    moe = c.is_moe(i)
    ffn = reader.moe(src, reader.GGUF, c, i) if moe else DenseFfn(*reader.mlp(src, reader.GGUF, i))
    return DeepseekLayer(
        attn_norm=src.vector(p + "attn_norm.weight"),
        attention=files.gguf_attention(src, c, i),
        ffn_norm=src.vector(p + "ffn_norm.weight"),
        ffn=ffn,
    )


def hf_layer(src: TensorSource, config: LlamaConfig, i: int) -> DeepseekLayer:
    c, p = _config(config), f"model.layers.{i}."
    moe = c.is_moe(i)
    ffn = reader.moe(src, reader.HF, c, i) if moe else DenseFfn(*reader.mlp(src, reader.HF, i))
    return DeepseekLayer(
        attn_norm=src.vector(p + "input_layernorm.weight"),
        attention=files.hf_attention(src, c, i, c.rope_interleave),
        ffn_norm=src.vector(p + "post_attention_layernorm.weight"),
        ffn=ffn,
    )


def _dense(w: Weight) -> Tensor:
    return w.dequantize() if isinstance(w, QuantTensor) else w


def slice_layer(layer: DeepseekLayer, config: LlamaConfig, rank: int, world: int) -> DeepseekLayer:
    c = _config(config)
    ffn = layer.ffn
    if isinstance(ffn, MoeWeights):
        ffn = slice_moe(ffn, rank, world)
    else:
        if c.ffn % world:
            raise ValueError(f"ffn ({c.ffn}) must divide by the tensor-parallel world ({world})")
        n = c.ffn // world
        gate, up = (_rows(w, rank * n, (rank + 1) * n) for w in (ffn.w_gate, ffn.w_up))
        down = _dense(ffn.w_down)[:, rank * n : (rank + 1) * n].contiguous()
        ffn = DenseFfn(gate, up, down)
    return replace(layer, attention=slice_mla(layer.attention, c.heads, rank, world), ffn=ffn)


def _rows(w: Weight, a: int, b: int) -> Weight:
    return w.rows(a, b) if isinstance(w, QuantTensor) else w[a:b].contiguous()


# --- the model -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    attention: MlaAttention
    ffn: DenseMlp | MoeFeedForward

    def linears(self) -> list[tuple[str, Linear]]:
        a = self.attention
        named = [("mla down", a.down), ("o", a.o)] + ([("q up", a.q_up)] if a.q_up else [])
        if isinstance(self.ffn, MoeFeedForward):
            return named + self.ffn.kernels()
        return [*named, ("gate_up", self.ffn.gate_up), ("down", self.ffn.down)]


class DeepseekModel(ShardStages):
    """Layers [start_layer, end_layer) of a deepseek2-family model, plus embedding / head if
    held."""

    def __init__(self, weights: ShardWeights[DeepseekLayer], options: BuildOptions) -> None:
        c = _config(weights.config)
        self.config: LlamaConfig = c
        self.start_layer, self.end_layer = weights.start_layer, weights.end_layer
        self.dtype, self.device = options.dtype, torch.device(options.device)
        self.kv_dtype = self.dtype  # the latent cache stays in the model's type (mla.py reads it)
        self.weight_format: WeightFormat = options.weight_format
        self.all_reduce, self.eps = options.all_reduce, c.rms_eps
        kernels = options.kernels
        if options.weight_format in ("q4", "q8") and kernels is None:
            kernels = load_kernels()
        regroup: Regroup = "in_place" if options.own_weights else "copy"
        make = LinearMaker(options.weight_format, self.dtype, self.device, kernels, c.rms_eps,
                           fuse_post_norms=True, regroup=regroup)  # fmt: skip
        heads = weights.layers[0].attention.wk_b.shape[0] if weights.layers else c.heads
        self.dims = c.mla_dims(heads)
        scale = mla_softmax_scale(self.dims, c.rope_scaling, c.mscale_all_dim)
        self.blocks = [self._block(w, scale, make) for w in weights.layers]
        self.final_norm = None
        if weights.final_norm is not None:
            self.final_norm = weights.final_norm.to(device=self.device, dtype=self.dtype)
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
            self.embedding = Embedding(
                weights.embed, options.weight_format, self.dtype, self.device, head, kernels
            )
        # YaRN's magnitude scales the rotary dims only (MLA's scale m^2 is in `scale`)
        s = c.rope_scaling
        magnitude = yarn_attention_factor(s) if s is not None and s.kind == "yarn" else 1.0
        self.rotary = RotaryTables(c, self.device, head_dim=c.head_dim, magnitude=magnitude)

    def _block(self, w: DeepseekLayer, scale: float, make: LinearMaker) -> Block:
        attention = build_mla(w.attention, w.attn_norm, self.dims, scale, make)
        if isinstance(w.ffn, MoeWeights):
            spec = router_spec(_config(self.config))
            ffn = MoeFeedForward(w.ffn_norm, w.ffn, spec, make, all_reduce=self.all_reduce)
            return Block(attention, ffn)
        f = w.ffn
        return Block(
            attention, build_dense_mlp(make, w.ffn_norm, f.w_gate, f.w_up, f.w_down, "silu")
        )

    # --- the three stages ------------------------------------------------------------------

    def forward_layers(self, hidden: Tensor, step: StepInputs, cache: KVCache) -> Tensor:
        check_step(step, cache)
        t = step_tensors(step, self.rotary.table(False), None, self.device, False)
        cache.prepare(step.slots, step.starts, step.n_new)
        for i, b in enumerate(self.blocks):
            attn = mla_attend(b.attention, hidden, t, cache.layer(i))
            hidden = residual(hidden, b.attention.o, attn, None, self.all_reduce, self.eps)
            if isinstance(b.ffn, MoeFeedForward):
                hidden = b.ffn(hidden)
            else:
                x = b.ffn.gate_up(hidden)
                hidden = residual(hidden, b.ffn.down, x, None, self.all_reduce, self.eps)
        return hidden

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        """One latent "head" of (R + dr) / 2 values in each half of a page (`mla.py`)."""
        self.rotary.ensure(max_seq)
        return KVCache(max(len(self.blocks), 1), max_batch, max_seq, 1, self.dims.cache_half,
                       dtype=self.dtype, device=self.device)  # fmt: skip

    def kv_bytes_per_position(self) -> int:
        return kv_bytes_per_token(len(self.blocks), self.dims, self.dtype.itemsize)

    def kernels_used(self) -> dict[str, int]:
        kernels: Counter[str] = Counter()
        for b in self.blocks:
            for name, linear in b.linears():
                kernels[f"{name}: {linear.kernel}"] += 1
        if self.lm_head is not None:
            kernels[f"head: {self.lm_head.kernel}"] += 1
        return dict(kernels)


class DeepseekFamily:
    """The deepseek2 family behind the model interface (`base.ModelFamily`)."""

    name = "deepseek2"
    gguf_architectures = files.GGUF_ARCHITECTURES
    hf_model_types = files.HF_MODEL_TYPES

    def gguf_config(self, f: GGUFFile) -> LlamaConfig:
        return files.gguf_config(f)

    def hf_config(self, raw: JsonDict, folder: Path) -> LlamaConfig:
        return files.hf_config(raw, folder)

    def gguf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> DeepseekLayer:
        return gguf_layer(src, config, i)

    def hf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> DeepseekLayer:
        return hf_layer(src, config, i)

    def hf_final_norm(self, src: TensorSource, config: LlamaConfig) -> Tensor:
        return src.vector("model.norm.weight")

    def slice_layer(
        self, layer: DeepseekLayer, config: LlamaConfig, rank: int, world: int
    ) -> DeepseekLayer:
        return slice_layer(layer, config, rank, world)

    def build(self, weights: ShardWeights[DeepseekLayer], options: BuildOptions) -> ShardModel:
        return DeepseekModel(weights, options)


DEEPSEEK2: ModelFamily[DeepseekLayer] = cast(ModelFamily[DeepseekLayer], DeepseekFamily())
