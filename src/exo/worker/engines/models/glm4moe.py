"""The glm4moe family (GLM-4.5 / 4.6 / 4.7, GLM-4.5-Air), a layer range.

    h_0 = E[tokens]                                          embed        (first shard only)
    for each block i:
        x   = rmsnorm(h) g_attn
        q, k, v = x Wq^T + bq, x Wk^T + bk, x Wv^T + bv      (attention_bias)
        q, k = rmsnorm_head(q) g_q, rmsnorm_head(k) g_k      (use_qk_norm)
        q, k = rotate the first rotary_dim dims of each head (partial_rotary_factor: half)
        h   = h + allreduce(attention(q, K, V) Wo^T)
        x   = rmsnorm(h) g_ffn
        i <  first_k_dense_replace:  m = (silu(x Wg^T) * (x Wu^T)) Wd^T           dense MLP
        i >= first_k_dense_replace:  m = shared(x) + sum_r w_r expert_{e_r}(x)      `moe.py`
              s = sigmoid(x Wr^T); choice = s + b_corr; top k of the topk_group best of n_group
              groups; w = s[chosen] (normalised: norm_topk_prob) * routed_scaling_factor
        h   = h + allreduce(m)
    logits = (rmsnorm(h) g_out) W_head^T                     head         (last shard only)

Attention and the dense MLP are the dense family's (`dense.py`: one fused q|k|v matmul, the
compiled decode attention); partial rotary is a rotary table whose last pairs turn at frequency
0 (`rotary.py`). An MoE layer's shared expert is that block's dense MLP, and the routed experts
add their sum to the same residual. Both file formats store q/k rows with each head's rotary
part half-split (llama.cpp runs glm4moe with NEOX rotary): those rows are permuted to pairs on
load. llama.cpp's files carry the multi-token-prediction layer as one more block
(`nextn_predict_layers`): it is not read (nor is Hugging Face's layer num_hidden_layers).
"""

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import torch
from torch import Tensor

from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.kv_cache import LayerCache
from exo.worker.engines.materialise import TensorSource
from exo.worker.engines.models import glm4moe_files as files
from exo.worker.engines.models.attention import StepTensors
from exo.worker.engines.models.base import BuildOptions, JsonDict, ModelFamily, ShardModel
from exo.worker.engines.models.dense import Block, DenseModel
from exo.worker.engines.models.glm4moe_files import GlmConfig, GlmLayer
from exo.worker.engines.models.linears import LinearMaker
from exo.worker.engines.models.moe import MoeFeedForward, slice_moe
from exo.worker.engines.models.norms import residual, rms_norm
from exo.worker.engines.models.router import RouterSpec
from exo.worker.engines.weights import LayerWeights, ShardWeights, slice_layer


def _config(config: LlamaConfig) -> GlmConfig:
    if not isinstance(config, GlmConfig):
        raise TypeError(f"a glm4moe model needs a GlmConfig, got {type(config).__name__}")
    return config


def router_spec(c: GlmConfig) -> RouterSpec:
    return RouterSpec(
        kind="sigmoid",
        n_experts=c.n_experts,
        top_k=c.experts_per_token,
        normalize=c.norm_topk_prob,
        n_group=c.n_group,
        topk_group=c.topk_group,
        scaling=c.routed_scaling,
    )


@dataclass(frozen=True)
class MoeBlock(Block):
    """A block whose MLP (`mlp`) is the shared expert, plus the routed experts."""

    moe: MoeFeedForward | None = None
    ffn_norm: Tensor | None = None  # [D]  the routed experts' input norm (the MLP's, unfused)


