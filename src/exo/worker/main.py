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
from exo.shared.models.model_cards import ModelId
from exo.shared.types.commands import Command, DeleteInstance
from exo.shared.types.common import NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    Event,
    NodeDownloadProgress,
    RunnerStatusUpdated,
    TaskAcknowledged,
    TaskStatusUpdated,
)
from exo.shared.types.state import State
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
from exo.shared.types.worker.downloads import DownloadCompleted
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import RunnerFailed, RunnerId, RunnerReady
from exo.utils.backoff import KeyedBackoff
from exo.utils.channels import Receiver, Sender, channel
from exo.utils.metrics import RUNNER_FAILURES, RUNNER_RESTARTS
from exo.utils.wakeup import Wakeup
from exo.worker.download.local import locate_model
from exo.worker.plan import plan
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
    _wakeup: Wakeup = field(default_factory=Wakeup)
    _abandoned: set[InstanceId] = field(default_factory=set[InstanceId])
    _stopping: set[RunnerId] = field(default_factory=set[RunnerId])
    _runner_threads: dict[RunnerId, int] = field(default_factory=dict[RunnerId, int])

    def update_state(self, state: State) -> None:
        self.state = state
        self._abandoned &= set(state.instances)
        self._wakeup.set()

    async def run(self) -> None:
        runner_events, self._runner_event_rx = channel[Event]()
        self._runner_events = runner_events
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._forward_runner_events)
                await self._plan_loop()
        finally:
            with anyio.CancelScope(shield=True):
                await self.stop_all_runners()

    async def _plan_loop(self) -> None:
        while True:
            task = plan(
                self.node_id,
                self._live_runners(),
                self.state,
                self.instance_backoff,
                self.download_backoff,
                time.monotonic(),
            )
            if task is None:
                await self._wakeup.wait(self._next_backoff_in())
                continue
            await self._execute(task)

    def _live_runners(self) -> dict[RunnerId, RunnerSupervisor]:
        return {rid: r for rid, r in self.runners.items() if rid not in self._stopping}

    def _next_backoff_in(self) -> float | None:
        now = time.monotonic()
        waits = [
            self.instance_backoff.next_at(iid) - now
            for iid in self.state.instances
            if self.instance_backoff.next_at(iid) > now
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
                if runner is not None:
                    await runner.cancel_task(task.cancelled_task_id)
            case ConnectToGroup() | LoadModel() | StartWarmup() | TextGeneration():
                runner = self._runner_for(task.instance_id)
                if runner is not None:
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
            task.bound_instance, self._runner_events.clone(), settings, self.timeouts
        )
        self.runners[runner.runner_id] = runner
        self._runner_threads[runner.runner_id] = threads
        self.runners_created += 1
        self._tg.start_soon(runner.run)

    async def _download(self, task: DownloadModel) -> None:
        card = task.shard_metadata.model_card
        self.download_backoff.record_attempt(card.model_id, time.monotonic())
        progress = await anyio.to_thread.run_sync(
            locate_model, card, self.runner_settings.models_dir
        )
        if isinstance(progress, DownloadCompleted):
            self.download_backoff.reset(card.model_id)
        await self.local_events.send(
            NodeDownloadProgress(node_id=self.node_id, model_id=card.model_id, progress=progress)
        )
        # Wait for the event to come back through the log before planning on it.
        await self._wakeup.wait(1.0)

    def _stop_runner(self, runner_id: RunnerId) -> None:
        runner = self.runners.get(runner_id)
        if runner is None or runner_id in self._stopping:
            return
        self._stopping.add(runner_id)

        async def stop() -> None:
            try:
                await runner.stop()
            finally:
                self.runners.pop(runner_id, None)
                self._runner_threads.pop(runner_id, None)
                self._stopping.discard(runner_id)
                self._wakeup.set()

        self._tg.start_soon(stop)

    async def stop_all_runners(self) -> None:
        async with anyio.create_task_group() as tg:
            for runner in list(self.runners.values()):
                tg.start_soon(runner.stop)
        self.runners.clear()

    async def _forward_runner_events(self) -> None:
        async for event in self._runner_event_rx:
            match event:
                case ChunkGenerated():
                    self.chunk_sink(event, self._origin_of(event))
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

    def _origin_of(self, event: ChunkGenerated) -> NodeId | None:
        for task in self.state.tasks.values():
            if isinstance(task, TextGeneration) and task.command_id == event.command_id:
                return task.origin_node_id
        for runner in self.runners.values():
            for task in runner.in_progress.values():
                if isinstance(task, TextGeneration) and task.command_id == event.command_id:
                    return task.origin_node_id
        return None


__all__ = ["Receiver", "Worker"]
