"""GLM-4.5 (ARCH `glm4moe`, llama.cpp's architecture for GLM-4.5 / 4.6 / 4.7): attention with
q/k/v biases, QK-norm and partial rotary (half of each head rotated), dense first layers, then
experts chosen by sigmoid scores with the expert-bias correction, group-limited top-k and a
routed scaling factor, plus a shared expert; GLM's chat format with <tool_call> /
<arg_key> / <arg_value> calls and <think> reasoning.

Shapes: `tiny` (3 blocks of width 256, the first dense; 16 experts of width 256 in 4 groups, 2
groups and 4 experts chosen; 4/2 heads of 64, 32 of them rotated) and `real-layer` (GLM-4.5-Air's
block: width 4096, 128 experts of width 1408, 8 active, 96/8 heads of 128, 64 rotated, a first
dense layer of width 10944; 2 blocks unless --layers says). GLM-4.5's routing has one group;
the tiny shape has four so group-limited routing is exercised. No multi-token-prediction block
is written (`nextn_predict_layers` 0). q/k rows keep Hugging Face's half-split rotary order in
both formats, as llama.cpp's converter leaves them.
"""

from dataclasses import dataclass

from exo.modelgen.blueprint import ChatFormat, MetaItem, TensorSpec, register
from exo.modelgen.families import moe_common as mc
from exo.modelgen.families.moe_common import BOOL, F32, U32, Experts, Gqa, MoeGenFamily


@dataclass(frozen=True)
class GlmShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    active: int
    groups: int
    groups_used: int
    expert_ffn: int
    dense_ffn: int
    dense_layers: int = 1
    context: int = 131072
    theta: float = 1_000_000.0
    routed_scale: float = 1.0

    def gqa(self) -> Gqa:
        return Gqa(self.hidden, self.heads, self.kv_heads, self.head_dim, self.layers, bias=True,
                   qk_norm=True)  # fmt: skip

    def moe(self) -> Experts:
        return mc.grouped_experts(self.hidden, self.experts, self.expert_ffn, self.layers)


SHAPES = {
    "tiny": GlmShape(3, 256, 4, 2, 64, 16, 4, 4, 2, 256, 512, context=4096, theta=10000.0,
                     routed_scale=2.5),
    "real-layer": GlmShape(2, 4096, 96, 8, 128, 128, 8, 1, 1, 1408, 10944),
}  # fmt: skip

# GLM-4.5's format: [gMASK]<sop>, then <|system|> / <|user|> / <|assistant|> / <|observation|>
# turns, each role token followed by a newline; calls as <tool_call>NAME then key / value pairs.
TEMPLATE = (
    "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- elif c -%}{%- for p in c -%}"
    "{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{{- '[gMASK]<sop>' -}}"
    "{%- if tools -%}{{- '<|system|>\\n# Tools\\n\\nFunctions you can call, as JSON schemas:"
    "\\n<tools>\\n' -}}{%- for t in tools -%}{{- (t | tojson) + '\\n' -}}{%- endfor -%}"
    "{{- '</tools>\\n\\nTo call one, write:\\n<tool_call>NAME\\n<arg_key>KEY</arg_key>\\n"
    "<arg_value>VALUE</arg_value>\\n...\\n</tool_call>' -}}{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}"
    "{{- '<|observation|>\\n<tool_response>\\n' + text(m.content) + '\\n</tool_response>' -}}"
    "{%- elif m.role == 'assistant' -%}"
    "{{- '<|assistant|>\\n<think></think>\\n' + text(m.content) -}}"
    "{%- for c in m.tool_calls or [] -%}{{- '\\n<tool_call>' + c.function.name + '\\n' -}}"
    "{%- set args = c.function.arguments -%}"
    "{%- if args is mapping -%}{%- for k, v in args.items() -%}"
    "{{- '<arg_key>' + k + '</arg_key>\\n<arg_value>' + (v if v is string else v | tojson) +"
    " '</arg_value>\\n' -}}{%- endfor -%}{%- endif -%}{{- '</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- else -%}{{- '<|' + m.role + '|>\\n' + text(m.content) -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '\\n<think></think>' -}}{%- endif -%}{%- endif -%}"
)

CHAT = ChatFormat(
    special_tokens=(
        "<|endoftext|>", "[gMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
        "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
        "</arg_key>", "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>",
    ),
    bos="[gMASK]",
    eos="<|endoftext|>",
    template=TEMPLATE,
    add_bos=False,
)  # fmt: skip


class Glm4Moe(MoeGenFamily[GlmShape]):
    name = "glm4moe"
    gguf_arch = "glm4moe"
    shapes = tuple(SHAPES)
    chat = CHAT

    def shape_table(self) -> dict[str, GlmShape]:
        return SHAPES

    def tensors(self, s: GlmShape, vocab: int) -> list[TensorSpec]:
        return mc.model_tensors(
            vocab, s.hidden, s.layers, "post_attention_norm", lambda i: mc.attention(s.gqa(), i),
            lambda i: mc.grouped_ffn(s.moe(), i, s.dense_layers, s.dense_ffn, s.expert_ffn),
        )  # fmt: skip

    def metadata(self, s: GlmShape, vocab: int) -> list[MetaItem]:
        arch = self.gguf_arch
        return [
            *mc.common_meta(arch, vocab, s.context, s.hidden, s.layers, s.dense_ffn, 1e-5, s.theta),
            *mc.gqa_meta(arch, s.gqa(), s.head_dim // 2),
            *mc.expert_meta(arch, s.experts, s.active, s.expert_ffn),
            *mc.meta(
                arch,
                leading_dense_block_count=(s.dense_layers, U32),
                expert_shared_count=(1, U32),
                expert_weights_scale=(s.routed_scale, F32),
                expert_weights_norm=(True, BOOL),
                expert_gating_func=(2, U32),
                expert_group_count=(s.groups, U32),
                expert_group_used_count=(s.groups_used, U32),
                nextn_predict_layers=(0, U32),
            ),
        ]

    def hf_config(self, s: GlmShape, vocab: int) -> dict[str, object]:
        return {
            "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
            "vocab_size": vocab, "hidden_size": s.hidden, "intermediate_size": s.dense_ffn,
            "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "rms_norm_eps": 1e-5,
            "rope_theta": s.theta, "partial_rotary_factor": 0.5,
            "max_position_embeddings": s.context, "tie_word_embeddings": False,
            "hidden_act": "silu", "attention_bias": True, "use_qk_norm": True,
            "first_k_dense_replace": s.dense_layers, "n_routed_experts": s.experts,
            "num_experts_per_tok": s.active, "n_shared_experts": 1,
            "moe_intermediate_size": s.expert_ffn, "n_group": s.groups,
            "topk_group": s.groups_used, "routed_scaling_factor": s.routed_scale,
            "norm_topk_prob": True,
        }  # fmt: skip


register(Glm4Moe())
