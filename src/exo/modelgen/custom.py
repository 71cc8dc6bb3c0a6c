"""Dense llama models of any shape, for engine tests and benchmarks that need sizes the named
shapes do not have (a 512-token vocabulary without a tokenizer, odd widths...).

With `tokenizer` (a GGUF file, e.g. the embedded SmolLM2's) the model gets that vocabulary plus
Llama 3's special tokens and chat template, as the named shapes do; without it, `vocab` tokens
and no tokenizer at all (BOS 1, EOS 2).
"""

from dataclasses import dataclass
from pathlib import Path

from exo.modelgen.blueprint import Blueprint
from exo.modelgen.families.dense import DenseShape, dense_tensors
from exo.modelgen.families.llama import CHAT, dense_hf_config, dense_metadata
from exo.modelgen.gguf_out import write_gguf
from exo.modelgen.recipes import recipe
from exo.modelgen.safetensors_out import write_safetensors
from exo.modelgen.vocab import Vocabulary, vocabulary, without_template


def llama_blueprint(shape: DenseShape, vocab: int) -> Blueprint:
    return Blueprint(
        arch="llama",
        gguf_arch="llama",
        shape_name="custom",
        n_layers=shape.layers,
        tensors=dense_tensors(shape, vocab),
        metadata=dense_metadata("llama", shape, vocab),
        hf_config=dense_hf_config("llama", "LlamaForCausalLM", shape, vocab),
    )


@dataclass(frozen=True)
class Size:
    """A dense llama's shape (head dim hidden / heads) and vocabulary (without a tokenizer)."""

    layers: int = 2
    hidden: int = 256
    ffn: int = 512
    heads: int = 4
    kv_heads: int = 2
    vocab: int = 512
    tied: bool = False

    @property
    def shape(self) -> DenseShape:
        return DenseShape(self.layers, self.hidden, self.ffn, self.heads, self.kv_heads,
                          self.hidden // self.heads, tied=self.tied, context=2048,
                          rope_theta=10000.0)  # fmt: skip


def _model(
    size: Size, tokenizer: Path | None, chat_template: bool = True
) -> tuple[Blueprint, Vocabulary | int]:
    v = size.vocab if tokenizer is None else vocabulary(CHAT, tokenizer)
    if isinstance(v, Vocabulary) and not chat_template:
        v = without_template(v)
    return llama_blueprint(size.shape, v if isinstance(v, int) else v.size), v


def llama_gguf(
    path: Path, quant: str, size: Size = Size(), *, tokenizer: Path | None = None, seed: int = 0,
    chat_template: bool = True,
) -> Path:  # fmt: skip
    """A llama GGUF of `size` in recipe `quant` (a GGUF type name, or Q4_K_M / Q5_K_M);
    `chat_template` False: with a tokenizer but no template (as a base model's file)."""
    bp, v = _model(size, tokenizer, chat_template)
    return write_gguf(path, bp, recipe(quant), v, name=path.stem, seed=seed)


def llama_safetensors(
    folder: Path, size: Size = Size(), *, quant: str = "BF16", tokenizer: Path | None = None,
    seed: int = 0,
) -> Path:  # fmt: skip
    """A llama Hugging Face folder of `size`, weights in `quant` (BF16, F16 or F32)."""
    bp, v = _model(size, tokenizer)
    return write_safetensors(folder, bp, recipe(quant).base, v, seed=seed)
