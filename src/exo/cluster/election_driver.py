"""The election driver: steps the pure election (``election.step``) whenever something
changed (a heartbeat, a node leaving) or every half heartbeat interval, persists the term
before anyone hears of it, announces this node's heartbeat, and tells whoever waits when
the master changes. What a change of master means for this node (take over, step down,
follow) is the caller's ``on_change``."""

from collections.abc import Awaitable, Callable

import anyio

from exo.cluster.config import ClusterConfig
from exo.cluster.election import HELD_EPOCHS, HELD_MARKS, Election, Held, step
from exo.cluster.messages import HEARTBEATS
from exo.cluster.network import ClusterNetwork
from exo.cluster.presence import Peers
from exo.cluster.replica import Replica
from exo.shared.types.common import NodeId
from exo.utils.wakeup import Wakeup

OnChange = Callable[[Election, Election], Awaitable[None]]
"""Called with the election before and after a step that changed the master."""

JOINED_BEAT_GAP_S = 0.05
"""A node that joins hears this node's heartbeat at once, not a heartbeat interval
later; the nodes that join in the next this-many seconds share one more. (One heartbeat
per join made a cluster of N nodes that start together send N^3 messages: 250,000 at
64 nodes.)"""


class ElectionDriver:
    def __init__(
        self,
        config: ClusterConfig,
        replica: Replica,
        peers: Peers,
        clock: Callable[[], float],
        network: Callable[[], ClusterNetwork],
    ) -> None:
        self._config = config
        self._replica = replica
        self._peers = peers
        self._clock = clock
        self._network = network
        self.election = Election.start(
            peers.node_id, config.force_master, replica.term, clock()
        )
        self._wake = Wakeup()
        self._joined = Wakeup()
        self._master_changed = anyio.Event()

    @property
    def master(self) -> NodeId | None:
        return self.election.master

    def wake(self) -> None:
        """Something changed: step the election soon."""
        self._wake.set()

    async def loop(self, on_change: OnChange, on_changed: Callable[[], Awaitable[None]]) -> None:
        while True:
            await self._wake.wait(self._config.heartbeat_interval_s / 2)
            await self.step(on_change, on_changed)

    async def step(self, on_change: OnChange, on_changed: Callable[[], Awaitable[None]]) -> None:
        """One step: on a change of master, ``on_change`` (which persists the new term),
        wake whoever waits for a master, announce it, then ``on_changed``."""
        before = self.election
        after = step(
            before,
            self._replica.last_idx,
            self._peers.heard,
            self._peers.gone,
            self._clock(),
            self._config.timing,
            log_term=self._replica.log_term,
            held=self._held(),
        )
        self.election = after
        if after.master == before.master:
            self._replica.save(after.term)
            return
        await on_change(before, after)
        self._master_changed.set()
        self._master_changed = anyio.Event()
        await self.send_heartbeat()
        await on_changed()

    async def joined(self) -> None:
        """A node joined: it should hear this node's heartbeat (``beat_on_joins``)."""
        self._joined.set()

    async def beat_on_joins(self) -> None:
        while True:
            await self._joined.wait()
            await self.send_heartbeat()
            await anyio.sleep(JOINED_BEAT_GAP_S)  # joins meanwhile: one more, then

    async def send_heartbeat(self) -> None:
        beat = self.election.heartbeat(
            self._replica.last_idx, self._replica.log_term, self._held()
        )
        await self._network().publish(HEARTBEATS, beat)

    def _held(self) -> Held | None:
        """What this node's log holds, while it claims (only claims are ranked by it)."""
        if not self.election.is_master:
            return None
        last = self._replica.last_idx
        return Held(
            lineage=tuple(e for e in self._replica.lineage if e.start_idx <= last + 1)[
                -HELD_EPOCHS:
            ],
            command_marks=tuple(
                i for i in self._replica.log.command_indices(HELD_MARKS) if i <= last
            ),
            serving=len(self._replica.host.state().instances),
        )

    async def wait_master_change(self, timeout: float) -> None:
        """Until the master changes, or ``timeout`` seconds."""
        with anyio.move_on_after(timeout):
            await self._master_changed.wait()
