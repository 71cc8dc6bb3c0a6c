"""Benchmarks of the pure core: ``apply`` throughput and ``plan`` latency.

Run: ``python bench/core.py`` (``--profile`` adds a cProfile of apply).
Targets: apply >= 20,000 events/s on a state of 1,000 tasks and 100 runners;
plan < 1 ms with 10 instances and 200 tasks.
"""

import argparse
import cProfile
import pstats
import statistics
import time
from collections.abc import Callable, Mapping

from exo.shared.apply import apply
from exo.shared.models.embedded import embedded_model_card
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import (
    Event,
    IndexedEvent,
    InstanceCreated,
    NodeDownloadProgress,
    NodeGatheredInfo,
    RunnerStatusUpdated,
    TaskAcknowledged,
    TaskCreated,
    TaskStatusUpdated,
    TopologyEdgeCreated,
)
from exo.shared.types.memory import Memory
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.state import State
from exo.shared.types.tasks import Task, TaskId, TaskStatus, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.topology import Connection
from exo.shared.types.worker.downloads import DownloadCompleted, DownloadOngoing
from exo.shared.types.worker.instances import BoundInstance, Instance, InstanceId, ShardAssignments
from exo.shared.types.worker.runners import (
    RunnerId,
    RunnerReady,
    RunnerRunning,
    RunnerStatus,
)
from exo.shared.types.worker.shards import PipelineShardMetadata
from exo.utils.backoff import KeyedBackoff
from exo.worker.plan import LocalRunner, RunnerView, plan

MODEL = embedded_model_card()


# ---------------------------------------------------------------- builders


def node_id(i: int) -> NodeId:
    return NodeId(f"node-{i:02d}")


def node_info(i: int, free_mb: int = 16_000) -> NodeInfo:
    return NodeInfo(
        hostname=f"host-{i:02d}",
        cpu_count=8,
        memory_total=Memory.from_mb(32_000),
        memory_available=Memory.from_mb(free_mb),
    )


def pipeline_instance(index: int, nodes: list[NodeId], card: ModelCard = MODEL) -> Instance:
    """An instance over ``nodes``, layers split evenly, runner ids ``inst-<i>-<rank>``."""
    iid = InstanceId(f"inst-{index:03d}")
    per = card.n_layers // len(nodes)
    runner_to_shard: dict[RunnerId, PipelineShardMetadata] = {}
    node_to_runner: dict[NodeId, RunnerId] = {}
    for rank, nid in enumerate(nodes):
        end = card.n_layers if rank == len(nodes) - 1 else (rank + 1) * per
        rid = RunnerId(f"{iid}-{rank}")
        runner_to_shard[rid] = PipelineShardMetadata(
            model_card=card,
            device_rank=rank,
            world_size=len(nodes),
            start_layer=rank * per,
            end_layer=end,
            n_layers=card.n_layers,
        )
        node_to_runner[nid] = rid
    return Instance(
        instance_id=iid,
        sharding="pipeline",
        shard_assignments=ShardAssignments(
            model_id=card.model_id, runner_to_shard=runner_to_shard, node_to_runner=node_to_runner
        ),
    )


def generation_task(index: int, instance_id: InstanceId, status: TaskStatus) -> TextGeneration:
    return TextGeneration(
        task_id=TaskId(f"task-{index:06d}"),
        instance_id=instance_id,
        task_status=status,
        command_id=CommandId(f"cmd-{index:06d}"),
        task_params=TextGenerationTaskParams(
            model=MODEL.model_id,
            input=[InputMessage(role="user", content=f"Question number {index}?")],
            max_tokens=128,
        ),
        origin_node_id=node_id(index % 10),
    )


def runner_ids(instance: Instance) -> list[RunnerId]:
    return list(instance.shard_assignments.runner_to_shard)


# ---------------------------------------------------------------- apply


def build_apply_state(
    n_nodes: int = 10, n_instances: int = 50, n_tasks: int = 1_000
) -> tuple[State, list[Instance]]:
    """50 two-node instances (100 runners, all ready) and 1,000 tasks, built through
    ``apply`` itself so the state is exactly what a node would hold."""
    nodes = [node_id(i) for i in range(n_nodes)]
    instances = [
        pipeline_instance(i, [nodes[i % n_nodes], nodes[(i + 1) % n_nodes]])
        for i in range(n_instances)
    ]
    events: list[Event] = [
        NodeGatheredInfo(node_id=n, info=node_info(i)) for i, n in enumerate(nodes)
    ]
    events += [
        TopologyEdgeCreated(connection=Connection(source=a, sink=b))
        for a in nodes
        for b in nodes
        if a != b
    ]
    events += [
        NodeDownloadProgress(
            node_id=n, model_id=MODEL.model_id, progress=DownloadCompleted(path="/models/smol.gguf")
        )
        for n in nodes
    ]
    events += [InstanceCreated(instance=inst) for inst in instances]
    events += [
        RunnerStatusUpdated(runner_id=rid, runner_status=RunnerReady())
        for inst in instances
        for rid in runner_ids(inst)
    ]
    events += [
        TaskCreated(
            task_id=TaskId(f"task-{i:06d}"),
            task=generation_task(i, instances[i % n_instances].instance_id, TaskStatus.Pending),
        )
        for i in range(n_tasks)
    ]
    state = State()
    for idx, event in enumerate(events):
        state = apply(state, IndexedEvent(idx=idx, event=event))
    return state, instances


