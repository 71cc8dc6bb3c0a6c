"""The master's decisions as tables: (state, command) -> the events it makes, or the
refusal and its kind. Synchronous, plain values."""

from dataclasses import dataclass

import pytest

from exo.master.decide import (
    Fresh,
    Refusal,
    RefusalKind,
    admit,
    decide,
    next_port_offset,
    refusal_status,
    replacements,
)
from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.tests.builders import (
    COMMAND_1,
    COMMAND_2,
    INSTANCE_1,
    INSTANCE_2,
    MODEL_1,
    MODEL_2,
    NODE_A,
    NODE_B,
    RUNNER_A1,
    RUNNER_A2,
    RUNNER_B1,
    TASK_1,
    TASK_2,
    fold,
    make_state,
    model_card,
    node_info,
    pair_instance,
    single_instance,
    text_generation,
)
from exo.shared.types.commands import (
    CancelCommand,
    Command,
    CreateInstance,
    DeleteInstance,
    GenerateText,
    PlaceInstance,
)
from exo.shared.types.common import NodeId
from exo.shared.types.events import (
    Event,
    InstanceCreated,
    InstanceDeleted,
    NodeTimedOut,
    RunnerStatusUpdated,
    TaskCreated,
    TaskStatusUpdated,
)
from exo.shared.types.state import State
from exo.shared.types.tasks import TaskId, TaskStatus
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.topology import Connection
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import RunnerIdle, RunnerReady, RunnerShutdown

NEW = InstanceId("new-instance")
NEW_2 = InstanceId("new-instance-2")
FRESH = Fresh(instance_ids=(NEW, NEW_2), task_id=TaskId("new-task"), port_base=29500)

ONE_NODE = make_state(nodes={NODE_A: node_info("a", memory_mb=8192)})
TWO_NODES = make_state(
    nodes={NODE_A: node_info("a", memory_mb=8192), NODE_B: node_info("b", memory_mb=8192)},
    connections=[Connection(source=NODE_A, sink=NODE_B), Connection(source=NODE_B, sink=NODE_A)],
)
READY_1 = make_state(instances=[single_instance()], runners={RUNNER_A1: RunnerReady()})
TWO_READY = make_state(
    instances=[single_instance(), single_instance(INSTANCE_2, NODE_A, RUNNER_A2)],
    runners={RUNNER_A1: RunnerReady(), RUNNER_A2: RunnerReady()},
    tasks=[text_generation(TASK_1, INSTANCE_1), text_generation(TASK_2, INSTANCE_1, COMMAND_2)],
)


def _generate(model: ModelId = MODEL_1) -> GenerateText:
    params = TextGenerationTaskParams(model=model, input=[InputMessage(role="user", content="hi")])
    return GenerateText(command_id=COMMAND_1, task_params=params, origin_node_id=NODE_A)


@dataclass(frozen=True)
class Row:
    name: str
    state: State
    command: Command
    card: ModelCard | None = None
    events: tuple[type[Event], ...] = ()
    refused: RefusalKind | None = None


