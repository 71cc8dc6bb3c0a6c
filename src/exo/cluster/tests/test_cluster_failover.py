"""Failover with real node processes on 127.0.0.1: what a new master acknowledged
survives the return of the old one (a stall: SIGSTOP, then SIGCONT)."""

import os
import signal
from pathlib import Path

import anyio
import httpx
import pytest

from exo.cluster.observer import ClusterObserver, agreed_master
from exo.cluster.tests.nodes import NODE_TIMEOUT_S, SECRET, NodeProc, node_group, wait_until
from exo.cluster.tests.test_cluster_nodes import master_seen, model_instance, two_nodes, wait_agreed
from exo.routing import loopback_config
from exo.shared.types.commands import CreateInstance
from exo.shared.types.common import NodeId

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


async def _instances(proc: NodeProc) -> set[str] | None:
    state = await proc.try_state()
    return None if state is None else set(state["instances"])


async def test_a_write_acknowledged_by_a_new_master_survives_the_stalled_old_master(
    tmp_path: Path,
) -> None:
    async with node_group(tmp_path) as group:
        a, b, by_id = await two_nodes(group)
        config = loopback_config("observer", SECRET, peers=[a.endpoint, b.endpoint])
        async with ClusterObserver.open(config) as observer:
            old = by_id[await master_seen(observer, 2)]
            new = b if old is a else a
            new_id = NodeId(next(n for n, p in by_id.items() if p is new))

            os.kill(old.process.pid, signal.SIGSTOP)
            try:
                await observer.wait_for(
                    lambda b: b.get(new_id) is not None and b[new_id].master == new_id,
                    timeout=15, max_age_s=NODE_TIMEOUT_S / 2,
                )
                async with httpx.AsyncClient(timeout=30) as client:
                    placed = await client.post(f"{new.url}/place_instance", json={"model": MODEL})
                assert placed.status_code == 200, placed.text
                acknowledged: set[str] = set()

                async def placed_on_new() -> bool:
                    found = await _instances(new)
                    acknowledged.update(found or ())
                    return bool(found)

                await wait_until(placed_on_new, 15, "the new master to place the instance")
            finally:
                os.kill(old.process.pid, signal.SIGCONT)

            async def both_hold_it() -> bool:
                return [await _instances(p) for p in (a, b)] == [acknowledged, acknowledged]

            await wait_until(both_hold_it, 20, "both nodes to hold the acknowledged instance")
            # And it stays: the stalled master does not take over again and drop it.
            for _ in range(int(3 * NODE_TIMEOUT_S / 0.2)):
                await anyio.sleep(0.2)
                for proc in (a, b):
                    assert await _instances(proc) in (acknowledged, None), proc.name
            beats = await observer.wait_for(lambda b: len(b) == 2, timeout=5)
            assert agreed_master(beats) == new_id
            assert beats[new_id].claim_term > 0


async def test_a_restarted_node_acts_only_once_caught_up(tmp_path: Path) -> None:
    """b hosts an instance, dies, the instance goes with it; b comes back with its old log
    (which still holds the instance) and must not start a runner for it."""
    async with node_group(tmp_path) as group:
        a, b, by_id = await two_nodes(group)
        b_id = NodeId(await b.node_id())
        config = loopback_config("observer", SECRET, peers=[a.endpoint, b.endpoint])
        async with ClusterObserver.open(config) as observer:
            master_id = await master_seen(observer, 2)
            assert by_id[master_id] is a
            instance = model_instance(b_id)
            assert await observer.send_command(CreateInstance(instance=instance), master_id)
        created = f"creating runner for instance {instance.instance_id}"
        await wait_until(lambda: _logged(b, created), 30, "b to start the instance's runner")
        b.kill()
        gone = str(instance.instance_id)

        async def deleted_on_a() -> bool:
            found = await _instances(a)
            return found is not None and gone not in found

        await wait_until(deleted_on_a, 15, "the instance to go with b")
        again = group.start("b-again", [a.endpoint], data_dir=b.data_dir,
                            cluster_port=b.cluster_port)
        await group.up(again)
        await wait_agreed([a, again], set(by_id))
        await anyio.sleep(NODE_TIMEOUT_S)  # time for a wrong start to show
        assert created not in again.log()
        assert "at event" in again.log()


async def _logged(proc: NodeProc, text: str) -> bool:
    return text in proc.log()
