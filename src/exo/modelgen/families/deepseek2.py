# ruff: noqa: RUF001, RUF003 (DeepSeek's markers are written with full-width bars)
"""DeepSeek V3 (ARCH `deepseek2`, llama.cpp's architecture for DeepSeek V2 / V3 and Kimi K2):
multi-head latent attention (q and kv LoRA ranks, rotary dims split from the rest, the latent
kv cache), dense first layers, then experts chosen by sigmoid scores with the expert-bias
correction, group-limited top-k and a routed scaling factor, plus a shared expert; YaRN.

Shapes: `tiny` (3 blocks of width 256, the first dense; 16 experts of width 256 in 4 groups,
2 groups and 4 experts chosen; 4 heads; q LoRA 64, kv LoRA 64, rotary 16, nope 32, v 32; YaRN
x4) and `real-layer` (DeepSeek V3's block: width 7168, q LoRA 1536, kv LoRA 512, rotary 64,
nope 128, v 128, 128 heads, experts of width 2048, a first dense layer of width 18432; 32
experts (256 in the real model) in 8 groups, 4 groups and 8 experts chosen; 3 blocks unless
--layers says: one dense, the rest MoE, about 2.7 GB in Q4_K_M). The GGUF holds kv_b split as
llama.cpp's newer files do (attn_k_b [H, R, nope], attn_v_b [H, v, R]). Rows of the
256-value K-quants that do not fit (attn_k_b's 128 values) take llama.cpp's fallback types.
GGUF only (DeepSeek's own checkpoints are FP8 safetensors, which the engine refuses).
"""

import math
from dataclasses import dataclass

from exo.modelgen.blueprint import ChatFormat, MetaItem, Role, TensorSpec, register
from exo.modelgen.families import moe_common as mc
from exo.modelgen.families.moe_common import BOOL, F32, U32, Experts, MoeGenFamily


@dataclass(frozen=True)
class DeepseekShape:
    layers: int
    hidden: int
    heads: int
    q_lora: int
    kv_lora: int
    rope: int
    nope: int
    v_dim: int
    experts: int
    active: int
    groups: int
    groups_used: int
    expert_ffn: int
    dense_ffn: int
    dense_layers: int = 1
    shared: int = 1
    yarn_factor: float = 40.0
    yarn_original: int = 4096
    context: int = 163840
    routed_scale: float = 2.5

    def moe(self) -> Experts:
        return mc.grouped_experts(self.hidden, self.experts, self.expert_ffn, self.layers)


SHAPES = {
    "tiny": DeepseekShape(3, 256, 4, 64, 64, 16, 32, 32, 16, 4, 4, 2, 256, 512,
                          yarn_factor=4.0, yarn_original=1024, context=4096),
    "real-layer": DeepseekShape(3, 7168, 128, 1536, 512, 64, 128, 128, 32, 8, 8, 4, 2048, 18432),
}  # fmt: skip


def mla(s: DeepseekShape, i: int) -> list[TensorSpec]:
    """blk.i's latent attention: q_a, q_a_norm, q_b, kv_a_mqa, kv_a_norm, k_b, v_b, output."""
    g, m = f"blk.{i}.", f"model.layers.{i}.self_attn."
    h, n, r = s.hidden, s.heads, s.kv_lora
    a = mc.spec
    return [
        mc.norm(i, "attn_norm", "input_layernorm", h),
        a(g + "attn_q_a.weight", m + "q_a_proj.weight", (s.q_lora, h), Role.ATTN_Q, i,
          1 / math.sqrt(h)),
        mc.norm(i, "attn_q_a_norm", "self_attn.q_a_layernorm", s.q_lora),
        a(g + "attn_q_b.weight", m + "q_b_proj.weight", (n * (s.nope + s.rope), s.q_lora),
          Role.ATTN_Q, i, 1 / math.sqrt(s.q_lora)),
        a(g + "attn_kv_a_mqa.weight", m + "kv_a_proj_with_mqa.weight", (r + s.rope, h),
          Role.ATTN_K, i, 1 / math.sqrt(h)),
        mc.norm(i, "attn_kv_a_norm", "self_attn.kv_a_layernorm", r),
        a(g + "attn_k_b.weight", m + "k_b_proj.weight", (n, r, s.nope), Role.ATTN_K, i,
          1 / math.sqrt(r)),
        a(g + "attn_v_b.weight", m + "v_b_proj.weight", (n, s.v_dim, r), Role.ATTN_V, i,
          1 / math.sqrt(r)),
        a(g + "attn_output.weight", m + "o_proj.weight", (h, n * s.v_dim), Role.ATTN_OUTPUT, i,
          mc.residual(s.layers) / math.sqrt(n * s.v_dim)),
    ]  # fmt: skip


