"""The master's decisions, pure: what a command (or a node's event) becomes in the log,
or why it is refused. ``Master`` (main.py) sequences what these return, writes it to the
log and publishes it; nothing here reads the clock, makes ids or does I/O: fresh ids and
the next free port come in as ``Fresh``.

* ``decide(state, command, fresh, card)``: the events a command makes, or a ``Refusal``.
* ``admit(state, event)``: whether a node's event is written at all (a runner's status
  arriving after its instance was deleted is not).
* ``replacements(before, after, gone, fresh)``: instances lost with a node, placed again
  on the nodes left (or why not), after its ``NodeTimedOut`` was applied.
"""

from dataclasses import dataclass, replace

from exo.master.placement import (
    PlacementError,
    group_host,
    model_holders,
    place_again,
    place_instance,
)
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.chunks import RefusalKind
from exo.shared.types.commands import (
    CancelCommand,
    Command,
    CreateInstance,
    DeleteInstance,
    DownloadAction,
    GenerateText,
    PlaceInstance,
    RecordRefusal,
)
from exo.shared.types.common import FrozenModel, NodeId
from exo.shared.types.events import (
    CommandRefused,
    DownloadActionRequested,
    Event,
    InstanceCreated,
    InstanceDeleted,
    RunnerStatusUpdated,
    TaskCreated,
    TaskStatusUpdated,
)
from exo.shared.types.state import State
from exo.shared.types.state_queries import (
    instance_of_runner,
    instances_of,
    least_loaded,
    serving_instances,
    task_of_command,
)
from exo.shared.types.tasks import TaskId, TaskStatus, TextGeneration
from exo.shared.types.worker.instances import Instance, InstanceId
from exo.shared.types.worker.runners import RunnerShutdown

PORT_SPAN = 10_000
"""Group ports are taken from ``port_base`` up to ``port_base + PORT_SPAN``."""


class Refusal(FrozenModel):
    """A command the master does not apply, and why (in words for the client); its
    ``kind`` travels to the requester in the error chunk (``refusal_status``)."""

    kind: RefusalKind
    reason: str


def refusal_status(kind: RefusalKind) -> int:
    """The HTTP status of a refusal."""
    match kind:
        case "unknown_model" | "no_instance":
            return 404
        case "no_placement":
            return 409
        case "not_serving":
            return 503
        case "log_full":
            return 507


@dataclass(frozen=True)
class Fresh:
    """What a decision may need that the state cannot give: new ids, and where the search
    for the next free group port starts (an offset from ``port_base``)."""

    instance_ids: tuple[InstanceId, ...]
    """New instance ids, used in order (a node's loss may need several)."""
    task_id: TaskId
    port_base: int = 29500
    port_offset: int = 0

    @property
    def instance_id(self) -> InstanceId:
        return self.instance_ids[0]


Decision = list[Event] | Refusal


def decide(state: State, command: Command, fresh: Fresh, card: ModelCard | None) -> Decision:
    """The events ``command`` makes in ``state``, or why it is refused. ``card``: the
    model card of a ``PlaceInstance`` (its own, or the one the master knows)."""
    match command:
        case PlaceInstance():
            return _place(state, command, fresh, card)
        case CreateInstance():
            return [InstanceCreated(instance=command.instance)]
        case DownloadAction():
            return [DownloadActionRequested(
                node_id=command.node_id, action=command.action, model_card=command.model_card)]
        case DeleteInstance():
            if command.instance_id not in state.instances:
                return Refusal(kind="no_instance", reason=f"no instance {command.instance_id}")
            return [InstanceDeleted(instance_id=command.instance_id, reason=command.reason)]
        case GenerateText():
            return _generate(state, command, fresh)
        case CancelCommand():
            task = task_of_command(state, command.cancelled_command_id)
            if task is None:
                return []  # finished already, or never began: nothing left to cancel
            return [TaskStatusUpdated(task_id=task.task_id, task_status=TaskStatus.Cancelled)]
        case RecordRefusal():
            return [CommandRefused(command_id=command.command_id, reason=command.reason)]


