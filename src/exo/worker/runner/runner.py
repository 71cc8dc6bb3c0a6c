"""The runner process: a state machine over the runner statuses that loads a shard,
warms it up and serves generation requests, batching them between decode steps."""

import struct
import time
from typing import assert_never

from anyio import ClosedResourceError, EndOfStream
from loguru import logger

from exo.shared.constants import EXO_RUNNER_CONNECT_TIMEOUT_S
from exo.shared.types.events import (
    Event,
    RunnerStatusUpdated,
    TaskAcknowledged,
    TaskStatusUpdated,
)
from exo.shared.types.tasks import (
    CANCEL_ALL_TASKS,
    AbandonInstance,
    CancelTask,
    ConnectToGroup,
    CreateRunner,
    DownloadModel,
    LoadModel,
    Shutdown,
    StartWarmup,
    Task,
    TaskId,
    TaskStatus,
    TextGeneration,
)
from exo.shared.types.worker.instances import BoundInstance
from exo.shared.types.worker.runners import (
    RunnerConnected,
    RunnerConnecting,
    RunnerFailed,
    RunnerIdle,
    RunnerLoaded,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerShuttingDown,
    RunnerStatus,
    RunnerWarmingUp,
)
from exo.utils.channels import MpReceiver, MpSender, mp_wait
from exo.utils.heap import freeze_long_lived
from exo.worker.runner.distributed import Follower, connect
from exo.worker.runner.generation import Generation, load_generation
from exo.worker.runner.settings import RunnerSettings

# A follower told to shut down waits this long for rank 0's stop (its trace is written then).
_FOLLOWER_STOP_GRACE_S = 2.0
# Queued inputs a serving runner takes between two steps (the rest wait for the next one):
# a flood of requests cannot hold up the running streams' tokens for long.
_MAX_INPUTS_PER_STEP = 64
MODEL_FILE_ERRORS = (ValueError, KeyError, IndexError, struct.error, NotImplementedError)
"""What a load raises for a model file it cannot use (a missing tensor, a bad header, an
unsupported layout): deterministic, unlike a lost peer or a lack of memory."""


class ModelFileError(Exception):
    """A load that failed on the model's files: retrying cannot help."""


