"""Real node processes on 127.0.0.1 for cluster tests: ``python -m exo.cli`` with
``--model none``, explicit loopback endpoints (or multicast on ``lo``), short timeouts.
Every process a group starts is killed when the group closes."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from exo.tests.node_process import free_port

SECRET = "cluster-test-secret"
NODE_TIMEOUT_S = 2.0


async def wait_until(
    check: Callable[[], Awaitable[bool]], timeout: float, what: str, interval: float = 0.05
) -> float:
    """Poll ``check`` until it holds; returns the seconds it took; fails after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if await check():
            return time.monotonic() - started
        await anyio.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@dataclass
class NodeProc:
    name: str
    data_dir: Path
    api_port: int
    cluster_port: int
    args: list[str]
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def endpoint(self) -> str:
        return f"tcp/127.0.0.1:{self.cluster_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def get(self, path: str) -> Any:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(self.url + path)
            response.raise_for_status()
            return response.json()

    async def delete(self, path: str) -> Any:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.delete(self.url + path)
            response.raise_for_status()
            return response.json()

    async def state(self) -> dict[str, Any]:
        return await self.get("/state")

    async def try_state(self) -> dict[str, Any] | None:
        try:
            return await self.state()
        except httpx.HTTPError:
            return None

    async def node_id(self) -> str:
        return await self.get("/node_id")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)


@dataclass
class NodeGroup:
    tmp: Path
    procs: list[NodeProc] = field(default_factory=list[NodeProc])

    def start(
        self,
        name: str,
        peers: Sequence[str] = (),
        *,
        secret: str = SECRET,
        extra: Sequence[str] = (),
        data_dir: Path | None = None,
        cluster_port: int | None = None,
        listen: str | None = None,
    ) -> NodeProc:
        """``listen=""``: no --listen (a node that joins through a router with --connect)."""
        data_dir = data_dir or self.tmp / name
        api_port = free_port()
        cluster_port = cluster_port or free_port()
        args = [
            "--model", "none", "--threads", "1", "--log-level", "DEBUG",
            "--api-port", str(api_port), "--data-dir", str(data_dir),
            *(["--listen", listen or f"tcp/127.0.0.1:{cluster_port}"] if listen != "" else []),
            "--secret", secret, "--node-timeout", str(NODE_TIMEOUT_S),
            *(arg for peer in peers for arg in ("--peer", peer)),
            *extra,
        ]
        self.tmp.mkdir(parents=True, exist_ok=True)
        log_path = self.tmp / f"{name}-{len(self.procs)}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "EXO_DISCOVERY_INTERFACE": "none"}
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "exo.cli", *args], stdout=log, stderr=subprocess.STDOUT,
                env=env,
            )
        proc = NodeProc(name, data_dir, api_port, cluster_port, args, process, log_path)
        self.procs.append(proc)
        return proc

    async def up(self, *procs: NodeProc, timeout: float = 30) -> None:
        """Until every one answers on its API."""
        for proc in procs:

            async def answers(proc: NodeProc = proc) -> bool:
                if proc.process.poll() is not None:
                    raise AssertionError(f"{proc.name} exited:\n{proc.log()[-4000:]}")
                return await proc.try_state() is not None

            await wait_until(answers, timeout, f"{proc.name}'s API")

    def logs(self) -> str:
        return "\n".join(f"===== {p.name}\n{p.log()[-3000:]}" for p in self.procs)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()


@asynccontextmanager
async def node_group(tmp: Path) -> AsyncGenerator[NodeGroup]:
    group = NodeGroup(tmp)
    try:
        yield group
    except BaseException:
        print(group.logs())
        raise
    finally:
        group.close()


async def agreed_states(procs: Sequence[NodeProc]) -> list[dict[str, Any]] | None:
    """The nodes' states when they all agree (same last index, same nodes), else None."""
    states = [await proc.try_state() for proc in procs]
    if any(s is None for s in states):
        return None
    complete = [s for s in states if s is not None]
    first = complete[0]
    for s in complete[1:]:
        if s["last_event_applied_idx"] != first["last_event_applied_idx"]:
            return None
        if set(s["nodes"]) != set(first["nodes"]) or s["instances"] != first["instances"]:
            return None
    return complete
