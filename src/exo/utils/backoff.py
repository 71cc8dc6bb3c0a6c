"""Exponential backoff per key, as plain data: the caller passes the time in."""

from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K")


@dataclass
class KeyedBackoff(Generic[K]):
    base_s: float = 1.0
    max_s: float = 30.0
    factor: float = 2.0
    _attempts: dict[K, int] = field(default_factory=dict[K, int])
    _next_at: dict[K, float] = field(default_factory=dict[K, float])

    def attempts(self, key: K) -> int:
        return self._attempts.get(key, 0)

    def should_proceed(self, key: K, now: float) -> bool:
        return now >= self._next_at.get(key, float("-inf"))

    def delay_after(self, attempts: int) -> float:
        """Seconds to wait after the given number of attempts (0 after none)."""
        if attempts <= 0:
            return 0.0
        try:
            delay = self.base_s * self.factor ** (attempts - 1)
        except OverflowError:  # a key retried for hours (~1000 attempts): long capped
            return self.max_s
        return min(delay, self.max_s)

    def next_at(self, key: K) -> float:
        return self._next_at.get(key, float("-inf"))

    def record_attempt(self, key: K, now: float) -> None:
        n = self._attempts.get(key, 0) + 1
        self._attempts[key] = n
        self._next_at[key] = now + self.delay_after(n)

    def reset(self, key: K) -> None:
        self._attempts.pop(key, None)
        self._next_at.pop(key, None)
