"""A per-sender budget for a stream of items (a token bucket), with the drops counted and
reported at most once per period. Pure: time is passed in."""

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class FloodGate:
    rate_per_s: float
    """Items a sender may send per second, sustained."""
    burst: float
    """Items a sender may send at once (and the most it can save up)."""
    log_period_s: float = 1.0
    dropped: Counter[str] = field(default_factory=Counter[str])
    """Items refused, per sender, since the gate was made."""
    _tokens: dict[str, float] = field(default_factory=dict[str, float])
    _seen: dict[str, float] = field(default_factory=dict[str, float])
    _unreported: Counter[str] = field(default_factory=Counter[str])
    _reported: dict[str, float] = field(default_factory=dict[str, float])

    def admit(self, sender: str, n: int, now: float) -> bool:
        """Whether ``sender`` may send ``n`` items now (all or none); counts a refusal."""
        last = self._seen.get(sender, now)
        tokens = min(self.burst, self._tokens.get(sender, self.burst)
                     + (now - last) * self.rate_per_s)
        self._seen[sender] = now
        if n <= tokens:
            self._tokens[sender] = tokens - n
            return True
        self._tokens[sender] = tokens
        self.dropped[sender] += n
        self._unreported[sender] += n
        return False

    def report(self, sender: str, now: float) -> int | None:
        """The items refused from ``sender`` since the last report, when one is due now
        (at most one per period); None: stay quiet."""
        last = self._reported.get(sender)
        if not self._unreported[sender] or (
            last is not None and now - last < self.log_period_s
        ):
            return None
        self._reported[sender] = now
        return self._unreported.pop(sender)