# DeepSeek V3's format: <｜User｜> / <｜Assistant｜> turns after the BOS, the system text first;
# calls in a <｜tool▁calls▁begin｜> section, each function<｜tool▁sep｜>NAME and a ```json fence;
# results in <｜tool▁outputs▁begin｜>.
TEMPLATE = (
    "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- elif c -%}{%- for p in c -%}"
    "{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{{- bos_token -}}"
    "{%- for m in messages if m.role == 'system' -%}{{- text(m.content) + '\\n\\n' -}}{%- endfor -%}"
    "{%- if tools -%}{{- '## Tools\\nYou can call these functions:\\n' -}}"
    "{%- for t in tools -%}{{- '- ' + t.function.name + ': ' + (t.function.description or '') +"
    " '\\n  parameters: ' + (t.function.parameters | tojson) + '\\n' -}}{%- endfor -%}"
    "{{- 'To call them, answer <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
    "NAME\\n```json\\nARGUMENTS\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}{{- '<｜User｜>' + text(m.content) -}}"
    "{%- elif m.role == 'assistant' -%}{{- '<｜Assistant｜>' + text(m.content) -}}"
    "{%- if m.tool_calls -%}{{- '<｜tool▁calls▁begin｜>' -}}"
    "{%- for c in m.tool_calls -%}{%- set args = c.function.arguments -%}"
    "{{- '<｜tool▁call▁begin｜>function<｜tool▁sep｜>' + c.function.name + '\\n```json\\n' +"
    " (args if args is string else args | tojson) + '\\n```<｜tool▁call▁end｜>' -}}"
    "{%- endfor -%}{{- '<｜tool▁calls▁end｜>' -}}{%- endif -%}"
    "{{- '<｜end▁of▁sentence｜>' -}}"
    "{%- elif m.role == 'tool' -%}{{- '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' +"
    " text(m.content) + '<｜tool▁output▁end｜><｜tool▁outputs▁end｜>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<｜Assistant｜>' -}}{%- endif -%}"
)

CHAT = ChatFormat(
    special_tokens=(
        "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
        "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
        "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<think>",
        "</think>",
    ),
    bos="<｜begin▁of▁sentence｜>",
    eos="<｜end▁of▁sentence｜>",
    template=TEMPLATE,
)  # fmt: skip


class Deepseek2(MoeGenFamily[DeepseekShape]):
    name = "deepseek2"
    gguf_arch = "deepseek2"
    shapes = tuple(SHAPES)
    chat = CHAT
    safetensors = "DeepSeek's models are run from GGUF files (their checkpoints are FP8)"

    def shape_table(self) -> dict[str, DeepseekShape]:
        return SHAPES

    def tensors(self, s: DeepseekShape, vocab: int) -> list[TensorSpec]:
        shared = s.shared * s.expert_ffn
        return mc.model_tensors(
            vocab, s.hidden, s.layers, "ffn_norm", lambda i: mla(s, i),
            lambda i: mc.grouped_ffn(s.moe(), i, s.dense_layers, s.dense_ffn, shared),
        )  # fmt: skip

    def metadata(self, s: DeepseekShape, vocab: int) -> list[MetaItem]:
        arch = self.gguf_arch
        return [
            *mc.common_meta(arch, vocab, s.context, s.hidden, s.layers, s.dense_ffn, 1e-6, 10000.0),
            *mc.meta(
                arch,
                attention__head_count=(s.heads, U32),
                attention__head_count_kv=(1, U32),
                attention__key_length=(s.kv_lora + s.rope, U32),
                attention__value_length=(s.kv_lora, U32),
                attention__key_length_mla=(s.nope + s.rope, U32),
                attention__value_length_mla=(s.v_dim, U32),
                attention__q_lora_rank=(s.q_lora, U32),
                attention__kv_lora_rank=(s.kv_lora, U32),
                rope__dimension_count=(s.rope, U32),
                leading_dense_block_count=(s.dense_layers, U32),
                expert_shared_count=(s.shared, U32),
                expert_weights_scale=(s.routed_scale, F32),
                expert_weights_norm=(True, BOOL),
                expert_gating_func=(2, U32),
                expert_group_count=(s.groups, U32),
                expert_group_used_count=(s.groups_used, U32),
            ),
            *mc.expert_meta(arch, s.experts, s.active, s.expert_ffn),
            *mc.yarn_meta(arch, s.yarn_factor, s.yarn_original),
            *mc.meta(arch, rope__scaling__yarn_log_multiplier=(0.1, F32)),
        ]


register(Deepseek2())
