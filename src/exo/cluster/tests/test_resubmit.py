"""What a node re-submits when a merge drops a stretch of its log (``resubmit``)."""

from pathlib import Path

from exo.cluster.pending import PendingResubmissions
from exo.cluster.resubmit import ALREADY_DELETED, CUT_BY_MERGE, NOT_AGAIN, resubmissions
from exo.shared.apply import apply
from exo.shared.models.model_cards import ModelId
from exo.shared.tests.builders import model_card, pipeline_instance, text_generation
from exo.shared.types.commands import (
    CreateInstance,
    DeleteInstance,
    DownloadAction,
    RecordRefusal,
)
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import (
    CommandRefused,
    DownloadActionRequested,
    Event,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeTimedOut,
    TaskCreated,
    TaskStatusUpdated,
)
from exo.shared.types.state import State
from exo.shared.types.tasks import TaskId, TaskStatus
from exo.shared.types.worker.instances import Instance, InstanceId
from exo.shared.types.worker.runners import RunnerId

N1 = NodeId("n1")


def instance(name: str, port: int = 0) -> Instance:
    made = pipeline_instance(InstanceId(name), [(N1, RunnerId(f"r-{name}"))])
    return made.model_copy(update={"group_port": port})


def log(*events: tuple[Event, str | None]) -> list[IndexedEvent]:
    return [
        IndexedEvent(idx=10 + i, event=event,
                     command_id=None if command is None else CommandId(command))
        for i, (event, command) in enumerate(events)
    ]


def state_with(*instances: Instance) -> State:
    state = State()
    for i, made in enumerate(instances):
        state = apply(state, IndexedEvent(idx=i, event=InstanceCreated(instance=made)))
    return state


def test_created_and_deleted_instances_come_back_as_commands_with_their_ids() -> None:
    old = instance("old")
    new = instance("new")
    card = model_card(ModelId("org/m"), n_layers=4)
    dropped = log(
        (NodeTimedOut(node_id=NodeId("n2")), None),  # a node-local fact: not a command
        (InstanceCreated(instance=new), "place-1"),
        (InstanceDeleted(instance_id=old.instance_id, reason="bye"), "delete-1"),
        (DownloadActionRequested(node_id=N1, action="start", model_card=card), "download-1"),
    )
    again = resubmissions(dropped, state_with(old))
    assert again.commands == [
        CreateInstance(instance=new, command_id=CommandId("place-1")),
        DeleteInstance(instance_id=old.instance_id, reason="bye",
                       command_id=CommandId("delete-1")),
        DownloadAction(action="start", node_id=N1, model_card=card,
                       command_id=CommandId("download-1")),
    ]
    assert again.settled == again.answered == []


def test_a_deletion_the_winner_made_already_is_recorded_as_refused() -> None:
    gone = instance("gone")
    again = resubmissions(log((InstanceDeleted(instance_id=gone.instance_id), "d")), State())
    assert again.commands == [RecordRefusal(command_id=CommandId("d"), reason=ALREADY_DELETED)]
    assert again.settled == [CommandId("d")]


def test_an_instance_created_and_deleted_after_the_fork_comes_back_in_order() -> None:
    made = instance("made")
    again = resubmissions(log(
        (InstanceCreated(instance=made), "c"),
        (InstanceDeleted(instance_id=made.instance_id), "d"),
    ), State())
    assert [type(c).__name__ for c in again.commands] == ["CreateInstance", "DeleteInstance"]


def test_generations_and_cancellations_are_recorded_as_refused_not_run_again() -> None:
    generation = TaskCreated(task_id=TaskId("t"), task=text_generation(TaskId("t"),
                             InstanceId("i"), CommandId("generate")))
    cancelled = TaskStatusUpdated(task_id=TaskId("t"), task_status=TaskStatus.Cancelled)
    again = resubmissions(
        log((generation, "generate"), (cancelled, "cancel"), (cancelled, "cancel")), State()
    )
    assert again.commands == [
        RecordRefusal(command_id=CommandId("generate"), reason=CUT_BY_MERGE),
        RecordRefusal(command_id=CommandId("cancel"), reason=NOT_AGAIN),
    ]  # once per command
    assert again.answered == [CommandId("generate"), CommandId("cancel")]


def test_a_refusal_in_the_dropped_stretch_comes_back_with_its_reason() -> None:
    refused = CommandRefused(command_id=CommandId("r"), reason="because")
    again = resubmissions(log((refused, "r")), State())
    assert again.commands == [RecordRefusal(command_id=CommandId("r"), reason="because")]
    assert again.refused == [CommandId("r")]


def test_a_group_port_the_winner_uses_is_moved() -> None:
    theirs = instance("theirs", port=29500)
    mine = instance("mine", port=29500)
    again = resubmissions(log((InstanceCreated(instance=mine), "c")), state_with(theirs))
    created = again.commands[0]
    assert isinstance(created, CreateInstance)
    assert created.instance.instance_id == mine.instance_id
    assert created.instance.group_port == 29501


def test_re_submissions_not_yet_taken_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "resubmit.json"
    first = CreateInstance(instance=instance("a"), command_id=CommandId("c1"))
    second = DeleteInstance(instance_id=InstanceId("b"), command_id=CommandId("c2"))
    PendingResubmissions(path).add([first, second])
    pending = PendingResubmissions(path)  # the node stopped before a master took them
    assert pending.commands == [first, second]
    pending.taken(CommandId("c1"))
    assert PendingResubmissions(path).commands == [second]
    path.write_text("not json")
    assert PendingResubmissions(path).commands == []  # said in the log, not a crash
