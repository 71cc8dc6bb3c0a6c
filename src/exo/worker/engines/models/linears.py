"""One place that turns a family's weights into running linears with the model's settings."""

from dataclasses import dataclass

import torch
from torch import Tensor

from exo.worker.engines.cpu_kernels import QKernels
from exo.worker.engines.linear import Linear, Prologue, Regroup, RmsNorm, WeightFormat, make_linear
from exo.worker.engines.qtensor import Weight


@dataclass(frozen=True)
class LinearMaker:
    """Running linears in one format, dtype and device. `fuse_post_norms`: a norm after a
    linear runs inside it (not with tensor parallelism: the all-reduce comes between them).
    `regroup`: what the linears may do with the file's blocks (`linear.Regroup`)."""

    fmt: WeightFormat
    dtype: torch.dtype
    device: torch.device
    kernels: QKernels | None
    eps: float
    fuse_post_norms: bool = True
    regroup: Regroup = "copy"

    def __call__(
        self,
        w: Weight | list[Weight],
        bias: Tensor | None = None,
        prologue: Prologue = None,
        post: Tensor | None = None,
    ) -> Linear:
        fused = post is not None and self.fuse_post_norms
        post_norm = RmsNorm(post.to(self.device), self.eps) if fused and post is not None else None
        return make_linear(
            w,
            bias,
            self.fmt,
            prologue=prologue,
            dtype=self.dtype,
            device=self.device,
            kernels=self.kernels,
            post_norm=post_norm,
            regroup=self.regroup,
        )

    def unfused(self, norm: Tensor | None) -> Tensor | None:
        """A post-norm's gain for the residual to apply itself (None when fused or absent)."""
        if self.fuse_post_norms or norm is None:
            return None
        return norm.to(device=self.device, dtype=self.dtype)
