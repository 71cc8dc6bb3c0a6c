"""The worker's side of one runner process: sends it tasks, forwards its events, and
turns its death or a stalled phase into events (errors for waiting clients first)."""

import multiprocessing as mp
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Self

import anyio
from anyio import BrokenResourceError, ClosedResourceError, EndOfStream
from loguru import logger

from exo.shared.constants import (
    EXO_RUNNER_CONNECT_TIMEOUT_S,
    EXO_RUNNER_INIT_TIMEOUT_S,
    EXO_RUNNER_LOAD_TIMEOUT_S,
    EXO_RUNNER_SHUTDOWN_GRACE_S,
    EXO_RUNNER_STEP_TIMEOUT_S,
    EXO_RUNNER_WARMUP_TIMEOUT_S,
)
from exo.shared.types.chunks import ErrorChunk, error_chunk
from exo.shared.types.events import (
    ChunkGenerated,
    Event,
    RunnerStatusUpdated,
    TaskAcknowledged,
    TaskStatusUpdated,
)
from exo.shared.types.tasks import (
    FINISHED_TASK_STATUSES,
    Shutdown,
    Task,
    TaskId,
    TaskStatus,
    TextGeneration,
)
from exo.shared.types.worker.instances import BoundInstance
from exo.shared.types.worker.runners import (
    RunnerConnecting,
    RunnerFailed,
    RunnerId,
    RunnerIdle,
    RunnerLoading,
    RunnerShutdown,
    RunnerShuttingDown,
    RunnerStatus,
    RunnerWarmingUp,
)
from exo.shared.types.worker.shards import ShardMetadata
from exo.utils.channels import MpReceiver, MpSender, Sender, mp_channel
from exo.worker.runner.settings import RunnerSettings


@dataclass(frozen=True)
class PhaseTimeouts:
    """Longest time a runner may go without a sign of progress in each phase."""

    connect_s: float = EXO_RUNNER_CONNECT_TIMEOUT_S
    load_s: float = EXO_RUNNER_LOAD_TIMEOUT_S
    warmup_s: float = EXO_RUNNER_WARMUP_TIMEOUT_S
    step_s: float = EXO_RUNNER_STEP_TIMEOUT_S
    shutdown_grace_s: float = EXO_RUNNER_SHUTDOWN_GRACE_S


