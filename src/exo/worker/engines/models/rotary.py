"""The rotary tables of a model's layers, sized by the context actually served.

    table[p, i] = exp(j p w_i)      w_i: the layer kind's frequencies (`rope.rope_frequencies`)

A model's files declare its trained context (`context_length`: up to ~1M for real models, and
whatever a hostile file says); a runner serves at most `runner_max_seq(context_length)`
positions per request (`EXO_MAX_CONTEXT_TOKENS`, as placement assumed when it sized the
node's memory). YaRN scales the rotation's magnitude too (`RopeScaling.attention_factor`: the
table is that times exp(j p w)); `head_dim` names the rotated dimensions when they are not a
whole head (MLA's rope part). Partial rotary (`config.rotary_dim` < head_dim, GLM): the first
rotary_dim / 2 pairs of a head turn at rotary_dim's frequencies, the rest at frequency 0, so one
rotation of the whole head (and the compiled decode attention) leaves them as they are. The tables start at that size and grow only when a cache asks for more
positions (`ensure`), so a file's claim alone never allocates anything.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from exo.shared.models.memory import runner_max_seq
from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.rope import rope_frequencies, rope_table


class RotaryTables:
    """exp(j p w) tables [P, hd/2] of global (False) and sliding (True) layers: one table
    unless sliding layers have a rotary base of their own (Gemma 3)."""

    def __init__(
        self,
        config: LlamaConfig,
        device: torch.device,
        freq_factors: Tensor | None = None,
        head_dim: int | None = None,
    ) -> None:
        hd = config.head_dim if head_dim is None else head_dim
        rot = hd if config.rotary_dim is None else config.rotary_dim
        global_freqs = rope_frequencies(rot, config.rope_theta, config.rope_scaling, freq_factors)
        local_freqs = global_freqs
        if config.rope_theta_local is not None:
            local_freqs = rope_frequencies(rot, config.rope_theta_local)
        if rot < hd:  # partial rotary: the last pairs turn at frequency 0 (are kept as they are)
            pad, same = (0, (hd - rot) // 2), local_freqs is global_freqs
            global_freqs = F.pad(global_freqs, pad)
            local_freqs = global_freqs if same else F.pad(local_freqs, pad)
        self._freqs = {False: global_freqs, True: local_freqs}
        scaling = config.rope_scaling
        self._magnitude = 1.0 if scaling is None else scaling.attention_factor
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
