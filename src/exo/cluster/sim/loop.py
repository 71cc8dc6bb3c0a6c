"""A virtual clock for asyncio: an event loop whose time only moves when every task
waits. When nothing is ready, the clock jumps to the next timer instead of sleeping, so a
simulated minute takes as long as the code it runs. With ``charge_cpu`` the CPU time the
code really spent is added to the clock as well (so that applying, snapshotting and
serialising cost simulated time, as they cost real time on a real node)."""

import asyncio
import selectors
import time
from typing import Any


class Deadlock(RuntimeError):
    """Nothing is ready and no timer is set: the simulation can never move again."""


class _VirtualSelector(selectors.BaseSelector):
    def __init__(self, real: selectors.BaseSelector, loop: "VirtualTimeLoop") -> None:
        self._real = real
        self._loop = loop

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self._loop.charge()
        ready = self._real.select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise Deadlock("no task is ready and no timer is set")
        self._loop.advance(timeout)
        return []

    def close(self) -> None:
        self._real.close()

    def get_map(self) -> Any:
        return self._real.get_map()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, charge_cpu: bool = False) -> None:
        real = selectors.DefaultSelector()
        self._now = 0.0
        self._charge_cpu = charge_cpu
        self._cpu_mark = time.process_time()
        super().__init__(_VirtualSelector(real, self))
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(seconds, 0.0)

    def charge(self) -> None:
        """Add the CPU time spent since the last call (only with ``charge_cpu``)."""
        if not self._charge_cpu:
            return
        mark = time.process_time()
        self._now += mark - self._cpu_mark
        self._cpu_mark = mark
