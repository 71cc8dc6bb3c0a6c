"""The seeded chaos suite: three real nodes on 127.0.0.1 whose cluster links run through
proxies the test controls; a random schedule of faults from a printed seed while clients
send requests in all four API formats (some cancelled); then the invariants.

Rerun a seed: ``EXO_CHAOS_SEEDS=1234 pytest src/exo/tests/chaos``. The schedule (which
faults, on which nodes, how long) is a function of the seed; the timing of the processes
is not, so a failure caused by a race may need a few reruns of its seed."""

import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from exo.shared.constants import EXO_MAX_INSTANCE_RETRIES
from exo.tests.chaos.clients import KINDS, Outcome, random_request, run_one
from exo.tests.chaos.cluster import BAD_MODELS, ChaosCluster, ChaosNode, remove_missing_model
from exo.tests.node_process import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
SEEDS = [int(s) for s in os.environ.get("EXO_CHAOS_SEEDS", "1,2,3").split(",") if s.strip()]
FAULTS_PER_RUN = int(os.environ.get("EXO_CHAOS_FAULTS", "5"))
REQUEST_DEADLINE_S = 60.0
CONVERGE_S = 15.0
CLIENTS = 2


@dataclass
class Record:
    outcome: Outcome
    node: int
    started: float
    ended: float


@dataclass
class Journal:
    """What happened when: faults per node, requests and their outcomes."""

    disrupted: list[tuple[int, float, float]] = field(default_factory=list[tuple[int, float, float]])
    requests: list[Record] = field(default_factory=list[Record])
    deleted: list[str] = field(default_factory=list[str])
    unobtainable: list[tuple[str, Record]] = field(default_factory=list[tuple[str, Record]])
    """Requests for a model no node can obtain (its name, how the request ended)."""
    orphans: list[int] = field(default_factory=list[int])

    def node_disrupted(self, node: int, start: float, end: float) -> bool:
        return any(n == node and a <= end and start <= b for n, a, b in self.disrupted)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ChaosCluster]:
    c = ChaosCluster.start(tmp_path)
    try:
        yield c
    finally:
        c.close()


def _serving(state: dict[str, Any]) -> bool:
    return any(
        inst["shard_assignments"]["model_id"] == MODEL and all(
            state["runners"].get(rid, {}).get("kind") in ("RunnerReady", "RunnerRunning")
            for rid in inst["shard_assignments"]["runner_to_shard"])
        for inst in state["instances"].values()
    )


def _place(node: ChaosNode) -> None:
    r = httpx.post(node.url + "/place_instance", json={"model": MODEL}, timeout=30)
    assert r.status_code == 200, r.text


def _answering(cluster: ChaosCluster) -> list[ChaosNode]:
    """Live nodes whose API answers (a node just restarted may not listen yet)."""
    answering: list[ChaosNode] = []

    def some() -> bool:
        answering[:] = [n for n in cluster.live() if n.state() is not None]
        return bool(answering)

    wait_until(some, 60, "a node whose API answers")
    return answering


def _check_cuts_are_real(cluster: ChaosCluster) -> None:
    """A cut link makes its two nodes see each other gone: zenoh has no way around."""
    a, b = cluster.nodes[0], cluster.nodes[1]
    a_id, b_id = a.node_id(), b.node_id()
    cluster.mesh.cut(0, 1)
    wait_until(lambda: f"node {b_id} left" in a.log() and f"node {a_id} left" in b.log(), 20,
               "the cut nodes to see each other gone")
    cluster.mesh.heal()
    wait_until(lambda: cluster.agreed() is not None, 40, "the nodes to agree after healing")


def _clients(cluster: ChaosCluster, journal: Journal, seed: int, stop: threading.Event) -> None:
    rng = random.Random(seed * 7919)
    while not stop.is_set():
        live = cluster.live()
        if not live:
            time.sleep(0.1)
            continue
        node = rng.choice(live)
        started = time.monotonic()
        outcome = random_request(rng, node.url, MODEL, deadline_s=REQUEST_DEADLINE_S)
        journal.requests.append(Record(outcome, node.index, started, time.monotonic()))


FAULTS = ("runner_kill", "node_restart", "stop_cont", "master_restart", "partition", "one_way",
          "delay", "unobtainable", "delete_place")
ALWAYS = ("delay", "unobtainable")
"""Faults every run has at least once (cheap ones; the others come as the seed says)."""


