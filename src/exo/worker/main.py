"""The worker: reconciles this node's runners with the state, one planned task at a time."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import anyio
from loguru import logger

from exo.shared.constants import (
    EXO_INSTANCE_BACKOFF_BASE_S,
    EXO_INSTANCE_BACKOFF_MAX_S,
)
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.commands import Command, DeleteInstance, DownloadActionKind
from exo.shared.types.common import NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    DownloadActionRequested,
    Event,
    NodeDownloadProgress,
    RunnerStatusUpdated,
    TaskAcknowledged,
    TaskStatusUpdated,
)
from exo.shared.types.state import State
from exo.shared.types.state_queries import task_of_command
from exo.shared.types.tasks import (
    AbandonInstance,
    CancelTask,
    ConnectToGroup,
    CreateRunner,
    DownloadModel,
    LoadModel,
    Shutdown,
    StartWarmup,
    Task,
    TextGeneration,
)
from exo.shared.types.worker.downloads import DownloadProgress
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import (
    RunnerFailed,
    RunnerId,
    RunnerReady,
    RunnerShuttingDown,
)
from exo.utils.backoff import KeyedBackoff
from exo.utils.channels import Sender, channel
from exo.utils.metrics import RUNNER_FAILURES, RUNNER_RESTARTS
from exo.utils.wakeup import Wakeup
from exo.worker.download.coordinator import DownloadCoordinator
from exo.worker.plan import LocalRunner, RunnerView, plan
from exo.worker.runner.runner_supervisor import PhaseTimeouts, RunnerSupervisor
from exo.worker.runner.settings import RunnerSettings
from exo.worker.thread_share import local_runner_count, threads_for_new_runner

ChunkSink = Callable[[ChunkGenerated, NodeId | None], None]


@dataclass(eq=False)
class Worker:
    node_id: NodeId
    runner_settings: RunnerSettings
    # Events about this node, to the master for sequencing.
    local_events: Sender[Event]
    # Commands to the master (deleting an instance we gave up on).
    commands: Sender[Command]
    # Chunks straight to the API that took the request (never through the log).
    chunk_sink: ChunkSink
    timeouts: PhaseTimeouts = field(default_factory=PhaseTimeouts)
    instance_backoff: KeyedBackoff[InstanceId] = field(
        default_factory=lambda: KeyedBackoff[InstanceId](
            base_s=EXO_INSTANCE_BACKOFF_BASE_S, max_s=EXO_INSTANCE_BACKOFF_MAX_S
        )
    )
    download_backoff: KeyedBackoff[ModelId] = field(default_factory=KeyedBackoff[ModelId])
    state: State = field(default_factory=State)
    runners: dict[RunnerId, RunnerSupervisor] = field(
        default_factory=dict[RunnerId, RunnerSupervisor]
    )
    runners_created: int = 0
    in_sync: bool = True
    """False while this node's state may be stale (a cluster node catching up after a
    start, a restart or a stall): the worker then starts nothing new."""
    _wakeup: Wakeup = field(default_factory=Wakeup)
    _abandoned: set[InstanceId] = field(default_factory=set[InstanceId])
    _stopping: set[RunnerId] = field(default_factory=set[RunnerId])
    # Every runner we started whose process may still live: reaped on the way out.
    _spawned: list[RunnerSupervisor] = field(default_factory=list[RunnerSupervisor])
    _runner_threads: dict[RunnerId, int] = field(default_factory=dict[RunnerId, int])
    reported_downloads: dict[ModelId, DownloadProgress] = field(
        default_factory=dict[ModelId, DownloadProgress]
    )
    """The last download progress this node reported per model (its coordinator's)."""

    def download_truth(self, state: State) -> list[Event]:
        """This node's download progress that ``state`` lacks or holds otherwise (a
        merge dropped the event that reported it): to report again."""
        held = state.downloads.get(self.node_id, {})
        return [
            NodeDownloadProgress(node_id=self.node_id, model_id=model_id, progress=progress)
            for model_id, progress in self.reported_downloads.items()
            if held.get(model_id) != progress
        ]

    def update_state(self, state: State) -> None:
        self.state = state
        self._abandoned &= set(state.instances)
        self._wakeup.set()

    def set_in_sync(self, in_sync: bool) -> None:
        """Act on the state only while it is caught up with the cluster's."""
        if in_sync != self.in_sync:
            logger.info(f"worker: {'acting on' if in_sync else 'waiting for'} the cluster's state")
        self.in_sync = in_sync
        self._wakeup.set()

    async def run(self) -> None:
        runner_events, self._runner_event_rx = channel[Event]()
        self._runner_events = runner_events
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                self.downloads = DownloadCoordinator(
                    self.node_id, self.runner_settings, self.local_events.send,
                    self.commands.send, self.download_backoff, lambda: self.state,
                    self._wakeup.set, tg, reported=self.reported_downloads,
                )
                tg.start_soon(self._forward_runner_events)
                await self._plan_loop()
        finally:
            with anyio.CancelScope(shield=True):
                await self.stop_all_runners()

    async def _plan_loop(self) -> None:
        while True:
            if not self.in_sync:
                await self._wakeup.wait(None)
                continue
            task = plan(
                self.node_id,
                self._planner_view(),
                self.state,
                self.instance_backoff,
                self.download_backoff,
                time.monotonic(),
            )
            if task is None:
                await self._wakeup.wait(self._next_backoff_in())
                continue
            await self._execute(task)
            # Never hold the event loop: a task that found nothing to do (its runner is on
            # its way out) comes back until the state moves, which needs the loop.
            await anyio.lowlevel.checkpoint()

    def _live_runners(self) -> dict[RunnerId, RunnerSupervisor]:
        return {rid: r for rid, r in self.runners.items() if rid not in self._stopping}

    def _planner_view(self) -> dict[RunnerId, LocalRunner]:
        """Every runner we hold, a stopping one shown as shutting down: its id cannot be
        given to a new runner while its process may still live."""
        view: dict[RunnerId, LocalRunner] = {}
        for rid, runner in self.runners.items():
            view[rid] = (
                RunnerView(runner.bound_instance, status=RunnerShuttingDown())
                if rid in self._stopping
                else runner
            )
        return view

    def _next_backoff_in(self) -> float | None:
        now = time.monotonic()
        waits = [
            self.instance_backoff.next_at(iid) - now
            for iid in self.state.instances
            if self.instance_backoff.next_at(iid) > now
        ] + [
            self.download_backoff.next_at(inst.shard_assignments.model_id) - now
            for inst in self.state.instances.values()
            if self.download_backoff.next_at(inst.shard_assignments.model_id) > now
        ]
        return max(min(waits), 0.01) if waits else None

    async def _execute(self, task: Task) -> None:
        match task:
            case CreateRunner():
                self._create_runner(task)
            case DownloadModel():
                await self._download(task)
            case Shutdown():
                self._stop_runner(task.runner_id)
            case AbandonInstance():
                if task.instance_id not in self._abandoned:
                    self._abandoned.add(task.instance_id)
                    logger.error(f"giving up on instance {task.instance_id}: {task.reason}")
                    await self.commands.send(
                        DeleteInstance(instance_id=task.instance_id, reason=task.reason)
                    )
                await self._wakeup.wait(1.0)
            case CancelTask():
                runner = self._runner_for(task.instance_id)
                if runner is None:
                    await self._wakeup.wait(0.5)  # its runner is stopping: wait for the state
                else:
                    await runner.cancel_task(task.cancelled_task_id)
            case ConnectToGroup() | LoadModel() | StartWarmup() | TextGeneration():
                runner = self._runner_for(task.instance_id)
                if runner is None:
                    await self._wakeup.wait(0.5)  # its runner is stopping: wait for the state
                else:
                    await runner.start_task(task)

    def _runner_for(self, instance_id: InstanceId) -> RunnerSupervisor | None:
        for runner in self._live_runners().values():
            if runner.bound_instance.instance.instance_id == instance_id:
                return runner
        return None

    def _create_runner(self, task: CreateRunner) -> None:
        instance_id = task.instance_id
        self.instance_backoff.record_attempt(instance_id, time.monotonic())
        attempt = self.instance_backoff.attempts(instance_id)
        if attempt > 1:
            RUNNER_RESTARTS.inc()
        logger.info(f"creating runner for instance {instance_id} (attempt {attempt})")
        if task.bound_instance.bound_runner_id in self.runners:
            # Never two processes under one runner id (the planner should not ask for it).
            logger.warning(f"runner {task.bound_instance.bound_runner_id} still exists")
            return
        budget = self.runner_settings.threads
        live = {rid: self._runner_threads.get(rid, 0) for rid in self._live_runners()}
        hosted = local_runner_count(self.state, self.node_id)
        threads = threads_for_new_runner(budget, list(live.values()), hosted)
        total = sum(live.values()) + threads
        logger.info(
            f"runner for instance {instance_id}: {threads} of this node's {budget} threads "
            f"({len(live) + 1} runners use {total}"
            + (", more than the cores: oversubscribed)" if total > budget else ")")
        )
        settings = replace(self.runner_settings, threads=threads)
        runner = RunnerSupervisor.create(
            task.bound_instance,
            self._runner_events.clone(),
            settings,
            self.timeouts,
            chunk_sink=self._deliver_chunk,
        )
        self.runners[runner.runner_id] = runner
        self._spawned = [r for r in self._spawned if not r.exited] + [runner]
        self._runner_threads[runner.runner_id] = threads
        self.runners_created += 1
        self._tg.start_soon(runner.run)

    async def _download(self, task: DownloadModel) -> None:
        model_id = task.shard_metadata.model_card.model_id
        if model_id not in self.downloads.running:
            await self.downloads.download(task)
            if model_id in self.downloads.running:
                return  # started in the background; its progress comes through the state
        # Wait for the event to come back through the log before planning on it.
        await self._wakeup.wait(1.0)

    def observe(self, event: Event) -> None:
        """An event of the log, as this node applies it: the worker acts on the download
        actions (start, cancel, delete) the master sequenced for this node."""
        if isinstance(event, DownloadActionRequested) and event.node_id == self.node_id:
            self.download_action(event.action, event.model_card)

    def download_action(self, action: DownloadActionKind, card: ModelCard) -> None:
        self.downloads.action(action, card)

    def _stop_runner(self, runner_id: RunnerId) -> None:
        runner = self.runners.get(runner_id)
        if runner is None or runner_id in self._stopping:
            return
        self._stopping.add(runner_id)

        async def stop() -> None:
            try:
                await runner.stop()
            finally:
                if self.runners.get(runner_id) is runner:
                    del self.runners[runner_id]
                    self._runner_threads.pop(runner_id, None)
                self._stopping.discard(runner_id)
                self._wakeup.set()

        self._tg.start_soon(stop)

    async def stop_all_runners(self) -> None:
        """Stop every runner we hold and reap every process we ever started."""
        held = list(self.runners.values())
        orphans = [r for r in self._spawned if r not in held and not r.exited]
        async with anyio.create_task_group() as tg:
            for runner in held:
                tg.start_soon(runner.stop)
            for runner in orphans:
                tg.start_soon(runner.reap)
        self.runners.clear()
        self._spawned.clear()

    async def _forward_runner_events(self) -> None:
        async for event in self._runner_event_rx:
            match event:
                case ChunkGenerated():  # (from a supervisor without its own chunk sink)
                    self._deliver_chunk(event)
                    continue
                case RunnerStatusUpdated(runner_status=RunnerReady()):
                    runner = self.runners.get(event.runner_id)
                    if runner is not None:
                        self.instance_backoff.reset(runner.bound_instance.instance.instance_id)
                case RunnerStatusUpdated(runner_status=RunnerFailed()):
                    RUNNER_FAILURES.inc()
                case TaskAcknowledged() | TaskStatusUpdated():
                    if event.task_id not in self.state.tasks:
                        continue  # a local task (load, warm up, ...): not the cluster's business
                case _:
                    pass
            await self.local_events.send(event)
            self._wakeup.set()

    def _deliver_chunk(self, event: ChunkGenerated) -> None:
        self.chunk_sink(event, self._origin_of(event))

    def _origin_of(self, event: ChunkGenerated) -> NodeId | None:
        task = task_of_command(self.state, event.command_id)
        if task is not None:
            return task.origin_node_id
        for runner in self.runners.values():
            for task in runner.in_progress.values():
                if isinstance(task, TextGeneration) and task.command_id == event.command_id:
                    return task.origin_node_id
        return None