def _place(state: State, command: PlaceInstance, fresh: Fresh, card: ModelCard | None) -> Decision:
    if command.unless_present and instances_of(state, command.model_id):
        return []  # racing placements of a model that needs one instance make one
    if card is None:
        return Refusal(kind="unknown_model", reason=f"unknown model {command.model_id!r}")
    placed = place_instance(
        card, command.sharding, command.min_nodes, state.nodes, state.topology,
        state.instances, fresh.instance_id, holders=model_holders(state, card.model_id),
    )
    if isinstance(placed, PlacementError):
        return Refusal(kind="no_placement", reason=placed.reason)
    return [InstanceCreated(instance=with_group_address(placed, state, fresh))]


def _generate(state: State, command: GenerateText, fresh: Fresh) -> Decision:
    model_id = command.task_params.model
    chosen = least_loaded(state, serving_instances(state, model_id))
    if chosen is None:
        return Refusal(
            kind="not_serving",
            reason=f"no ready instance of {model_id} (its runners are not all ready)",
        )
    task = TextGeneration(
        task_id=fresh.task_id,
        instance_id=chosen.instance_id,
        command_id=command.command_id,
        task_params=command.task_params,
        origin_node_id=command.origin_node_id,
    )
    return [TaskCreated(task_id=task.task_id, task=task)]


def with_group_address(instance: Instance, state: State, fresh: Fresh) -> Instance:
    """Rank 0's node hosts the runners' rendezvous; ports differ per instance, and the
    next instance takes the next free port from ``fresh.port_offset`` (a port just left
    by a deleted instance may still be held by its runners)."""
    used = {i.group_port for i in state.instances.values()}
    offset = next(
        o
        for k in range(PORT_SPAN)
        if (o := (fresh.port_offset + k) % PORT_SPAN) + fresh.port_base not in used
    )
    port = fresh.port_base + offset
    return instance.model_copy(
        update={"group_host": group_host(instance, state.nodes), "group_port": port}
    )


def next_port_offset(event: Event, port_base: int, port_offset: int) -> int:
    """Where the search for a free port starts after ``event`` was sequenced."""
    if isinstance(event, InstanceCreated) and event.instance.group_port >= port_base:
        return (event.instance.group_port - port_base + 1) % PORT_SPAN
    return port_offset


def admit(state: State, event: Event) -> bool:
    """Whether a node's event is written: a runner's status arriving after its instance
    was deleted (its last words on the way out) would bring a runner of no instance back."""
    if not isinstance(event, RunnerStatusUpdated) or isinstance(
        event.runner_status, RunnerShutdown
    ):
        return True
    return instance_of_runner(state, event.runner_id) is not None


def replacements(
    before: State, after: State, gone: NodeId, fresh: Fresh
) -> list[InstanceCreated | Refusal]:
    """Each instance that went with node ``gone`` (in ``before``, not in ``after``),
    placed again on the nodes left, or why it cannot be (``no_placement``)."""
    out: list[InstanceCreated | Refusal] = []
    state = after
    lost_ones = [i for iid, i in before.instances.items() if iid not in after.instances]
    for lost, new_id in zip(lost_ones, fresh.instance_ids, strict=False):
        placed = place_again(lost, state.nodes, state.topology, state.instances, new_id)
        if isinstance(placed, PlacementError):
            out.append(Refusal(
                kind="no_placement",
                reason=f"instance {lost.instance_id} of {lost.shard_assignments.model_id} "
                f"was lost with node {gone} and cannot be placed again: {placed.reason}",
            ))
            continue
        created = InstanceCreated(instance=with_group_address(placed, state, fresh))
        fresh = replace(
            fresh, port_offset=next_port_offset(created, fresh.port_base, fresh.port_offset)
        )
        state = state.model_copy(update={"instances": {
            **state.instances, created.instance.instance_id: created.instance}})
        out.append(created)
    return out
