"""RMSNorm and the residual add around a layer, with tensor parallelism's all-reduce.

    h = h + layer(x)                                  (norm and add fused into the linear)
    h = h + rmsnorm(allreduce(layer(x))) * g_post     (Gemma's post-norms; TP all-reduces first)

A pre-norm (rmsnorm(h) * g before a linear) is the linear's prologue (`linear.RmsNorm`), so it
has no function here.
"""

import torch.nn.functional as F
from torch import Tensor

from exo.worker.engines.linear import Linear
from exo.worker.engines.models.base import AllReduce, no_all_reduce


def rms_norm(x: Tensor, gain: Tensor | None, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * gain over the last axis."""
    return F.rms_norm(x, (x.shape[-1],), gain, eps)


def residual(
    h: Tensor,
    layer: Linear,
    x: Tensor,
    post_norm: Tensor | None,
    all_reduce: AllReduce,
    eps: float,
) -> Tensor:
    """h + [rmsnorm](allreduce(layer(x))); without TP the norm and the add are fused."""
    if all_reduce is no_all_reduce and post_norm is None:
        return layer(x, residual=h)
    y = all_reduce(layer(x))
    if post_norm is not None:
        y = rms_norm(y, post_norm, eps)
    return h + y
