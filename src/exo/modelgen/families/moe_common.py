"""What the generator's mixture-of-experts families share: their tensors in llama.cpp's names
(with Hugging Face's), the GGUF keys of experts and YaRN, and the family shell.

Scales follow the dense families (`dense.py`): inputs of every projection have unit RMS, so a
matrix reading K values has std 1/sqrt(K); the residual branches are scaled by
1/sqrt(2 layers); the head gives logits of std LOGIT_STD. Routers get std 2/sqrt(D): router
logits of std ~2, so each token's experts are chosen by clear margins (two engines pick the same
ones). The weighted sum of the chosen experts is one FFN's output at most (weights summing to
one), so an expert's down projection is scaled as a dense FFN's.

Merged expert tensors are [experts, rows, K] (llama.cpp's `ffn_{gate,up,down}_exps`); their
Hugging Face name holds `{e}`: a safetensors folder stores one matrix per expert
(`model.layers.i.mlp.experts.{e}.gate_proj.weight`), the same bytes in the same order.
"""

import dataclasses
import math
from abc import abstractmethod
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from gguf import GGUFValueType

from exo.modelgen.blueprint import Blueprint, Family, MetaItem, MetaValue, Role, TensorSpec
from exo.modelgen.families.dense import head_std

U32, F32, BOOL, STR = (
    GGUFValueType.UINT32, GGUFValueType.FLOAT32, GGUFValueType.BOOL, GGUFValueType.STRING
)  # fmt: skip
BIAS_STD = 0.1  # attention and expert biases
SINK_STD = 0.5  # gpt-oss's per-head sink logits
CORRECTION_STD = 0.5  # DeepSeek V3 / GLM's expert-bias correction (routing only)


class Shape(Protocol):
    @property
    def layers(self) -> int: ...


S = TypeVar("S", bound=Shape)


def pick(shapes: dict[str, S], name: str, layers: int | None) -> S:
    """Shape `name`, with `layers` blocks when given (ValueError for unknown or < 1)."""
    if name not in shapes:
        raise ValueError(f"unknown shape {name!r} (choose from {', '.join(shapes)})")
    if layers is None:
        return shapes[name]
    if layers < 1:
        raise ValueError(f"--layers must be at least 1, not {layers}")
    return dataclasses.replace(shapes[name], layers=layers)  # type: ignore[type-var]


def residual(layers: int) -> float:
    return 1 / math.sqrt(2 * layers)


def spec(gguf: str, hf: str, shape: tuple[int, ...], role: Role, layer: int | None,
         std: float) -> TensorSpec:  # fmt: skip
    return TensorSpec(gguf, hf, shape, role, layer, std)


def embedding(vocab: int, hidden: int) -> list[TensorSpec]:
    return [spec("token_embd.weight", "model.embed_tokens.weight", (vocab, hidden),
                 Role.EMBEDDING, None, 1.0)]  # fmt: skip


def head(vocab: int, hidden: int) -> list[TensorSpec]:
    """The final norm and the (untied) LM head."""
    return [
        spec("output_norm.weight", "model.norm.weight", (hidden,), Role.OUTPUT_NORM, None, 1),
        spec("output.weight", "lm_head.weight", (vocab, hidden), Role.OUTPUT, None,
             head_std(hidden)),
    ]  # fmt: skip