def event_stream(state: State, instances: list[Instance], n_events: int) -> list[IndexedEvent]:
    """A steady stream over the life of requests: the oldest task is acknowledged, its
    runners go running, it completes, a new request arrives; nodes report memory and a
    download makes progress now and then. The task count stays at about 1,000."""
    first_idx = state.last_event_applied_idx + 1
    pending = list(state.tasks)
    next_task = len(pending)
    events: list[Event] = []
    cycle = 0
    while len(events) < n_events:
        task_id = pending[cycle % len(pending)]
        task = state.tasks[task_id]
        instance = next(i for i in instances if i.instance_id == task.instance_id)
        rids = runner_ids(instance)
        events.append(TaskAcknowledged(task_id=task_id))
        events.append(TaskStatusUpdated(task_id=task_id, task_status=TaskStatus.Running))
        events += [RunnerStatusUpdated(runner_id=r, runner_status=RunnerRunning()) for r in rids]
        events.append(TaskStatusUpdated(task_id=task_id, task_status=TaskStatus.Complete))
        events += [RunnerStatusUpdated(runner_id=r, runner_status=RunnerReady()) for r in rids]
        new_task = generation_task(next_task, instance.instance_id, TaskStatus.Pending)
        events.append(TaskCreated(task_id=new_task.task_id, task=new_task))
        pending[cycle % len(pending)] = new_task.task_id
        state = state.model_copy(update={"tasks": {**state.tasks, new_task.task_id: new_task}})
        next_task += 1
        n = node_id(cycle % 10)
        events.append(NodeGatheredInfo(node_id=n, info=node_info(cycle % 10, 16_000 - cycle % 97)))
        if cycle % 4 == 0:
            events.append(
                NodeDownloadProgress(
                    node_id=n,
                    model_id=ModelId("other/model"),
                    progress=DownloadOngoing(downloaded_bytes=cycle, total_bytes=10**9),
                )
            )
        cycle += 1
    return [
        IndexedEvent(idx=first_idx + i, event=event) for i, event in enumerate(events[:n_events])
    ]


