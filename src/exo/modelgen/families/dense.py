"""The pieces every dense decoder family shares: its shape and its tensors, with the random
scales that make next-token distributions peaked.

Peaked weights: the residual stream starts at unit scale (embedding std 1, or the tied head's
scale), every projection is scaled by 1/sqrt(fan in), and the two that write to the residual
stream (attn_output, ffn_down) also by 1/sqrt(2 * layers), so the blocks together add about as
much as the embedding holds (the state depends on the context, and an engine's rounding is
not amplified block after block); and the LM head is scaled so that logits of the normalised final state have a
standard deviation of `LOGIT_STD`. The final norm's gain is random signs: with a tied head the
input token's own logit would otherwise be the squared norm of its embedding, far above every
other (the model would repeat its input). Over a vocabulary of ~50k the gap between the largest
and second-largest of that many such logits is then a few logits: greedy decoding picks a
clear winner, and two engines that agree to within a fraction of a logit pick the same one.
"""

import math
from dataclasses import dataclass

from exo.modelgen.blueprint import Role, TensorSpec

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


def head_std(hidden: int) -> float:
    return LOGIT_STD / math.sqrt(hidden)


def dense_tensors(s: DenseShape, vocab: int) -> tuple[TensorSpec, ...]:
    """llama.cpp's tensor names for a llama-like block stack, with Hugging Face's names."""
    h, q_rows, kv_rows = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
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
                       s.head_dim),
            TensorSpec(g + "attn_k.weight", a + "k_proj.weight", (kv_rows, h), Role.ATTN_K, i, proj,
                       s.head_dim),
            TensorSpec(g + "attn_v.weight", a + "v_proj.weight", (kv_rows, h), Role.ATTN_V, i, proj),
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
    out.append(
        TensorSpec("output_norm.weight", "model.norm.weight", (h,), Role.OUTPUT_NORM, None, 1)
    )
    if not s.tied:
        out.append(TensorSpec("output.weight", "lm_head.weight", (vocab, h), Role.OUTPUT, None,
                              head_std(h)))  # fmt: skip
    return tuple(out)