class Runner:
    def __init__(
        self,
        bound_instance: BoundInstance,
        event_sender: MpSender[Event],
        task_receiver: MpReceiver[Task],
        cancel_receiver: MpReceiver[TaskId],
        settings: RunnerSettings,
    ) -> None:
        self.bound_instance = bound_instance
        self.runner_id = bound_instance.bound_runner_id
        self.events = event_sender
        self.tasks = task_receiver
        self.cancels = cancel_receiver
        self.settings = settings
        self.current_status: RunnerStatus = RunnerIdle()
        self.generation: Generation | None = None
        self.follower: Follower | None = None
        self.early_cancels: set[TaskId] = set()
        self.done = False

    # -- reporting -------------------------------------------------------------------

    def update_status(self, status: RunnerStatus) -> None:
        self.current_status = status
        self.events.send(RunnerStatusUpdated(runner_id=self.runner_id, runner_status=status))

    def acknowledge_task(self, task: Task) -> None:
        self.events.send(TaskAcknowledged(task_id=task.task_id))

    def send_task_status(
        self, task_id: TaskId, status: TaskStatus, error_message: str | None = None
    ) -> None:
        self.events.send(
            TaskStatusUpdated(task_id=task_id, task_status=status, error_message=error_message)
        )

    # -- main loop -------------------------------------------------------------------

    def run(self) -> None:
        self.update_status(RunnerIdle())
        try:
            while not self.done:
                # a request only waiting for its images is not work: wait for them instead
                busy = self.generation is not None and self.generation.stepping
                self._take_inputs(block=not busy)
                if self.generation is None or self.done:
                    continue
                self._report_running()
                if self.generation.active > 0:
                    self.events.send_many(self.generation.step())  # one message a step
                    self._report_running()
        except (EndOfStream, ClosedResourceError):
            logger.info("node closed the runner's pipes: exiting")
        except Exception as e:  # the runner dies; its failure is data for the node
            logger.opt(exception=e).error("runner failed")
            deterministic = isinstance(e, ModelFileError)
            message = str(e) if deterministic else f"{type(e).__name__}: {e}"
            try:
                self.update_status(
                    RunnerFailed(error_message=message, deterministic=deterministic)
                )
            except ClosedResourceError:
                pass  # the node is gone: nobody to tell

    def _take_inputs(self, block: bool) -> None:
        timeout = None if block else 0.0
        if self.follower is not None:
            # Following rank 0 in a thread: wake up now and then to see that it still does.
            if self.follower.error is not None:
                raise RuntimeError(f"lost the group: {self.follower.error}") from self.follower.error
            if self.follower.finished.is_set():
                logger.info("rank 0 released the group")
            timeout = 0.5 if block else 0.0
        wakeup = None if self.generation is None else self.generation.images.wakeup
        fds = () if wakeup is None else (wakeup,)
        ready = mp_wait([self.tasks, self.cancels], timeout, fds)
        # Serving, everything already queued is taken before the next step: requests that
        # arrive together join one batch (one prefill turn, full decode steps) instead of
        # one per step, and a cancel lands before its stream's next token.
        taken = 0
        while 0 in ready or 1 in ready:  # (the images' wakeup alone is the step's to read)
            if 1 in ready:
                self._handle_cancel(self.cancels.receive())
            if 0 in ready:
                self.handle_task(self.tasks.receive())
            taken += 1
            if self.generation is None or self.done or taken >= _MAX_INPUTS_PER_STEP:
                return
            ready = mp_wait([self.tasks, self.cancels], 0.0, fds)

    def _report_running(self) -> None:
        assert self.generation is not None
        active = self.generation.active
        if active == 0 and isinstance(self.current_status, RunnerRunning):
            self.update_status(RunnerReady())
        elif active > 0 and (
            not isinstance(self.current_status, RunnerRunning)
            or self.current_status.active_requests != active
        ):
            self.update_status(RunnerRunning(active_requests=active))

    def _handle_cancel(self, task_id: TaskId) -> None:
        if self.generation is None:
            return
        if task_id == CANCEL_ALL_TASKS:
            cancelled = self.generation.cancel_all()
        else:
            cancelled = self.generation.cancel(task_id)
            if not cancelled:
                self.early_cancels.add(task_id)
        self.events.send_many(cancelled)

    # -- tasks -----------------------------------------------------------------------

    def handle_task(self, task: Task) -> None:
        status = self.current_status
        match task:
            case ConnectToGroup() if isinstance(status, RunnerIdle):
                self.update_status(RunnerConnecting())
                self.acknowledge_task(task)
                self._connect()
                self.update_status(RunnerConnected())
                self.send_task_status(task.task_id, TaskStatus.Complete)
            case LoadModel() if self._can_load(status):
                total = self._layer_count()
                self.update_status(RunnerLoading(layers_loaded=0, total_layers=total))
                self.acknowledge_task(task)
                try:
                    loaded = load_generation(
                        self.bound_instance, self.settings, self._loading_progress
                    )
                except MODEL_FILE_ERRORS as e:  # the same file fails the same way again
                    raise ModelFileError(f"{type(e).__name__}: {e}") from e
                if isinstance(loaded, Follower):
                    self.follower = loaded
                else:
                    self.generation = loaded
                self.update_status(RunnerLoaded())
                self.send_task_status(task.task_id, TaskStatus.Complete)
            case StartWarmup() if isinstance(status, RunnerLoaded):
                self.update_status(RunnerWarmingUp())
                self.acknowledge_task(task)
                started = time.perf_counter()
                if self.follower is not None:
                    self.follower.start()  # rank 0's warm-up runs through us
                else:
                    assert self.generation is not None
                    self.generation.warmup()
                took = time.perf_counter() - started
                frozen = freeze_long_lived()  # the model's objects: out of full collections
                logger.info(f"warmed up in {took:.2f} s ({frozen} long-lived objects frozen)")
                self.update_status(RunnerReady())
                self.send_task_status(task.task_id, TaskStatus.Complete)
            case TextGeneration() if self.generation is not None and isinstance(
                status, (RunnerReady, RunnerRunning)
            ):
                self.acknowledge_task(task)
                self.send_task_status(task.task_id, TaskStatus.Running)
                if task.task_id in self.early_cancels:
                    self.early_cancels.discard(task.task_id)
                    self.send_task_status(task.task_id, TaskStatus.Cancelled)
                    return
                self.events.send_many(self.generation.submit(task))
            case Shutdown():
                self.acknowledge_task(task)
                self.update_status(RunnerShuttingDown())
                if self.generation is not None:
                    self.events.send_many(self.generation.cancel_all())
                    self.generation.close()
                if self.follower is not None:  # rank 0's stop, when it comes, ends its trace
                    self.follower.finished.wait(_FOLLOWER_STOP_GRACE_S)
                self.send_task_status(task.task_id, TaskStatus.Complete)
                self.done = True
            case CancelTask():
                self.acknowledge_task(task)
                self._handle_cancel(task.cancelled_task_id)
                self.send_task_status(task.task_id, TaskStatus.Complete)
            case (
                ConnectToGroup()
                | LoadModel()
                | StartWarmup()
                | TextGeneration()
                | CreateRunner()
                | DownloadModel()
                | AbandonInstance()
            ):
                self._refuse(task, status)
            case _:  # pyright: ignore[reportUnnecessaryComparison]
                assert_never(task)

    def _refuse(self, task: Task, status: RunnerStatus) -> None:
        """A task that does not fit the current status: refused, never half-done. A failed
        runner is dead and takes nothing."""
        message = f"runner cannot {type(task).__name__} while {type(status).__name__}"
        logger.warning(message)
        self.acknowledge_task(task)
        self.send_task_status(task.task_id, TaskStatus.Failed, message)

    def _can_load(self, status: RunnerStatus) -> bool:
        if self.bound_instance.instance.world_size == 1:
            return isinstance(status, RunnerIdle)
        return isinstance(status, RunnerConnected)

    def _layer_count(self) -> int:
        shard = self.bound_instance.bound_shard
        if shard.kind == "PipelineShardMetadata":
            return shard.end_layer - shard.start_layer
        return shard.model_card.n_layers

    def _loading_progress(self, loaded: int, total: int) -> None:
        self.update_status(RunnerLoading(layers_loaded=loaded, total_layers=total))

    def _connect(self) -> None:
        connect(self.bound_instance, EXO_RUNNER_CONNECT_TIMEOUT_S)
