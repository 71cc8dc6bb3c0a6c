"""Mixture-of-experts routers: which k of E experts each token uses, and with what weights.

    logits = x Wr^T (+ br)                                   [N, E], float32
    softmax          (Qwen3-MoE, Mixtral)  p = softmax(logits); chosen = top_k(p); w = p[chosen]
                                           (norm_topk_prob: w = w / sum(w))
                     group-limited (DeepSeek V2): a group scores its best p; only the
                     topk_group best groups may be chosen from
    softmax_selected (gpt-oss)             chosen = top_k(logits); w = softmax(logits[chosen])
    sigmoid          (DeepSeek V3, GLM-4.5) s = sigmoid(logits); c = s + b_corr (choice only)
                     group-limited: the E experts form n_group groups; a group scores the sum of
                     its two best c; only the topk_group best groups may be chosen from
                     chosen = top_k(c); w = s[chosen]  (norm_topk_prob: w = w / (sum(w) + 1e-20))
    every kind:      w = w * routed_scaling_factor

Choices are made per token and ties go to the lower expert index (a stable sort, not
`torch.topk`, whose order among equal values is unspecified), so a token's experts and weights
never depend on the other tokens of its batch.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from exo.worker.engines.config import RouterKind as RouterKind


@dataclass(frozen=True)
class RouterSpec:
    """How a family routes (see the module docstring)."""

    kind: RouterKind
    n_experts: int  # E
    top_k: int  # k experts per token
    normalize: bool = False  # norm_topk_prob: the chosen weights sum to one (softmax, sigmoid)
    n_group: int = 1  # expert groups (DeepSeek V2 / V3: 8)
    topk_group: int = 1  # groups a token may choose from (DeepSeek V2: 3, V3: 4)
    scaling: float = 1.0  # routed_scaling_factor

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must be in 1..{self.n_experts} experts")
        if self.n_group < 1 or self.n_experts % self.n_group:
            raise ValueError(f"{self.n_experts} experts do not form {self.n_group} groups")
        per_group = self.n_experts // self.n_group
        if self.n_group > 1 and (
            not 1 <= self.topk_group <= self.n_group or self.topk_group * per_group < self.top_k
        ):
            raise ValueError(
                f"topk_group ({self.topk_group}) of {self.n_group} groups of {per_group} cannot "
                f"hold top_k ({self.top_k}) experts"
            )


def top_k_stable(values: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest of each row, largest first, ties to the lower index: (values, indices)."""
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices[..., :k]
    return values.gather(-1, order), order


def _group_mask(choice: Tensor, spec: RouterSpec, best: int) -> Tensor:
    """choice [N, E] with the experts of the groups a token may not use set to -inf (a group
    scores the sum of its `best` highest choices)."""
    n, per_group = choice.shape[0], spec.n_experts // spec.n_group
    grouped = choice.view(n, spec.n_group, per_group)
    scores = top_k_stable(grouped, min(best, per_group))[0].sum(-1)  # [N, G]
    _, groups = top_k_stable(scores, spec.topk_group)  # [N, topk_group]
    allowed = torch.zeros(n, spec.n_group, dtype=torch.bool, device=choice.device)
    allowed.scatter_(1, groups, True)
    allowed = allowed.unsqueeze(-1).expand(n, spec.n_group, per_group).reshape(n, -1)
    return choice.masked_fill(~allowed, float("-inf"))


def route(
    logits: Tensor, spec: RouterSpec, correction_bias: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """logits [N, E] -> (weights [N, k] float32, experts [N, k] int64), best choice first."""
    logits = logits.float()
    if logits.shape[-1] != spec.n_experts:
        raise ValueError(f"router logits have {logits.shape[-1]} experts, not {spec.n_experts}")
    if spec.kind == "softmax":
        probs = torch.softmax(logits, dim=-1)
        choice = _group_mask(probs, spec, best=1) if spec.n_group > 1 else probs
        _, experts = top_k_stable(choice, spec.top_k)
        weights = probs.gather(-1, experts)
        if spec.normalize:
            weights = weights / weights.sum(-1, keepdim=True)
    elif spec.kind == "softmax_selected":
        chosen, experts = top_k_stable(logits, spec.top_k)
        weights = torch.softmax(chosen, dim=-1)
    else:
        # row by row: torch's vectorised sigmoid rounds a row differently with other rows beside it
        scores = torch.stack([torch.sigmoid(row) for row in logits]) if len(logits) else logits
        choice = scores if correction_bias is None else scores + correction_bias.float()
        if spec.n_group > 1:
            choice = _group_mask(choice, spec, best=2)
        _, experts = top_k_stable(choice, spec.top_k)
        weights = scores.gather(-1, experts)
        if spec.normalize:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    if spec.scaling != 1.0:
        weights = weights * spec.scaling
    return weights, experts
