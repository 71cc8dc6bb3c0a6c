"""Real node processes for end-to-end tests: started with the CLI, on 127.0.0.1."""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.02) -> None:
    """Poll a condition until it holds; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@dataclass
class NodeProcess:
    process: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=30, **kw)

    def state(self) -> dict[str, Any]:
        return self.get("/state").json()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def runner_pids(self) -> list[int]:
        """Live runner processes (children of the node started by multiprocessing spawn)."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        pids: list[int] = []
        for child in children:
            try:
                cmdline = " ".join(child.cmdline())
                if (
                    "multiprocessing" in cmdline
                    and "resource_tracker" not in cmdline
                    and child.status() != "zombie"
                ):
                    pids.append(child.pid)
            except psutil.NoSuchProcess:
                continue
        return pids

    def serving(self) -> bool:
        try:
            state = self.state()
        except httpx.HTTPError:
            return False
        instances = state["instances"].values()
        return any(
            all(
                state["runners"].get(rid, {}).get("kind") in ("RunnerReady", "RunnerRunning")
                for rid in inst["shard_assignments"]["runner_to_shard"]
            )
            for inst in instances
        )

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode


@contextmanager
def running_node(
    tmp: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    wait_ready: bool = True,
    timeout: float = 120,
) -> Generator[NodeProcess]:
    port = free_port()
    data_dir = tmp / f"node-{port}"
    log_path = tmp / f"node-{port}.log"
    # Tests never scout by multicast on the machine's real network: a node alone.
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "EXO_DISCOVERY_INTERFACE": "none",
                **(env or {})}
    cmd = [sys.executable, "-m", "exo.cli", "--api-port", str(port), "--data-dir",
           str(data_dir), "--threads", "1", *args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    node = NodeProcess(process, port, data_dir, log_path)
    try:
        def up() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"node exited early:\n{node.log()[-3000:]}")
            try:
                return node.get("/health").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout, "the node's API")
        if wait_ready:
            wait_until(node.serving, timeout, "the model to be served")
        yield node
    finally:
        runners = node.runner_pids()
        node.stop()
        for pid in runners:
            if psutil.pid_exists(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
