"""The SigLIP vision encoder (Gemma 3's vision tower): a square image cut into patches, a
linear patch embedding plus learned positions, pre-norm transformer layers with full
(bidirectional) attention and a tanh-GELU MLP, and a final LayerNorm.

Weights are read by name (``embeddings.patch_embedding.weight``,
``encoder.layers.{i}.self_attn.q_proj.weight``, ``post_layernorm.weight`` ...) from a
``Weights`` lookup that already removed the checkpoint's prefix.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

# A tensor by its name under the tower's prefix (KeyError: absent).
Weights = Callable[[str], Tensor]


@dataclass(frozen=True)
class SiglipConfig:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    image_size: int
    patch_size: int
    eps: float = 1e-6
    channels: int = 3

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @classmethod
    def from_hf(cls, raw: dict[str, object]) -> "SiglipConfig":
        """From a transformers ``vision_config`` (SigLIP's defaults where a key is absent)."""

        def num(key: str, default: float) -> float:
            value = raw.get(key, default)
            if not isinstance(value, int | float):
                raise ValueError(f"vision_config.{key} must be a number")
            return float(value)

        act = raw.get("hidden_act", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"vision_config.hidden_act {act!r} is not supported")
        return cls(
            hidden=int(num("hidden_size", 768)),
            intermediate=int(num("intermediate_size", 3072)),
            layers=int(num("num_hidden_layers", 12)),
            heads=int(num("num_attention_heads", 12)),
            image_size=int(num("image_size", 224)),
            patch_size=int(num("patch_size", 16)),
            eps=num("layer_norm_eps", 1e-6),
            channels=int(num("num_channels", 3)),
        )


@dataclass(frozen=True)
class _Layer:
    norm1: tuple[Tensor, Tensor]
    qkv: tuple[Tensor, Tensor]  # the q, k and v projections stacked: [3D, D], [3D]
    out: tuple[Tensor, Tensor]
    norm2: tuple[Tensor, Tensor]
    fc1: tuple[Tensor, Tensor]
    fc2: tuple[Tensor, Tensor]


class SiglipEncoder:
    """Pixels ``[B, C, S, S]`` (already resized and normalised) -> ``[B, patches, D]``."""

    def __init__(self, config: SiglipConfig, weights: Weights, dtype: torch.dtype) -> None:
        self.config = config

        def w(name: str) -> Tensor:
            return weights(name).to(dtype)

        def pair(name: str) -> tuple[Tensor, Tensor]:
            return w(f"{name}.weight"), w(f"{name}.bias")

        patch = w("embeddings.patch_embedding.weight")  # [D, C, P, P]
        self.patch = (patch.reshape(patch.shape[0], -1), w("embeddings.patch_embedding.bias"))
        self.positions = w("embeddings.position_embedding.weight")  # [N, D]
        self.layers = [self._layer(f"encoder.layers.{i}", w, pair) for i in range(config.layers)]
        self.post_norm = pair("post_layernorm")

    @staticmethod
    def _layer(
        at: str, w: Callable[[str], Tensor], pair: Callable[[str], tuple[Tensor, Tensor]]
    ) -> _Layer:
        qkv = [pair(f"{at}.self_attn.{p}_proj") for p in "qkv"]
        return _Layer(
            norm1=pair(f"{at}.layer_norm1"),
            qkv=(torch.cat([q[0] for q in qkv]), torch.cat([q[1] for q in qkv])),
            out=pair(f"{at}.self_attn.out_proj"),
            norm2=pair(f"{at}.layer_norm2"),
            fc1=pair(f"{at}.mlp.fc1"),
            fc2=pair(f"{at}.mlp.fc2"),
        )

    def __call__(self, pixels: Tensor) -> Tensor:
        c = self.config
        b = pixels.shape[0]
        p = c.patch_size
        # [B, C, S, S] -> [B, N, C*P*P] in the conv weight's (C, P, P) order.
        patches = pixels.unfold(2, p, p).unfold(3, p, p)  # [B, C, n, n, P, P]
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c.channels * p * p)
        h = F.linear(patches, *self.patch) + self.positions
        for layer in self.layers:
            h = h + self._attention(layer, F.layer_norm(h, (c.hidden,), *layer.norm1, c.eps))
            x = F.layer_norm(h, (c.hidden,), *layer.norm2, c.eps)
            h = h + F.linear(F.gelu(F.linear(x, *layer.fc1), approximate="tanh"), *layer.fc2)
        return F.layer_norm(h, (c.hidden,), *self.post_norm, c.eps)

    def _attention(self, layer: _Layer, x: Tensor) -> Tensor:
        b, n, d = x.shape
        heads = self.config.heads
        qkv = F.linear(x, *layer.qkv).view(b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])  # every patch sees all
        return F.linear(out.transpose(1, 2).reshape(b, n, d), *layer.out)
