"""Parts of ``bench/split.py``: a streaming chat client that times every token, the figures
taken from a set of streams, a sampler of process-tree RSS, and the llama.cpp RPC row."""

import asyncio
import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from exo.tests.node_process import free_port


@dataclass
class Stream:
    started: float
    arrivals: list[float] = field(default_factory=list[float])
    tokens: int = 0  # from the final usage when the server gives it, else the chunks seen

    @property
    def ttft(self) -> float:
        return self.arrivals[0] - self.started

    @property
    def decode_tok_s(self) -> float:
        span = self.arrivals[-1] - self.arrivals[0]
        return (self.tokens - 1) / span if span > 0 and self.tokens > 1 else 0.0


async def chat_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> Stream:
    """One streaming chat completion; the time of every chunk that carries text."""
    stream = Stream(time.perf_counter())
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=payload) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{url}: {r.status_code} {(await r.aread()).decode()[:400]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if "error" in data:
                raise RuntimeError(f"{url}: {data['error']}")
            for choice in data.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    stream.arrivals.append(time.perf_counter())
            usage = data.get("usage")
            if usage:
                stream.tokens = int(usage["completion_tokens"])
    if not stream.arrivals:
        raise RuntimeError(f"{url}: a stream with no text")
    stream.tokens = stream.tokens or len(stream.arrivals)
    return stream


async def streams(url: str, body: dict[str, Any], n: int, timeout: float) -> list[Stream]:
    """``n`` concurrent streams of the same request."""
    async with httpx.AsyncClient(timeout=timeout) as client:
        return list(await asyncio.gather(*(chat_stream(client, url, body) for _ in range(n))))


@dataclass(frozen=True)
class Figures:
    decode_1: float  # tokens/s of one stream
    decode_n: float  # aggregate tokens/s of n concurrent streams
    ttft_p50: float  # seconds, over the n concurrent streams
    n: int


def aggregate(runs: Sequence[Stream]) -> float:
    """Tokens after each stream's first, over the time from the first first-token to the
    last token of any stream."""
    start = min(s.arrivals[0] for s in runs)
    end = max(s.arrivals[-1] for s in runs)
    return sum(s.tokens - 1 for s in runs) / (end - start) if end > start else 0.0


async def measure(url: str, body: dict[str, Any], n: int, timeout: float) -> Figures:
    [one] = await streams(url, body, 1, timeout)
    many = await streams(url, body, n, timeout)
    return Figures(one.decode_tok_s, aggregate(many), statistics.median(s.ttft for s in many), n)


def show(name: str, f: Figures) -> str:
    one = f"decode 1 stream {f.decode_1:.2f} tok/s; " if f.decode_1 else ""
    return (f"{name}: {one}{f.n} streams aggregate {f.decode_n:.2f} tok/s; "
            f"TTFT p50 under {f.n} streams {f.ttft_p50:.2f} s")


class RssSampler:
    """Peak RSS of each watched process tree (the process and its children), and of them
    all together (the host's share), sampled every ``interval`` seconds in a thread."""

    def __init__(self, interval: float = 0.2) -> None:
        self.roots: dict[str, int] = {}
        self.peaks: dict[str, int] = {}
        self.host_peak = 0
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, name: str, pid: int) -> None:
        self.roots[name] = pid

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            total = 0
            for name, pid in list(self.roots.items()):
                rss = _tree_rss(pid)
                total += rss
                self.peaks[name] = max(self.peaks.get(name, 0), rss)
            self.host_peak = max(self.host_peak, total)


def _tree_rss(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


# --- llama.cpp RPC -------------------------------------------------------------------------


@dataclass
class RpcSetup:
    server: Path
    rpc_server: Path
    model: Path
    n_layers: int
    log_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list[subprocess.Popen[bytes]])


def rpc_binaries() -> tuple[Path, Path] | str:
    """LLAMA_SERVER and LLAMA_RPC_SERVER from the environment, or why the row is skipped."""
    server, rpc = os.environ.get("LLAMA_SERVER"), os.environ.get("LLAMA_RPC_SERVER")
    if not server or not rpc:
        return ("LLAMA_SERVER / LLAMA_RPC_SERVER not set (build them with "
                "bench/build_llama_cpp.sh)")
    paths = (Path(server), Path(rpc))
    missing = [str(p) for p in paths if not p.is_file()]
    return f"not found: {', '.join(missing)}" if missing else paths


def _spawn(setup: RpcSetup, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    with (setup.log_dir / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    setup.procs.append(proc)
    return proc


async def start_rpc(setup: RpcSetup, ctx: int, slots: int) -> str:
    """Two ggml-rpc-server processes (1 thread each) holding about two thirds of the layers,
    and llama-server (1 thread) holding the rest; its URL once it answers /health."""
    ports = [free_port(), free_port()]
    for i, port in enumerate(ports):
        _spawn(setup, f"rpc{i}", [str(setup.rpc_server), "-H", "127.0.0.1", "-p", str(port),
                                  "-t", "1"])
    api = free_port()
    offloaded = setup.n_layers - setup.n_layers // 3  # the RPC devices hold these
    _spawn(setup, "llama-server", [
        str(setup.server), "-m", str(setup.model), "--host", "127.0.0.1", "--port", str(api),
        "--rpc", ",".join(f"127.0.0.1:{p}" for p in ports), "-ngl", str(offloaded),
        "--tensor-split", "1,1", "-t", "1", "-tb", "1", "-np", str(slots),
        "-c", str(ctx * slots), "--no-warmup",
    ])  # fmt: skip
    url = f"http://127.0.0.1:{api}"
    deadline = time.monotonic() + 900
    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in setup.procs):
                raise RuntimeError(f"a llama.cpp process exited; logs in {setup.log_dir}")
            try:
                if (await client.get(f"{url}/health")).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)  # polling a server that is loading, bounded above
    raise RuntimeError("llama-server did not answer /health within 900 s")


def stop_rpc(setup: RpcSetup) -> None:
    for p in setup.procs:
        p.terminate()
    for p in setup.procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    setup.procs.clear()
