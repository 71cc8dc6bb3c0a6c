"""A model too big for one node, the whole journey at real size, over loopback nodes.

    python bench/split.py [--arch llama|qwen3moe] [--shape S] [--layers N] [--quant Q4_K_M]
                          [--rows ROWS] [--tokens N] [--lanes N] [--keep-trace DIR]
                          [--rounds N] [--model-cache DIR]

It generates a GGUF with random weights (``bench/make_model.py``) under a temp dir (removed
after; 15 GB of free disk is checked first): Llama-shaped by default (8b: 32 layers at width
4096, about 4.5 GB), or with ``--arch qwen3moe`` Qwen3-30B-A3B-shaped (its real blocks: 128
experts of width 768, 8 active; 8 of them unless ``--layers`` says, about 3 GB). It serves
it from the local hub stand-in (one per node, from disk, so each counts what its node
downloads), and runs its rows one after another, never two sets of big processes at once:

* ``baseline``: one node without a limit: cold first token (from the placement to the
  first token of the first request), download, load time and peak RSS, decode tok/s of 1
  stream and aggregate of ``--streams`` (8) concurrent streams, TTFT p50 under them;
* ``split``: 3 nodes, each with ``--memory-limit`` below the running size (a share of the
  baseline's placement estimate), placed over 3: the same figures per node, and the bytes
  each node downloaded against its shard's share (its tensors plus the file's header);
* ``rpc``: llama.cpp's RPC backend on the same file: ``llama-server --rpc`` holding a
  third of the layers, 2 ``ggml-rpc-server`` processes the rest, 1 thread each, EOS
  ignored (``LLAMA_SERVER`` / ``LLAMA_RPC_SERVER`` from the environment; skipped with a
  note when absent); ours against it for 1 and ``--streams`` streams;
* ``pipelined``: 16 concurrent streams on 1 node pinned to one core (the whole model)
  against 2 nodes pinned to a core each (a 2-stage pipeline with micro-batches in flight),
  with each stage's busy/idle trace (``--lanes``: the pipeline's micro-batches, else the
  runner's default).

``--rounds N`` runs the split and rpc rows N times one after another, the order swapping each
round, and compares each row's figures at their best over the rounds.

Ours: one runner thread per node, greedy, the end tokens biased away (``logit_bias``) so
every stream runs its ``--tokens``. Ends with one line:
``summary: download_share_max=R rpc_decode_1=R rpc_decode_8=R pipelined=R``.
On a machine shared with other work the figures are noisy; compare ratios of one run.
"""

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
from split_parts import (
    Figures,
    RpcSetup,
    RssSampler,
    aggregate,
    measure,
    rpc_binaries,
    show,
    start_rpc,
    stop_rpc,
    streams,
)

from exo.cluster.tests.nodes import NodeGroup, NodeProc, node_group, wait_until
from exo.cluster.tests.test_cluster_nodes import ids_of, wait_agreed
from exo.worker.download.tests.hub_server import FakeHub, serve_hub
from exo.worker.engines.gguf_reader import GGUFFile, eos_token_ids
from exo.worker.runner.stage_trace import TRACE_DIR_ENV, busy_fractions, format_traces, load_traces

REPOS = {"llama": "bench-org/Split-GGUF", "qwen3moe": "bench-org/Split-Qwen3-30B-A3B-GGUF"}
SHAPES = {"llama": "8b", "qwen3moe": "real-layer"}  # each architecture's default shape
LANES_ENV = "EXO_PIPELINE_LANES"  # microbatch.LANES_ENV (importing it would load torch here)
PROMPT = "Write a long story about a lighthouse keeper and the sea."
ROWS = ("baseline", "split", "rpc", "pipelined")
MiB = 1 << 20


@dataclass
class Model:
    repo: str
    path: Path
    quant: str
    n_layers: int
    header: int
    eos: tuple[int, ...]

    @property
    def model_id(self) -> str:
        return f"{self.repo}:{self.quant}"


@dataclass
class NodeFigures:
    name: str
    node_id: str
    downloaded: int = 0
    share: int = 0
    load_s: float = float("nan")
    peak_rss: int = 0
    layers: tuple[int, int] = (0, 0)


@dataclass
class Journey:
    cold_s: float
    placed_bytes: dict[str, int]
    nodes: list[NodeFigures] = field(default_factory=list[NodeFigures])
    figures: Figures | None = None
    host_peak: int = 0

    @property
    def share_max(self) -> float:
        return max((n.downloaded / (n.share + 0.0) for n in self.nodes if n.share), default=0.0)


