"""Commands a merge dropped that must not run again (a generation, a cancellation, the
deletion of an instance the winner deleted already) come back as ``RecordRefusal``: the
master logs a ``CommandRefused`` under their id once, and nothing for an id its log
holds already (issue #20, fault 3: every acknowledged id ends in the log exactly once)."""

from pathlib import Path
from typing import cast

import pytest

from exo.cluster.network import ClusterNetwork
from exo.cluster.presence import Peers
from exo.cluster.replica import Replica
from exo.cluster.sequencer import Sequencer
from exo.cluster.sim.node import SimHost
from exo.cluster.store import ElectionStore
from exo.master.decide import Fresh, decide
from exo.master.event_log import SqliteEventLog
from exo.shared.tests.builders import node_info, pipeline_instance
from exo.shared.types.commands import CreateInstance, DeleteInstance, RecordRefusal
from exo.shared.types.common import CommandId, NodeId
from exo.shared.types.events import CommandRefused, IndexedEvent
from exo.shared.types.state import State
from exo.shared.types.tasks import TaskId
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import RunnerId

ME = NodeId("me")


class _Published:
    async def publish(self, _topic: object, _message: object) -> None:
        return None


def _logged(replica: Replica) -> list[IndexedEvent]:
    return replica.log.read_from(0, 1000)


def test_a_refusal_record_becomes_a_command_refused_event() -> None:
    record = RecordRefusal(command_id=CommandId("c"), reason="cut by a merge")
    decided = decide(State(), record, Fresh(instance_ids=(InstanceId(),), task_id=TaskId()), None)
    assert decided == [CommandRefused(command_id=CommandId("c"), reason="cut by a merge")]


@pytest.mark.anyio
async def test_a_refusal_is_logged_once_and_never_for_an_id_the_log_holds(
    tmp_path: Path,
) -> None:
    host = SimHost(ME, State(), lambda: 0.0, node_info())
    replica = Replica(host, SqliteEventLog(tmp_path / "events.db"),
                      ElectionStore(tmp_path / "election.json"))
    sequencer = Sequencer(host, replica, Peers(ME, lambda: 0.0, 5.0),
                          lambda: cast(ClusterNetwork, _Published()))
    await sequencer.take_over(1, lambda: None)
    instance = pipeline_instance(InstanceId("i"), [(ME, RunnerId("r"))])
    host.pending.add(CommandId("applied"))
    assert await sequencer.submit(CreateInstance(instance=instance,
                                                 command_id=CommandId("applied")), ME)
    # A later master of this log (it knows the ids from the log alone).
    await sequencer.step_down()
    await sequencer.take_over(2, lambda: None)
    held = RecordRefusal(command_id=CommandId("applied"), reason="the instance was deleted")
    new = RecordRefusal(command_id=CommandId("new"), reason="cut by a merge")
    for record in (held, new, new, held):  # several nodes re-submit the same records
        assert await sequencer.submit(record, ME)
    ids = [(e.command_id, type(e.event).__name__) for e in _logged(replica)]
    assert ids == [(CommandId("applied"), "InstanceCreated"),
                   (CommandId("new"), "CommandRefused")]
    refused = _logged(replica)[-1].event
    assert refused == CommandRefused(command_id=CommandId("new"), reason="cut by a merge")
    assert host.state().instances.keys() == {InstanceId("i")}  # a refusal changes no state
    assert host.failed == {}  # the refusal's client was told before: no error chunk now


@pytest.mark.anyio
async def test_a_re_submitted_command_the_master_refuses_is_logged_as_refused(
    tmp_path: Path,
) -> None:
    """A deletion re-submitted after a merge whose instance went meanwhile (another
    deletion, its node timed out): the master's refusal is logged under its id. A client's
    own command refused the same way is not logged (its client hears why)."""
    host = SimHost(ME, State(), lambda: 0.0, node_info())
    replica = Replica(host, SqliteEventLog(tmp_path / "events.db"),
                      ElectionStore(tmp_path / "election.json"))
    sequencer = Sequencer(host, replica, Peers(ME, lambda: 0.0, 5.0),
                          lambda: cast(ClusterNetwork, _Published()))
    await sequencer.take_over(1, lambda: None)
    again = DeleteInstance(instance_id=InstanceId("gone"), command_id=CommandId("again"))
    fresh = DeleteInstance(instance_id=InstanceId("gone"), command_id=CommandId("fresh"))
    host.pending.add(CommandId("fresh"))
    assert await sequencer.submit(again, ME, resubmitted=True)
    assert await sequencer.submit(again, ME, resubmitted=True)  # once
    assert await sequencer.submit(fresh, ME)
    logged = _logged(replica)
    assert [e.command_id for e in logged] == [CommandId("again")]
    assert logged[0].event == CommandRefused(command_id=CommandId("again"),
                                             reason="no instance gone")
    assert host.failed == {CommandId("fresh"): "no instance gone"}