@dataclass(eq=False)
class RunnerSupervisor:
    shard_metadata: ShardMetadata
    bound_instance: BoundInstance
    runner_process: BaseProcess
    initialize_timeout: float
    _ev_recv: MpReceiver[Event]
    _task_sender: MpSender[Task]
    _event_sender: Sender[Event]
    _cancel_sender: MpSender[TaskId]
    timeouts: PhaseTimeouts = field(default_factory=PhaseTimeouts)
    threads: int = 1
    """The runner's thread budget (its pools are sized from it at spawn)."""
    chunk_sink: Callable[[ChunkGenerated], None] | None = None
    """Where the runner's chunks go straight from its pipe (the node's delivery to the
    waiting request); without one they travel with the other events."""
    status: RunnerStatus = field(default_factory=RunnerIdle, init=False)
    pending: dict[TaskId, anyio.Event] = field(default_factory=dict[TaskId, anyio.Event], init=False)
    in_progress: dict[TaskId, Task] = field(default_factory=dict[TaskId, Task], init=False)
    completed: set[TaskId] = field(default_factory=set[TaskId], init=False)
    cancelled: set[TaskId] = field(default_factory=set[TaskId], init=False)
    _initialized: bool = field(default=False, init=False)
    _stopping: bool = field(default=False, init=False)
    _exited: anyio.Event = field(default_factory=anyio.Event, init=False)
    _cancel_scope: anyio.CancelScope = field(default_factory=anyio.CancelScope, init=False)
    _waiting: anyio.CancelScope | None = field(default=None, init=False)
    """The wait for the runner's next event, while one is under way."""
    _wait_from: float = field(default=0.0, init=False)
    # Our copies of the child's pipe ends, closed once the child has started.
    _child_ends: tuple[MpSender[Event], MpReceiver[Task], MpReceiver[TaskId]] | None = field(
        default=None, init=False
    )

    @classmethod
    def create(
        cls,
        bound_instance: BoundInstance,
        event_sender: Sender[Event],
        settings: RunnerSettings,
        timeouts: PhaseTimeouts | None = None,
        chunk_sink: Callable[[ChunkGenerated], None] | None = None,
    ) -> Self:
        """Prepare (not start) a runner process for this instance's shard."""
        from exo.worker.runner.bootstrap import entrypoint

        ev_send, ev_recv = mp_channel[Event]()
        task_send, task_recv = mp_channel[Task]()
        cancel_send, cancel_recv = mp_channel[TaskId]()
        process = mp.get_context("spawn").Process(
            target=entrypoint,
            args=(bound_instance, ev_send, task_recv, cancel_recv, settings),
            name=f"exo-runner-{bound_instance.bound_runner_id}",
            daemon=True,
        )
        supervisor = cls(
            shard_metadata=bound_instance.bound_shard,
            bound_instance=bound_instance,
            runner_process=process,
            initialize_timeout=EXO_RUNNER_INIT_TIMEOUT_S,
            _ev_recv=ev_recv,
            _task_sender=task_send,
            _event_sender=event_sender,
            _cancel_sender=cancel_send,
            timeouts=timeouts or PhaseTimeouts(),
            threads=settings.threads,
            chunk_sink=chunk_sink,
        )
        supervisor._child_ends = (ev_send, task_recv, cancel_recv)
        return supervisor

    @property
    def runner_id(self) -> RunnerId:
        return self.bound_instance.bound_runner_id

    @property
    def pid(self) -> int | None:
        return self.runner_process.pid

    async def run(self) -> None:
        """Start the process and forward its events until it exits."""
        from exo.worker.runner.bootstrap import child_thread_pools

        with child_thread_pools(self.threads):
            self.runner_process.start()
        if self._child_ends is not None:
            # The child holds its own copies; ours would hide the child's death (no EOF).
            for end in self._child_ends:
                end.close()
            self._child_ends = None
        try:
            with self._cancel_scope:
                await self._forward_events()
        finally:
            self._exited.set()

    async def _forward_events(self) -> None:
        while True:
            try:
                event = await self._next_event()
            except (EndOfStream, ClosedResourceError, BrokenResourceError) as e:
                if self._stopping:
                    return
                await self._check_runner(e)
                return
            if event is None:
                return
            self._initialized = True
            await self._handle_event(event)

    async def _next_event(self) -> Event | None:
        """The runner's next event, waited for within its phase's deadline; None once the
        runner was failed for missing it."""
        if self._ev_recv.poll():  # already here (a step's other streams' tokens): no wait
            return self._ev_recv.receive()
        event: Event | None = None
        self._wait_from = anyio.current_time()
        with anyio.CancelScope(deadline=self._wait_from + self._deadline()) as wait:
            self._waiting = wait  # start_task may bring the deadline closer
            try:
                event = await self._ev_recv.receive_async()
            finally:
                self._waiting = None
        if event is None:  # the deadline passed
            await self._stalled(wait.deadline - self._wait_from)
        return event

    def _rearm(self) -> None:
        """A task was handed over: the runner must now show progress within its phase's
        deadline, also when it was waiting with none (idle, ready)."""
        now = anyio.current_time()
        if self._waiting is not None and now + self._deadline() < self._waiting.deadline:
            self._waiting.deadline = now + self._deadline()
            self._wait_from = now

    def _deadline(self) -> float:
        """Seconds to wait for the next event: the deadline of the current phase."""
        if not self._initialized:
            return self.initialize_timeout
        match self.status:
            case RunnerConnecting():
                return self.timeouts.connect_s
            case RunnerLoading():
                return self.timeouts.load_s
            case RunnerWarmingUp():
                return self.timeouts.warmup_s
            case RunnerShuttingDown():
                return self.timeouts.shutdown_grace_s
            case _:
                busy = self.pending or any(
                    isinstance(t, TextGeneration) for t in self.in_progress.values()
                )
                return self.timeouts.step_s if busy else float("inf")

    async def _handle_event(self, event: Event) -> None:
        event = _humane(event, self.runner_id)
        if isinstance(event, RunnerStatusUpdated):
            self.status = event.runner_status
        if isinstance(event, TaskAcknowledged) and (
            waiter := self.pending.pop(event.task_id, None)
        ):
            waiter.set()
        if isinstance(event, TaskStatusUpdated) and event.task_status in FINISHED_TASK_STATUSES:
            self.in_progress.pop(event.task_id, None)
            self.completed.add(event.task_id)
        if isinstance(event, ChunkGenerated) and self.chunk_sink is not None:
            # A streamed token's one hop in the node: no trip through the worker's queue.
            self.chunk_sink(event)
            return
        await self._event_sender.send(event)

    async def start_task(self, task: Task) -> None:
        """Send a task and wait until the runner has taken it (or has died); a request is
        not waited for (a pipeline's runner takes inputs once per trip through its stages)."""
        if task.task_id in self.completed or task.task_id in self.in_progress:
            return
        logger.debug(f"runner {self.runner_id}: starting {type(task).__name__} {task.task_id}")
        waiter = anyio.Event()
        self.pending[task.task_id] = waiter
        self.in_progress[task.task_id] = task
        self._rearm()
        try:
            await self._task_sender.send_async(task)
        except ClosedResourceError:
            self.pending.pop(task.task_id, None)
            self.in_progress.pop(task.task_id, None)
            if not isinstance(task, Shutdown):
                logger.warning(f"Task {task} dropped, runner closed communication.")
            return
        if isinstance(task, TextGeneration):
            return  # requests queue in the pipe: the runner takes them all between two steps
        await waiter.wait()

    async def cancel_task(self, task_id: TaskId) -> None:
        self.cancelled.add(task_id)
        try:
            await self._cancel_sender.send_async(task_id)
        except ClosedResourceError:
            logger.debug(f"cancel of {task_id} dropped: runner already closed")

    async def _check_runner(self, e: BaseException) -> None:
        """The runner's pipe broke: find out why, tell every waiting client, fail it."""
        if self.runner_process.is_alive():
            await anyio.to_thread.run_sync(self.runner_process.join, 1.0)
        cause = _describe_exit(self.runner_process)
        logger.opt(exception=e).error(f"Runner terminated with {cause}")
        error = f"Terminated ({cause})"
        if isinstance(self.status, RunnerFailed):
            error = f"{self.status.error_message} ({cause})"
        await self._fail(error, f"Runner shutdown before completing command ({cause})")

    async def _stalled(self, waited: float) -> None:
        phase = type(self.status).__name__.removeprefix("Runner").lower()
        if self.in_progress and phase in ("ready", "running"):
            phase = "running a task"
        reason = f"runner stalled: no progress for {waited:g} s while {phase}"
        logger.error(f"{self.runner_id}: {reason}")
        await self._kill()
        await self._fail(reason, f"Runner shutdown before completing command ({reason})")

    async def _fail(self, error_message: str, chunk_message: str) -> None:
        """Every waiting client hears first, then the runner's failure; then its requests
        are failed too, so that no new runner picks them up again."""
        for task in self.in_progress.values():
            if isinstance(task, TextGeneration):
                with anyio.CancelScope(shield=True):
                    await self._event_sender.send(
                        ChunkGenerated(
                            command_id=task.command_id,
                            chunk=error_chunk(
                                chunk_message, self.shard_metadata.model_card.model_id
                            ),
                        )
                    )
        failed_tasks = [t for t in self.in_progress.values() if isinstance(t, TextGeneration)]
        self.in_progress.clear()
        for waiter in self.pending.values():
            waiter.set()
        self.pending.clear()
        try:
            deterministic = isinstance(self.status, RunnerFailed) and self.status.deterministic
            self.status = RunnerFailed(error_message=error_message, deterministic=deterministic)
            with anyio.CancelScope(shield=True):
                await self._event_sender.send(
                    RunnerStatusUpdated(runner_id=self.runner_id, runner_status=self.status)
                )
            for task in failed_tasks:
                with anyio.CancelScope(shield=True):
                    await self._event_sender.send(
                        TaskStatusUpdated(
                            task_id=task.task_id,
                            task_status=TaskStatus.Failed,
                            error_message=chunk_message,
                        )
                    )
        except (ClosedResourceError, BrokenResourceError):
            logger.warning(f"{self.runner_id}: event channel closed; failure not reported")
        self.shutdown()

    def shutdown(self) -> None:
        """Stop forwarding events; the process, if any, is left to ``stop``."""
        self._stopping = True
        self._cancel_scope.cancel()
        self._task_sender.close()
        self._cancel_sender.close()

    async def stop(self) -> None:
        """Graceful, then SIGTERM, then SIGKILL. Reports RunnerShutdown once the process
        has exited -- unless the runner had failed: its failure stays in the state until
        a new runner replaces it, so its siblings wait instead of looping."""
        was_failed = isinstance(self.status, RunnerFailed)
        if self.runner_process.is_alive():
            self._stopping = True
            try:
                await self._task_sender.send_async(
                    Shutdown(instance_id=self.bound_instance.instance.instance_id,
                             runner_id=self.runner_id)
                )
            except ClosedResourceError:
                pass  # its pipe is closed already: it is on its way out
            await self._join(self.timeouts.shutdown_grace_s)
        await self._kill()
        self.shutdown()
        if self.runner_process.pid is not None:
            await self._exited.wait()
        if not was_failed:
            self.status = RunnerShutdown()
            with anyio.CancelScope(shield=True):
                try:
                    await self._event_sender.send(
                        RunnerStatusUpdated(runner_id=self.runner_id, runner_status=self.status)
                    )
                except (ClosedResourceError, BrokenResourceError):
                    logger.debug(f"{self.runner_id}: shut down after the event channel closed")

    @property
    def exited(self) -> bool:
        """Its process was started and has been reaped (or was never started)."""
        return self.runner_process.pid is None or self.runner_process.exitcode is not None

    async def reap(self) -> None:
        """Kill and reap the process, without reporting anything (shutdown path)."""
        self.shutdown()
        await self._kill()
        await self._join(self.timeouts.shutdown_grace_s)

    async def _kill(self) -> None:
        for send_signal in (self.runner_process.terminate, self.runner_process.kill):
            if not self.runner_process.is_alive():
                return
            send_signal()
            await self._join(self.timeouts.shutdown_grace_s)

    async def _join(self, timeout: float) -> None:
        if self.runner_process.pid is None:
            return
        await anyio.to_thread.run_sync(self.runner_process.join, timeout, abandon_on_cancel=True)


