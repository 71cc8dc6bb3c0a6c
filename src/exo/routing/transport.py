"""What the parts of a router share: the zenoh session, the cluster keys, the counters,
the statistics, and the bridge from zenoh's threads into the event loop.

Threading rule: zenoh callbacks only copy bytes and ``post`` a function to the event loop.
Everything else (authentication, decoding, statistics, stream writes) runs on the loop
thread, so nothing here needs a lock. Outgoing messages are sealed on the loop, in counter
order, and handed to zenoh by the Outbox thread in that same order.
"""

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import TypeVar

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from loguru import logger

from exo.routing._zenoh import IncomingQuery, ZenohSession
from exo.routing.envelope import (
    PROTOCOL_VERSION,
    CounterSource,
    Opened,
    Rejection,
    ReplayGuard,
    claimed_header,
    open_envelope,
    seal,
)
from exo.routing.keys import ClusterKeys
from exo.routing.outbox import Outbox
from exo.routing.replay_book import ReplayBook
from exo.utils.metrics import CLUSTER_MESSAGES_REJECTED

T = TypeVar("T")


@dataclass
class RouterStats:
    sent: int = 0
    """Messages, requests and replies handed to zenoh."""
    delivered: int = 0
    """Items handed to readers: messages, replies, presence events."""
    rejected: int = 0
    """Messages that failed authentication (bad MAC, replayed, malformed, undecodable)."""
    dropped: int = 0
    """Authentic messages dropped because a reader's buffer was full."""
    rejections: Counter[str] = field(default_factory=Counter[str])


class LoopBridge:
    """Runs functions posted from any thread on the event loop that created the bridge."""

    def __init__(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError as e:
            raise RuntimeError("the router needs anyio's asyncio backend") from e
        self._closed = False

    def post(self, fn: Callable[[], None]) -> None:
        if self._closed:
            return
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:
            logger.debug("event loop closed: a late zenoh callback is dropped")

    def close(self) -> None:
        """Ignore whatever zenoh still delivers: the router is gone."""
        self._closed = True


@dataclass
class RateLimitedLog:
    """At most one log line per key per period; counts what it held back."""

    period_s: float
    _last: dict[str, float] = field(default_factory=dict[str, float])
    _held: Counter[str] = field(default_factory=Counter[str])

    def admit(self, key: str, now: float) -> int | None:
        """None: stay quiet; else log now, with how many were held back since the last."""
        last = self._last.get(key)
        if last is not None and now - last < self.period_s:
            self._held[key] += 1
            return None
        if len(self._last) > 10_000:  # garbage with ever new sender names: forget old ones
            self._last.clear()
            self._held.clear()
        self._last[key] = now
        return self._held.pop(key, 0)


class Transport:
    def __init__(
        self,
        node_id: str,
        keys: ClusterKeys,
        session: ZenohSession,
        bridge: LoopBridge,
        outbox: Outbox,
        stats: RouterStats,
        replay_book: ReplayBook | None = None,
    ) -> None:
        """``replay_book``: what the replay guards remember across restarts (shared)."""
        self.node_id = node_id
        self.keys = keys
        self.session = session
        self.bridge = bridge
        self.stats = stats
        self._outbox = outbox
        self._counter = CounterSource()
        self.replay_book = replay_book or ReplayBook()
        self._reject_log = RateLimitedLog(period_s=60.0)

    async def put(self, key: str, payload: bytes) -> None:
        async with self._outbox.order:
            data = seal(self.keys.mac_key, key, self.node_id, self._counter.session,
                        self._counter.next(), payload)
            await self._outbox.push(partial(self.session.put, key, data))
        self.stats.sent += 1

    async def query(
        self,
        key: str,
        payload: bytes,
        *,
        timeout_s: float,
        on_reply: Callable[[bytes], None],
        on_done: Callable[[], None],
    ) -> int:
        """Send a request; returns its counter (replies are bound to it, see reply_context)."""

        def ask() -> None:
            try:
                self.session.query(
                    key, data, timeout_s=timeout_s, on_reply=on_reply, on_done=on_done
                )
            except Exception:
                on_done()
                raise

        async with self._outbox.order:
            counter = self._counter.next()
            data = seal(self.keys.mac_key, key, self.node_id, self._counter.session, counter,
                        payload)
            await self._outbox.push(ask)
        self.stats.sent += 1
        return counter

    async def reply(
        self, query: IncomingQuery, request: Opened, reply_key: str, body: bytes
    ) -> None:
        """Reply to ``query``, then finish it (in that order, on the outbox thread)."""

        def answer() -> None:
            try:
                query.reply(reply_key, data)
            finally:
                query.finish()

        context = reply_context(query.key, request.sender, request.session, request.counter)
        async with self._outbox.order:
            data = seal(self.keys.mac_key, context, self.node_id, self._counter.session,
                        self._counter.next(), body)
            await self._outbox.push(answer)
        self.stats.sent += 1

    @property
    def envelope_session(self) -> int:
        """This process's session (in every envelope it seals)."""
        return self._counter.session

    def guard(self) -> ReplayGuard:
        """A replay guard for one stream of envelopes, sharing this node's book."""
        return ReplayGuard(self.replay_book)

    def open(self, context: str, data: bytes, guard: ReplayGuard | None) -> Opened | None:
        """Authenticate a received envelope (and check its counter, given a guard)."""
        result = open_envelope(self.keys.mac_key, context, data)
        if isinstance(result, Rejection):
            version, sender = claimed_header(data)
            self.reject(result, context, sender, version)
            return None
        if guard is not None and not guard.admit(
            result.sender, context, result.counter, result.session
        ):
            self.reject(Rejection.REPLAY, context, result.sender)
            return None
        return result

    def reject(
        self, reason: Rejection, context: str, sender: str | None = None,
        version: str | None = None,
    ) -> None:
        """Count a refused message; log it at most once per peer per minute."""
        self.stats.rejected += 1
        self.stats.rejections[reason] += 1
        CLUSTER_MESSAGES_REJECTED.labels(reason=str(reason)).inc()
        peer = sender or "an unknown sender"
        suppressed = self._reject_log.admit(peer, time.monotonic())
        if suppressed is None:
            return
        more = f" ({suppressed} more refused from it in the last minute)" if suppressed else ""
        if reason == Rejection.VERSION:
            logger.warning(
                f"cluster: node {peer} speaks cluster protocol v{version}, this node "
                f"v{PROTOCOL_VERSION}: its messages are refused; run the same exo version "
                f"on every node{more}"
            )
        else:
            logger.warning(f"rejected a message from {peer} on {context}: {reason}{more}")

    @cached_property
    def _drop_log(self) -> RateLimitedLog:
        return RateLimitedLog(period_s=1.0)

    def offer(self, stream: MemoryObjectSendStream[T], item: T, what: str) -> None:
        """Hand an authentic item to a reader without waiting; a full buffer drops it
        (counted; logged at most once a second per reader, with the count held back)."""
        try:
            stream.send_nowait(item)
        except anyio.WouldBlock:
            self.stats.dropped += 1
            held = self._drop_log.admit(what, time.monotonic())
            if held is not None:
                more = f" ({held} more dropped since the last report)" if held else ""
                logger.warning(f"{what}: reader too slow, buffer full, message dropped{more}")
            return
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return  # the reader closed its end: nobody wants this any more
        self.stats.delivered += 1


def reply_context(request_key: str, requester: str, session: int, counter: int) -> str:
    """What a reply's MAC covers: it answers this very request and no other."""
    return f"{request_key}#reply/{requester}/{session}/{counter}"
