"""Decode speed of a model split across runners, against one runner, on the embedded model.

    /work/venv/bin/python bench/distributed.py [--new-tokens 96] [--repeat 2] [--threads 1]

Real runner processes (``RunnerSupervisor``, as a node starts them), one thread each,
joined over torch.distributed (gloo on 127.0.0.1):

* one runner (the whole model);
* a 2-rank pipeline (rank 0 embeds and runs the first layers, rank 1 the rest and the
  head; activations and logits go by ``send``/``recv``);
* 3-way tensor parallelism (every rank a third of every layer; two ``all_reduce`` per
  layer, and a ``broadcast`` of each step from rank 0).

All runners are loaded first (idle ones must block: their CPU use is shown); then each
configuration answers the same chat prompt greedily, taking turns, ``--repeat`` times
(a shared machine's load then weighs on all alike). The best decode rate (tokens after
the first, per second, timed as chunks reach this process) is reported with its ratio
against one runner (target for the pipeline: >= 0.9). The runner
processes of this bench time every collective call (``torch.distributed`` wrapped with
``perf_counter`` in the runner processes this bench starts, nowhere else); the calls
made while tokens were decoded are summed per rank and divided by the tokens decoded.
Waiting counts: a ``recv`` lasts until the other stage has computed, an ``all_reduce``
until the slowest rank arrives.
"""

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import psutil

import exo.worker.runner.bootstrap as bootstrap
from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.types.common import CommandId
from exo.shared.types.events import Event
from exo.shared.types.tasks import (
    ConnectToGroup,
    LoadModel,
    StartWarmup,
    Task,
    TaskId,
    TextGeneration,
)
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.instances import (
    BoundInstance,
    Sharding,
)
from exo.utils.channels import MpReceiver, MpSender, channel
from exo.worker.runner.runner_supervisor import RunnerSupervisor
from exo.worker.runner.settings import RunnerSettings
from exo.worker.tests.test_distributed_runners import RunnerEvents, make_instance

STATS_DIR_ENV = "EXO_BENCH_COLLECTIVE_STATS"
TIMED = ("all_reduce", "broadcast", "send", "recv")
PROMPT = "Write a long story about a cat who travels around the world."


# --- in the runner processes --------------------------------------------------------------


