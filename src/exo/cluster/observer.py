"""An observer: a process that holds the cluster secret but is no node. It watches the
heartbeats (who is alive, who is master, how far each log is) and can hand a command to
the master, without ever appearing in the state (nodes enter the state by reporting
their info, which an observer never does). For tests, benchmarks and tools.

    async with ClusterObserver.open(loopback_config("observer", secret, peers=[...])) as obs:
        beats = await obs.wait_for(lambda beats: ..., timeout=5)
"""

import time
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager
from typing import Self

import anyio

from exo.cluster.election import Heartbeat
from exo.cluster.messages import COMMANDS, HEARTBEATS, CommandMsg
from exo.routing import RequestError, Router, RoutingConfig, Subscription
from exo.shared.types.commands import Command
from exo.shared.types.common import NodeId


class ClusterObserver:
    def __init__(self, router: Router) -> None:
        self.router = router
        self._beats: dict[NodeId, tuple[Heartbeat, float]] = {}
        self._changed = anyio.Event()

    @classmethod
    @asynccontextmanager
    async def open(cls, config: RoutingConfig) -> AsyncGenerator[Self]:
        async with Router(config) as router, anyio.create_task_group() as tg:
            observer = cls(router)
            tg.start_soon(observer._watch, router.subscribe(HEARTBEATS))
            try:
                yield observer
            finally:
                tg.cancel_scope.cancel()

    def beats(self, max_age_s: float) -> dict[NodeId, Heartbeat]:
        """The latest heartbeat of every node heard within ``max_age_s``."""
        now = time.monotonic()
        return {n: beat for n, (beat, at) in self._beats.items() if now - at <= max_age_s}

    async def wait_for(
        self,
        predicate: Callable[[dict[NodeId, Heartbeat]], bool],
        timeout: float,
        max_age_s: float = 1.0,
    ) -> dict[NodeId, Heartbeat]:
        """Until the live heartbeats satisfy ``predicate``; TimeoutError after ``timeout``."""
        with anyio.fail_after(timeout):
            while not predicate(beats := self.beats(max_age_s)):
                with anyio.move_on_after(0.05):
                    await self._changed.wait()
        return beats

    async def send_command(self, command: Command, master: NodeId, timeout: float = 2.0) -> bool:
        """Hand ``command`` to ``master``; True once it accepted it."""
        try:
            ack = await self.router.request(
                COMMANDS, CommandMsg(command=command, origin=None), target=master, timeout=timeout
            )
        except RequestError:
            return False
        return ack.accepted

    async def _watch(self, beats: Subscription[Heartbeat]) -> None:
        async for delivery in beats.deliveries():
            beat = delivery.message
            if delivery.sender == beat.node_id:
                self._beats[beat.node_id] = (beat, time.monotonic())
                self._changed.set()
                self._changed = anyio.Event()


def agreed_master(beats: dict[NodeId, Heartbeat]) -> NodeId | None:
    """The master every live node follows, if they all follow the same one."""
    masters = {beat.master for beat in beats.values()}
    if len(masters) != 1:
        return None
    (master,) = masters
    if master is None or master not in beats or beats[master].master != master:
        return None
    return master
