"""The master: the single writer. It turns commands and workers' events into indexed
events, applies them, keeps them in its log and publishes them to every node.

When a node times out, the instances that had a shard on it go with it (``apply``); the
master places each of their models again on the nodes that remain (``place_again``), or
logs why it cannot."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeGuard

import anyio
from loguru import logger

from exo.master.event_log import EventLog, MemoryEventLog
from exo.master.placement import (
    PlacementError,
    group_host,
    model_holders,
    place_again,
    place_instance,
)
from exo.shared.apply import apply
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.types.chunks import error_chunk
from exo.shared.types.commands import (
    CancelCommand,
    Command,
    CreateInstance,
    DeleteInstance,
    DownloadAction,
    GenerateText,
    PlaceInstance,
)
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import (
    ChunkGenerated,
    DownloadActionRequested,
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeTimedOut,
    RunnerStatusUpdated,
    TaskCreated,
    TaskStatusUpdated,
)
from exo.shared.types.state import State
from exo.shared.types.tasks import TaskId, TaskStatus, TextGeneration
from exo.shared.types.worker.instances import Instance, InstanceId, instance_is_serving
from exo.shared.types.worker.runners import RunnerShutdown
from exo.utils.channels import Receiver

Publish = Callable[[IndexedEvent], Awaitable[None]]
SendChunk = Callable[[ChunkGenerated, NodeId | None], None]
ResolveCard = Callable[[ModelId], ModelCard | None]


@dataclass(eq=False)
class Master:
    node_id: NodeId
    commands: Receiver[tuple[Command, NodeId | None]]
    local_events: Receiver[Event]
    publish: Publish
    send_chunk: SendChunk
    resolve_card: ResolveCard
    log: EventLog = field(default_factory=MemoryEventLog)
    state: State = field(default_factory=State)
    group_port_base: int = 29500
    _next_port: int = field(default=0, init=False)
    _handling: CommandId | None = field(default=None, init=False)
    """The command being handled: its events carry its id into the log."""
    """Where the search for the next group port starts, from ``group_port_base``."""

    async def run(self) -> None:
        logger.info(
            f"master {self.node_id} starting at event {self.state.last_event_applied_idx + 1}"
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._command_loop)
            tg.start_soon(self._event_loop)

    async def _command_loop(self) -> None:
        async for command, origin in self.commands:
            await self.submit(command, origin)

    async def submit(self, command: Command, origin: NodeId | None) -> None:
        """Handle a command; a failure becomes an error for its requester."""
        self._handling = command.command_id
        try:
            await self.handle_command(command, origin)
        except Exception as e:  # a bad command must not take the master down
            logger.opt(exception=e).error(f"command {type(command).__name__} failed")
            self._error(command.command_id, origin, f"{type(e).__name__}: {e}")
        finally:
            self._handling = None

    async def _event_loop(self) -> None:
        async for event in self.local_events:
            await self.emit(event)

    async def emit(self, event: Event) -> None:
        if _stale_runner_status(event, self.state):
            logger.debug(f"dropped a status of runner {event.runner_id}: no instance has it")
            return
        before = self.state
        await self._sequence(event)
        if isinstance(event, NodeTimedOut):
            lost = [i for iid, i in before.instances.items() if iid not in self.state.instances]
            for instance in lost:
                await self._place_again(instance, event.node_id)

    async def _sequence(self, event: Event) -> None:
        """Give ``event`` the next index: written to the log first, then the master's
        state, then published. An event that cannot be applied or written raises and
        leaves the state and the log as they were (it was never sequenced)."""
        indexed = IndexedEvent(
            idx=self.state.last_event_applied_idx + 1, event=event, command_id=self._handling
        )
        state = apply(self.state, indexed)
        self.log.append(indexed, state)
        self.state = state
        await self.publish(indexed)

    async def _place_again(self, lost: Instance, gone: NodeId) -> None:
        """An instance went with a node: its model, placed again on the nodes left."""
        model_id = lost.shard_assignments.model_id
        placed = place_again(
            lost, self.state.nodes, self.state.topology, self.state.instances, InstanceId()
        )
        if isinstance(placed, PlacementError):
            logger.warning(
                f"instance {lost.instance_id} of {model_id} was lost with node {gone} and "
                f"cannot be placed again: {placed.reason}"
            )
            return
        instance = self._with_group_address(placed)
        logger.info(
            f"instance {lost.instance_id} of {model_id} was lost with node {gone}: placed "
            f"again as {instance.instance_id} ({instance.sharding}, "
            f"{_count_nodes(instance.world_size)}, was {_count_nodes(lost.world_size)})"
        )
        await self._sequence(InstanceCreated(instance=instance))

    async def handle_command(self, command: Command, origin: NodeId | None) -> None:
        match command:
            case PlaceInstance():
                await self._place(command, origin)
            case CreateInstance():
                await self.emit(InstanceCreated(instance=command.instance))
            case DownloadAction():
                await self.emit(DownloadActionRequested(
                    node_id=command.node_id, action=command.action, model_card=command.model_card))
            case DeleteInstance():
                if command.instance_id in self.state.instances:
                    await self.emit(
                        InstanceDeleted(instance_id=command.instance_id, reason=command.reason)
                    )
            case GenerateText():
                await self._generate(command)
            case CancelCommand():
                for task in list(self.state.tasks.values()):
                    if (
                        isinstance(task, TextGeneration)
                        and task.command_id == command.cancelled_command_id
                    ):
                        await self.emit(
                            TaskStatusUpdated(
                                task_id=task.task_id, task_status=TaskStatus.Cancelled
                            )
                        )

    async def _place(self, command: PlaceInstance, origin: NodeId | None) -> None:
        present = [
            i for i in self.state.instances.values()
            if i.shard_assignments.model_id == command.model_id
        ]
        if command.unless_present and present:
            logger.info(
                f"{command.model_id} has an instance already ({present[0].instance_id}): "
                f"not placed again for command {command.command_id}"
            )
            return
        card = command.model_card or self.resolve_card(command.model_id)
        if card is None:
            self._error(command.command_id, origin, f"unknown model {command.model_id!r}")
            return
        placed = place_instance(
            card,
            command.sharding,
            command.min_nodes,
            self.state.nodes,
            self.state.topology,
            self.state.instances,
            InstanceId(),
            holders=model_holders(self.state, card.model_id),
        )
        if isinstance(placed, PlacementError):
            self._error(command.command_id, origin, placed.reason)
            return
        await self.emit(InstanceCreated(instance=self._with_group_address(placed)))

    def _with_group_address(self, instance: Instance) -> Instance:
        """Rank 0's node hosts the runners' rendezvous; ports differ per instance, and
        the next instance takes the next free port (a port just left by a deleted
        instance may still be held by its runners)."""
        span = 10_000
        used = {i.group_port for i in self.state.instances.values()}
        offset = next(
            o
            for k in range(span)
            if (o := (self._next_port + k) % span) + self.group_port_base not in used
        )
        self._next_port = (offset + 1) % span
        port = self.group_port_base + offset
        host = group_host(instance, self.state.nodes)
        return instance.model_copy(update={"group_host": host, "group_port": port})

    async def _generate(self, command: GenerateText) -> None:
        model_id = command.task_params.model
        serving = [
            inst
            for inst in self.state.instances.values()
            if inst.shard_assignments.model_id == model_id
            and instance_is_serving(inst, self.state.runners)
        ]
        if not serving:
            self._error(
                command.command_id,
                command.origin_node_id,
                f"no ready instance of {model_id} (its runners are not all ready)",
            )
            return
        load = {i.instance_id: 0 for i in serving}
        for task in self.state.tasks.values():
            if task.instance_id in load:
                load[task.instance_id] += 1
        chosen = min(serving, key=lambda i: (load[i.instance_id], i.instance_id))
        task = TextGeneration(
            task_id=TaskId(),
            instance_id=chosen.instance_id,
            command_id=command.command_id,
            task_params=command.task_params,
            origin_node_id=command.origin_node_id,
        )
        await self.emit(TaskCreated(task_id=task.task_id, task=task))

    def _error(self, command_id: CommandId, origin: NodeId | None, message: str) -> None:
        logger.warning(f"command {command_id}: {message}")
        self.send_chunk(
            ChunkGenerated(
                command_id=command_id,
                chunk=error_chunk(message),
            ),
            origin,
        )


def _stale_runner_status(event: Event, state: State) -> TypeGuard[RunnerStatusUpdated]:
    """A runner's status arriving after its instance was deleted (its last words on the
    way out): writing it would bring a runner of no instance back into the state."""
    if not isinstance(event, RunnerStatusUpdated) or isinstance(
        event.runner_status, RunnerShutdown
    ):
        return False
    return not any(
        event.runner_id in instance.shard_assignments.runner_to_shard
        for instance in state.instances.values()
    )


def _count_nodes(n: int) -> str:
    return "1 node" if n == 1 else f"{n} nodes"
