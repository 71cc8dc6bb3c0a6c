"""A guard against connections that never finish their request head (slowloris,
half-open sockets): uvicorn has no header timeout, so a client could hold thousands of
connections open for ever with a few bytes each.

Each connection must deliver a complete request head within ``head_timeout_s`` of its
first byte (or of being accepted); past it, it gets ``408`` and is closed. At most
``max_pending`` connections may be sending a head at once; one more is closed at once.
Connections with a request in progress (a long stream, a slow body) are not affected.
"""

import asyncio
import os
from dataclasses import dataclass
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

HEAD_TIMEOUT_S = float(os.getenv("EXO_API_HEAD_TIMEOUT_S", "10"))
MAX_PENDING_HEADS = int(os.getenv("EXO_API_MAX_PENDING_HEADS", "256"))
_TIMEOUT_BODY = b'{"error": {"message": "request head not received in time", "code": 408}}'
_TIMEOUT_REPLY = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


@dataclass
class HeadGuard:
    """Shared by the connections of one server: the limits and what is pending now."""

    head_timeout_s: float = HEAD_TIMEOUT_S
    max_pending: int = MAX_PENDING_HEADS
    pending: int = 0
    timed_out: int = 0
    refused: int = 0


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for every request head."""

    guard: HeadGuard = HeadGuard()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_scope: object = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def data_received(self, data: bytes) -> None:
        cycle = cast(RequestResponseCycle | None, self.cycle)  # None before a first request
        idle = cycle is None or cycle.response_complete
        if self._head_timer is None and idle:
            self._await_head()  # a new request head starts with these bytes
        super().data_received(data)
        if self._head_timer is not None and self.scope is not self._head_scope:
            self._head_done()  # uvicorn parsed a new request head

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_done()
        super().connection_lost(exc)

    def _await_head(self) -> None:
        if self.transport.is_closing():
            return
        if self.guard.pending >= self.guard.max_pending:
            self.guard.refused += 1
            self.transport.close()
            return
        self.guard.pending += 1
        self._head_scope = self.scope
        self._head_timer = self.loop.call_later(self.guard.head_timeout_s, self._head_expired)

    def _head_done(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
            self.guard.pending -= 1

    def _head_expired(self) -> None:
        self._head_timer = None
        self.guard.pending -= 1
        self.guard.timed_out += 1
        if not self.transport.is_closing():
            self.transport.write(_TIMEOUT_REPLY)
            self.transport.close()


def guarded_protocol(guard: HeadGuard | None = None) -> type[GuardedH11Protocol]:
    """A protocol class whose connections share ``guard`` (one per server)."""
    return type("ServerH11Protocol", (GuardedH11Protocol,), {"guard": guard or HeadGuard()})


def server_config(app: Any, guard: HeadGuard | None = None, **kwargs: Any) -> uvicorn.Config:
    """The API server's uvicorn config, with the head guard."""
    return uvicorn.Config(app, http=guarded_protocol(guard), **kwargs)
