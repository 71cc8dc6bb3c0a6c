"""What a family tells the generator: a model's tensors, metadata and config (a Blueprint).

A family (one module under `families/`) turns a shape name, an optional layer count and a
vocabulary size into a `Blueprint`; the writers (`gguf_out`, `safetensors_out`) know nothing
of any family. Adding a family is one module that calls `register` (and one name in
`families.MODULES`).
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from gguf import GGMLQuantizationType, GGUFValueType


class Role(Enum):
    """What a tensor does, which decides its random scale and (in a mix) its type."""

    EMBEDDING = "embedding"
    OUTPUT = "output"  # the LM head (absent when tied to the embedding)
    ATTN_Q = "attn_q"
    ATTN_K = "attn_k"
    ATTN_V = "attn_v"
    ATTN_OUTPUT = "attn_output"
    FFN_GATE = "ffn_gate"
    FFN_UP = "ffn_up"
    FFN_DOWN = "ffn_down"
    NORM = "norm"  # 1-D, always float32, all ones
    OUTPUT_NORM = "output_norm"  # 1-D, float32: the final norm's gain, random signs
    # mixture-of-experts families: kept in float32 whatever the recipe (as llama.cpp keeps them)
    ROUTER = "router"  # ffn_gate_inp: the router's matrix
    VECTOR = "vector"  # biases, attention sinks, the expert-bias correction: random values


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: GGUF and Hugging Face names, shape (outer dims..., K: values per row, the
    quantised axis), role, layer (None outside the blocks), random scale (std of N(0, std)).
    `rope_head_dim`: rows of heads of this size are in llama.cpp's interleaved rotary order in
    a GGUF and in Hugging Face's half-split order in safetensors (q and k of llama-like
    families), so both files of one seed hold the same model. `grid`: the values are snapped to
    that block type's grid (gpt-oss's experts: MXFP4, as its checkpoints hold them), and a
    safetensors folder stores them in that type (`safetensors_out`). Tensors sharing one
    `hf_name` (gpt-oss's gate and up) are one Hugging Face tensor, fused along axis 1,
    alternating."""

    gguf_name: str
    hf_name: str
    shape: tuple[int, ...]
    role: Role
    layer: int | None
    std: float
    rope_head_dim: int = 0
    grid: GGMLQuantizationType | None = None

    @property
    def rows(self) -> int:
        n = 1
        for d in self.shape[:-1]:
            n *= d
        return n

    @property
    def k(self) -> int:
        return self.shape[-1]


MetaValue = int | float | str | bool


@dataclass(frozen=True)
class MetaItem:
    """One GGUF key-value pair in the family's keys (`llama.block_count`...)."""

    key: str
    value: MetaValue
    vtype: GGUFValueType


@dataclass(frozen=True)
class ChatFormat:
    """The family's special tokens (appended to SmolLM2's vocabulary), which of them are BOS
    and EOS, and its chat template (Jinja, as in a GGUF / tokenizer_config.json)."""

    special_tokens: tuple[str, ...]
    bos: str
    eos: str
    template: str
    add_bos: bool = True
    # Tokens added as plain (user-defined) tokens, text the model writes rather than control
    # tokens: Qwen's <think> and <tool_call>, which its grammar-forced calls spell as text.
    plain_tokens: tuple[str, ...] = ()


@dataclass(frozen=True)
class Blueprint:
    """A whole model as the writers need it."""

    arch: str  # the CLI's ARCH (the family's name)
    gguf_arch: str  # general.architecture
    shape_name: str
    n_layers: int
    tensors: tuple[TensorSpec, ...]
    metadata: tuple[MetaItem, ...]
    hf_config: dict[str, object] = field(default_factory=dict[str, object])


class Family(ABC):
    """A model family the generator can write."""

    name: str
    shapes: tuple[str, ...]
    chat: ChatFormat
    safetensors: str | None = None  # why --safetensors is not offered (None: it is)
    safetensors_only: bool = False  # (a vision family's GGUF needs its mmproj file too)
    mmproj_pair: bool = False  # without --safetensors: a text GGUF and its mmproj GGUF

    def write_extra(self, folder: Path) -> None:
        """Files a safetensors folder of this family needs besides config, tokenizer and
        weights (a vision family's processor configs); none by default."""
        return None

    @abstractmethod
    def blueprint(self, shape: str, layers: int | None, vocab: int) -> Blueprint:
        """The model of `shape` (one of `shapes`), with `layers` blocks when given, over a
        vocabulary of `vocab` tokens. Raises ValueError for a shape it does not have."""


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    FAMILIES[family.name] = family
    return family
