"""Soak: many mixed requests against a 2-node cluster of real node processes on
127.0.0.1 -- the four API formats, streaming and not, some cancelled early -- then what
leaked or stuck.

    python bench/soak.py [--requests 1000] [--concurrency 4] [--seed 1]

Prints: hung requests, 5xx answers, p50/p99 latency of completed requests, and the RSS
and open file descriptors of every process (nodes and runners) after warm-up and at the
end. Targets: 0 hung, 0 5xx, RSS growth <= 5% after warm-up, fds flat.
"""

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

from exo.tests.chaos.clients import Outcome, random_request
from exo.tests.chaos.cluster import ChaosCluster
from exo.tests.node_process import wait_until

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def processes(cluster: ChaosCluster) -> dict[str, psutil.Process]:
    found: dict[str, psutil.Process] = {}
    for node in cluster.nodes:
        assert node.process is not None
        found[f"node{node.index}"] = psutil.Process(node.process.pid)
        for k, pid in enumerate(node.runner_pids()):
            found[f"node{node.index}-runner{k}"] = psutil.Process(pid)
    return found


def usage(procs: dict[str, psutil.Process]) -> dict[str, tuple[int, int]]:
    """RSS bytes and open fds per process (absent: it exited)."""
    out: dict[str, tuple[int, int]] = {}
    for name, p in procs.items():
        try:
            out[name] = (p.memory_info().rss, p.num_fds())
        except psutil.NoSuchProcess:
            continue
    return out


def serving(cluster: ChaosCluster) -> bool:
    states = cluster.states()
    if not states:
        return False
    state = states[0]
    return any(all(state["runners"].get(r, {}).get("kind") in ("RunnerReady", "RunnerRunning")
                   for r in inst["shard_assignments"]["runner_to_shard"])
               for inst in state["instances"].values())


def run_batch(cluster: ChaosCluster, n: int, concurrency: int, seed: int) -> list[Outcome]:
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    counter = iter(range(n))

    def worker(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        while True:
            with lock:
                if next(counter, None) is None:
                    return
            node = rng.choice(cluster.nodes)
            outcome = random_request(rng, node.url, MODEL, deadline_s=120)
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description="Soak a 2-node cluster with mixed requests.")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="exo-soak-") as tmp:
        cluster = ChaosCluster.start(Path(tmp), n=2)
        try:
            wait_until(lambda: cluster.agreed() is not None, 90, "two nodes to agree")
            r = httpx.post(cluster.nodes[0].url + "/place_instance", json={"model": MODEL},
                           timeout=30)
            assert r.status_code == 200, r.text
            wait_until(lambda: serving(cluster), 300, "the model to serve")
            warmup = max(10, args.requests // 20)
            run_batch(cluster, warmup, args.concurrency, args.seed + 1)
            procs = processes(cluster)
            before = usage(procs)
            started = time.monotonic()
            outcomes = run_batch(cluster, args.requests, args.concurrency, args.seed)
            elapsed = time.monotonic() - started
            time.sleep(2)  # let cancelled generations wind down
            after = usage(procs)
            report(outcomes, before, after, elapsed, warmup)
        finally:
            cluster.close()


def report(outcomes: list[Outcome], before: dict[str, tuple[int, int]],
           after: dict[str, tuple[int, int]], elapsed: float, warmup: int) -> None:
    endings = Counter(o.ending for o in outcomes)
    kinds = Counter(f"{o.kind}{'/stream' if o.stream else ''}" for o in outcomes)
    five_xx = [o for o in outcomes if o.status >= 500]
    latencies = sorted(o.seconds for o in outcomes if o.ending == "answer")
    print(f"requests: {len(outcomes)} in {elapsed:.1f} s (after {warmup} warm-up)")
    print(f"  by format: {dict(kinds)}")
    print(f"  endings: {dict(endings)}")
    print(f"hung: {endings.get('hung', 0)}   5xx: {len(five_xx)}   cut: {endings.get('cut', 0)}")
    for o in five_xx[:5]:
        print(f"  5xx {o.kind}: {o.status} {o.detail[:160]}")
    if latencies:
        p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
        print(f"latency of answers: p50 {statistics.median(latencies):.2f} s, p99 {p99:.2f} s")
    print(f"{'process':<18} {'RSS before':>11} {'RSS after':>11} {'growth':>7} {'fds':>9}")
    for name, (rss0, fds0) in before.items():
        if name not in after:
            print(f"{name:<18} {rss0 / 2**20:>9.0f}MB {'exited':>11}")
            continue
        rss1, fds1 = after[name]
        print(f"{name:<18} {rss0 / 2**20:>9.0f}MB {rss1 / 2**20:>9.0f}MB "
              f"{100 * (rss1 - rss0) / rss0:>6.1f}% {fds0:>4}->{fds1:<4}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