ROWS = [
    Row("place: a card and room", ONE_NODE, PlaceInstance(model_id=MODEL_1), model_card(),
        events=(InstanceCreated,)),
    Row("place: no card", ONE_NODE, PlaceInstance(model_id=MODEL_1), None,
        refused="unknown_model"),
    Row("place: no node", State(), PlaceInstance(model_id=MODEL_1), model_card(),
        refused="no_placement"),
    Row("place: more nodes than the cluster has", ONE_NODE,
        PlaceInstance(model_id=MODEL_1, min_nodes=2), model_card(), refused="no_placement"),
    Row("place unless present: present", READY_1,
        PlaceInstance(model_id=MODEL_1, unless_present=True), model_card()),
    Row("place unless present: another model's instance only",
        fold(ONE_NODE, [InstanceCreated(instance=single_instance())]),
        PlaceInstance(model_id=MODEL_2, unless_present=True), model_card(MODEL_2),
        events=(InstanceCreated,)),
    Row("create", State(), CreateInstance(instance=single_instance()), events=(InstanceCreated,)),
    Row("delete: present", READY_1, DeleteInstance(instance_id=INSTANCE_1),
        events=(InstanceDeleted,)),
    Row("delete: absent", State(), DeleteInstance(instance_id=INSTANCE_1),
        refused="no_instance"),
    Row("generate: a serving instance", READY_1, _generate(), events=(TaskCreated,)),
    Row("generate: runners not ready", make_state(
        instances=[single_instance()], runners={RUNNER_A1: RunnerIdle()}), _generate(),
        refused="not_serving"),
    Row("generate: no instance of the model", READY_1, _generate(MODEL_2),
        refused="not_serving"),
    Row("cancel: a running task", make_state(tasks=[text_generation()]),
        CancelCommand(cancelled_command_id=COMMAND_1), events=(TaskStatusUpdated,)),
    Row("cancel: nothing left", State(), CancelCommand(cancelled_command_id=COMMAND_1)),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_decide(row: Row) -> None:
    decided = decide(row.state, row.command, FRESH, row.card)
    if row.refused is not None:
        assert isinstance(decided, Refusal), decided
        assert decided.kind == row.refused
        assert decided.reason
    else:
        assert not isinstance(decided, Refusal), decided
        assert tuple(type(e) for e in decided) == row.events


def test_a_generation_goes_to_the_least_loaded_serving_instance() -> None:
    decided = decide(TWO_READY, _generate(), FRESH, None)
    assert not isinstance(decided, Refusal)
    (created,) = decided
    assert isinstance(created, TaskCreated)
    assert created.task.instance_id == INSTANCE_2  # INSTANCE_1 holds two tasks
    assert created.task_id == FRESH.task_id


def test_cancel_names_the_task_of_the_command() -> None:
    state = make_state(tasks=[text_generation(TASK_1, command_id=COMMAND_2),
                              text_generation(TASK_2, command_id=COMMAND_1)])
    decided = decide(state, CancelCommand(cancelled_command_id=COMMAND_1), FRESH, None)
    assert decided == [TaskStatusUpdated(task_id=TASK_2, task_status=TaskStatus.Cancelled)]


def test_placements_take_the_next_free_group_port() -> None:
    first = decide(ONE_NODE, PlaceInstance(model_id=MODEL_1), FRESH, model_card())
    assert isinstance(first, list) and isinstance(first[0], InstanceCreated)
    assert first[0].instance.group_port == 29500
    assert first[0].instance.instance_id == NEW
    after = fold(ONE_NODE, first)
    fresh = Fresh(instance_ids=(NEW_2,), task_id=TASK_1,
                  port_offset=next_port_offset(first[0], FRESH.port_base, FRESH.port_offset))
    second = decide(after, PlaceInstance(model_id=MODEL_1), fresh, model_card())
    assert isinstance(second, list) and isinstance(second[0], InstanceCreated)
    assert second[0].instance.group_port == 29501


@pytest.mark.parametrize(
    ("event", "admitted"),
    [
        (RunnerStatusUpdated(runner_id=RUNNER_A1, runner_status=RunnerIdle()), True),
        (RunnerStatusUpdated(runner_id=RUNNER_B1, runner_status=RunnerIdle()), False),
        (RunnerStatusUpdated(runner_id=RUNNER_B1, runner_status=RunnerShutdown()), True),
        (NodeTimedOut(node_id=NODE_B), True),
    ],
    ids=["its instance's runner", "a runner of no instance", "a shutdown", "not a status"],
)
def test_admit(event: Event, admitted: bool) -> None:
    assert admit(READY_1, event) is admitted


def test_an_instance_lost_with_a_node_is_placed_again_on_the_nodes_left() -> None:
    before = fold(TWO_NODES, [InstanceCreated(instance=pair_instance())])
    after = fold(before, [NodeTimedOut(node_id=NODE_B)])
    (outcome,) = replacements(before, after, NODE_B, FRESH)
    assert isinstance(outcome, InstanceCreated)
    assert outcome.instance.instance_id == NEW
    assert set(outcome.instance.shard_assignments.node_to_runner) == {NODE_A}


def test_an_instance_that_cannot_be_placed_again_says_why() -> None:
    before = fold(make_state(nodes={NODE_A: node_info("a", memory_mb=1)}),
                  [InstanceCreated(instance=pair_instance())])
    after = fold(before, [NodeTimedOut(node_id=NODE_B)])
    (outcome,) = replacements(before, after, NODE_B, FRESH)
    assert isinstance(outcome, Refusal)
    assert outcome.kind == "no_placement"
    assert str(INSTANCE_1) in outcome.reason and str(NodeId(NODE_B)) in outcome.reason


@pytest.mark.parametrize(
    ("kind", "status"),
    [("unknown_model", 404), ("no_instance", 404), ("no_placement", 409),
     ("not_serving", 503), ("log_full", 507)],
)
def test_refusal_status(kind: RefusalKind, status: int) -> None:
    assert refusal_status(kind) == status
