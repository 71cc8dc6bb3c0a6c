"""What a node re-submits when a merge drops a stretch of its log.

When partitions heal, the master whose claim ranks lower (``election``) steps down and
every node that followed it starts again from the winner's state, dropping the events
its log holds past the fork. The commands behind those events were acknowledged to
their clients, so the nodes that drop them re-submit them to the winner, rebuilt from
the dropped events themselves (every such node holds them, durably, in its log): the
command keeps its id, so the winner applies it once however many nodes re-submit it,
and not at all when its log holds it already.

* ``InstanceCreated`` (a placement or a creation) -> ``CreateInstance`` of the same
  instance, its id kept (its group port moved when the winner uses that one).
* ``InstanceDeleted`` -> ``DeleteInstance``; when the winner's state lacks the instance
  already, ``RecordRefusal`` ("the instance was already deleted").
* ``DownloadActionRequested`` -> ``DownloadAction``.
* A generation (``TaskCreated``) or a cancellation (any other event behind a command) is
  not run again: its client already has its answer, or its stream ended with the reason
  (the request is gone from the cluster's state), and running it again would repeat an
  answer already streamed. It comes back as ``RecordRefusal`` with that reason.
* ``CommandRefused`` -> ``RecordRefusal`` with its reason.

So every command behind the dropped stretch ends in the winner's log once, applied or
refused with a reason (the master writes ``CommandRefused`` for a ``RecordRefusal``
whose id its log lacks, and nothing for one it holds).

Node-local facts in the dropped stretch (runner statuses, downloads, node info) are not
commands: each node re-reports its own to the new master (``Delivery.queue_local_truth``).

Pure: events and the winner's state in, commands out.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

from exo.shared.types.commands import (
    Command,
    CreateInstance,
    DeleteInstance,
    DownloadAction,
    RecordRefusal,
)
from exo.shared.types.common import CommandId
from exo.shared.types.events import (
    CommandRefused,
    DownloadActionRequested,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    TaskCreated,
)
from exo.shared.types.state import State
from exo.shared.types.worker.instances import Instance

ALREADY_DELETED = "the instance was already deleted (a cluster merge dropped this deletion)"
CUT_BY_MERGE = ("the generation was cut by a cluster merge; its client was answered or told "
                "(not run again)")
NOT_AGAIN = "a cluster merge dropped this command; its client was answered (not applied again)"


@dataclass(frozen=True)
class Resubmission:
    commands: list[Command] = field(default_factory=list[Command])
    """To re-submit, in the order the dropped log applied them (those below among them,
    as ``RecordRefusal``)."""
    settled: list[CommandId] = field(default_factory=list[CommandId])
    """Dropped, but their effect holds in the winner's state already."""
    answered: list[CommandId] = field(default_factory=list[CommandId])
    """Generations and cancellations: their clients were answered (see the module)."""
    refused: list[CommandId] = field(default_factory=list[CommandId])
    """Refused in the dropped stretch already."""


def resubmissions(dropped: Sequence[IndexedEvent], winner: State) -> Resubmission:
    """The commands behind ``dropped`` (a stretch of this node's log, in order) to
    re-submit to the master whose state is ``winner``."""
    out = Resubmission()
    seen: set[CommandId] = set()
    present = set(winner.instances)
    ports = {(i.group_host, i.group_port) for i in winner.instances.values()}
    for indexed in dropped:
        command_id = indexed.command_id
        if command_id is None or command_id in seen:
            continue
        seen.add(command_id)
        match indexed.event:
            case InstanceCreated(instance=instance):
                instance = _free_port(instance, ports)
                ports.add((instance.group_host, instance.group_port))
                present.add(instance.instance_id)
                out.commands.append(CreateInstance(instance=instance, command_id=command_id))
            case InstanceDeleted(instance_id=instance_id, reason=reason):
                if instance_id not in present:
                    out.settled.append(command_id)
                    out.commands.append(RecordRefusal(command_id=command_id,
                                                      reason=ALREADY_DELETED))
                    continue
                present.discard(instance_id)
                out.commands.append(
                    DeleteInstance(instance_id=instance_id, reason=reason or "deleted by request",
                                   command_id=command_id)
                )
            case DownloadActionRequested(node_id=node_id, action=action, model_card=card):
                out.commands.append(DownloadAction(action=action, node_id=node_id,
                                                   model_card=card, command_id=command_id))
            case CommandRefused(reason=reason):
                out.refused.append(command_id)
                out.commands.append(RecordRefusal(command_id=command_id, reason=reason))
            case TaskCreated():
                out.answered.append(command_id)
                out.commands.append(RecordRefusal(command_id=command_id, reason=CUT_BY_MERGE))
            case _:
                out.answered.append(command_id)
                out.commands.append(RecordRefusal(command_id=command_id, reason=NOT_AGAIN))
    return out


def _free_port(instance: Instance, used: set[tuple[str, int]]) -> Instance:
    """``instance`` with a group port no instance of the winner's uses on its host (0:
    it has none)."""
    if instance.group_port == 0 or (instance.group_host, instance.group_port) not in used:
        return instance
    taken = {port for host, port in used if host == instance.group_host}
    port = max(taken) + 1
    return instance.model_copy(update={"group_port": port})
