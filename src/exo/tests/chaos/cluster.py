"""Three real node processes whose cluster links all go through a ``Mesh`` of proxies
(gossip and multicast off, so zenoh cannot connect around them), and what the chaos test
does to them: kill, restart with the data dir, stop and continue a process group."""

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from exo.tests.chaos.proxy import Mesh
from exo.tests.node_process import free_port
from exo.worker.download.embedded import find_embedded_gguf

SECRET = "chaos-secret"
NODE_TIMEOUT_S = 2.0
ENV = {
    "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", "EXO_DISCOVERY_INTERFACE": "none", "EXO_CLUSTER_GOSSIP": "0",
    "EXO_INSTANCE_BACKOFF_BASE_S": "0.3", "EXO_INSTANCE_BACKOFF_MAX_S": "3",
}
_CREATED = re.compile(r"creating runner for instance (\S+) \(attempt (\d+)\)")


BAD_MODELS = {"missing-model": "not found", "broken-model": "truncated"}
"""Models no node can obtain (after ``remove_missing_model``), and what their error says."""


def bad_models(folder: Path) -> Path:
    """A models folder that every node serves: ``broken-model``, a GGUF cut off after its
    header, and ``missing-model``, a whole copy that the test removes once the nodes
    listed it (its card is known, its file is gone)."""
    source = find_embedded_gguf()
    assert source is not None
    folder.mkdir(parents=True, exist_ok=True)
    with source.open("rb") as src, (folder / "broken-model.gguf").open("wb") as dst:
        dst.write(src.read(30_000_000))
    shutil.copyfile(source, folder / "missing-model.gguf")
    return folder


def remove_missing_model(folder: Path) -> None:
    (folder / "missing-model.gguf").unlink(missing_ok=True)


@dataclass(eq=False)
class ChaosNode:
    index: int
    data_dir: Path
    cluster_port: int
    api_port: int
    log_dir: Path
    peers: list[str]
    models_dir: Path
    extra: list[str] = field(default_factory=list[str])
    """More command-line options (``--force-master``, ``--memory-limit``)."""
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    stopped: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def start(self) -> None:
        self.starts += 1
        args = [sys.executable, "-m", "exo.cli", "--model", "none", "--threads", "1",
                "--log-level", "debug", "--api-port", str(self.api_port),
                "--data-dir", str(self.data_dir), "--listen",
                f"tcp/127.0.0.1:{self.cluster_port}", "--secret", SECRET,
                "--node-timeout", str(NODE_TIMEOUT_S), "--models-dir", str(self.models_dir),
                *(a for p in self.peers for a in ("--peer", p)), *self.extra]
        with self.log_path(self.starts).open("wb") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                            env={**os.environ, **ENV}, start_new_session=True)
        self.stopped = False

    def log_path(self, start: int) -> Path:
        return self.log_dir / f"node{self.index}-{start}.log"

    def log(self) -> str:
        return self.log_path(self.starts).read_text(errors="replace")

    def all_logs(self) -> str:
        return "".join(self.log_path(s).read_text(errors="replace")
                       for s in range(1, self.starts + 1))

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the node; its runners notice their parent is gone and exit."""
        if self.process is not None and self.alive:
            self.cont()
            self.process.kill()
            self.process.wait(10)

    def stop_group(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        if self.process is not None and self.stopped:
            os.killpg(self.process.pid, signal.SIGCONT)
        self.stopped = False

    def state(self) -> dict[str, Any] | None:
        if not self.alive or self.stopped:
            return None
        try:
            return httpx.get(self.url + "/state", timeout=5).json()
        except (httpx.HTTPError, ValueError):
            return None

    def node_id(self) -> str:
        return (self.data_dir / "node_id").read_text().strip()

    def runner_pids(self) -> list[int]:
        if self.process is None:
            return []
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found: list[int] = []
        for child in children:
            try:
                cmd = " ".join(child.cmdline())
                if ("multiprocessing" in cmd and "resource_tracker" not in cmd
                        and child.status() != psutil.STATUS_ZOMBIE):
                    found.append(child.pid)
            except psutil.NoSuchProcess:
                continue
        return found

    def runner_creations(self) -> list[tuple[str, int]]:
        return [(iid, int(n)) for iid, n in _CREATED.findall(self.all_logs())]


@dataclass(eq=False)
class ChaosCluster:
    nodes: list[ChaosNode]
    mesh: Mesh
    events: list[str] = field(default_factory=list[str])

    @classmethod
    def start(cls, tmp: Path, n: int = 3, *, extra: dict[int, list[str]] | None = None,
              start: bool = True) -> "ChaosCluster":
        """``extra``: more options per node index; ``start``: start every node now (else
        the caller starts them, in its order)."""
        ports = [free_port() for _ in range(n)]
        mesh = Mesh.start(ports)
        models = bad_models(tmp / "models")
        nodes = [ChaosNode(i, tmp / f"node{i}", ports[i], free_port(), tmp, mesh.peers_of(i),
                           models, list((extra or {}).get(i, []))) for i in range(n)]
        for node in nodes if start else []:
            node.start()
        return cls(nodes, mesh)

    def dump_stacks(self) -> None:
        """Every live node writes its threads' stacks to its log (SIGABRT, faulthandler)."""
        for node in self.nodes:
            if node.alive and node.process is not None:
                node.cont()
                node.process.send_signal(signal.SIGABRT)
                try:
                    node.process.wait(10)
                except subprocess.TimeoutExpired:
                    pass

    def close(self) -> None:
        for node in self.nodes:
            pids = node.runner_pids()
            node.kill()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.mesh.close()

    def live(self) -> list[ChaosNode]:
        return [n for n in self.nodes if n.alive and not n.stopped]

    def states(self) -> list[dict[str, Any]] | None:
        states = [n.state() for n in self.nodes]
        if any(s is None for s in states):
            return None
        return [s for s in states if s is not None]

    def agreed(self) -> list[dict[str, Any]] | None:
        """Every node up, and all hold the same state (same index, nodes, instances)."""
        states = self.states()
        if states is None:
            return None
        first = states[0]
        for s in states[1:]:
            if (s["last_event_applied_idx"] != first["last_event_applied_idx"]
                    or s["instances"] != first["instances"]
                    or set(s["nodes"]) != set(first["nodes"])
                    or s["runners"] != first["runners"]):
                return None
        if len(first["nodes"]) != len(self.nodes):
            return None
        return states

    def master_index(self) -> int | None:
        for node in self.live():
            if "is the master" in node.log():
                last_master = node.log().rfind("is the master")
                last_down = node.log().rfind("steps down as master")
                if last_master > last_down:
                    return node.index
        return None