class GlmModel(DenseModel):
    """Layers [start_layer, end_layer) of a glm4moe model: the dense model's blocks, with the
    routed experts added to the MoE layers' (shared-expert) MLPs."""

    def __init__(self, weights: ShardWeights[GlmLayer], options: BuildOptions) -> None:
        c = _config(weights.config)
        dense = cast(
            ShardWeights[LayerWeights], replace(weights, layers=[w.dense for w in weights.layers])
        )
        super().__init__(
            dense, weight_format=options.weight_format, dtype=options.dtype,
            device=options.device, all_reduce=options.all_reduce, kernels=options.kernels,
            own_weights=options.own_weights,
        )  # fmt: skip
        kernels = options.kernels
        if options.weight_format in ("q4", "q8") and kernels is None:
            kernels = load_kernels()
        make = LinearMaker(
            options.weight_format, self.dtype, self.device, kernels, c.rms_eps,
            regroup="in_place" if options.own_weights else "copy",
        )  # fmt: skip
        for i, w in enumerate(weights.layers):
            if w.moe is not None:
                moe = MoeFeedForward(w.dense.ffn_norm, w.moe, router_spec(c), make,
                                     all_reduce=self.all_reduce)  # fmt: skip
                norm = w.dense.ffn_norm.to(device=self.device, dtype=self.dtype)
                self.blocks[i] = MoeBlock(**vars(self.blocks[i]), moe=moe, ffn_norm=norm)

    def _block(self, b: Block, h: Tensor, t: StepTensors, layer_cache: LayerCache) -> Tensor:
        if not isinstance(b, MoeBlock) or b.moe is None or b.ffn_norm is None:
            return super()._block(b, h, t, layer_cache)
        attn = self._attention(b, h, t, layer_cache)
        h = residual(h, b.o, attn, b.post_attn_norm, self.all_reduce, self.eps)
        flat = h.reshape(-1, h.shape[-1])
        if b.moe.fused is not None and h.dtype == torch.float32 and h.is_cpu:  # one C call
            y = b.moe.fused(flat, residual=False).out  # (its norm is ffn_norm)
        else:
            y = b.moe.routed(rms_norm(flat, b.ffn_norm, self.eps))
        routed = self.all_reduce(y.reshape(h.shape).to(h.dtype))
        return residual(h, b.mlp.down, b.mlp.gate_up(h), None, self.all_reduce, self.eps) + routed

    def kernels_used(self) -> dict[str, int]:
        kernels = Counter(super().kernels_used())
        for b in self.blocks:
            if isinstance(b, MoeBlock) and b.moe is not None:
                for name, linear in b.moe.kernels():
                    kernels[f"{name}: {linear.kernel}"] += 1
        return dict(kernels)


class GlmFamily:
    """The glm4moe family behind the model interface (`base.ModelFamily`)."""

    name = "glm4moe"
    gguf_architectures = files.GGUF_ARCHITECTURES
    hf_model_types = files.HF_MODEL_TYPES

    def gguf_config(self, f: GGUFFile) -> LlamaConfig:
        return files.gguf_config(f)

    def hf_config(self, raw: JsonDict, folder: Path) -> LlamaConfig:
        return files.hf_config(raw, folder)

    def gguf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> GlmLayer:
        return files.gguf_layer(src, _config(config), i)

    def hf_layer(self, src: TensorSource, config: LlamaConfig, i: int) -> GlmLayer:
        return files.hf_layer(src, _config(config), i)

    def hf_final_norm(self, src: TensorSource, config: LlamaConfig) -> Tensor:
        return src.vector("model.norm.weight")

    def slice_layer(self, layer: GlmLayer, config: LlamaConfig, rank: int, world: int) -> GlmLayer:
        c = _config(config)
        # the dense check (heads, kv heads, ffn) with the shared expert's width as the ffn
        width = replace(c, ffn=layer.dense.w_gate.shape[0])
        dense = slice_layer(layer.dense, width, rank, world)
        moe = None if layer.moe is None else slice_moe(layer.moe, rank, world)
        return GlmLayer(dense, moe)

    def build(self, weights: ShardWeights[GlmLayer], options: BuildOptions) -> ShardModel:
        return GlmModel(weights, options)


GLM4MOE: ModelFamily[GlmLayer] = cast(ModelFamily[GlmLayer], GlmFamily())

__all__ = ["GLM4MOE", "GlmModel", "router_spec"]
