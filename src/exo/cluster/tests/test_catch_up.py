"""A follower's buffer of events that came out of order (``catch_up.LogFollower``): in
order, once, and at a cost per event that does not grow with what is buffered."""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from exo.cluster.catch_up import LogFollower, catch_up_reply
from exo.cluster.config import ClusterConfig
from exo.cluster.lineage import Epoch
from exo.cluster.messages import CatchUpReply, CatchUpRequest, EventMsg
from exo.cluster.network import ClusterNetwork
from exo.cluster.replica import Replica
from exo.cluster.resubmit import Resubmission
from exo.cluster.sim.node import SimHost
from exo.cluster.store import ElectionStore
from exo.master.event_log import SqliteEventLog
from exo.routing.topics import Delivery
from exo.shared.apply import apply
from exo.shared.tests.builders import node_info
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import IndexedEvent, MergeReported, TopologyEdgeCreated
from exo.shared.types.state import State
from exo.shared.types.topology import Connection

pytestmark = pytest.mark.anyio

MASTER, ME = NodeId("master"), NodeId("me")
EPOCH = Epoch(term=1, master=MASTER, start_idx=0)


class _CountingDict(dict[int, Any]):
    """A dict that counts the keys its iterations visit."""

    visited = 0

    def __iter__(self) -> Any:
        for key in super().__iter__():
            type(self).visited += 1
            yield key


class _Inbox:
    def __init__(self, messages: list[EventMsg]) -> None:
        self._messages = messages

    def __aiter__(self) -> AsyncIterator[EventMsg]:
        raise NotImplementedError

    async def deliveries(self) -> AsyncIterator[Delivery[EventMsg]]:
        for message in self._messages:
            yield Delivery(str(MASTER), message)


def _edge(idx: int) -> EventMsg:
    connection = Connection(source=NodeId(f"a{idx}"), sink=NodeId(f"b{idx}"))
    return EventMsg(epoch=EPOCH, event=IndexedEvent(idx=idx, event=TopologyEdgeCreated(
        connection=connection)))


def _follower(tmp_path: Path) -> tuple[LogFollower, Replica]:
    host = SimHost(ME, State(), lambda: 0.0, node_info())
    replica = Replica(host, SqliteEventLog(tmp_path / "events.db"),
                      ElectionStore(tmp_path / "election.json"))

    def network() -> ClusterNetwork:
        raise AssertionError("no catch-up is needed here")

    async def wait(_timeout: float) -> None:
        await anyio.sleep(0)

    def report(_report: MergeReported) -> None:
        raise AssertionError("nothing is dropped here")

    def resubmit(_again: Resubmission) -> None:
        raise AssertionError("nothing is dropped here")

    follower = LogFollower(
        ClusterConfig(secret="s", listen=()), host, replica, lambda: 0.0, network,
        master=lambda: MASTER, is_master=lambda: False, wait_master_change=wait,
        report=report, resubmit=resubmit, on_synced=lambda: None,
    )
    follower.synced = True  # in sync at the start of the log
    return follower, replica


async def test_events_behind_a_gap_cost_the_same_however_many_wait(tmp_path: Path) -> None:
    """2000 events overtake the first one; then it comes. Each arrival used to scan the
    whole buffer (n^2/2 = 2,000,000 visits here): the 4032 link events of a 64-node
    cluster stalled every follower for seconds."""
    follower, replica = _follower(tmp_path)
    counting = _CountingDict()
    follower._buffer = counting  # pyright: ignore[reportPrivateUsage]
    n = 2000
    late = [_edge(i) for i in range(1, n + 1)]
    await follower.receive_events(_Inbox([*late, _edge(0), _edge(5)]))  # 5: a duplicate
    assert replica.last_idx == n
    assert len(replica.host.state().topology.connections) == n + 1
    assert _CountingDict.visited <= 2 * n, _CountingDict.visited


async def test_events_a_catch_up_page_brought_are_forgotten(tmp_path: Path) -> None:
    """Events buffered behind a gap that a catch-up page then covered are not applied
    again, and what follows the page is."""
    follower, replica = _follower(tmp_path)
    await follower.receive_events(_Inbox([_edge(i) for i in range(2, 6)]))
    assert replica.last_idx == -1
    page = CatchUpReply(
        base=None, events=[_edge(i).event for i in range(4)], last_idx=5, lineage=(EPOCH,)
    )
    assert await follower._apply(MASTER, page)  # pyright: ignore[reportPrivateUsage]
    assert replica.last_idx == 5
    assert follower._buffer == {}  # pyright: ignore[reportPrivateUsage]


async def test_a_gap_that_closed_before_the_follower_looked_costs_no_request(
    tmp_path: Path,
) -> None:
    """Event 1 overtakes event 0 (a gap), then 0 comes before the catch-up loop runs:
    nothing is missing, so nothing is asked. (Every follower asked the master after
    every burst of reordered events, for nothing: a catch-up storm at 32 nodes.)"""
    follower, replica = _follower(tmp_path)  # its network fails the test if used
    await follower.receive_events(_Inbox([_edge(1), _edge(0)]))
    assert replica.last_idx == 1
    async with anyio.create_task_group() as tg:
        tg.start_soon(follower.loop)
        await anyio.sleep(0.2)  # ten times the gap wait
        tg.cancel_scope.cancel()


async def test_a_node_that_starts_again_from_the_masters_state_knows_its_commands(
    tmp_path: Path,
) -> None:
    """A follower far behind gets the master's state, not its events; it must still learn
    which commands the master's log applied. Else, once it is the master, a client's
    retry of one of them is applied a second time (at-most-once lost)."""
    master_log = SqliteEventLog(tmp_path / "master.db", snapshot_every=5, keep_tail=5)
    state = State()
    for idx in range(30):
        indexed = IndexedEvent(idx=idx, event=_edge(idx).event.event,
                               command_id=CommandId(f"c{idx}"))
        state = apply(state, indexed)
        master_log.append(indexed, state)
    master = Replica(SimHost(MASTER, state, lambda: 0.0, node_info()), master_log,
                     ElectionStore(tmp_path / "master.json"))
    master.save(1, (EPOCH,))
    reply = catch_up_reply(master, state, CatchUpRequest(last_idx=-1, lineage=()))
    assert reply.base is not None  # event 0 was compacted away: the state it is
    follower, replica = _follower(tmp_path)
    assert await follower._apply(MASTER, reply)  # pyright: ignore[reportPrivateUsage]
    assert replica.last_idx == 29
    assert replica.log.command_ids(100) == [CommandId(f"c{i}") for i in range(30)]
    # what it applies next is remembered after them, in order
    await replica.apply(EventMsg(epoch=EPOCH, event=IndexedEvent(
        idx=30, event=_edge(30).event.event, command_id=CommandId("c30"))))
    assert replica.log.command_ids(2) == [CommandId("c29"), CommandId("c30")]
