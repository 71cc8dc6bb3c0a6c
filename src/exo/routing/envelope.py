"""The authenticated envelope around every payload, and replay protection.

Wire format (all integers big-endian)::

    magic "EXO" + protocol version digit | sender length (1 byte) | sender (utf-8) | counter (8 bytes)
    | HMAC-SHA256 (32 bytes) | payload

The MAC covers the key expression the message was sent on (its "context"), the sender,
the counter and the payload, so a message cannot be moved to another key, sender or
counter. The counter grows strictly per sender: it starts from the wall clock in
nanoseconds, so it keeps growing across restarts of the sender (unless its clock steps
back). A receiver admits a counter only if it is above the last one it admitted from that
sender on that context. Anyone holding the secret may claim any sender id: the envelope
proves membership of the cluster, not identity inside it.
"""

import hashlib
import hmac
import struct
import time
from dataclasses import dataclass, field
from enum import StrEnum

PROTOCOL_VERSION = 2
"""The version of what nodes say to each other (envelope and messages). Nodes of
different versions refuse each other's messages, with a clear log line, instead of
misreading them. Bump it whenever a message changes in a way an older node misreads."""
_FAMILY = b"EXO"
_MAGIC = _FAMILY + str(PROTOCOL_VERSION).encode()
_MAC_LEN = 32
_COUNTER = struct.Struct(">Q")


class Rejection(StrEnum):
    MALFORMED = "malformed"
    BAD_MAC = "bad_mac"
    REPLAY = "replay"
    UNDECODABLE = "undecodable"
    VERSION = "version"


@dataclass(frozen=True)
class Opened:
    sender: str
    counter: int
    payload: bytes


def seal(mac_key: bytes, context: str, sender: str, counter: int, payload: bytes) -> bytes:
    sender_bytes = sender.encode()
    if len(sender_bytes) > 255:
        raise ValueError("sender id longer than 255 bytes")
    counter_bytes = _COUNTER.pack(counter)
    mac = _mac(mac_key, context, sender_bytes, counter_bytes, payload)
    return b"".join(
        (_MAGIC, bytes((len(sender_bytes),)), sender_bytes, counter_bytes, mac, payload)
    )


def open_envelope(mac_key: bytes, context: str, data: bytes) -> Opened | Rejection:
    """Check the MAC; the caller still has to check the counter (see ReplayGuard)."""
    if data.startswith(_FAMILY) and len(data) > len(_FAMILY) and not data.startswith(_MAGIC):
        return Rejection.VERSION
    if len(data) < len(_MAGIC) + 1 or not data.startswith(_MAGIC):
        return Rejection.MALFORMED
    sender_end = len(_MAGIC) + 1 + data[len(_MAGIC)]
    counter_end = sender_end + _COUNTER.size
    mac_end = counter_end + _MAC_LEN
    if len(data) < mac_end:
        return Rejection.MALFORMED
    sender_bytes = data[len(_MAGIC) + 1 : sender_end]
    counter_bytes = data[sender_end:counter_end]
    payload = data[mac_end:]
    expected = _mac(mac_key, context, sender_bytes, counter_bytes, payload)
    if not hmac.compare_digest(expected, data[counter_end:mac_end]):
        return Rejection.BAD_MAC
    try:
        sender = sender_bytes.decode()
    except UnicodeDecodeError:
        return Rejection.MALFORMED
    return Opened(sender=sender, counter=_COUNTER.unpack(counter_bytes)[0], payload=payload)


def claimed_header(data: bytes) -> tuple[str | None, str | None]:
    """What an envelope claims, unauthenticated, for logs: (protocol version, sender)."""
    if not data.startswith(_FAMILY) or len(data) <= len(_MAGIC):
        return None, None
    version = data[len(_FAMILY) : len(_MAGIC)].decode(errors="replace")
    sender_end = len(_MAGIC) + 1 + data[len(_MAGIC)]
    sender = data[len(_MAGIC) + 1 : sender_end].decode(errors="replace") or None
    return version, sender


def _mac(mac_key: bytes, context: str, sender: bytes, counter: bytes, payload: bytes) -> bytes:
    h = hmac.new(mac_key, b"exo/envelope/v1", hashlib.sha256)
    context_bytes = context.encode()
    for part in (context_bytes, sender, counter):
        h.update(struct.pack(">I", len(part)))
        h.update(part)
    h.update(payload)
    return h.digest()


@dataclass
class ReplayGuard:
    """Admits each (sender, context) counter only if it is above the last one admitted."""

    _last: dict[tuple[str, str], int] = field(default_factory=dict[tuple[str, str], int])

    def admit(self, sender: str, context: str, counter: int) -> bool:
        key = (sender, context)
        if counter <= self._last.get(key, -1):
            return False
        self._last[key] = counter
        return True


@dataclass
class CounterSource:
    """Strictly increasing counters, starting from the wall clock in nanoseconds."""

    _last: int = 0

    def next(self) -> int:
        self._last = max(time.time_ns(), self._last + 1)
        return self._last
