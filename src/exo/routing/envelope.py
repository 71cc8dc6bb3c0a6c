"""The authenticated envelope around every payload, and replay protection.

Wire format (all integers big-endian)::

    magic "EXO" + protocol version digit | sender length (1 byte) | sender (utf-8)
    | session (8 bytes) | counter (8 bytes) | HMAC-SHA256 (32 bytes) | payload

The MAC covers the key expression the message was sent on (its "context"), the sender,
the session, the counter and the payload, so a message cannot be moved to another key,
sender, session or counter. The session is drawn at random when the sender's process
starts; the counter grows strictly within it (it starts from the wall clock in
nanoseconds). A receiver admits a counter only if it is above the last one it admitted
from that sender's session on that context (``ReplayGuard``); with a ``ReplayBook`` it
also remembers, across its own restarts, each sender's current session with the highest
counter admitted from it and the sessions that sender has left behind (``replay_book``).
Anyone holding the secret may claim any sender id: the envelope proves membership of the
cluster, not identity inside it.
"""

import hashlib
import hmac
import secrets
import struct
import time
from dataclasses import dataclass, field
from enum import StrEnum

from exo.routing.replay_book import ReplayBook

PROTOCOL_VERSION = 3
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
    session: int
    counter: int
    payload: bytes


def seal(
    mac_key: bytes, context: str, sender: str, session: int, counter: int, payload: bytes
) -> bytes:
    sender_bytes = sender.encode()
    if len(sender_bytes) > 255:
        raise ValueError("sender id longer than 255 bytes")
    stamp = _COUNTER.pack(session) + _COUNTER.pack(counter)
    mac = _mac(mac_key, context, sender_bytes, stamp, payload)
    return b"".join((_MAGIC, bytes((len(sender_bytes),)), sender_bytes, stamp, mac, payload))


def open_envelope(mac_key: bytes, context: str, data: bytes) -> Opened | Rejection:
    """Check the MAC; the caller still has to check the counter (see ReplayGuard)."""
    if data.startswith(_FAMILY) and len(data) > len(_FAMILY) and not data.startswith(_MAGIC):
        return Rejection.VERSION
    if len(data) < len(_MAGIC) + 1 or not data.startswith(_MAGIC):
        return Rejection.MALFORMED
    sender_end = len(_MAGIC) + 1 + data[len(_MAGIC)]
    stamp_end = sender_end + 2 * _COUNTER.size
    mac_end = stamp_end + _MAC_LEN
    if len(data) < mac_end:
        return Rejection.MALFORMED
    sender_bytes = data[len(_MAGIC) + 1 : sender_end]
    stamp = data[sender_end:stamp_end]
    payload = data[mac_end:]
    expected = _mac(mac_key, context, sender_bytes, stamp, payload)
    if not hmac.compare_digest(expected, data[stamp_end:mac_end]):
        return Rejection.BAD_MAC
    try:
        sender = sender_bytes.decode()
    except UnicodeDecodeError:
        return Rejection.MALFORMED
    session, counter = _COUNTER.unpack(stamp[:8])[0], _COUNTER.unpack(stamp[8:])[0]
    return Opened(sender=sender, session=session, counter=counter, payload=payload)


def claimed_header(data: bytes) -> tuple[str | None, str | None]:
    """What an envelope claims, unauthenticated, for logs: (protocol version, sender)."""
    if not data.startswith(_FAMILY) or len(data) <= len(_MAGIC):
        return None, None
    version = data[len(_FAMILY) : len(_MAGIC)].decode(errors="replace")
    sender_end = len(_MAGIC) + 1 + data[len(_MAGIC)]
    sender = data[len(_MAGIC) + 1 : sender_end].decode(errors="replace") or None
    return version, sender


def _mac(mac_key: bytes, context: str, sender: bytes, stamp: bytes, payload: bytes) -> bytes:
    h = hmac.new(mac_key, b"exo/envelope/v2", hashlib.sha256)
    context_bytes = context.encode()
    for part in (context_bytes, sender, stamp):
        h.update(struct.pack(">I", len(part)))
        h.update(part)
    h.update(payload)
    return h.digest()


@dataclass
class ReplayGuard:
    """Admits each (sender, session, context) counter only if it is above the last one
    admitted. With a shared ``book`` (one per node, kept in its data directory) it also
    refuses, after this node restarts, what it admitted before (a counter at or below
    the highest one recorded for that sender's session) and every session the sender has
    left behind."""

    book: ReplayBook = field(default_factory=ReplayBook)
    _last: dict[tuple[str, int, str], int] = field(
        default_factory=dict[tuple[str, int, str], int]
    )

    def admit(self, sender: str, context: str, counter: int, session: int = 0) -> bool:
        if not self.book.admit(sender, session, counter):
            return False
        key = (sender, session, context)
        if counter <= self._last.get(key, -1):
            return False
        self._last[key] = counter
        self.book.record(sender, session, counter)
        return True


@dataclass
class CounterSource:
    """Strictly increasing counters, starting from the wall clock in nanoseconds, in a
    session drawn at random when it is made (one per process start of a node)."""

    session: int = field(default_factory=lambda: secrets.randbits(64))
    _last: int = 0

    def next(self) -> int:
        self._last = max(time.time_ns(), self._last + 1)
        return self._last