def timed_entrypoint(
    bound_instance: BoundInstance,
    event_sender: MpSender[Event],
    task_receiver: MpReceiver[Task],
    cancel_receiver: MpReceiver[TaskId],
    settings: RunnerSettings,
) -> None:
    """The runner's own entry point, with every collective call timed; the calls
    (name, start, seconds) go to a file when the runner exits."""
    bootstrap.size_thread_pools(os.environ, settings.threads)  # before torch is imported
    import torch.distributed as dist

    from exo.worker.runner.bootstrap import entrypoint

    calls: list[tuple[str, float, float]] = []

    def timer(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()  # CLOCK_MONOTONIC: the same clock in every process
            try:
                return original(*args, **kwargs)
            finally:
                calls.append((name, started, time.perf_counter() - started))

        return timed

    for name in TIMED:
        setattr(dist, name, timer(name, getattr(dist, name)))
    try:
        entrypoint(bound_instance, event_sender, task_receiver, cancel_receiver, settings)
    finally:
        folder = os.environ.get(STATS_DIR_ENV)
        if folder:
            path = Path(folder) / f"{bound_instance.bound_runner_id}.json"
            path.write_text(json.dumps(calls))


# --- in this process ----------------------------------------------------------------------


@dataclass
class Run:
    decode_tok_s: float
    tokens: int
    window: tuple[float, float]  # first and last chunk, perf_counter


@dataclass
class Config:
    name: str
    sharding: Sharding
    world: int
    supervisors: list[RunnerSupervisor] = field(default_factory=list[RunnerSupervisor])
    runs: list[Run] = field(default_factory=list[Run])
    calls: dict[int, list[tuple[str, float, float]]] = field(
        default_factory=dict[int, list[tuple[str, float, float]]]
    )

    @property
    def best(self) -> Run:
        return max(self.runs, key=lambda r: r.decode_tok_s)


class Bench:
    """Every configuration's runners, loaded once; generations run one at a time, the
    configurations taking turns (a shared machine's load then weighs on all alike)."""

    def __init__(self, configs: list[Config], args: argparse.Namespace, tmp: Path) -> None:
        self.configs = configs
        self.args = args
        self.stats = tmp / "stats"
        self.stats.mkdir()
        send, events = channel[Event]()
        self.seen = RunnerEvents(events)
        settings = RunnerSettings(
            cache_dir=tmp / "cache", models_dir=tmp / "models", threads=args.threads
        )
        setattr(bootstrap, "entrypoint", timed_entrypoint)  # noqa: B010  # used by create()
        os.environ[STATS_DIR_ENV] = str(self.stats)  # the runners inherit it at spawn
        for config in configs:
            instance = make_instance(config.sharding, config.world)
            config.supervisors = [
                RunnerSupervisor.create(
                    BoundInstance(instance=instance, bound_runner_id=rid, bound_node_id=nid),
                    send.clone(),
                    settings,
                )
                for nid, rid in instance.shard_assignments.node_to_runner.items()
            ]

    @property
    def supervisors(self) -> list[RunnerSupervisor]:
        return [s for c in self.configs for s in c.supervisors]

    def all_in(self, kind: str, supervisors: list[RunnerSupervisor]) -> bool:
        return all(type(self.seen.status.get(s.runner_id)).__name__ == kind for s in supervisors)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            for s in self.supervisors:
                tg.start_soon(s.run)
            grouped = [s for c in self.configs if c.world > 1 for s in c.supervisors]
            for s in grouped:
                tg.start_soon(
                    s.start_task, ConnectToGroup(instance_id=s.bound_instance.instance.instance_id)
                )
            await self.seen.until(lambda: self.all_in("RunnerConnected", grouped), 180)
            await self.phase(tg, LoadModel, "RunnerLoaded", 600)
            await self.phase(tg, StartWarmup, "RunnerReady", 300)
            await self.idle_cpu()
            for i in range(self.args.repeat):
                for config in self.configs:
                    await self.generate(config, i)
            for s in self.supervisors:
                tg.start_soon(s.stop)
        for config in self.configs:
            for s in config.supervisors:
                path = self.stats / f"{s.runner_id}.json"
                if path.exists():
                    loaded: list[list[Any]] = json.loads(path.read_text())
                    config.calls[s.bound_instance.bound_shard.device_rank] = [
                        (str(n), float(t), float(d)) for n, t, d in loaded
                    ]

    async def phase(
        self,
        tg: anyio.abc.TaskGroup,
        task: type[LoadModel] | type[StartWarmup],
        reached: str,
        timeout: float,
    ) -> None:
        print(f"{task.__name__} ...", flush=True)
        for s in self.supervisors:
            tg.start_soon(s.start_task, task(instance_id=s.bound_instance.instance.instance_id))
        await self.seen.until(lambda: self.all_in(reached, self.supervisors), timeout)

    async def idle_cpu(self) -> None:
        """Runners with nothing to do must block, not spin: their CPU use over a second."""
        procs = [psutil.Process(s.pid) for s in self.supervisors if s.pid is not None]
        before = [sum(p.cpu_times()[:2]) for p in procs]
        await anyio.sleep(1.0)
        used = [sum(p.cpu_times()[:2]) - b for p, b in zip(procs, before, strict=True)]
        print(f"idle runners' CPU over 1 s: {', '.join(f'{100 * u:.0f}%' for u in used)}")

    async def generate(self, config: Config, i: int) -> None:
        command = CommandId(f"{config.name}-{i}")
        params = TextGenerationTaskParams(
            model=EMBEDDED_MODEL_ID,
            input=[InputMessage(role="user", content=PROMPT)],
            temperature=0.0,
            max_tokens=self.args.new_tokens,
        )
        leader = config.supervisors[0]
        await leader.start_task(
            TextGeneration(
                task_id=TaskId(f"task-{config.name}-{i}".replace(" ", "-")),
                instance_id=leader.bound_instance.instance.instance_id,
                command_id=command,
                task_params=params,
            )
        )
        await self.seen.until(lambda: command in self.seen.finished, 600)
        times = self.seen.arrivals[command]
        if len(times) < 8:
            raise RuntimeError(f"{config.name}: only {len(times)} tokens; try another prompt")
        rate = (len(times) - 1) / (times[-1] - times[0])
        config.runs.append(Run(rate, len(times), (times[0], times[-1])))
        print(f"  {config.name}: run {i + 1}: {rate:.1f} tok/s ({len(times)} tokens)", flush=True)


async def bench(configs: list[Config], args: argparse.Namespace, tmp: Path) -> None:
    await Bench(configs, args, tmp).run()  # supervisors are made inside the event loop


def collective_summary(config: Config) -> list[str]:
    """Per rank: milliseconds per decoded token in each kind of collective call, and
    outside them (computing, or anything else that is not a collective call). For a
    pipeline, the token time minus the ranks' time outside collectives is what passing
    the step along costs beyond the stages' own work."""
    best = config.best
    start, end = best.window
    tokens = best.tokens - 1
    per_token_ms = 1000 * (end - start) / tokens
    lines: list[str] = []
    outside: list[float] = []
    for rank in sorted(config.calls):
        spent: dict[str, float] = {}
        count: dict[str, int] = {}
        for name, started, seconds in config.calls[rank]:
            if start <= started <= end:
                spent[name] = spent.get(name, 0.0) + seconds
                count[name] = count.get(name, 0) + 1
        total_ms = 1000 * sum(spent.values()) / tokens
        outside.append(per_token_ms - total_ms)
        parts = ", ".join(
            f"{name} {1000 * spent[name] / tokens:.2f} ms ({count[name] / tokens:.0f}/token)"
            for name in TIMED
            if name in spent
        )
        lines.append(
            f"    rank {rank}: {total_ms:6.2f} ms/token in collectives ({parts or 'none'}); "
            f"{outside[-1]:.2f} ms outside"
        )
    if config.sharding == "pipeline" and outside:
        lines.append(
            f"    passing the step along: {per_token_ms - sum(outside):.2f} ms/token "
            f"(token time {per_token_ms:.2f} ms minus the stages' {sum(outside):.2f} ms)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="threads per runner")
    args = parser.parse_args()
    configs = [
        Config("one runner", "pipeline", 1),
        Config("pipeline x2", "pipeline", 2),
        Config("tensor x3", "tensor", 3),
    ]
    with tempfile.TemporaryDirectory(prefix="exo-bench-dist-") as tmp:
        anyio.run(bench, configs, args, Path(tmp))
    base = configs[0].best.decode_tok_s
    print(
        f"\nembedded model, {args.threads} thread(s) per runner, greedy, "
        f"best of {args.repeat}, up to {args.new_tokens} new tokens"
    )
    for config in configs:
        rate = config.best.decode_tok_s
        print(
            f"  {config.name:12s} {rate:6.1f} tok/s  {rate / base:5.2f}x one runner  "
            f"({1000 / rate:.1f} ms/token)"
        )
        if config.world > 1:
            print("\n".join(collective_summary(config)))
    ratio = configs[1].best.decode_tok_s / base
    print(f"pipeline target >= 0.90x: {'met' if ratio >= 0.9 else 'NOT met'} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