def schedule(rng: random.Random, count: int) -> list[str]:
    """The kinds of the run's faults, in order: random, with each of ``ALWAYS`` in it."""
    kinds = [rng.choice(FAULTS) for _ in range(max(count, len(ALWAYS)))]
    for kind in ALWAYS:
        if kind not in kinds:
            slots = [i for i, k in enumerate(kinds) if k not in ALWAYS]
            kinds[rng.choice(slots)] = kind
    return kinds


def _fault(cluster: ChaosCluster, journal: Journal, rng: random.Random, kind: str) -> str:
    n = len(cluster.nodes)
    hold = rng.uniform(1.0, 4.0)
    start = time.monotonic()
    match kind:
        case "runner_kill":
            pids = [p for node in cluster.live() for p in node.runner_pids()]
            if pids:
                os.kill(rng.choice(pids), 9)
            time.sleep(hold)
        case "node_restart" | "master_restart":
            index = cluster.master_index() if kind == "master_restart" else None
            node = cluster.nodes[index if index is not None else rng.randrange(n)]
            journal.orphans += node.runner_pids()
            node.kill()
            time.sleep(hold)
            node.start()
            # Down until its API listens again (a loaded machine takes a while to import).
            wait_until(lambda: node.state() is not None, 90, f"node {node.index} to listen again")
            journal.disrupted.append((node.index, start, time.monotonic() + 5))
            return f"{kind} node {node.index} ({hold:.1f} s down)"
        case "stop_cont":
            node = cluster.nodes[rng.randrange(n)]
            if node.alive:
                node.stop_group()
                time.sleep(hold)
                node.cont()
            journal.disrupted.append((node.index, start, time.monotonic() + 5))
            return f"stop_cont node {node.index} ({hold:.1f} s)"
        case "partition":
            i, j = rng.sample(range(n), 2)
            cluster.mesh.cut(i, j)
            time.sleep(hold)
            cluster.mesh.heal()
            return f"partition {i}|{j} ({hold:.1f} s)"
        case "one_way":
            i, j = rng.sample(range(n), 2)
            cluster.mesh.one_way(i, j)
            time.sleep(hold)
            cluster.mesh.heal()
            return f"one_way {i}->{j} ({hold:.1f} s)"
        case "delay":
            i, j = rng.sample(range(n), 2)
            delay = rng.uniform(0.05, 0.6)
            cluster.mesh.delay(i, j, delay)
            time.sleep(hold)
            cluster.mesh.heal()
            return f"delay {i}<->{j} by {delay * 1000:.0f} ms ({hold:.1f} s)"
        case "unobtainable":  # a missing or truncated GGUF: a clear error, never a hang
            model = rng.choice(sorted(BAD_MODELS))
            node = rng.choice(_answering(cluster))
            started = time.monotonic()
            outcome = run_one(node.url, rng.choice(KINDS), model, stream=rng.random() < 0.5,
                              deadline_s=REQUEST_DEADLINE_S, max_tokens=8)
            record = Record(outcome, node.index, started, time.monotonic())
            journal.unobtainable.append((model, record))
            return (f"unobtainable {model} on node {node.index}: {outcome.ending} "
                    f"{outcome.status} in {outcome.seconds:.1f} s")
        case _:  # delete_place: an acknowledged deletion, then a new placement
            node = rng.choice(_answering(cluster))
            state = node.state() or {"instances": {}}
            for iid in list(state["instances"]):
                r = httpx.delete(f"{node.url}/instance/{iid}", timeout=30)
                if r.status_code == 200:
                    journal.deleted.append(iid)
            _place(node)
            time.sleep(hold)
    return f"{kind} ({hold:.1f} s)"


@pytest.mark.parametrize("seed", SEEDS)
def test_chaos(cluster: ChaosCluster, seed: int) -> None:
    print(f"chaos seed {seed} (rerun: EXO_CHAOS_SEEDS={seed})")
    try:
        _run(cluster, seed)
    except BaseException:
        cluster.dump_stacks()  # a hung node shows where it hangs
        for node in cluster.nodes:
            print(f"===== node {node.index} (log: {node.log_path(node.starts)})\n"
                  f"{node.log()[-4000:]}")
        raise


