"""Byte quantities."""

from typing import Self

from exo.shared.types.common import FrozenModel

_MIB = 1024 * 1024


class Memory(FrozenModel):
    in_bytes: int

    @classmethod
    def from_bytes(cls, n: int) -> Self:
        return cls(in_bytes=n)

    @classmethod
    def from_mb(cls, mb: float) -> Self:
        return cls(in_bytes=int(mb * _MIB))

    @property
    def in_mb(self) -> float:
        return self.in_bytes / _MIB

    def __add__(self, other: "Memory") -> "Memory":
        return Memory(in_bytes=self.in_bytes + other.in_bytes)

    def __sub__(self, other: "Memory") -> "Memory":
        return Memory(in_bytes=self.in_bytes - other.in_bytes)

    def __lt__(self, other: "Memory") -> bool:
        return self.in_bytes < other.in_bytes

    def __le__(self, other: "Memory") -> bool:
        return self.in_bytes <= other.in_bytes
