"""The dense gated MLP (SwiGLU, or GeGLU for Gemma).

    x = rmsnorm(h) * g_ffn
    m = (act(x Wg^T) * (x Wu^T)) Wd^T        act = silu | gelu_tanh

Gate and up are one linear with their rows stacked (the norm fused in as its prologue); the
gating is the down projection's prologue. The residual add is the caller's (`norms.residual`).
"""

from dataclasses import dataclass

from torch import Tensor

from exo.worker.engines.config import Activation
from exo.worker.engines.linear import GeGLU, Linear, RmsNorm, SwiGLU
from exo.worker.engines.models.linears import LinearMaker
from exo.worker.engines.qtensor import Weight


@dataclass(frozen=True)
class DenseMlp:
    gate_up: Linear  # h [.., D] -> rmsnorm(h) g_ffn [Wg | Wu]^T: [.., 2F]
    down: Linear  # [.., 2F] -> act(gate) * up Wd^T
    post_norm: Tensor | None  # [D]  Gemma 3: norm of the MLP output (unless fused into down)


def build_dense_mlp(
    make: LinearMaker,
    norm: Tensor,
    w_gate: Weight,
    w_up: Weight,
    w_down: Weight,
    activation: Activation,
    post_norm: Tensor | None = None,
) -> DenseMlp:
    return DenseMlp(
        gate_up=make([w_gate, w_up], None, RmsNorm(norm, make.eps)),
        # the gating (SiLU or GELU-tanh) is fused into the down projection
        down=make(w_down, None, SwiGLU() if activation == "silu" else GeGLU(), post=post_norm),
        post_norm=make.unfused(post_norm),
    )
