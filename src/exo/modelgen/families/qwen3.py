"""The dense Qwen3 family (ARCH `qwen3`): per-head q/k RMS norms, head dim 128 independent of
the width, ChatML turns with <think> reasoning.

Shapes: `tiny` (2 blocks of width 256, 4/2 heads of 128: q is wider than the model), `1b`
(Qwen3-1.7B: 28 blocks, width 2048, ffn 6144, 16/8 heads, tied embeddings), `8b` (Qwen3-8B: 36
blocks, width 4096, ffn 12288, 32/8 heads) and `real-layer` (the flagship dense Qwen3-32B's
block: width 5120, ffn 25600, 64/8 heads; 2 blocks unless --layers says). SmolLM2's
vocabulary already holds <|im_start|> and <|im_end|>; Qwen3's <think> and tool-call tokens
are added. In a GGUF, Qwen3's q/k rows keep Hugging Face's order (llama.cpp's NEOX rotary).
"""

from exo.modelgen.blueprint import Blueprint, ChatFormat, Family, register
from exo.modelgen.families.dense import (
    DenseShape,
    dense_hf_config,
    dense_metadata,
    dense_tensors,
    pick_shape,
)


def _shape(layers: int, hidden: int, ffn: int, heads: int, tied: bool) -> DenseShape:
    return DenseShape(layers, hidden, ffn, heads, 8 if heads > 4 else 2, 128, tied=tied,
                      context=8192, rope_theta=1_000_000.0, norm_eps=1e-6,
                      qk_norm=True)  # fmt: skip


SHAPES: dict[str, DenseShape] = {
    "tiny": _shape(2, 256, 512, 4, tied=False),
    "1b": _shape(28, 2048, 6144, 16, tied=True),
    "8b": _shape(36, 4096, 12288, 32, tied=False),
    "real-layer": _shape(2, 5120, 25600, 64, tied=False),
}

# ChatML: each turn is <|im_start|>role\n...<|im_end|>\n; with enable_thinking false the
# answer starts after an empty think block.
TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set text = message['content'] %}"
    "{%- else %}{%- set text = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') %}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + text + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
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
)  # fmt: skip


class Qwen3(Family):
    name = "qwen3"
    shapes = tuple(SHAPES)
    chat = CHAT

    def blueprint(self, shape: str, layers: int | None, vocab: int) -> Blueprint:
        s = pick_shape(SHAPES, shape, layers)
        return Blueprint(
            arch=self.name,
            gguf_arch="qwen3",
            shape_name=shape,
            n_layers=s.layers,
            tensors=dense_tensors(s, vocab, interleaved_rope=False),
            metadata=dense_metadata("qwen3", s, vocab),
            hf_config=dense_hf_config("qwen3", "Qwen3ForCausalLM", s, vocab),
        )


register(Qwen3())
