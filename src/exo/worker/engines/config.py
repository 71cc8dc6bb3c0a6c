"""The shape of a Llama-family model, whatever file it came from."""

from dataclasses import dataclass
from typing import Literal

RopeScalingKind = Literal["linear", "llama3", "yarn"]
Activation = Literal["silu", "gelu_tanh"]
RouterKind = Literal["softmax", "softmax_selected", "sigmoid"]  # see models/router.py
ExpertActivation = Literal["silu", "gelu_tanh", "swiglu_oai"]  # see models/moe.py


@dataclass(frozen=True)
class RopeScaling:
    """Context extension applied to the rotary frequencies.

    linear: every frequency divided by `factor`.
    llama3: low frequencies divided by `factor`, high ones kept, a smooth ramp in between.
    yarn: the same idea with the ramp between `beta_fast` and `beta_slow` rotations over the
    original context (`models/rotary.yarn_frequencies`), and attention scaled by
    `attention_factor` squared (default 0.1 ln(factor) + 1).
    """

    kind: RopeScalingKind
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context_length: int = 8192
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    truncate: bool = True  # yarn: the ramp's ends rounded to whole dimensions
    attention_factor: float | None = None  # yarn: None = 0.1 ln(factor) + 1


@dataclass(frozen=True)
class LlamaConfig:
    """Llama 2/3, SmolLM2, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm) and Gemma 3 share this shape.

    Gemma 3 adds: GELU-tanh gating instead of SiLU, embeddings scaled by sqrt(hidden), norms
    after attention and MLP too (present as weights), an attention scale of its own, sliding-window
    layers with their own rotary base, and optionally a tanh cap on the final logits.
    """

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
    rope_scaling: RopeScaling | None = None  # of the global (full-attention) layers
    activation: Activation = "silu"
    embed_scale: float | None = None  # hidden states start as E[tokens] * embed_scale
    attn_scale: float | None = None  # softmax(q k^T * attn_scale); None: 1 / sqrt(head_dim)
    sliding_window: int | None = None  # a sliding layer sees the last `sliding_window` keys
    sliding_layers: tuple[bool, ...] = ()  # per layer: True = sliding window; () = none slide
    rope_theta_local: float | None = None  # rotary base of sliding layers (None: rope_theta)
    final_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    rotary_dim: int | None = None  # dims of a head that rotate (GLM: half); None: all of them

    def is_sliding(self, layer: int) -> bool:
        return self.sliding_window is not None and bool(
            self.sliding_layers and self.sliding_layers[layer]
        )

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads != 0:
            raise ValueError(
                f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.sliding_layers and len(self.sliding_layers) != self.n_layers:
            raise ValueError(
                f"{len(self.sliding_layers)} sliding-layer flags for {self.n_layers} layers"
            )


@dataclass(frozen=True)
class MoeConfig(LlamaConfig):
    """A mixture-of-experts model (`models/moe.py`): the Llama shape plus its experts, router and
    the attention extras of its families (gpt-oss's sinks and output bias)."""

    n_experts: int = 0  # E routed experts per MoE layer
    experts_per_token: int = 0  # k
    expert_ffn: int = 0  # F, each expert's width
    router: RouterKind = "softmax"
    norm_topk_prob: bool = False  # the k chosen weights renormalised to sum to one
    n_group: int = 1  # group-limited routing (DeepSeek V3)
    topk_group: int = 1
    routed_scaling: float = 1.0
    n_shared_experts: int = 0  # always-on experts (their total width: shared_ffn)
    shared_ffn: int = 0
    moe_layers: tuple[bool, ...] = ()  # per layer: True = MoE FFN, False = dense; () = all MoE
    expert_activation: ExpertActivation = "silu"
    swiglu_alpha: float = 1.702  # gpt-oss's clamped SwiGLU
    swiglu_limit: float = 7.0
    attention_sinks: bool = False  # gpt-oss: a learned per-head logit in every softmax
    attention_out_bias: bool = False  # gpt-oss: o_proj has a bias

    def is_moe(self, layer: int) -> bool:
        return not self.moe_layers or self.moe_layers[layer]

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.experts_per_token <= self.n_experts:
            raise ValueError(
                f"experts per token ({self.experts_per_token}) must be in 1..{self.n_experts}"
            )
        if self.moe_layers and len(self.moe_layers) != self.n_layers:
            raise ValueError(f"{len(self.moe_layers)} MoE-layer flags for {self.n_layers} layers")


def check_layer_range(config: LlamaConfig, start_layer: int, end_layer: int) -> None:
    """Raise ValueError unless 0 <= start_layer < end_layer <= n_layers."""
    if not 0 <= start_layer < end_layer <= config.n_layers:
        raise ValueError(
            f"invalid layer range [{start_layer}, {end_layer}) for a model of {config.n_layers} layers"
        )


MAX_CONTEXT_LENGTH = 2**24
"""The largest context a model card may carry (real models declare 128k to 1M positions): a
file declaring more is refused when its card is built. (The engine itself sizes everything by
the context it serves, so it loads such a file without harm: `models/rotary.py`.)"""


def check_context_length(context_length: int) -> None:
    """Raise ValueError unless 1 <= context_length <= 2^24."""
    if not 1 <= context_length <= MAX_CONTEXT_LENGTH:
        raise ValueError(
            f"the model declares a context of {context_length} tokens; the most a model file "
            f"may declare is 2^24 = {MAX_CONTEXT_LENGTH} (real models declare up to ~1M)"
        )