def norm(i: int, gguf: str, hf: str, width: int) -> TensorSpec:
    return spec(f"blk.{i}.{gguf}.weight", f"model.layers.{i}.{hf}.weight", (width,), Role.NORM,
                i, 0)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Gqa:
    """Grouped-query attention of one family: widths and the optional parts."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    bias: bool = False  # q, k, v biases (gpt-oss, GLM)
    out_bias: bool = False  # o bias (gpt-oss)
    qk_norm: bool = False  # per-head RMS norms of q and k (Qwen3-MoE, GLM)
    sinks: bool = False  # per-head sink logits (gpt-oss)


def attention(a: Gqa, i: int) -> list[TensorSpec]:
    """blk.i.attn_{q,k,v,output} (+ biases, q/k norms, sinks); the pre-attention norm first."""
    g, m = f"blk.{i}.", f"model.layers.{i}.self_attn."
    h, q_rows, kv_rows = a.hidden, a.heads * a.head_dim, a.kv_heads * a.head_dim
    proj = 1 / math.sqrt(h)
    out = [
        norm(i, "attn_norm", "input_layernorm", h),
        spec(g + "attn_q.weight", m + "q_proj.weight", (q_rows, h), Role.ATTN_Q, i, proj),
        spec(g + "attn_k.weight", m + "k_proj.weight", (kv_rows, h), Role.ATTN_K, i, proj),
        spec(g + "attn_v.weight", m + "v_proj.weight", (kv_rows, h), Role.ATTN_V, i, proj),
        spec(g + "attn_output.weight", m + "o_proj.weight", (h, q_rows), Role.ATTN_OUTPUT, i,
             residual(a.layers) / math.sqrt(q_rows)),
    ]  # fmt: skip
    if a.bias:
        out += [spec(f"{g}attn_{x}.bias", f"{m}{x}_proj.bias", (n,), Role.VECTOR, i, BIAS_STD)
                for x, n in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))]  # fmt: skip
    if a.out_bias:
        out.append(spec(g + "attn_output.bias", m + "o_proj.bias", (h,), Role.VECTOR, i, BIAS_STD))
    if a.qk_norm:
        out += [norm(i, f"attn_{x}_norm", f"self_attn.{x}_norm", a.head_dim) for x in "qk"]
    if a.sinks:
        out.append(spec(g + "attn_sinks.weight", m + "sinks", (a.heads,), Role.VECTOR, i,
                        SINK_STD))  # fmt: skip
    return out


def dense_ffn(i: int, hidden: int, ffn: int, layers: int, suffix: str = "",
              hf: str = "mlp.") -> list[TensorSpec]:  # fmt: skip
    """A gated MLP: blk.i.ffn_{gate,up,down}{suffix} (suffix `_shexp`: a shared expert)."""
    g, m = f"blk.{i}.ffn_", f"model.layers.{i}.{hf}"
    proj = 1 / math.sqrt(hidden)
    return [
        spec(f"{g}gate{suffix}.weight", m + "gate_proj.weight", (ffn, hidden), Role.FFN_GATE, i,
             proj),
        spec(f"{g}up{suffix}.weight", m + "up_proj.weight", (ffn, hidden), Role.FFN_UP, i, proj),
        spec(f"{g}down{suffix}.weight", m + "down_proj.weight", (hidden, ffn), Role.FFN_DOWN, i,
             2 * residual(layers) / math.sqrt(ffn)),
    ]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Experts:
    """One MoE layer's routed experts and router."""

    hidden: int
    n: int  # routed experts
    ffn: int  # each expert's width
    layers: int
    bias: bool = False  # router and expert biases (gpt-oss)
    correction: bool = False  # the expert-bias correction exp_probs_b (DeepSeek V3, GLM)
    router_logit_std: float = 2.0


def experts(x: Experts, i: int) -> list[TensorSpec]:
    """blk.i.ffn_gate_inp (router), ffn_{gate,up,down}_exps [E, rows, K] (+ biases),
    exp_probs_b."""
    g, m = f"blk.{i}.", f"model.layers.{i}.mlp."
    h, e, f = x.hidden, x.n, x.ffn
    proj = 1 / math.sqrt(h)
    out = [
        spec(g + "ffn_gate_inp.weight", m + "gate.weight", (e, h), Role.ROUTER, i,
             x.router_logit_std / math.sqrt(h)),
        spec(g + "ffn_gate_exps.weight", m + "experts.{e}.gate_proj.weight", (e, f, h),
             Role.FFN_GATE, i, proj),
        spec(g + "ffn_up_exps.weight", m + "experts.{e}.up_proj.weight", (e, f, h), Role.FFN_UP,
             i, proj),
        spec(g + "ffn_down_exps.weight", m + "experts.{e}.down_proj.weight", (e, h, f),
             Role.FFN_DOWN, i, 2 * residual(x.layers) / math.sqrt(f)),
    ]  # fmt: skip
    if x.bias:
        out += [
            spec(g + "ffn_gate_inp.bias", m + "gate.bias", (e,), Role.VECTOR, i, BIAS_STD),
            spec(g + "ffn_gate_exps.bias", m + "experts.gate_bias", (e, f), Role.VECTOR, i,
                 BIAS_STD),
            spec(g + "ffn_up_exps.bias", m + "experts.up_bias", (e, f), Role.VECTOR, i, BIAS_STD),
            spec(g + "ffn_down_exps.bias", m + "experts.down_bias", (e, h), Role.VECTOR, i,
                 BIAS_STD),
        ]  # fmt: skip
    if x.correction:
        out.append(spec(g + "exp_probs_b.bias", m + "gate.e_score_correction_bias", (e,),
                        Role.VECTOR, i, CORRECTION_STD))  # fmt: skip
    return out


