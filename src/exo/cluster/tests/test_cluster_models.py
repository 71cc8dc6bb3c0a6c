"""Models split across nodes.

* The master's part, with plain values: an instance lost with a node is placed again on
  the nodes left (fewer when it must), and the runners of an instance meet on loopback
  when its nodes share a host, else at an address of rank 0's node the others reach.
* Real node processes on 127.0.0.1 (explicit ``--peer``/``--listen``, the embedded
  model): a pipeline over 2 nodes and tensor parallelism over 3 answer exactly as one
  node does, and killing a node mid-stream fails the stream at once and the master
  places the lost instance again on the nodes left, where it serves.
"""

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from exo.cluster.observer import ClusterObserver
from exo.cluster.tests.nodes import SECRET, NodeGroup, NodeProc, node_group, wait_until
from exo.cluster.tests.test_cluster_nodes import ids_of, master_seen, wait_agreed
from exo.master.main import Master
from exo.master.placement import group_host, place_instance
from exo.routing import loopback_config
from exo.shared.models.embedded import embedded_model_card
from exo.shared.models.model_cards import ModelCard
from exo.shared.tests.builders import make_state
from exo.shared.types.chunks import Chunk
from exo.shared.types.commands import Command, PlaceInstance
from exo.shared.types.common import NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    Event,
    IndexedEvent,
    InstanceCreated,
    NodeTimedOut,
)
from exo.shared.types.memory import Memory
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.topology import Connection, Topology
from exo.shared.types.worker.instances import Instance, InstanceId, Sharding
from exo.utils.channels import channel

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
QUESTION = "What is the capital of France?"

# ---------------------------------------------------------------- the master, plain values

A, B, C = NodeId("node-a"), NodeId("node-b"), NodeId("node-c")


def info(hostname: str = "host", addresses: Sequence[str] = ()) -> NodeInfo:
    return NodeInfo(
        hostname=hostname,
        cpu_count=4,
        memory_total=Memory.from_mb(8192),
        memory_available=Memory.from_mb(4096),
        addresses=list(addresses),
    )