def bench_apply(n_events: int, profile: bool) -> None:
    state, instances = build_apply_state()
    stream = event_stream(state, instances, n_events)
    print(
        f"apply: state with {len(state.tasks)} tasks, {len(state.runners)} runners, "
        f"{len(state.instances)} instances, {len(state.nodes)} nodes; {len(stream)} events"
    )
    kinds: dict[str, int] = {}
    for e in stream:
        kinds[e.event.kind] = kinds.get(e.event.kind, 0) + 1
    print("  mix: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))

    def run() -> State:
        s = state
        for indexed in stream:
            s = apply(s, indexed)
        return s

    run()  # warm up
    times: list[float] = []
    cpu_times: list[float] = []
    final = state
    for _ in range(3):
        start, start_cpu = time.perf_counter(), time.thread_time()
        final = run()
        cpu_times.append(time.thread_time() - start_cpu)
        times.append(time.perf_counter() - start)
    best, best_cpu = min(times), min(cpu_times)
    print(
        f"  wall: {len(stream) / best:,.0f} events/s (best of 3; median "
        f"{len(stream) / statistics.median(times):,.0f}), {best / len(stream) * 1e6:.1f} us/event\n"
        f"  cpu:  {len(stream) / best_cpu:,.0f} events/s, "
        f"{best_cpu / len(stream) * 1e6:.1f} us/event; "
        f"final state: {len(final.tasks)} tasks, {len(final.runners)} runners"
    )
    per_kind(state, stream)
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(run)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def per_kind(state: State, stream: list[IndexedEvent]) -> None:
    """Cost of each event kind, measured on the state it meets in the stream."""
    cost: dict[str, float] = {}
    count: dict[str, int] = {}
    s = state
    for indexed in stream:
        start = time.perf_counter()
        s = apply(s, indexed)
        elapsed = time.perf_counter() - start
        kind = indexed.event.kind
        cost[kind] = cost.get(kind, 0.0) + elapsed
        count[kind] = count.get(kind, 0) + 1
    for kind in sorted(cost, key=lambda k: -cost[k]):
        print(f"    {kind:<22} {cost[kind] / count[kind] * 1e6:7.1f} us/event")


# ---------------------------------------------------------------- plan


def build_plan_state(
    n_instances: int = 10, n_tasks: int = 200, pending_tail: bool = False
) -> tuple[State, dict[RunnerId, LocalRunner], NodeId]:
    """10 instances over 4 nodes, every runner ready, 200 requests; this node (node-00)
    holds 5 runners, each busy with its instance's running requests. With
    ``pending_tail`` the last request is pending and plan forwards it."""
    nodes = [node_id(i) for i in range(4)]
    instances = [
        pipeline_instance(i, [nodes[i % 4], nodes[(i + 1) % 4]]) for i in range(n_instances)
    ]
    me = nodes[0]
    # The last request for an instance with a runner here: the worst case to find.
    last_local = max(
        i
        for i in range(n_tasks)
        if me in instances[i % n_instances].shard_assignments.node_to_runner
    )
    tasks: dict[TaskId, Task] = {}
    for i in range(n_tasks):
        pending = pending_tail and i == last_local
        status = TaskStatus.Pending if pending else TaskStatus.Running
        task = generation_task(i, instances[i % n_instances].instance_id, status)
        tasks[task.task_id] = task
    statuses: dict[RunnerId, RunnerStatus] = {
        rid: RunnerRunning() for inst in instances for rid in runner_ids(inst)
    }
    local: dict[RunnerId, LocalRunner] = {}
    for inst in instances:
        rid = inst.shard_assignments.node_to_runner.get(me)
        if rid is None:
            continue
        in_progress: Mapping[TaskId, Task] = {
            tid: t
            for tid, t in tasks.items()
            if t.instance_id == inst.instance_id and t.task_status != TaskStatus.Pending
        }
        local[rid] = RunnerView(
            bound_instance=BoundInstance(instance=inst, bound_runner_id=rid, bound_node_id=me),
            status=RunnerRunning(),
            in_progress=in_progress,
        )
    state = State(
        instances={inst.instance_id: inst for inst in instances},
        runners=statuses,
        tasks=tasks,
        downloads={n: {MODEL.model_id: DownloadCompleted(path="/models/smol.gguf")} for n in nodes},
        nodes={n: node_info(i) for i, n in enumerate(nodes)},
    )
    return state, local, me


def bench_plan(calls: int) -> None:
    for label, pending_tail in (("steady (nothing to do)", False), ("forward a request", True)):
        state, local, me = build_plan_state(pending_tail=pending_tail)
        instance_backoff = KeyedBackoff[InstanceId]()
        download_backoff = KeyedBackoff[ModelId]()

        def call(
            state: State = state,
            local: dict[RunnerId, LocalRunner] = local,
            me: NodeId = me,
            ib: KeyedBackoff[InstanceId] = instance_backoff,
            db: KeyedBackoff[ModelId] = download_backoff,
        ) -> Task | None:
            return plan(me, local, state, ib, db, 1000.0)

        result = call()
        wall, cpu = _sample(call, calls)
        print(
            f"plan, {label}: {len(state.instances)} instances, {len(state.tasks)} tasks, "
            f"{len(local)} local runners -> {type(result).__name__}; {calls} calls\n"
            f"  wall: median {statistics.median(wall):.1f} us, p99 {_p99(wall):.1f} us\n"
            f"  cpu:  median {statistics.median(cpu):.1f} us, p99 {_p99(cpu):.1f} us"
        )


def _sample(fn: Callable[[], object], calls: int) -> tuple[list[float], list[float]]:
    """Wall and CPU (thread) time of each call, in microseconds. On a shared machine
    the CPU time is the figure to trust: wall time includes waiting for a core."""
    for _ in range(min(calls // 10, 200)):
        fn()
    wall: list[float] = []
    cpu: list[float] = []
    for _ in range(calls):
        start, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
        fn()
        cpu.append((time.thread_time_ns() - start_cpu) / 1000)
        wall.append((time.perf_counter_ns() - start) / 1000)
    return wall, cpu


def _p99(samples: list[float]) -> float:
    return sorted(samples)[int(len(samples) * 0.99) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--plan-calls", type=int, default=5_000)
    parser.add_argument("--profile", action="store_true", help="cProfile the apply run")
    args = parser.parse_args()
    bench_apply(args.events, args.profile)
    bench_plan(args.plan_calls)


if __name__ == "__main__":
    main()