def grouped_experts(hidden: int, n: int, ffn: int, layers: int) -> Experts:
    """DeepSeek V3's and GLM-4.5's routed experts: sigmoid scores with the expert-bias
    correction, router logits of unit scale."""
    return Experts(hidden, n, ffn, layers, correction=True, router_logit_std=1.0)


def grouped_ffn(x: Experts, i: int, dense_layers: int, dense_width: int,
                shared_width: int) -> list[TensorSpec]:  # fmt: skip
    """Block i's feed-forward in DeepSeek V3 and GLM-4.5: a dense MLP in the first
    `dense_layers` blocks, then routed experts and a shared expert of `shared_width`."""
    if i < dense_layers:
        return dense_ffn(i, x.hidden, dense_width, x.layers)
    return experts(x, i) + dense_ffn(i, x.hidden, shared_width, x.layers, "_shexp",
                                     "mlp.shared_experts.")  # fmt: skip


def model_tensors(vocab: int, hidden: int, layers: int, ffn_norm: str,
                  attention_of: Callable[[int], list[TensorSpec]],
                  ffn_of: Callable[[int], list[TensorSpec]]) -> list[TensorSpec]:  # fmt: skip
    """The embedding; each block's attention, its MLP's pre-norm (GGUF `blk.i.{ffn_norm}`,
    Hugging Face `post_attention_layernorm`) and feed-forward; the final norm and the head."""
    out = embedding(vocab, hidden)
    for i in range(layers):
        out += attention_of(i)
        out.append(norm(i, ffn_norm, "post_attention_layernorm", hidden))
        out += ffn_of(i)
    return out + head(vocab, hidden)


# --- GGUF metadata -------------------------------------------------------------------------------


def meta(arch: str, **values: tuple[MetaValue, GGUFValueType]) -> list[MetaItem]:
    """`{arch}.KEY` items; a `__` in a keyword is a `.` in the key."""
    return [MetaItem(f"{arch}.{k.replace('__', '.')}", v, t) for k, (v, t) in values.items()]


def common_meta(arch: str, vocab: int, context: int, hidden: int, layers: int, ffn: int,
                eps: float, theta: float) -> list[MetaItem]:  # fmt: skip
    return meta(
        arch, vocab_size=(vocab, U32), context_length=(context, U32),
        embedding_length=(hidden, U32), block_count=(layers, U32),
        feed_forward_length=(ffn, U32), attention__layer_norm_rms_epsilon=(eps, F32),
        rope__freq_base=(theta, F32),
    )  # fmt: skip


def gqa_meta(arch: str, a: Gqa, rope_dims: int) -> list[MetaItem]:
    return meta(
        arch, attention__head_count=(a.heads, U32), attention__head_count_kv=(a.kv_heads, U32),
        attention__key_length=(a.head_dim, U32), attention__value_length=(a.head_dim, U32),
        rope__dimension_count=(rope_dims, U32),
    )  # fmt: skip


def expert_meta(arch: str, n: int, used: int, ffn: int) -> list[MetaItem]:
    return meta(arch, expert_count=(n, U32), expert_used_count=(used, U32),
                expert_feed_forward_length=(ffn, U32))  # fmt: skip


def yarn_meta(arch: str, factor: float, original_context: int) -> list[MetaItem]:
    return meta(arch, rope__scaling__type=("yarn", STR), rope__scaling__factor=(factor, F32),
                rope__scaling__original_context_length=(original_context, U32))  # fmt: skip


# --- the family shell ----------------------------------------------------------------------------


class MoeGenFamily(Family, Generic[S]):
    """A family whose blueprint is its shape's tensors, metadata and config.json."""

    gguf_arch: str

    def blueprint(self, shape: str, layers: int | None, vocab: int) -> Blueprint:
        s = pick(self.shape_table(), shape, layers)
        return Blueprint(
            arch=self.name,
            gguf_arch=self.gguf_arch,
            shape_name=shape,
            n_layers=s.layers,
            tensors=tuple(self.tensors(s, vocab)),
            metadata=tuple(self.metadata(s, vocab)),
            hf_config=self.hf_config(s, vocab),
        )

    @abstractmethod
    def shape_table(self) -> dict[str, S]: ...

    @abstractmethod
    def tensors(self, s: S, vocab: int) -> list[TensorSpec]: ...

    @abstractmethod
    def metadata(self, s: S, vocab: int) -> list[MetaItem]: ...

    def hf_config(self, s: S, vocab: int) -> dict[str, object]:
        return {}
