"""gpt-oss (ARCH `gpt-oss`): attention with q/k/v/o biases and a learned sink logit per head,
even blocks attending to a sliding window, YaRN rotary scaling, a biased router whose chosen
logits are softmaxed, experts with biases (clamped SwiGLU), and OpenAI's harmony chat format.

Shapes: `tiny` (4 blocks of width 256, 8 experts of width 256, 2 active, 8/2 heads of 64,
window 8: shorter than the test prompts, YaRN x4 of 1024 positions) and `real-layer`
(gpt-oss-20b's block: width 2880, 32 experts of width 2880, 4 active, 64/8 heads of 64, window
128, YaRN x32 of 4096 positions; 4 blocks unless --layers says). gpt-oss ships its experts in
MXFP4 and the rest in 8 bits: `--quant MXFP4` writes that mix (a K-quant recipe stores the
2880-wide rows, not whole 256-value blocks, as llama.cpp's fallback types do). The vocabulary
is SmolLM2's plus harmony's tokens (o200k's 201k in the real model).
"""

from dataclasses import dataclass

from exo.modelgen.blueprint import ChatFormat, MetaItem, TensorSpec, register
from exo.modelgen.families import moe_common as mc
from exo.modelgen.families.moe_common import U32, Experts, Gqa, MoeGenFamily


@dataclass(frozen=True)
class GptOssShape:
    layers: int
    hidden: int
    experts: int
    active: int
    expert_ffn: int
    heads: int
    kv_heads: int
    window: int
    yarn_factor: float
    yarn_original: int
    context: int
    head_dim: int = 64
    theta: float = 150000.0

    def gqa(self) -> Gqa:
        return Gqa(self.hidden, self.heads, self.kv_heads, self.head_dim, self.layers, bias=True,
                   out_bias=True, sinks=True)  # fmt: skip

    def moe(self) -> Experts:
        return Experts(self.hidden, self.experts, self.expert_ffn, self.layers, bias=True)


SHAPES = {
    "tiny": GptOssShape(4, 256, 8, 2, 256, 8, 2, 8, 4.0, 1024, 4096),
    "real-layer": GptOssShape(4, 2880, 32, 4, 2880, 64, 8, 128, 32.0, 4096, 131072),
}

# Harmony: a system message with the reasoning level and the channels, a developer message with
# the instructions and the tools (a TypeScript-like namespace), then the turns. The assistant's
# answers are in the final channel; its calls are commentary messages addressed to
# functions.NAME, answered by a message from functions.NAME.
TEMPLATE = (
    "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- elif c -%}{%- for p in c -%}"
    "{%- if p.type == 'text' -%}{{ p.text }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{{- '<|start|>system<|message|>You are a model generated for tests.\\nReasoning: ' +"
    " (reasoning_effort | default('medium')) + '\\n\\n# Valid channels: analysis, commentary,"
    " final. Every message names its channel.' -}}"
    "{%- if tools -%}{{- '\\nCalls to functions go to the commentary channel.' -}}{%- endif -%}"
    "{{- '<|end|>' -}}"
    "{%- set system = messages | selectattr('role', 'in', ['system', 'developer']) | list -%}"
    "{%- if system or tools -%}"
    "{{- '<|start|>developer<|message|>' -}}"
    "{%- if system -%}{{- '# Instructions\\n\\n' + text(system[0].content) -}}{%- endif -%}"
    "{%- if tools -%}{{- '\\n\\n# Tools\\n\\n## functions\\n\\nnamespace functions {\\n' -}}"
    "{%- for t in tools -%}"
    "{{- '\\n// ' + (t.function.description or '') + '\\ntype ' + t.function.name +"
    " ' = (_: ' + (t.function.parameters | tojson) + ') => any;\\n' -}}"
    "{%- endfor -%}{{- '\\n} // namespace functions' -}}{%- endif -%}"
    "{{- '<|end|>' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role in ['system', 'developer'] -%}"
    "{%- elif m.role == 'tool' -%}"
    "{{- '<|start|>functions.' + (m.name | default('tool')) + ' to=assistant<|channel|>"
    "commentary<|message|>' + text(m.content) + '<|end|>' -}}"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}"
    "{%- for c in m.tool_calls -%}{%- set args = c.function.arguments -%}"
    "{{- '<|start|>assistant to=functions.' + c.function.name + '<|channel|>commentary json"
    "<|message|>' + (args if args is string else args | tojson) + '<|call|>' -}}"
    "{%- endfor -%}"
    "{%- elif m.role == 'assistant' -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + text(m.content) + '<|end|>' -}}"
    "{%- else -%}"
    "{{- '<|start|>' + m.role + '<|message|>' + text(m.content) + '<|end|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}"
)

CHAT = ChatFormat(
    special_tokens=(
        "<|startoftext|>", "<|endoftext|>", "<|start|>", "<|channel|>", "<|message|>",
        "<|constrain|>", "<|end|>", "<|return|>", "<|call|>",
    ),
    bos="<|startoftext|>",
    eos="<|return|>",
    template=TEMPLATE,
    add_bos=False,
)  # fmt: skip


class GptOss(MoeGenFamily[GptOssShape]):
    name = "gpt-oss"
    gguf_arch = "gpt-oss"
    shapes = tuple(SHAPES)
    chat = CHAT
    safetensors = (
        "gpt-oss's checkpoints hold experts as MXFP4 blocks or fused, input-major gate_up "
        "tensors, which the generator does not write: use a GGUF file"
    )

    def shape_table(self) -> dict[str, GptOssShape]:
        return SHAPES

    def tensors(self, s: GptOssShape, vocab: int) -> list[TensorSpec]:
        out = mc.embedding(vocab, s.hidden)
        for i in range(s.layers):
            out += mc.attention(s.gqa(), i)
            out.append(mc.norm(i, "post_attention_norm", "post_attention_layernorm", s.hidden))
            out += mc.experts(s.moe(), i)
        return out + mc.head(vocab, s.hidden)

    def metadata(self, s: GptOssShape, vocab: int) -> list[MetaItem]:
        arch = self.gguf_arch
        return [
            *mc.common_meta(
                arch, vocab, s.context, s.hidden, s.layers, s.expert_ffn, 1e-5, s.theta
            ),
            *mc.gqa_meta(arch, s.gqa(), s.head_dim),
            *mc.expert_meta(arch, s.experts, s.active, s.expert_ffn),
            *mc.meta(arch, attention__sliding_window=(s.window, U32)),
            *mc.yarn_meta(arch, s.yarn_factor, s.yarn_original),
        ]


register(GptOss())