def generate(args: argparse.Namespace, folder: Path) -> Model:
    """The file the rows serve: generated into ``folder``, or with ``--model-cache`` generated
    there once (per arch, shape, layers and quant) and linked into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"Split-{args.quant}.gguf"
    started = time.perf_counter()
    made = out
    if args.model_cache is not None:
        made = args.model_cache / f"split-{args.arch}-{args.shape}-{args.layers or 'all'}-{args.quant}.gguf"
        args.model_cache.mkdir(parents=True, exist_ok=True)
    if not made.exists():
        part = made.with_name(made.stem + ".partial.gguf")
        subprocess.run([sys.executable, str(Path(__file__).parent / "make_model.py"), args.arch,
                        "--shape", args.shape, "--quant", args.quant, "--out", str(part),
                        *(["--layers", str(args.layers)] if args.layers else [])], check=True)
        part.rename(made)
    if made != out:
        out.symlink_to(made.resolve())
    gguf = GGUFFile(out)
    try:
        n_layers = int(str(gguf.metadata[f"{gguf.metadata['general.architecture']}.block_count"]))
        header = min(t.offset for t in gguf.tensors.values())
        eos = eos_token_ids(gguf.metadata)
    finally:
        gguf.close()
    print(f"generated {out.name}: {out.stat().st_size / MiB:.0f} MiB, {n_layers} layers, "
          f"in {time.perf_counter() - started:.0f} s")
    return Model(REPOS[args.arch], out, args.quant, n_layers, header, eos)


def body(model: Model, tokens: int) -> dict[str, Any]:
    return {"model": model.model_id, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens, "temperature": 0,
            "logit_bias": {str(t): -100 for t in model.eos}}


class Cluster:
    """Nodes on loopback, each with a hub stand-in of its own and its own HF cache."""

    def __init__(self, group: NodeGroup, tmp: Path, model: Model, stack: ExitStack) -> None:
        self.group, self.tmp, self.model, self.stack = group, tmp, model, stack
        self.procs: list[NodeProc] = []
        self.hubs: list[FakeHub] = []
        self.caches: list[Path] = []

    def start(self, name: str, extra: list[str], core: int | None,
              env: dict[str, str]) -> NodeProc:
        hub = FakeHub()
        hub.add_folder(self.model.repo, self.model.path.parent, from_disk=True)
        self.stack.enter_context(serve_hub(hub))
        cache = self.tmp / f"hf-{name}"
        os.environ.update({"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": hub.url, **env})
        proc = self.group.start(name, [p.endpoint for p in self.procs], extra=extra)
        if core is not None:  # as taskset does: the node and every runner it starts
            os.sched_setaffinity(proc.process.pid, {core})
        self.procs.append(proc)
        self.hubs.append(hub)
        self.caches.append(cache)
        return proc

    async def up(self) -> None:
        await self.group.up(*self.procs, timeout=180)
        await wait_agreed(self.procs, set(await ids_of(*self.procs)))


async def journey(cluster: Cluster, min_nodes: int, sampler: RssSampler,
                  args: argparse.Namespace) -> Journey:
    """Place the model, wait for it to serve, time the first token; then what it cost."""
    model, first = cluster.model, cluster.procs[0]
    names = {await p.node_id(): p.name for p in cluster.procs}
    for p in cluster.procs:
        sampler.watch(p.name, p.process.pid)
    async with httpx.AsyncClient(timeout=600) as http:
        added = await http.post(f"{first.url}/models/add", json={"model": model.model_id})
        if added.status_code != 200:
            raise RuntimeError(f"/models/add: {added.text}")
        # (the first node's header read for the card counts: it is part of its download)
        t0 = time.perf_counter()
        placed = await http.post(f"{first.url}/place_instance",
                                 json={"model": model.model_id, "min_nodes": min_nodes})
        if placed.status_code != 200:
            raise RuntimeError(f"/place_instance: {placed.text}")
    loading: dict[str, float] = {}
    loaded: dict[str, float] = {}
    state: dict[str, Any] = {}

    async def serving() -> bool:
        nonlocal state
        state = await first.state()
        now = time.perf_counter()
        for rid, status in state["runners"].items():
            kind = status.get("kind")
            if kind == "RunnerLoading":
                loading.setdefault(rid, now)
            if kind in ("RunnerLoaded", "RunnerWarmingUp", "RunnerReady", "RunnerRunning"):
                loaded.setdefault(rid, now)
        runners = [r for i in state["instances"].values()
                   for r in i["shard_assignments"]["runner_to_shard"]]
        return bool(runners) and all(state["runners"].get(r, {}).get("kind") in
                                     ("RunnerReady", "RunnerRunning") for r in runners)

    await wait_until(serving, args.timeout, "the instance to serve", interval=0.2)
    [one] = await streams(first.url, body(model, 4), 1, args.timeout)
    result = Journey(one.arrivals[0] - t0, placed.json().get("memory_per_node", {}))
    [instance] = state["instances"].values()
    assignments = instance["shard_assignments"]
    for node_id, rid in assignments["node_to_runner"].items():
        name = names[node_id]
        i = [p.name for p in cluster.procs].index(name)
        shard = assignments["runner_to_shard"][rid]
        result.nodes.append(NodeFigures(
            name, node_id, cluster.hubs[i].bytes_sent(model.repo),
            share_bytes(model.path, shard["start_layer"], shard["end_layer"], model.n_layers)
            + model.header,
            loaded.get(rid, float("nan")) - loading.get(rid, float("nan")),
            layers=(shard["start_layer"], shard["end_layer"]),
        ))  # fmt: skip
    return result


def share_bytes(path: Path, start: int, end: int, n_layers: int) -> int:
    """The tensor bytes a stage of layers [start, end) needs from the whole file: its blocks,
    the embedding on the first stage, the head (or the tied embedding) on the last, and any
    other tensor everywhere."""
    gguf = GGUFFile(path)
    try:
        names = set(gguf.tensors)
        total = 0
        for name, t in gguf.tensors.items():
            if name.startswith("blk."):
                keep = start <= int(name.split(".")[1]) < end
            elif name == "token_embd.weight":
                keep = start == 0 or (end == n_layers and "output.weight" not in names)
            elif name.startswith("output"):
                keep = end == n_layers
            else:
                keep = True
            total += t.n_bytes if keep else 0
        return total
    finally:
        gguf.close()


def print_journey(name: str, j: Journey, sampler: RssSampler) -> None:
    print(f"{name}: cold first token {j.cold_s:.1f} s after the placement")
    for n in j.nodes:
        n.peak_rss = sampler.peaks.get(n.name, 0)
        ratio = n.downloaded / n.share if n.share else float("nan")
        print(f"  node {n.name} layers {n.layers[0]}-{n.layers[1]}: downloaded "
              f"{n.downloaded / MiB:.0f} MiB, share + header {n.share / MiB:.0f} MiB "
              f"({ratio:.3f}x), load {n.load_s:.1f} s, peak RSS {n.peak_rss / MiB:.0f} MiB, "
              f"placement's estimate {j.placed_bytes.get(n.node_id, 0) / MiB:.0f} MiB")
    if j.figures is not None:
        print("  " + show(name, j.figures))
    print(f"  host peak RSS (every node's processes together): {sampler.host_peak / MiB:.0f} MiB")


async def row_nodes(args: argparse.Namespace, tmp: Path, model: Model, label: str, count: int,
                    extra: list[str], cores: list[int] | None = None,
                    trace: Path | None = None, lanes: int | None = None) -> Journey:
    """``count`` nodes, the model placed over all of them; their figures."""
    async with AsyncExitStack() as astack:
        stack = astack.enter_context(ExitStack())
        group = await astack.enter_async_context(node_group(tmp / label))
        cluster = Cluster(group, tmp, model, stack)
        env = {TRACE_DIR_ENV: str(trace)} if trace is not None else {}
        if lanes is not None:
            env[LANES_ENV] = str(lanes)
        for i in range(count):
            cluster.start(f"{label}{i}", extra, cores[i] if cores else None, env)
        await cluster.up()
        with RssSampler() as sampler:
            j = await journey(cluster, count, sampler, args)
            if cores is None:
                j.figures = await measure(cluster.procs[0].url, body(model, args.tokens),
                                          args.streams, args.timeout)
            else:
                many = await streams(cluster.procs[0].url, body(model, args.tokens),
                                     args.pipelined_streams, args.timeout)
                j.figures = Figures(0.0, aggregate(many), statistics.median(s.ttft for s in many),
                                    len(many))
                if trace is not None:
                    await _collect_trace(cluster, trace, count, min(s.started for s in many),
                                         args.keep_trace)
            j.host_peak = sampler.host_peak
        print_journey(label, j, sampler)
        return j


async def _collect_trace(cluster: Cluster, trace: Path, stages: int, since: float,
                         keep: Path | None) -> None:
    """Delete the instance (its runners write their traces as they stop); print them."""
    state = await cluster.procs[0].state()
    [iid] = state["instances"]
    await cluster.procs[0].delete(f"/instance/{iid}")
    try:
        await wait_until(lambda: _count(trace, stages), 60, "every stage's trace")
    except AssertionError as e:
        print(f"  trace: {e}")
    traces = load_traces(trace)
    if keep is not None:
        shutil.copytree(trace, keep, dirs_exist_ok=True)
        print(f"  traces kept in {keep}")
    wall_since = time.time() - (time.perf_counter() - since)
    print(format_traces(traces, wall_since))
    busy = busy_fractions(traces, wall_since)
    print(f"  stages busy: {', '.join(f'stage {s} {b:.0%}' for s, b in busy.items())} "
          f"(target: each >= 80% at 16 streams)")


async def _count(folder: Path, n: int) -> bool:
    return len(list(folder.glob("stage*.json"))) >= n


async def row_rpc(args: argparse.Namespace, tmp: Path, model: Model, label: str = "rpc") -> Figures | None:
    found = rpc_binaries()
    if isinstance(found, str):
        print(f"rpc: skipped: {found}")
        return None
    logs = tmp / f"{label}-logs"
    logs.mkdir()
    setup = RpcSetup(found[0], found[1], model.path, model.n_layers, logs)
    try:
        started = time.perf_counter()
        url = await start_rpc(setup, ctx=args.tokens + 128, slots=args.streams)
        print(f"{label}: llama-server with 2 ggml-rpc-server up in {time.perf_counter() - started:.1f} s")
        request = {**body(model, args.tokens), "ignore_eos": True}
        request.pop("logit_bias")
        figures = await measure(url, request, args.streams, args.timeout)
        print("  " + show("llama.cpp RPC (3 processes, 1 thread each)", figures))
        return figures
    except (RuntimeError, httpx.HTTPError) as e:  # the row fails; the others stand
        print(f"rpc: failed: {e} (they are removed with the temp dir)")
        return None
    finally:
        stop_rpc(setup)


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "n/a"


def best_of(runs: list[Figures]) -> Figures:
    """Each figure at its best over the rounds (the most tok/s, the least TTFT)."""
    return Figures(max(f.decode_1 for f in runs), max(f.decode_n for f in runs),
                   min(f.ttft_p50 for f in runs), runs[0].n)


async def split_and_rpc(args: argparse.Namespace, tmp: Path, model: Model, rows: set[str],
                        base: Journey | None) -> tuple[Journey | None, Figures | None, Figures | None]:
    """The split and rpc rows, ``--rounds`` times, one after another, the order swapping each
    round (split first in odd rounds, rpc first in even ones); the split's journey from its
    first round, each row's figures at their best over the rounds (a machine whose speed
    drifts favours neither)."""
    split: Journey | None = None
    ours: list[Figures] = []
    theirs: list[Figures] = []
    limit = 0
    if "split" in rows and base is not None:
        need = max(base.placed_bytes.values(), default=model.path.stat().st_size)
        limit = int(need * args.limit_share)
        print(f"split: --memory-limit {limit / MiB:.0f} MiB per node (one node needs "
              f"{need / MiB:.0f} MiB: it must split)")
    for r in range(args.rounds):
        suffix = f"-r{r + 1}_" if args.rounds > 1 else ""
        order = ["split", "rpc"] if r % 2 == 0 else ["rpc", "split"]
        for row in [o for o in order if o in rows]:
            if row == "split" and limit:
                j = await row_nodes(args, tmp, model, f"split{suffix}", 3,
                                    ["--memory-limit", f"{limit // MiB}MiB"])
                split = split or j
                ours += [j.figures] if j.figures is not None else []
            elif row == "rpc":
                f = await row_rpc(args, tmp, model, f"rpc{suffix}")
                theirs += [f] if f is not None else []
        if ours and theirs:
            print(f"  round {r + 1}: ours (3 nodes) / llama.cpp RPC: 1 stream "
                  f"{ratio(ours[-1].decode_1, theirs[-1].decode_1)}x, {args.streams} streams "
                  f"{ratio(ours[-1].decode_n, theirs[-1].decode_n)}x")
    best_ours = best_of(ours) if ours else None
    best_theirs = best_of(theirs) if theirs else None
    if best_ours is not None and best_theirs is not None:
        best = f", each figure the best of {args.rounds} rounds" if args.rounds > 1 else ""
        print(f"  ours (3 nodes) / llama.cpp RPC{best}: 1 stream "
              f"{ratio(best_ours.decode_1, best_theirs.decode_1)}x ({best_ours.decode_1:.2f} "
              f"against {best_theirs.decode_1:.2f} tok/s), {args.streams} streams "
              f"{ratio(best_ours.decode_n, best_theirs.decode_n)}x ({best_ours.decode_n:.2f} "
              f"against {best_theirs.decode_n:.2f} tok/s)")
    return split, best_ours, best_theirs


async def run(args: argparse.Namespace, tmp: Path) -> None:
    model = generate(args, tmp / "repo")
    rows = set(args.rows.split(","))
    base: Journey | None = None
    pipelined: float | None = None
    if "baseline" in rows or "split" in rows:
        base = await row_nodes(args, tmp, model, "baseline", 1, [])
    split, s_fig, rpc = await split_and_rpc(args, tmp, model, rows, base)
    if "pipelined" in rows:
        pipelined = await row_pipelined(args, tmp, model)
    print(f"summary: download_share_max={f'{split.share_max:.3f}' if split else 'n/a'} "
          f"rpc_decode_1={ratio(s_fig.decode_1 if s_fig else None, rpc.decode_1 if rpc else None)} "
          f"rpc_decode_8={ratio(s_fig.decode_n if s_fig else None, rpc.decode_n if rpc else None)} "
          f"pipelined={f'{pipelined:.2f}' if pipelined is not None else 'n/a'}")


async def row_pipelined(args: argparse.Namespace, tmp: Path, model: Model) -> float | None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        print("pipelined: skipped: needs 2 cores")
        return None
    one = await row_nodes(args, tmp, model, "pinned-one", 1, [], cores=cores[:1])
    two = await row_nodes(args, tmp, model, "pinned-two", 2, [], cores=cores[:2],
                          trace=tmp / "stage-trace", lanes=args.lanes)
    assert one.figures is not None and two.figures is not None
    gain = two.figures.decode_n / one.figures.decode_n if one.figures.decode_n else 0.0
    print(f"pipelined: {args.pipelined_streams} streams, 2 nodes on a core each "
          f"{two.figures.decode_n:.2f} tok/s against 1 node on one core "
          f"{one.figures.decode_n:.2f} tok/s: {gain:.2f}x (target >= 1.6x)")
    return gain


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--arch", default="llama", choices=sorted(REPOS),
                    help="llama (Llama-3.1-8B-shaped) or qwen3moe (Qwen3-30B-A3B-shaped)")
    ap.add_argument("--shape", help="make_model.py's shape (llama: 8b, 1b, tiny; qwen3moe: "
                    "real-layer, tiny); default 8b for llama, real-layer for qwen3moe")
    ap.add_argument("--layers", type=int, help="blocks (default: the shape's)")
    ap.add_argument("--quant", default="Q4_K_M")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma list of {', '.join(ROWS)}")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per stream")
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--pipelined-streams", type=int, default=16)
    ap.add_argument("--keep-trace", type=Path, help="copy the stages' traces to this folder")
    ap.add_argument("--lanes", type=int,
                    help="micro-batches of the pipelined row (default: the runner's)")
    ap.add_argument("--limit-share", type=float, default=0.95,
                    help="each split node's --memory-limit, as a share of one node's need")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the split and rpc rows this many times, alternating which goes "
                    "first; each figure the best of the rounds")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--min-free-gb", type=float, default=15.0)
    ap.add_argument("--model-cache", type=Path,
                    help="keep the generated file in this folder and reuse it on later runs")
    args = ap.parse_args()
    args.shape = args.shape or SHAPES[args.arch]
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    unknown = set(args.rows.split(",")) - set(ROWS)
    if unknown:
        ap.error(f"unknown rows: {', '.join(sorted(unknown))}")
    # the nodes run this checkout's code (not whatever an editable install points at)
    src = str(Path(__file__).resolve().parents[1] / "src")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="exo-bench-split-") as tmp:
        free = shutil.disk_usage(tmp).free / 1e9
        if free < args.min_free_gb:
            sys.exit(f"split: {free:.1f} GB free under {tmp}; needs {args.min_free_gb:.0f} GB")
        print(f"{free:.0f} GB free under {tmp}; figures on a shared machine are noisy")
        asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
