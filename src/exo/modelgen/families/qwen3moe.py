"""Qwen3-MoE (ARCH `qwen3moe`): Qwen3's attention (per-head q/k RMS norms, head dim 128
independent of the width) with every block a mixture of experts (softmax router, top-k weights
renormalised), ChatML turns with <think> reasoning and Hermes-style <tool_call> calls.

Shapes: `tiny` (3 blocks of width 256, 16 experts of width 256, 4 active, 4/2 heads of 128)
and `real-layer` (Qwen3-30B-A3B's block: width 2048, 128 experts of width 768, 8 active, 32/4
heads of 128; 8 blocks unless --layers says: about 3 GB in Q4_K_M). Qwen3-30B-A3B's own
vocabulary is 151k tokens; ours is SmolLM2's 49k plus Qwen3's special tokens. q/k rows keep
Hugging Face's order in both formats (llama.cpp's NEOX rotary for this architecture).
"""

from dataclasses import dataclass

from exo.modelgen.blueprint import ChatFormat, MetaItem, TensorSpec, register
from exo.modelgen.families import moe_common as mc
from exo.modelgen.families.moe_common import BOOL, Experts, Gqa, MoeGenFamily


@dataclass(frozen=True)
class Qwen3MoeShape:
    layers: int
    hidden: int
    experts: int
    active: int
    expert_ffn: int
    heads: int
    kv_heads: int
    ffn: int = 6144  # the config's dense width (no dense layers: written, not used)
    head_dim: int = 128
    context: int = 40960
    theta: float = 1_000_000.0

    def gqa(self) -> Gqa:
        return Gqa(self.hidden, self.heads, self.kv_heads, self.head_dim, self.layers,
                   qk_norm=True)  # fmt: skip

    def moe(self) -> Experts:
        return Experts(self.hidden, self.experts, self.expert_ffn, self.layers)


SHAPES = {
    "tiny": Qwen3MoeShape(3, 256, 16, 4, 256, 4, 2, ffn=512, context=4096),
    "real-layer": Qwen3MoeShape(8, 2048, 128, 8, 768, 32, 4),
}

# ChatML. Tools go in a system turn as JSON schemas; the model answers a call with
# <tool_call>{"name": ..., "arguments": {...}}</tool_call>; results come back in a user turn.
TEMPLATE = (
    "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- elif c -%}{%- for p in c -%}"
    "{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set first = messages[0] if messages else none -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if first and first.role == 'system' -%}{{- text(first.content) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\nThese functions can be called (JSON schemas):\\n<tools>' -}}"
    "{%- for t in tools -%}{{- '\\n' + (t | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\nTo call one, answer with <tool_call>\\n{\"name\": the function\\'s name,"
    ' "arguments": an object of its arguments}\\n</tool_call><|im_end|>\\n\' -}}'
    "{%- elif first and first.role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + text(first.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}"
    "{%- elif m.role == 'tool' -%}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + text(m.content) +"
    " '\\n</tool_response><|im_end|>\\n' -}}"
    "{%- elif m.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + text(m.content) -}}"
    "{%- for c in m.tool_calls or [] -%}"
    "{%- set args = c.function.arguments -%}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + c.function.name + \'", "arguments": \' +'
    " (args if args is string else args | tojson) + '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + text(m.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}{%- endif -%}{%- endif -%}"
)

CHAT = ChatFormat(
    special_tokens=(
        "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
        "</tool_call>",
    ),
    bos="<|endoftext|>",
    eos="<|im_end|>",
    template=TEMPLATE,
    add_bos=False,
    plain_tokens=("<think>", "</think>", "<tool_call>", "</tool_call>"),
)  # fmt: skip


class Qwen3Moe(MoeGenFamily[Qwen3MoeShape]):
    name = "qwen3moe"
    gguf_arch = "qwen3moe"
    shapes = tuple(SHAPES)
    chat = CHAT

    def shape_table(self) -> dict[str, Qwen3MoeShape]:
        return SHAPES

    def tensors(self, s: Qwen3MoeShape, vocab: int) -> list[TensorSpec]:
        return mc.model_tensors(vocab, s.hidden, s.layers, "ffn_norm",
                                lambda i: mc.attention(s.gqa(), i),
                                lambda i: mc.experts(s.moe(), i))  # fmt: skip

    def metadata(self, s: Qwen3MoeShape, vocab: int) -> list[MetaItem]:
        arch = self.gguf_arch
        return [
            *mc.common_meta(arch, vocab, s.context, s.hidden, s.layers, s.ffn, 1e-6, s.theta),
            *mc.gqa_meta(arch, s.gqa(), s.head_dim),
            *mc.expert_meta(arch, s.experts, s.active, s.expert_ffn),
            *mc.meta(arch, expert_weights_norm=(True, BOOL)),
        ]

    def hf_config(self, s: Qwen3MoeShape, vocab: int) -> dict[str, object]:
        return {
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "vocab_size": vocab, "hidden_size": s.hidden, "intermediate_size": s.ffn,
            "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "rms_norm_eps": 1e-6,
            "rope_theta": s.theta, "max_position_embeddings": s.context,
            "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False,
            "num_experts": s.experts, "num_experts_per_tok": s.active,
            "moe_intermediate_size": s.expert_ffn, "norm_topk_prob": True,
            "decoder_sparse_step": 1, "mlp_only_layers": [],
        }  # fmt: skip


register(Qwen3Moe())