def _run(cluster: ChaosCluster, seed: int) -> None:
    rng = random.Random(seed)
    wait_until(lambda: cluster.agreed() is not None, 90, "three nodes to agree")
    remove_missing_model(cluster.nodes[0].models_dir)  # every node listed it; now it is gone
    _check_cuts_are_real(cluster)
    _place(cluster.nodes[rng.randrange(3)])
    wait_until(lambda: any(_serving(s) for s in cluster.states() or []), 180, "the model")

    journal = Journal()
    stop = threading.Event()
    clients = [threading.Thread(target=_clients, args=(cluster, journal, seed * 10 + k, stop))
               for k in range(CLIENTS)]
    for client in clients:
        client.start()
    try:
        for step, kind in enumerate(schedule(rng, FAULTS_PER_RUN)):
            print(f"fault {step}: {_fault(cluster, journal, rng, kind)}", flush=True)
            time.sleep(rng.uniform(0.5, 3.0))
        cluster.mesh.heal()
        for node in cluster.nodes:
            node.cont()
        last_fault = time.monotonic()
        converged = _wait(lambda: cluster.agreed() is not None, CONVERGE_S)
        print(f"converged {converged:.1f} s after the last fault")
        wait_until(lambda: any(_serving(s) for s in cluster.states() or []), 180,
                   "the model to serve again")
        time.sleep(3)  # requests against the healed cluster
    finally:
        stop.set()
        for client in clients:
            client.join(REQUEST_DEADLINE_S + 10)
    _check_invariants(cluster, journal, last_fault)


def _wait(check: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    wait_until(check, timeout, f"convergence within {timeout} s of the last fault")
    return time.monotonic() - started


def _check_invariants(cluster: ChaosCluster, journal: Journal, last_fault: float) -> None:
    # Requests that just ended still move the state: agreement is when it holds still.
    states: list[dict[str, Any]] = []

    def agreed() -> bool:
        states[:] = cluster.agreed() or []
        return bool(states)

    wait_until(agreed, CONVERGE_S, "the nodes to agree at the end")
    state = states[0]
    endings: dict[str, int] = {}
    for r in journal.requests:
        endings[r.outcome.ending] = endings.get(r.outcome.ending, 0) + 1
    print(f"requests: {len(journal.requests)} {endings}")
    for r in journal.requests:
        if r.outcome.ending in ("error", "cut"):
            print(f"  node {r.node} {r.outcome.kind} stream={r.outcome.stream} "
                  f"{r.outcome.ending} {r.outcome.status}: {r.outcome.detail[:160]}")
    # Every request ended within its deadline; a cut connection only from a node that was
    # killed or stopped meanwhile.
    for r in journal.requests:
        assert r.outcome.ending != "hung", r
        if r.outcome.ending == "cut":
            assert journal.node_disrupted(r.node, r.started, r.ended), r
        if r.outcome.ending == "error":
            assert r.outcome.status != 500, r
    # A model no node can obtain is a clear error naming the cause, within the deadline
    # (a cut only from a node that was killed or stopped meanwhile).
    for model, r in journal.unobtainable:
        if r.outcome.ending == "cut" and journal.node_disrupted(r.node, r.started, r.ended):
            continue
        assert r.outcome.ending == "error", (model, r)
        assert r.outcome.status != 500, (model, r)
        assert model in r.outcome.detail and BAD_MODELS[model] in r.outcome.detail, (model, r)
    # A merge that dropped events is in the replicated log, not only in a log line (a
    # node that dropped some in its current run and lives has told the master).
    if any("cluster: dropping" in node.log() for node in cluster.nodes):
        assert state.get("last_merge_report") is not None, "a merge dropped events silently"
        print(f"last merge report: {state['last_merge_report']}")
    # No acknowledged deletion lost; the model is placed (an acknowledged placement).
    for iid in journal.deleted:
        assert iid not in state["instances"], f"deleted instance {iid} came back"
    assert _serving(state)
    # No stray processes: each node's children are exactly its live runners, and the
    # runners of killed nodes are gone.
    for node in cluster.nodes:
        node_id = node.node_id()
        hosted = [inst for inst in state["instances"].values()
                  if node_id in inst["shard_assignments"]["node_to_runner"]]
        wait_until(lambda node=node, hosted=hosted: len(node.runner_pids()) == len(hosted), 20,
                   f"node {node.index} to have {len(hosted)} runner processes")
    wait_until(lambda: not any(psutil.pid_exists(p) and _not_zombie(p) for p in journal.orphans),
               20, "the runners of killed nodes to exit")
    # Runner creations per instance within the backoff cap.
    for node in cluster.nodes:
        for iid, attempt in node.runner_creations():
            assert attempt <= EXO_MAX_INSTANCE_RETRIES, (node.index, iid, attempt)


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
