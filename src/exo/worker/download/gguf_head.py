"""GGUF metadata from the head of a file (bytes fetched with an HTTP Range request).

Layout (little endian): "GGUF", u32 version, u64 tensor count, u64 kv count, then kv
pairs (string key, u32 type, value). Only the kv pairs are read; arrays of strings and long
arrays are skipped (token lists make most of a header) but must be complete in the bytes given;
short arrays of numbers (a vision tower's per-layer flags) are read as lists.
"""

import struct
from typing import Any

_SCALARS: dict[int, tuple[str, int]] = {
    0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
    6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8),
}
_STRING, _ARRAY = 8, 9
_SHORT_ARRAY = 256  # numeric arrays up to this long are read


class TruncatedHead(Exception):
    """The bytes end before the metadata does: fetch more."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise TruncatedHead()
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, size: int) -> Any:
        return struct.unpack(fmt, self.take(size))[0]

    def string(self) -> str:
        return self.take(self.unpack("<Q", 8)).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(*_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.unpack("<I", 4), self.unpack("<Q", 8)
            if item_kind in _SCALARS and count <= _SHORT_ARRAY:
                return [self.unpack(*_SCALARS[item_kind]) for _ in range(count)]
            if item_kind in _SCALARS:
                self.take(_SCALARS[item_kind][1] * count)
            else:
                for _ in range(count):
                    self.value(item_kind)
            return None  # long and string arrays are not needed for a card
        raise ValueError(f"unknown GGUF value type {kind}")


def read_counts(r: _Reader) -> tuple[int, int, int]:
    """The version and the tensor and metadata counts that open a GGUF header (after its magic);
    raises TruncatedHead or ValueError (not a GGUF file, or a version before 2)."""
    if r.take(4) != b"GGUF":
        raise ValueError("not a GGUF file (bad magic)")
    version = r.unpack("<I", 4)
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported")
    return version, r.unpack("<Q", 8), r.unpack("<Q", 8)


def read_gguf_metadata(data: bytes) -> dict[str, Any]:
    """Scalar and string metadata; raises TruncatedHead or ValueError (not a GGUF)."""
    r = _Reader(data)
    _, _, kv_count = read_counts(r)
    meta: dict[str, Any] = {}
    for _ in range(kv_count):
        key = r.string()
        meta[key] = r.value(r.unpack("<I", 4))
    return meta
