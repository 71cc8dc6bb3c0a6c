"""Typed channels: in-process (anyio memory streams) and across processes (pipes).

Both are created as ``sender, receiver = channel[T]()`` / ``mp_channel[T]()``. A reader
sees the end of a stream (``anyio.EndOfStream``, or the end of ``async for``) once every
sender is closed; a sender whose reader is gone raises ``anyio.ClosedResourceError``.
A pipe's ``send_many`` writes several items as one message (one write, one wake-up of the
reader: a runner's step sends a token event per stream); the reader still gets them one by
one, in order.
"""

import math
import multiprocessing as mp
import select
import threading
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Generic, TypeVar, cast

import anyio
from anyio import ClosedResourceError, EndOfStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

T = TypeVar("T")


class Sender(Generic[T]):
    def __init__(self, stream: MemoryObjectSendStream[T]) -> None:
        self._stream = stream

    async def send(self, item: T) -> None:
        # Room in the buffer (or a waiting reader): handed over at once. anyio's own send
        # first yields to the event loop, a loop turn per item on a hop a streamed token
        # takes; only a full buffer waits here.
        try:
            self.send_nowait(item)
        except anyio.WouldBlock:
            try:
                await self._stream.send(item)
            except anyio.BrokenResourceError as e:
                raise ClosedResourceError from e

    def send_nowait(self, item: T) -> None:
        try:
            self._stream.send_nowait(item)
        except anyio.BrokenResourceError as e:
            raise ClosedResourceError from e

    def clone(self) -> "Sender[T]":
        return Sender(self._stream.clone())

    def close(self) -> None:
        self._stream.close()

    async def aclose(self) -> None:
        await self._stream.aclose()


class Receiver(Generic[T]):
    def __init__(self, stream: MemoryObjectReceiveStream[T]) -> None:
        self._stream = stream

    async def receive(self) -> T:
        # An item already waiting is taken without first yielding to the event loop (as
        # anyio's receive does); only an empty stream waits.
        try:
            return self._stream.receive_nowait()
        except anyio.WouldBlock:
            return await self._stream.receive()

    def receive_nowait(self) -> T:
        return self._stream.receive_nowait()

    def clone(self) -> "Receiver[T]":
        return Receiver(self._stream.clone())

    def close(self) -> None:
        self._stream.close()

    async def aclose(self) -> None:
        await self._stream.aclose()

    def __aiter__(self) -> AsyncIterator[T]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[T]:
        while True:
            try:
                yield await self.receive()
            except EndOfStream:
                return


class channel(Generic[T]):
    """``channel[T](max_buffer_size)`` returns a connected ``(Sender[T], Receiver[T])``."""

    def __new__(cls, max_buffer_size: float = math.inf) -> tuple[Sender[T], Receiver[T]]:  # type: ignore[misc]
        send, receive = anyio.create_memory_object_stream[T](max_buffer_size)
        return Sender(send), Receiver(receive)


@dataclass
class MpSender(Generic[T]):
    """The writing end of a pipe to another process. Picklable (for spawn)."""

    _conn: Connection
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, item: T) -> None:
        with self._lock:
            if self._conn.closed:
                raise ClosedResourceError
            try:
                self._conn.send(item)
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError) as e:
                raise ClosedResourceError from e

    def send_many(self, items: Sequence[T]) -> None:
        """Send ``items`` in order as one message (nothing for none)."""
        if len(items) == 1:
            self.send(items[0])
        elif items:
            self.send(cast(T, _Many(list(items))))

    async def send_async(self, item: T) -> None:
        await anyio.to_thread.run_sync(self.send, item)

    def close(self) -> None:
        """Close this copy. The reader sees the end once every copy is closed (in every
        process), so a parent may close the copy it handed to a child: the stream then
        ends when the child closes its copy or dies."""
        with self._lock:
            self._conn.close()

    def __getstate__(self) -> dict[str, object]:
        return {"_conn": self._conn}

    def __setstate__(self, state: dict[str, object]) -> None:
        self._conn = cast(Connection, state["_conn"])
        self._lock = threading.Lock()


@dataclass(frozen=True)
class _Many:
    """Items ``send_many`` wrote as one message."""

    items: list[Any]


@dataclass
class MpReceiver(Generic[T]):
    """The reading end of a pipe from another process. Picklable (for spawn)."""

    _conn: Connection
    _held: deque[T] = field(default_factory=deque[T])  # the rest of a send_many's message
    # The pipe's readiness, asked of one poll object kept for the purpose: Connection.poll
    # builds, fills and closes a selector on every call (tens of microseconds, twice a message
    # on a runner's event pipe: a streamed token's largest cost in the node besides its write).
    _poller: "select.poll | None" = field(default=None, repr=False, compare=False)

    def receive(self) -> T:
        """Block until an item arrives; ``EndOfStream`` once the sender closed or died."""
        if self._held:
            return self._held.popleft()
        if self._conn.closed:
            raise ClosedResourceError
        try:
            item = self._conn.recv()
        except (EOFError, ConnectionResetError, OSError) as e:
            raise EndOfStream from e
        if isinstance(item, _Many):
            self._held.extend(cast(list[T], item.items[1:]))
            return cast(T, item.items[0])
        return cast(T, item)

    def poll(self, timeout: float = 0.0) -> bool:
        """True when an item (or the end of the stream) can be received without blocking."""
        if self._held:
            return True
        if self._conn.closed:
            return False
        if self._poller is None:
            self._poller = select.poll()
            self._poller.register(self._conn.fileno(), select.POLLIN)
        # an end of stream (POLLHUP) or a broken descriptor reads as ready: receive says which
        return bool(self._poller.poll(max(0, math.ceil(timeout * 1000))))

    async def receive_async(self) -> T:
        if self._conn.closed and not self._held:
            raise ClosedResourceError
        while not self.poll():
            await anyio.wait_readable(self._conn.fileno())
        return self.receive()

    def close(self) -> None:
        self._held.clear()
        self._poller = None
        self._conn.close()

    def __getstate__(self) -> dict[str, object]:
        return {"_conn": self._conn}

    def __setstate__(self, state: dict[str, object]) -> None:
        self._conn = cast(Connection, state["_conn"])
        self._held = deque()
        self._poller = None

    def __aiter__(self) -> AsyncIterator[T]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[T]:
        while True:
            try:
                yield await self.receive_async()
            except (EndOfStream, ClosedResourceError):
                return


class mp_channel(Generic[T]):
    """``mp_channel[T]()`` returns a connected ``(MpSender[T], MpReceiver[T])`` pipe."""

    def __new__(cls) -> tuple[MpSender[T], MpReceiver[T]]:  # type: ignore[misc]
        reader, writer = mp.Pipe(duplex=False)
        return MpSender(writer), MpReceiver(reader)


def mp_wait(
    receivers: "list[MpReceiver[Any]]", timeout: float | None, fds: Sequence[int] = ()
) -> list[int]:
    """Block until any of the receivers has something (or its end) to read; the indexes
    of those that do. ``timeout`` 0 polls; None waits for ever. ``fds``: file descriptors
    that also wake the wait (ready, not reported) -- a thread's "done" pipe."""
    from multiprocessing.connection import wait

    held = [i for i, r in enumerate(receivers) if r._held]
    if held:  # items of a message already read: ready now
        return held
    open_conns = {id(r._conn): i for i, r in enumerate(receivers) if not r._conn.closed}
    if not open_conns:
        return []
    ready = wait([*(r._conn for r in receivers if not r._conn.closed), *fds], timeout)
    return sorted(open_conns[id(c)] for c in ready if not isinstance(c, int))
