"""The rotary tables of a model's layers, sized by the context actually served.

    table[p, i] = exp(j p w_i)      w_i: the layer kind's frequencies (`rope.rope_frequencies`)

A model's files declare its trained context (`context_length`: up to ~1M for real models, and
whatever a hostile file says); a runner serves at most `runner_max_seq(context_length)`
positions per request (`EXO_MAX_CONTEXT_TOKENS`, as placement assumed when it sized the
node's memory). The tables start at that size and grow only when a cache asks for more
positions (`ensure`), so a file's claim alone never allocates anything.

`head_dim` names the rotated dimensions when they are not a whole head (MLA's rope part), and
`magnitude` scales the table (YaRN's attention factor on the rotated dims only: MLA, whose
other dims it must not scale). Partial rotary (`config.rotary_dim` < head_dim, GLM): the first
rotary_dim / 2 pairs of a head turn at rotary_dim's frequencies, the rest at frequency 0, so one
rotation of the whole head (and the compiled decode attention) leaves them as they are.
"""

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from exo.shared.models.memory import runner_max_seq
from exo.worker.engines.config import LlamaConfig, RopeScaling
from exo.worker.engines.rope import rope_frequencies, rope_table


def yarn_frequencies(head_dim: int, theta: float, s: RopeScaling) -> Tensor:
    """YaRN: w_i kept for pairs that turn more than `beta_fast` times over the original
    context, divided by `factor` for those turning fewer than `beta_slow` times, a linear ramp
    (over the pair index) between. [head_dim / 2], float64.

        d(r) = head_dim ln(original / (2 pi r)) / (2 ln theta)     the pair turning r times
        ramp_i = clamp((i - d(beta_fast)) / (d(beta_slow) - d(beta_fast)), 0, 1)
        w_i' = w_i / factor * ramp_i + w_i * (1 - ramp_i)
    """
    w = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)

    def dim_of(rotations: float) -> float:
        turns = s.original_context_length / (rotations * 2 * math.pi)
        return head_dim * math.log(turns) / (2 * math.log(theta))

    low, high = dim_of(s.beta_fast), dim_of(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0.0), min(high, head_dim - 1.0)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return w / s.factor * ramp + w * (1 - ramp)


def yarn_attention_factor(s: RopeScaling) -> float:
    """YaRN's scale of q and k (so of the attention logits, squared): 0.1 ln(factor) + 1."""
    if s.attention_factor is not None:
        return s.attention_factor
    return 1.0 if s.factor <= 1 else 0.1 * math.log(s.factor) + 1.0


def _frequencies(hd: int, config: LlamaConfig, freq_factors: Tensor | None) -> Tensor:
    s = config.rope_scaling
    if s is not None and s.kind == "yarn":
        return yarn_frequencies(hd, config.rope_theta, s)
    return rope_frequencies(hd, config.rope_theta, s, freq_factors)


class RotaryTables:
    """exp(j p w) tables [P, hd/2] of global (False) and sliding (True) layers: one table
    unless sliding layers have a rotary base of their own (Gemma 3)."""

    def __init__(
        self,
        config: LlamaConfig,
        device: torch.device,
        freq_factors: Tensor | None = None,
        head_dim: int | None = None,
        magnitude: float = 1.0,
    ) -> None:
        hd = config.head_dim if head_dim is None else head_dim
        rot = hd if config.rotary_dim is None else config.rotary_dim
        global_freqs = _frequencies(rot, config, freq_factors)
        local_freqs = global_freqs
        if config.rope_theta_local is not None:
            local_freqs = rope_frequencies(rot, config.rope_theta_local)
        if rot < hd:  # partial rotary: the last pairs turn at frequency 0 (are kept as they are)
            pad, same = (0, (hd - rot) // 2), local_freqs is global_freqs
            global_freqs = F.pad(global_freqs, pad)
            local_freqs = global_freqs if same else F.pad(local_freqs, pad)
        self._freqs = {False: global_freqs, True: local_freqs}
        self._magnitude = magnitude
        self.device = device
        self._tables: dict[bool, Tensor] = {}
        self._build(runner_max_seq(config.context_length))

    @property
    def positions(self) -> int:
        return self._tables[False].shape[0]

    def table(self, sliding: bool) -> Tensor:
        return self._tables[sliding]

    def ensure(self, n_positions: int) -> None:
        """Tables of at least `n_positions` positions (beyond the served context on demand)."""
        if n_positions > self.positions:
            self._build(n_positions)

    def _build(self, n_positions: int) -> None:
        table = rope_table(n_positions, self._freqs[False], self.device)
        if self._magnitude != 1.0:
            table = table * self._magnitude
        local = self._freqs[True]
        same = local is self._freqs[False]
        self._tables = {
            False: table,
            True: table if same else rope_table(n_positions, local, self.device),
        }