# What the distributed backends (gloo, NCCL) say when a peer of the group is gone: their
# raw text (source paths, "GLHF!") means nothing to a client.
_PEER_LOSS_MARKERS = (
    "gloo", "GLHF", "NCCL", "ProcessGroup", "Connection closed by peer",
    "Connection reset by peer", "lost the group",
)
PEER_LOST = (
    "a runner of this instance on another process or node was lost (peer gone); the "
    "request cannot complete: retry it once the instance is back"
)


def human_error(message: str) -> str:
    """The message for clients and the state: a peer loss in plain words."""
    return PEER_LOST if any(m in message for m in _PEER_LOSS_MARKERS) else message


def _humane(event: Event, runner_id: RunnerId) -> Event:
    """The event with any raw backend error replaced (the raw text goes to the log)."""
    raw: str | None = None
    match event:
        case ChunkGenerated(chunk=ErrorChunk() as chunk) if human_error(chunk.error_message) != chunk.error_message:
            raw = chunk.error_message
            event = event.model_copy(
                update={"chunk": chunk.model_copy(update={"error_message": PEER_LOST})}
            )
        case TaskStatusUpdated(error_message=str() as message) if human_error(message) != message:
            raw = message
            event = event.model_copy(update={"error_message": PEER_LOST})
        case RunnerStatusUpdated(runner_status=RunnerFailed() as failed) if (
            human_error(failed.error_message) != failed.error_message
        ):
            raw = failed.error_message
            event = event.model_copy(
                update={"runner_status": RunnerFailed(error_message=PEER_LOST)}
            )
        case _:
            pass
    if raw is not None:
        logger.warning(f"runner {runner_id}: peer lost: {raw}")
    return event


def _describe_exit(process: BaseProcess) -> str:
    code = process.exitcode
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"

