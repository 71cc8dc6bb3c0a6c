"""Cluster benchmarks with real node processes on 127.0.0.1 (``--model none``).

Run: ``python bench/cluster.py`` (``--trials N``, ``--node-timeout S``, ``--events N``).

* Failover: three nodes; SIGKILL the master, and at that same moment send a command
  (``DELETE /instance/ID``) to a surviving node's API; measured until the command took
  effect in that node's state (and, on the side, until an observer saw a new master).
  The killed node then comes back with its data directory, and the next trial kills
  the next master. Target: < 3 s.
* Catch-up: a node's log holds 100,000 events (written straight into its data
  directory); a new node joins. Measured from the moment the new node's API answers to
  the moment its state is at the master's last index (and, from its log, the time its
  catch-up requests took). Target: < 2 s.
"""

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from exo.cluster.observer import ClusterObserver, agreed_master
from exo.cluster.tests.history import write_history
from exo.cluster.tests.nodes import SECRET, NodeGroup, NodeProc, node_group, wait_until
from exo.cluster.tests.test_cluster_nodes import model_instance, wait_agreed
from exo.routing import loopback_config
from exo.shared.types.commands import CreateInstance
from exo.shared.types.common import NodeId

FAILOVER_TARGET_S = 3.0
CATCH_UP_TARGET_S = 2.0


async def failover(tmp: Path, trials: int, extra: list[str]) -> list[tuple[float, float]]:
    """(seconds to a new master, seconds to the first command that took effect) per trial."""
    results: list[tuple[float, float]] = []
    async with node_group(tmp) as group:
        a = group.start("a", extra=extra)
        await group.up(a)
        b = group.start("b", [a.endpoint], extra=extra)
        c = group.start("c", [a.endpoint, b.endpoint], extra=extra)
        await group.up(b, c)
        nodes = {await p.node_id(): p for p in (a, b, c)}
        await wait_agreed(list(nodes.values()), set(nodes))
        config = loopback_config("bench-observer", SECRET, peers=[p.endpoint for p in nodes.values()])
        async with ClusterObserver.open(config) as observer:
            for trial in range(trials):
                result = await _failover_trial(group, nodes, observer, trial, extra)
                results.append(result)
                print(f"  trial {trial + 1}: new master after {result[0]:.2f} s, "
                      f"first command in effect after {result[1]:.2f} s", flush=True)
    return results


async def _failover_trial(
    group: NodeGroup, nodes: dict[str, NodeProc], observer: ClusterObserver, trial: int,
    extra: list[str],
) -> tuple[float, float]:
    beats = await observer.wait_for(lambda b: len(b) == 3 and agreed_master(b) is not None, 30)
    master_id = agreed_master(beats)
    assert master_id is not None
    master = nodes[master_id]
    survivors = [p for n, p in nodes.items() if n != master_id]
    instance = model_instance(NodeId(await survivors[0].node_id()))
    assert await observer.send_command(CreateInstance(instance=instance), master_id)

    async def everywhere() -> bool:
        states = [await p.try_state() for p in nodes.values()]
        return all(s is not None and str(instance.instance_id) in s["instances"] for s in states)

    await wait_until(everywhere, 10, "the instance on every node")

    killed_at = time.monotonic()
    master.kill()
    await survivors[1].delete(f"/instance/{instance.instance_id}")

    async def deleted() -> bool:
        state = await survivors[1].try_state()
        return state is not None and str(instance.instance_id) not in state["instances"]

    await wait_until(deleted, 30, "the command to take effect", interval=0.01)
    command_s = time.monotonic() - killed_at
    await observer.wait_for(
        lambda b: master_id not in b and agreed_master(b) not in (None, master_id), 30, 0.5
    )
    elected_s = time.monotonic() - killed_at

    back = group.start(f"{master.name}-{trial}", [p.endpoint for p in survivors],
                       data_dir=master.data_dir, cluster_port=master.cluster_port, extra=extra)
    await group.up(back)
    nodes[master_id] = back
    await wait_agreed(list(nodes.values()), set(nodes), timeout=30)
    return elected_s, command_s


async def catch_up(tmp: Path, trials: int, events: int, extra: list[str]) -> list[tuple[float, float]]:
    """(seconds from the API answering to in sync, seconds of catch-up requests) per trial."""
    started = time.monotonic()
    master_id = write_history(tmp / "master", events)
    print(f"  wrote {events:,} events in {time.monotonic() - started:.1f} s", flush=True)
    results: list[tuple[float, float]] = []
    async with node_group(tmp) as group:
        master = group.start("master", extra=extra)
        await group.up(master)

        async def mastering() -> bool:
            state = await master.try_state()
            return state is not None and master_id in state["nodes"]

        await wait_until(mastering, 30, "the master to serve its log")
        for trial in range(trials):
            joiner = group.start(f"joiner-{trial}", [master.endpoint], extra=extra)
            await group.up(joiner)

            async def in_sync(joiner: NodeProc = joiner) -> bool:
                ours, theirs = await joiner.try_state(), await master.try_state()
                return (
                    ours is not None and theirs is not None
                    and ours["last_event_applied_idx"] == theirs["last_event_applied_idx"]
                )

            synced_s = await wait_until(in_sync, 30, "the joiner to catch up", interval=0.01)
            requests_s = sum(
                float(m) for m in re.findall(r"caught up to .* in ([0-9.]+) s", joiner.log())
            )
            idx = (await joiner.state())["last_event_applied_idx"]
            results.append((synced_s, requests_s))
            print(f"  trial {trial + 1}: in sync at event {idx:,} {synced_s:.2f} s after its API "
                  f"answered; catch-up requests {requests_s:.3f} s", flush=True)
            joiner.kill()
    return results


def summary(name: str, values: list[float], target: float) -> None:
    verdict = "ok" if max(values) < target else "MISSED"
    print(f"{name}: median {statistics.median(values):.2f} s, max {max(values):.2f} s "
          f"(target < {target:g} s: {verdict})")


async def main(args: argparse.Namespace) -> None:
    extra = ["--node-timeout", str(args.node_timeout), "--log-level", "DEBUG"]
    with tempfile.TemporaryDirectory(prefix="exo-bench-cluster-") as tmp:
        print(f"failover ({args.trials} trials, node timeout {args.node_timeout:g} s)")
        failovers = await failover(Path(tmp) / "failover", args.trials, extra)
        print(f"catch-up after {args.events:,} events ({args.trials} trials)")
        catch_ups = await catch_up(Path(tmp) / "catch-up", args.trials, args.events, extra)
    print()
    summary("failover: SIGKILL to a new master", [e for e, _ in failovers], FAILOVER_TARGET_S)
    summary("failover: SIGKILL to the first command in effect on a survivor",
            [c for _, c in failovers], FAILOVER_TARGET_S)
    summary(f"catch-up of a new node after {args.events:,} events (API up to in sync)",
            [s for s, _ in catch_ups], CATCH_UP_TARGET_S)
    summary("catch-up requests themselves", [r for _, r in catch_ups], CATCH_UP_TARGET_S)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--node-timeout", type=float, default=5.0)
    parser.add_argument("--events", type=int, default=100_000)
    anyio.run(main, parser.parse_args())
