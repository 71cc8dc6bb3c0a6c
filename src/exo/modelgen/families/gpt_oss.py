"""gpt-oss (ARCH `gpt-oss`): attention with q/k/v/o biases and a learned sink logit per head,
even blocks attending to a sliding window, YaRN rotary scaling, a biased router whose chosen
logits are softmaxed, experts with biases (clamped SwiGLU), and OpenAI's harmony chat format.

Shapes: `tiny` (4 blocks of width 256, 8 experts of width 256, 2 active, 8/2 heads of 64,
window 8: shorter than the test prompts, YaRN x4 of 1024 positions) and `real-layer`
(gpt-oss-20b's block: width 2880, 32 experts of width 2880, 4 active, 64/8 heads of 64, window
128, YaRN x32 of 4096 positions; 4 blocks unless --layers says). gpt-oss ships its experts in
MXFP4 and the rest in 8 bits: `--quant MXFP4` writes that mix (a K-quant recipe stores the
2880-wide rows, not whole 256-value blocks, as llama.cpp's fallback types do). The experts'
values lie on MXFP4's grid whatever the file type, as gpt-oss's own do: `--safetensors` writes
its checkpoint layout (experts as MXFP4 `_blocks` / `_scales`, gate and up fused with rows
alternating, the rest in the float type asked for), the same model as the GGUF of its seed.
The vocabulary is SmolLM2's plus harmony's tokens (o200k's 201k in the real model).
"""

from dataclasses import dataclass, replace

from gguf import GGMLQuantizationType

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

    def shape_table(self) -> dict[str, GptOssShape]:
        return SHAPES

    def tensors(self, s: GptOssShape, vocab: int) -> list[TensorSpec]:
        def ffn(i: int) -> list[TensorSpec]:
            return [_as_checkpoint(t, i) for t in mc.experts(s.moe(), i)]

        return mc.model_tensors(vocab, s.hidden, s.layers, "post_attention_norm",
                                lambda i: mc.attention(s.gqa(), i), ffn)  # fmt: skip

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

    def hf_config(self, s: GptOssShape, vocab: int) -> dict[str, object]:
        return {
            "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
            "vocab_size": vocab, "hidden_size": s.hidden, "intermediate_size": s.expert_ffn,
            "num_hidden_layers": s.layers, "num_attention_heads": s.heads,
            "num_key_value_heads": s.kv_heads, "head_dim": s.head_dim, "rms_norm_eps": 1e-5,
            "rope_theta": s.theta, "max_position_embeddings": s.context,
            "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": True,
            "num_local_experts": s.experts, "num_experts_per_tok": s.active,
            "sliding_window": s.window, "swiglu_limit": 7.0,
            "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                            for i in range(s.layers)],
            "rope_scaling": {
                "rope_type": "yarn", "factor": s.yarn_factor, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": s.yarn_original,
            },
            "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
                "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                "lm_head",
            ]},
        }  # fmt: skip


# Hugging Face's names of the experts' tensors: the router `mlp.router`; gate and up fused into
# one tensor (`gate_up_proj`, rows alternating) as `down_proj`, both in MXFP4 (`_blocks`,
# `_scales`; values on MXFP4's grid in a GGUF too); gate_up_proj_bias and down_proj_bias.
_CHECKPOINT_NAMES = {
    "ffn_gate_inp.weight": "router.weight",
    "ffn_gate_inp.bias": "router.bias",
    "ffn_gate_exps.weight": "experts.gate_up_proj",
    "ffn_up_exps.weight": "experts.gate_up_proj",
    "ffn_down_exps.weight": "experts.down_proj",
    "ffn_gate_exps.bias": "experts.gate_up_proj_bias",
    "ffn_up_exps.bias": "experts.gate_up_proj_bias",
    "ffn_down_exps.bias": "experts.down_proj_bias",
}


def _as_checkpoint(t: TensorSpec, i: int) -> TensorSpec:
    hf = f"model.layers.{i}.mlp." + _CHECKPOINT_NAMES[t.gguf_name.removeprefix(f"blk.{i}.")]
    grid = GGMLQuantizationType.MXFP4 if t.gguf_name.endswith("_exps.weight") else None
    return replace(t, hf_name=hf, grid=grid)


register(GptOss())