class _Recorder:
    """A master's outputs: what it published, and the errors for requesters."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.errors: list[Chunk] = []

    async def publish(self, indexed: IndexedEvent) -> None:
        self.events.append(indexed.event)

    def send_chunk(self, event: ChunkGenerated, origin: NodeId | None) -> None:
        self.errors.append(event.chunk)


def _master(nodes: dict[NodeId, NodeInfo], recorder: _Recorder) -> Master:
    card = embedded_model_card()
    return Master(
        node_id=A,
        commands=channel[tuple[Command, NodeId | None]]()[1],
        local_events=channel[Event]()[1],
        publish=recorder.publish,
        send_chunk=recorder.send_chunk,
        resolve_card=lambda model_id: card if model_id == card.model_id else None,
        state=make_state(
            nodes=nodes,
            connections=[Connection(source=s, sink=t) for s in nodes for t in nodes if s != t],
        ),
    )


async def _placed(master: Master, sharding: Sharding, min_nodes: int, rec: _Recorder) -> Instance:
    card: ModelCard = embedded_model_card()
    command = PlaceInstance(model_id=card.model_id, sharding=sharding, min_nodes=min_nodes)
    await master.submit(command, A)
    assert not rec.errors, rec.errors
    created = rec.events[-1]
    assert isinstance(created, InstanceCreated)
    return created.instance


@pytest.mark.parametrize(
    ("sharding", "world", "left"),
    [("pipeline", 2, 1), ("pipeline", 3, 2), ("tensor", 3, 1)],
)
async def test_an_instance_lost_with_a_node_is_placed_again_on_the_nodes_left(
    sharding: Sharding, world: int, left: int
) -> None:
    """Same model and sharding, as many nodes as still fit (tensor: 9 heads do not
    split over 2 nodes, so 1), a new instance id and a new group port."""
    rec = _Recorder()
    master = _master({n: info() for n in (A, B, C)[:world]}, rec)
    lost = await _placed(master, sharding, world, rec)
    assert lost.world_size == world
    dead = max(lost.shard_assignments.node_to_runner)
    await master.emit(NodeTimedOut(node_id=dead))
    assert isinstance(rec.events[-2], NodeTimedOut)
    created = rec.events[-1]
    assert isinstance(created, InstanceCreated)
    again = created.instance
    assert again.instance_id != lost.instance_id
    assert again.sharding == sharding
    assert again.shard_assignments.model_id == lost.shard_assignments.model_id
    assert again.world_size == left
    assert dead not in again.shard_assignments.node_to_runner
    assert again.group_port != lost.group_port
    assert set(master.state.instances) == {again.instance_id}


async def test_an_instance_that_no_longer_fits_is_not_placed_again() -> None:
    rec = _Recorder()
    small = info().model_copy(update={"memory_available": Memory.from_mb(100)})
    master = _master({A: small, B: info()}, rec)
    lost = await _placed(master, "pipeline", 1, rec)
    assert set(lost.shard_assignments.node_to_runner) == {B}
    await master.emit(NodeTimedOut(node_id=B))
    assert isinstance(rec.events[-1], NodeTimedOut)
    assert master.state.instances == {}
    assert not rec.errors


async def test_a_node_without_instances_times_out_without_placements() -> None:
    rec = _Recorder()
    master = _master({A: info(), B: info()}, rec)
    await master.emit(NodeTimedOut(node_id=B))
    assert [type(e) for e in rec.events] == [NodeTimedOut]


def _instance_on(nodes: dict[NodeId, NodeInfo], world: int) -> Instance:
    mesh = Topology(
        connections=[Connection(source=s, sink=t) for s in nodes for t in nodes if s != t]
    )
    placed = place_instance(
        embedded_model_card(), "pipeline", world, nodes, mesh, {}, InstanceId("i")
    )
    assert isinstance(placed, Instance)
    return placed


def test_runners_on_one_host_meet_on_loopback() -> None:
    lan = ["192.168.1.7/24", "127.0.0.1/8"]
    nodes = {A: info("box", lan), B: info("box", lan)}
    assert group_host(_instance_on(nodes, 2), nodes) == "127.0.0.1"
    assert group_host(_instance_on(nodes, 1), nodes) == "127.0.0.1"


def test_runners_on_several_hosts_meet_at_an_address_of_rank_0_the_others_reach() -> None:
    nodes = {
        # rank 0 (smallest id): a docker bridge first, the LAN second
        A: info("a", ["172.17.0.1/16", "10.0.0.5/24", "fd00::5/64", "127.0.0.1/8"]),
        B: info("b", ["10.0.0.6/24", "127.0.0.1/8"]),
        C: info("c", ["10.0.0.7/24", "192.168.9.9/24", "127.0.0.1/8"]),
    }
    assert group_host(_instance_on(nodes, 3), nodes) == "10.0.0.5"
    # No shared network: rank 0's first address that is not loopback.
    apart = {**nodes, B: info("b", ["192.168.5.5/24"])}
    assert group_host(_instance_on(apart, 3), apart) == "172.17.0.1"
    # Only loopback known (an older node's info): loopback.
    bare = {A: info("a"), B: info("b")}
    assert group_host(_instance_on(bare, 2), bare) == "127.0.0.1"


# ---------------------------------------------------------------- real nodes


async def start_cluster(group: NodeGroup, n: int) -> list[NodeProc]:
    """``n`` nodes on 127.0.0.1 that agree on each other (the others join the first)."""
    first = group.start("n0")
    await group.up(first)
    procs = [first]
    for i in range(1, n):
        procs.append(group.start(f"n{i}", [p.endpoint for p in procs]))
    await group.up(*procs[1:])
    await wait_agreed(procs, set(await ids_of(*procs)))
    return procs


def client(proc: NodeProc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=120
    )


async def ask(proc: NodeProc, question: str = QUESTION, max_tokens: int = 12) -> str:
    """The greedy answer, through the official client."""
    async with client(proc) as c:
        reply = await c.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            temperature=0,
            max_tokens=max_tokens,
        )
    return reply.choices[0].message.content or ""


def _serving(state: dict[str, Any], instance: dict[str, Any]) -> bool:
    return all(
        state["runners"].get(rid, {}).get("kind") in ("RunnerReady", "RunnerRunning")
        for rid in instance["shard_assignments"]["runner_to_shard"]
    )


async def serving_instance(
    procs: Sequence[NodeProc],
    timeout: float = 120,
    *,
    sharding: Sharding,
    world: int,
    not_id: str | None = None,
) -> dict[str, Any]:
    """Wait until every node sees one instance of this shape serving; returns it."""
    found: list[dict[str, Any]] = []

    async def check() -> bool:
        for proc in procs:
            state = await proc.try_state()
            if state is None:
                return False
            matching = [
                i
                for i in state["instances"].values()
                if i["sharding"] == sharding
                and len(i["shard_assignments"]["runner_to_shard"]) == world
                and i["instance_id"] != not_id
                and _serving(state, i)
            ]
            if len(matching) != 1:
                return False
            found[:] = matching
        return True

    await wait_until(
        check, timeout, f"a {sharding} instance on {world} node(s) to serve", interval=0.1
    )
    return found[0]


async def place(
    proc: NodeProc, procs: Sequence[NodeProc], sharding: Sharding, min_nodes: int
) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(
            f"{proc.url}/place_instance",
            json={"model": MODEL, "sharding": sharding, "min_nodes": min_nodes},
        )
    assert response.status_code == 200, response.text
    assert response.json()["node_count"] == min_nodes, response.text
    return await serving_instance(procs, sharding=sharding, world=min_nodes)


async def delete_all(procs: Sequence[NodeProc]) -> None:
    state = await procs[0].state()
    for instance_id in state["instances"]:
        await procs[0].delete(f"/instance/{instance_id}")

    async def gone() -> bool:
        states = [await p.try_state() for p in procs]
        return all(s is not None and not s["instances"] and not s["runners"] for s in states)

    await wait_until(gone, 30, "the instances and their runners to go", interval=0.1)


async def test_split_models_answer_like_one_node_and_a_lost_node_is_healed_around(
    tmp_path: Path,
) -> None:
    """Three nodes, reused throughout: a pipeline over 2 of them (asked through every
    node), then tensor parallelism over all 3, greedy answers compared; then a node
    that holds a tensor slice is killed mid-stream. The stream fails at once, the master places the model
    again by itself (9 heads do not split over the 2 nodes left: one node), and that
    single-node instance gives the same answer."""
    async with node_group(tmp_path) as group:
        procs = await start_cluster(group, 3)
        by_id = await ids_of(*procs)
        config = loopback_config("observer", SECRET, peers=[p.endpoint for p in procs])
        async with ClusterObserver.open(config) as observer:
            master_id = await master_seen(observer, 3)
        master = by_id[master_id]
        others = [p for p in procs if p is not master]
        for node in (await master.state())["nodes"].values():  # its addresses, loopback last
            loopback = [a.startswith(("127.", "::1/")) for a in node["addresses"]]
            assert any(loopback) and loopback == sorted(loopback), node["addresses"]

        started = time.monotonic()
        pipeline = await place(others[0], procs, "pipeline", 2)
        assert pipeline["group_host"] == "127.0.0.1"  # every node is on this host
        layers = sorted(
            (s["start_layer"], s["end_layer"])
            for s in pipeline["shard_assignments"]["runner_to_shard"].values()
        )
        assert layers[0][0] == 0 and layers[0][1] == layers[1][0] < layers[1][1]
        answer = await ask(procs[0])
        assert "paris" in answer.lower(), answer
        for proc in procs[1:]:  # whichever node takes the request
            assert await ask(proc) == answer
        await delete_all(procs)
        print(f"pipeline over 2 nodes: {answer!r} ({time.monotonic() - started:.1f} s)")

        started = time.monotonic()
        tensor = await place(others[1], procs, "tensor", 3)
        assert await ask(others[0]) == answer
        print(f"tensor over 3 nodes: same answer ({time.monotonic() - started:.1f} s)")

        # A node holding a slice dies mid-stream; the stream is on the master.
        victim = others[1]
        killed_at: float | None = None
        received = 0
        async with client(master) as c:
            stream = await c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Write a long story about a cat."}],
                temperature=0,
                max_tokens=2000,
                stream=True,
            )
            with pytest.raises(openai.APIError) as raised:
                async for _chunk in stream:
                    received += 1
                    if received == 3:
                        victim.kill()
                        killed_at = time.monotonic()
        assert killed_at is not None, "the stream ended before the node was killed"
        failed_after = time.monotonic() - killed_at
        print(f"the stream failed {failed_after:.2f} s after the kill: {raised.value}")
        assert failed_after < 2.0

        survivors = [master, others[0]]
        again = await serving_instance(
            survivors, 120, sharding="tensor", world=1, not_id=tensor["instance_id"]
        )
        healed_after = time.monotonic() - killed_at
        victim_id = next(n for n, p in by_id.items() if p is victim)
        assert victim_id not in again["shard_assignments"]["node_to_runner"]
        for proc in survivors:
            state = await proc.state()
            assert list(state["instances"]) == [again["instance_id"]]
            assert victim_id not in state["nodes"]
        assert await ask(others[0]) == answer
        print(f"placed again on one node and serving {healed_after:.1f} s after the kill")
