"""The dense llama family (ARCH `llama`): Llama 3 shapes, its special tokens and chat format.

Shapes: `tiny` (2 blocks of width 256, for tests), `1b` (Llama-3.2-1B: 16 blocks, width 2048,
ffn 8192, 32/8 heads of 64, tied embeddings), `8b` (Llama-3.1-8B: 32 blocks, width 4096, ffn
14336, 32/8 heads of 128) and `real-layer` (the flagship Llama-3.3-70B's block: width 8192, ffn
28672, 64/8 heads of 128; 2 blocks unless --layers says). The vocabulary is SmolLM2's plus
Llama 3's header and turn tokens, so the embedding is 49k rows, not 128k. Llama 3.1's
long-context rope scaling is left out (the file's context is the 8k it was trained at).
"""

from exo.modelgen.blueprint import Blueprint, ChatFormat, Family, register
from exo.modelgen.families.dense import (
    DenseShape,
    dense_hf_config,
    dense_metadata,
    dense_tensors,
    pick_shape,
)

SHAPES: dict[str, DenseShape] = {
    "tiny": DenseShape(2, 256, 512, 4, 2, 64, tied=False, context=2048, rope_theta=10000.0),
    "1b": DenseShape(16, 2048, 8192, 32, 8, 64, tied=True, context=8192, rope_theta=500000.0),
    "8b": DenseShape(32, 4096, 14336, 32, 8, 128, tied=False, context=8192, rope_theta=500000.0),
    "real-layer": DenseShape(
        2, 8192, 28672, 64, 8, 128, tied=False, context=8192, rope_theta=500000.0
    ),
}

# Llama 3's prompt format: a header names the role, each turn ends with <|eot_id|>.
TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set text = message['content'] %}"
    "{%- else %}{%- set text = message['content'] | selectattr('type', 'equalto', 'text')"
    " | map(attribute='text') | join('') %}{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + text | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)

CHAT = ChatFormat(
    special_tokens=(
        "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
        "<|eot_id|>", "<|eom_id|>", "<|python_tag|>",
    ),
    bos="<|begin_of_text|>",
    eos="<|eot_id|>",
    template=TEMPLATE,
)  # fmt: skip


class Llama(Family):
    name = "llama"
    shapes = tuple(SHAPES)
    chat = CHAT

    def blueprint(self, shape: str, layers: int | None, vocab: int) -> Blueprint:
        s = pick_shape(SHAPES, shape, layers)
        return Blueprint(
            arch=self.name,
            gguf_arch="llama",
            shape_name=shape,
            n_layers=s.layers,
            tensors=dense_tensors(s, vocab),
            metadata=dense_metadata("llama", s, vocab),
            hf_config=dense_hf_config("llama", "LlamaForCausalLM", s, vocab),
        )


register(Llama())
