"""One thread that hands outgoing messages to zenoh, in the order they were pushed.

A reliable zenoh put blocks while the transmit queue is full, and must not block the event
loop; a thread hop per message costs far more than the put itself. So the loop pushes jobs
into a bounded queue (waiting, in order, only while it is full) and this thread runs them.
"""

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.to_thread
from loguru import logger

Job = Callable[[], None]


@dataclass(frozen=True)
class _Stop:
    pass


class Outbox:
    def __init__(self, name: str, capacity: int) -> None:
        self._queue: queue.Queue[Job | _Stop] = queue.Queue(maxsize=capacity)
        self._order = anyio.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def order(self) -> anyio.Lock:
        """Hold this while choosing what to push, when the order must match (counters)."""
        return self._order

    async def push(self, job: Job) -> None:
        """Queue ``job``; call with ``order`` held, so that jobs run in push order."""
        await self._enqueue(job)

    async def close(self) -> None:
        """Run what is queued, then stop the thread."""
        async with self._order:
            await self._enqueue(_Stop())
        await anyio.to_thread.run_sync(self._thread.join)

    async def _enqueue(self, item: Job | _Stop) -> None:
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            await anyio.to_thread.run_sync(self._queue.put, item)

    def _run(self) -> None:
        while not isinstance(job := self._queue.get(), _Stop):
            try:
                job()
            except Exception:
                logger.exception("sending a message failed")
