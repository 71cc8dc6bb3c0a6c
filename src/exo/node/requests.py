"""Which open request on this node waits on which task and instance, and the errors that end
a request whose task, instance or answer is gone.

Answers travel straight from the runner's node to the request's node and are not resent:
a cluster link cut at the wrong moment loses the end of an answer while the task's
completion (an event, replicated) still arrives. A request whose task finished without its
last chunk arriving within ``tail_grace_s`` ends with an error rather than waiting forever."""

import time
from collections.abc import Callable

import anyio
from loguru import logger

from exo.node.chunks import ChunkRouter
from exo.shared.types.chunks import Chunk, error_chunk
from exo.shared.types.common import CommandId
from exo.shared.types.events import (
    Event,
    InstanceDeleted,
    NodeTimedOut,
    TaskCreated,
    TaskStatusUpdated,
)
from exo.shared.types.state import State
from exo.shared.types.tasks import TaskId, TaskStatus, TextGeneration
from exo.shared.types.worker.instances import InstanceId
from exo.utils.channels import Receiver

TAIL_GRACE_S = 5.0
"""How long after its task finished a request may still wait for its last chunk."""

LOST_TAIL = (
    "the end of the answer was lost on the way from the node that ran it "
    "(the generation finished, its last part never arrived)"
)


class RequestsEnded(Exception):
    """The node is stopping: no request opens any more (`RequestTracker.end_all`)."""


class RequestTracker:
    def __init__(
        self,
        chunks: ChunkRouter,
        clock: Callable[[], float] = time.monotonic,
        tail_grace_s: float = TAIL_GRACE_S,
    ) -> None:
        self.chunks = chunks
        self._clock = clock
        self._tail_grace_s = tail_grace_s
        self._task_commands: dict[TaskId, CommandId] = {}
        self._command_instances: dict[CommandId, InstanceId] = {}
        self._tail_due: dict[CommandId, float] = {}
        """Requests whose task finished: by when their last chunk must have come."""
        self._responding: set[CommandId] = set()
        """Requests whose response is still being written (opened, not yet closed)."""
        self._ended: str | None = None
        """Why no request opens any more (`end_all`), or None."""

    def open(self, command_id: CommandId) -> Receiver[Chunk]:
        """The chunks of request `command_id`; raises RequestsEnded once `end_all` ran."""
        if self._ended is not None:
            raise RequestsEnded(self._ended)
        self._responding.add(command_id)
        return self.chunks.open(command_id)

    def close(self, command_id: CommandId) -> None:
        self._responding.discard(command_id)
        self.chunks.close(command_id)
        self._command_instances.pop(command_id, None)
        self._tail_due.pop(command_id, None)

    def fail(self, command_id: CommandId, message: str) -> None:
        self._command_instances.pop(command_id, None)
        self._tail_due.pop(command_id, None)
        self.chunks.deliver(command_id, error_chunk(message))

    def observe(self, event: Event, state: State) -> None:
        """Requests whose task or instance disappears get an error at once; ``state`` is
        the state with ``event`` applied."""
        match event:
            case TaskCreated(task=TextGeneration() as task):
                if self.chunks.is_open(task.command_id):
                    self._task_commands[task.task_id] = task.command_id
                    self._command_instances[task.command_id] = task.instance_id
            case TaskStatusUpdated(task_status=TaskStatus.Failed | TaskStatus.TimedOut):
                command_id = self._task_commands.pop(event.task_id, None)
                if command_id is not None:
                    self.fail(command_id, event.error_message or "generation failed")
            case TaskStatusUpdated(task_status=TaskStatus.Complete | TaskStatus.Cancelled):
                command_id = self._task_commands.pop(event.task_id, None)
                if command_id is not None and self.chunks.is_open(command_id):
                    self._tail_due[command_id] = self._clock() + self._tail_grace_s
            case InstanceDeleted() | NodeTimedOut():
                live = set(state.instances)
                reason = (
                    f"instance deleted: {event.reason}"
                    if isinstance(event, InstanceDeleted)
                    else f"node {event.node_id} left the cluster"
                )
                for command_id, instance_id in list(self._command_instances.items()):
                    if instance_id not in live and command_id not in self._tail_due:
                        self.fail(command_id, reason)
            case _:
                pass

    def reset(self, state: State) -> None:
        """The state was replaced wholesale (from the master): requests it no longer knows of
        end."""
        reason = "the request is gone from the cluster's state (reset from the master)"
        for task_id, command_id in list(self._task_commands.items()):
            if task_id not in state.tasks:
                del self._task_commands[task_id]
                self.fail(command_id, reason)
        for command_id, instance_id in list(self._command_instances.items()):
            if instance_id not in state.instances and command_id not in self._tail_due:
                self.fail(command_id, reason)

    def expire(self) -> None:
        """End the requests whose task finished but whose last chunk is overdue."""
        now = self._clock()
        for command_id, due in list(self._tail_due.items()):
            if not self.chunks.is_open(command_id):
                del self._tail_due[command_id]  # the end came
            elif now >= due:
                logger.warning(f"response {command_id}: {LOST_TAIL}")
                self.fail(command_id, LOST_TAIL)

    async def run(self, interval_s: float = 0.25) -> None:
        while True:
            self.expire()
            await anyio.sleep(interval_s)

    async def end_all(self, message: str, grace_s: float = 3.0) -> None:
        """Every waiting or streaming request gets an error that says why, and a moment to
        send it (until its response closed, or ``grace_s``); a request that comes after is
        refused with the same words (it would otherwise wait on a node that is stopping)."""
        self._ended = message
        open_now = self.chunks.open_commands()
        if not open_now:
            return
        logger.info(f"ending {len(open_now)} open request(s): {message}")
        for command_id in open_now:
            self.fail(command_id, message)
        with anyio.move_on_after(grace_s):
            while any(c in self._responding for c in open_now):
                await anyio.sleep(0.02)
