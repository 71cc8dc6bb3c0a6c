"""Across subnets: nodes that share no multicast domain form one cluster through router
nodes (``--router``); the other nodes join through one of them (``--connect``: zenoh
client mode, every packet goes through that router, and the node listens on nothing,
so no other node could reach it directly anyway).

Two "subnets" on loopback with multicast off: routers ra and rb are linked to each
other; group A (a1, a2) connects to ra only, group B (b1) to rb only. A node of one
group reaches a node of the other only through both routers."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from exo.cluster.observer import ClusterObserver, agreed_master
from exo.cluster.tests.nodes import SECRET, NodeProc, node_group, wait_until
from exo.cluster.tests.test_cluster_nodes import ids_of, model_instance, wait_agreed
from exo.routing import loopback_config
from exo.shared.types.commands import CreateInstance
from exo.shared.types.common import NodeId
from exo.tests.node_process import free_port

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def has_instance(procs: list[NodeProc], instance_id: str, present: bool = True) -> bool:
    for proc in procs:
        state = await proc.try_state()
        if state is None or (instance_id in state["instances"]) != present:
            return False
    return True


async def test_two_groups_form_one_cluster_through_a_router(
    tmp_path: Path) -> None:
    async with node_group(tmp_path) as group:
        ra = group.start("ra", extra=["--router"])
        rb = group.start("rb", [ra.endpoint], extra=["--router"])
        await group.up(ra, rb)  # a node joining through a router needs it up
        a1 = group.start("a1", listen="", extra=["--connect", ra.endpoint, "--force-master"])
        a2 = group.start("a2", listen="", extra=["--connect", ra.endpoint])
        b1 = group.start("b1", listen="", extra=["--connect", rb.endpoint])
        everyone = [ra, rb, a1, a2, b1]
        await group.up(*everyone)
        by_id = await ids_of(*everyone)
        a1_id = next(i for i, p in by_id.items() if p is a1)
        b1_id = next(i for i, p in by_id.items() if p is b1)
        # One shared state: all four nodes, every pair linked, the same last index.
        await wait_agreed(everyone, set(by_id), timeout=60)

        observer_config = dataclasses.replace(
            loopback_config("observer", SECRET, peers=[rb.endpoint]), mode="client"
        )
        async with ClusterObserver.open(observer_config) as observer:
            beats = await observer.wait_for(
                lambda b: len(b) == 5 and agreed_master(b) == a1_id, timeout=30
            )
            assert {beat.master for beat in beats.values()} == {a1_id}

            # An instance on b1 (group B), sequenced by a1 (group A): every node has it,
            # and b1's runner status (its local events) crosses to group A.
            instance = model_instance(NodeId(b1_id))
            assert await observer.send_command(CreateInstance(instance=instance), NodeId(a1_id))
            iid = str(instance.instance_id)
            await wait_until(lambda: has_instance(everyone, iid), 30, "the instance everywhere")
            runner = str(next(iter(instance.shard_assignments.runner_to_shard)))

            async def runner_seen_in_a() -> bool:
                state = await a2.try_state()
                return state is not None and runner in state["runners"]

            await wait_until(runner_seen_in_a, 60, "b1's runner status in group A's state")

            # A request placed on group A's node (a2) is carried out by group B's node.
            async with httpx.AsyncClient(timeout=10) as client:
                reply = await client.delete(f"{a2.url}/instance/{iid}")
            assert reply.status_code == 200, reply.text
            await wait_until(
                lambda: has_instance(everyone, iid, present=False), 30, "the instance gone"
            )

            async def runner_gone_on_b() -> bool:
                state = await b1.try_state()
                return state is not None and runner not in state["runners"]

            await wait_until(runner_gone_on_b, 60, "b1 to shut its runner down")


def _run_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "exo.cli", "--model", "none", "--api-port", str(free_port()),
           "--threads", "1", "--discovery-interface", "none", "--data-dir",
           str(tmp_path / "data"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [
    ["--connect", "tcp/127.0.0.1:7447", "--peer", "tcp/127.0.0.1:7448"],
    ["--connect", "tcp/127.0.0.1:7447", "--router"],
])
def test_connect_does_not_combine_with_peer_or_router(tmp_path: Path, args: list[str]) -> None:
    result = _run_cli(tmp_path, *args)
    assert result.returncode != 0
    assert "--connect joins through a router" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_garbage_or_unreachable_router_is_refused_clearly(tmp_path: Path) -> None:
    garbage = _run_cli(tmp_path, "--connect", "router.example")
    assert garbage.returncode != 0
    assert "--connect 'router.example'" in garbage.stderr, garbage.stderr
    unreachable = _run_cli(tmp_path, "--connect", f"tcp/127.0.0.1:{free_port()}")
    assert unreachable.returncode != 0
    assert "cannot join the cluster network" in unreachable.stderr, unreachable.stderr
    assert "Traceback" not in unreachable.stderr and ".rs" not in unreachable.stderr
