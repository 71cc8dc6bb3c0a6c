"""The pieces every dense decoder family shares: its shape and its tensors, with the random
scales that make next-token distributions peaked.

Peaked weights: the residual stream starts at unit scale (embedding std 1, or the tied head's
scale), every projection is scaled by 1/sqrt(fan in), and the two that write to the residual
stream (attn_output, ffn_down) also by 1/sqrt(2 * layers), so the blocks together add about as
much as the embedding holds (the state depends on the context, and an engine's rounding is
not amplified block after block); the LM head is scaled so that logits of the normalised
final state have a standard deviation of `LOGIT_STD`; and the final norm's gain is random
signs (with a tied head the input token's own logit would otherwise be the squared norm of its
embedding, far above every other: the model would repeat its input). Over a vocabulary of ~50k
the gap between the largest and second-largest of that many logits is then a few logits:
greedy decoding picks a clear winner, and two engines that agree to within a fraction of a
logit pick the same one.
"""

import dataclasses
import math
from dataclasses import dataclass

from gguf import GGUFValueType

from exo.modelgen.blueprint import MetaItem, Role, TensorSpec

LOGIT_STD = 24.0


@dataclass(frozen=True)
class DenseShape:
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    context: int
    rope_theta: float
    norm_eps: float = 1e-5
    qk_norm: bool = False  # RMS norms of each head's q and k (Qwen3)


def head_std(hidden: int) -> float:
    return LOGIT_STD / math.sqrt(hidden)


def dense_tensors(
    s: DenseShape, vocab: int, *, interleaved_rope: bool = True
) -> tuple[TensorSpec, ...]:
    """llama.cpp's tensor names for a llama-like block stack, with Hugging Face's names.
    `interleaved_rope`: llama.cpp's converter reorders q/k rows for this architecture (llama,
    mistral); the others keep Hugging Face's order in a GGUF too."""
    h, q_rows, kv_rows = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    rope = s.head_dim if interleaved_rope else 0
    embed_std = head_std(h) if s.tied else 1.0
    out: list[TensorSpec] = [
        TensorSpec("token_embd.weight", "model.embed_tokens.weight", (vocab, h), Role.EMBEDDING,
                   None, embed_std),
    ]  # fmt: skip
    proj, residual = 1 / math.sqrt(h), 1 / math.sqrt(2 * s.layers)
    for i in range(s.layers):
        g, m = f"blk.{i}.", f"model.layers.{i}."
        a = m + "self_attn."
        out += [
            TensorSpec(g + "attn_norm.weight", m + "input_layernorm.weight", (h,), Role.NORM, i, 0),
            TensorSpec(g + "attn_q.weight", a + "q_proj.weight", (q_rows, h), Role.ATTN_Q, i, proj,
                       rope),
            TensorSpec(g + "attn_k.weight", a + "k_proj.weight", (kv_rows, h), Role.ATTN_K, i, proj,
                       rope),
            TensorSpec(g + "attn_v.weight", a + "v_proj.weight", (kv_rows, h), Role.ATTN_V, i,
                       proj),
            TensorSpec(g + "attn_output.weight", a + "o_proj.weight", (h, q_rows), Role.ATTN_OUTPUT,
                       i, residual / math.sqrt(q_rows)),
            TensorSpec(g + "ffn_norm.weight", m + "post_attention_layernorm.weight", (h,),
                       Role.NORM, i, 0),
            TensorSpec(g + "ffn_gate.weight", m + "mlp.gate_proj.weight", (s.ffn, h), Role.FFN_GATE,
                       i, proj),
            TensorSpec(g + "ffn_up.weight", m + "mlp.up_proj.weight", (s.ffn, h), Role.FFN_UP, i,
                       proj),
            TensorSpec(g + "ffn_down.weight", m + "mlp.down_proj.weight", (h, s.ffn), Role.FFN_DOWN,
                       i, 2 * residual / math.sqrt(s.ffn)),
        ]  # fmt: skip
        if s.qk_norm:
            out += [
                TensorSpec(g + "attn_q_norm.weight", a + "q_norm.weight", (s.head_dim,), Role.NORM,
                           i, 0),
                TensorSpec(g + "attn_k_norm.weight", a + "k_norm.weight", (s.head_dim,), Role.NORM,
                           i, 0),
            ]  # fmt: skip
    out.append(
        TensorSpec("output_norm.weight", "model.norm.weight", (h,), Role.OUTPUT_NORM, None, 1)
    )
    if not s.tied:
        out.append(TensorSpec("output.weight", "lm_head.weight", (vocab, h), Role.OUTPUT, None,
                              head_std(h)))  # fmt: skip
    return tuple(out)


def dense_metadata(arch: str, s: DenseShape, vocab: int) -> tuple[MetaItem, ...]:
    """llama.cpp's hyper-parameter keys for a dense decoder of architecture `arch`."""
    u32, f32 = GGUFValueType.UINT32, GGUFValueType.FLOAT32
    items = [
        MetaItem(f"{arch}.vocab_size", vocab, u32),
        MetaItem(f"{arch}.context_length", s.context, u32),
        MetaItem(f"{arch}.embedding_length", s.hidden, u32),
        MetaItem(f"{arch}.block_count", s.layers, u32),
        MetaItem(f"{arch}.feed_forward_length", s.ffn, u32),
        MetaItem(f"{arch}.rope.dimension_count", s.head_dim, u32),
        MetaItem(f"{arch}.attention.head_count", s.heads, u32),
        MetaItem(f"{arch}.attention.head_count_kv", s.kv_heads, u32),
        MetaItem(f"{arch}.attention.layer_norm_rms_epsilon", s.norm_eps, f32),
        MetaItem(f"{arch}.rope.freq_base", s.rope_theta, f32),
    ]
    if s.head_dim * s.heads != s.hidden:
        items += [
            MetaItem(f"{arch}.attention.key_length", s.head_dim, u32),
            MetaItem(f"{arch}.attention.value_length", s.head_dim, u32),
        ]
    return tuple(items)


def dense_hf_config(
    model_type: str, architecture: str, s: DenseShape, vocab: int
) -> dict[str, object]:
    return {
        "architectures": [architecture], "model_type": model_type, "vocab_size": vocab,
        "hidden_size": s.hidden, "intermediate_size": s.ffn, "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim, "rms_norm_eps": s.norm_eps, "rope_theta": s.rope_theta,
        "max_position_embeddings": s.context, "tie_word_embeddings": s.tied,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
    }  # fmt: skip


def pick_shape(shapes: dict[str, DenseShape], name: str, layers: int | None) -> DenseShape:
    if name not in shapes:
        raise ValueError(f"unknown shape {name!r} (choose from {', '.join(shapes)})")
    s = shapes[name]
    if layers is None:
        return s
    if layers < 1:
        raise ValueError(f"--layers must be at least 1, not {layers}")
    return dataclasses.replace(s, layers=layers)
