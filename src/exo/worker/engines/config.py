"""The shape of a Llama-family model, whatever file it came from."""

from dataclasses import dataclass
from typing import Literal

RopeScalingKind = Literal["linear", "llama3"]


@dataclass(frozen=True)
class RopeScaling:
    """Context extension applied to the rotary frequencies.

    linear: every frequency divided by `factor`.
    llama3: low frequencies divided by `factor`, high ones kept, a smooth ramp in between.
    """

    kind: RopeScalingKind
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context_length: int = 8192


@dataclass(frozen=True)
class LlamaConfig:
    """Llama 2/3, SmolLM2, Mistral, Qwen2 (qkv bias) and Qwen3 (q/k norm) share this shape."""

    architecture: str
    n_layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    vocab: int
    context_length: int
    tie_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    chat_template: str | None
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_scaling: RopeScaling | None = None

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads != 0:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")


def check_layer_range(config: LlamaConfig, start_layer: int, end_layer: int) -> None:
    """Raise ValueError unless 0 <= start_layer < end_layer <= n_layers."""
    if not 0 <= start_layer < end_layer <= config.n_layers:
        raise ValueError(
            f"invalid layer range [{start_layer}, {end_layer}) for a model of {config.n_layers} layers"
        )
