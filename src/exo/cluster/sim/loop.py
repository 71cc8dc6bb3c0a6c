"""A virtual clock for asyncio: an event loop whose time only moves when every task
waits. When nothing is ready, the clock jumps to the next timer instead of sleeping, so a
simulated minute takes as long as the code it runs.

With ``charge_cpu`` the CPU time the code really spends costs simulated time, on the
simulated *machine* that spent it (``Machine``; each node is one): every callback that
runs for a machine (a task step of one of its tasks, a message arriving at it) adds the
CPU time it took to that machine's busy time, and a machine's next task step waits until
the machine is free again. So applying, snapshotting and serialising delay the node that
does them, as on a real node, while N nodes of a simulated cluster run side by side (as on
N machines) instead of queueing on one core. Code that runs for no machine (the
simulator's own harness) costs nothing."""

import asyncio
import contextvars
import gc
import selectors
import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any

RETRY_S = 1e-4
_RETRY = "_deliver_cancellation"


class Deadlock(RuntimeError):
    """Nothing is ready and no timer is set: the simulation can never move again."""


class Machine:
    """One simulated machine's CPU: busy until ``busy_until`` (virtual seconds)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.busy_until = 0.0
        self.cpu_s = 0.0
        """CPU seconds charged to it so far."""

    def context(self) -> contextvars.Context:
        """A copy of the current context in which code runs for this machine."""
        context = contextvars.copy_context()
        context.run(_MACHINE.set, self)
        return context


_MACHINE: contextvars.ContextVar[Machine | None] = contextvars.ContextVar(
    "exo_sim_machine", default=None
)


def run_on(machine: Machine) -> None:
    """From now on, the calling task (and every task it starts) runs on ``machine``."""
    _MACHINE.set(machine)


def current_machine() -> Machine | None:
    return _MACHINE.get()


@contextmanager
def not_charged() -> Generator[None]:
    """The CPU time spent inside is the simulator's own (e.g. scheduling a message's
    delivery to each of N nodes, which a real node hands to the network), not the
    machine's that runs the code around it."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, VirtualTimeLoop):
        yield
        return
    started, before = time.process_time(), loop.excluded_s
    try:
        yield
    finally:
        counted = loop.excluded_s - before  # a collection inside, already excluded
        loop.excluded_s += max(time.process_time() - started - counted, 0.0)


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
        self.excluded_s = 0.0
        """CPU seconds spent ``not_charged`` (or collecting garbage) so far."""
        self._gc_started: float | None = None
        super().__init__(_VirtualSelector(real, self))
        self._clock_resolution = 1e-9
        if charge_cpu:
            gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        super().close()

    def _on_gc(self, phase: str, _info: dict[str, int]) -> None:
        """Garbage collection is not charged: one process holds every simulated node's
        objects, so a collection walks N nodes' heaps (at 64 nodes, seconds) where a
        real node walks its own; charged to whichever step it interrupts, it stalled
        that node for seconds at random."""
        if phase == "start":
            self._gc_started = time.process_time()
        elif self._gc_started is not None:
            self.excluded_s += time.process_time() - self._gc_started
            self._gc_started = None

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(seconds, 0.0)

    # -- charging machines -------------------------------------------------------------

    def call_soon(
        self, callback: Callable[..., object], *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        machine = self._machine(context)
        if machine is None:
            if self._charge_cpu and getattr(callback, "__name__", "") == _RETRY:
                # anyio retries a cancellation on every turn of the loop until the tasks
                # it cancels finish; they may be waiting for their machine, which only
                # time frees: retry a little later instead, or the clock never moves.
                return super().call_at(self._now + RETRY_S, callback, *args, context=context)
            return super().call_soon(callback, *args, context=context)
        # The very context the callback was given: a task step must run in its own.
        ctx = context if context is not None else contextvars.copy_context()
        return super().call_soon(self._when_free, machine, ctx, callback, args, context=ctx)

    def call_at(
        self, when: float, callback: Callable[..., object], *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        # A timer is not held back (it may be cancelled by its handle), only charged;
        # the task steps it wakes wait for the machine.
        machine = self._machine(context)
        if machine is None:
            return super().call_at(when, callback, *args, context=context)
        return super().call_at(when, self._charged, machine, callback, args, context=context)

    def _machine(self, context: contextvars.Context | None) -> Machine | None:
        if not self._charge_cpu:
            return None
        return context.get(_MACHINE) if context is not None else _MACHINE.get()

    def _when_free(
        self, machine: Machine, ctx: contextvars.Context, callback: Callable[..., object],
        args: tuple[Any, ...],
    ) -> None:
        if machine.busy_until > self._now:
            # The machine is still busy with what it did before: this waits its turn.
            super().call_at(
                machine.busy_until, self._when_free, machine, ctx, callback, args, context=ctx
            )
            return
        self._charged(machine, callback, args)

    def _charged(
        self, machine: Machine, callback: Callable[..., object], args: tuple[Any, ...]
    ) -> None:
        started, excluded = time.process_time(), self.excluded_s
        try:
            callback(*args)
        finally:
            spent = max(time.process_time() - started - (self.excluded_s - excluded), 0.0)
            machine.cpu_s += spent
            machine.busy_until = max(machine.busy_until, self._now) + spent
