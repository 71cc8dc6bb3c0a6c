"""What nodes of a cluster say to each other, and where."""

from pydantic import Field

from exo.cluster.election import Heartbeat
from exo.cluster.lineage import Epoch, Lineage
from exo.routing import Endpoint, Topic
from exo.shared.types.commands import Command
from exo.shared.types.common import CommandId, FrozenModel, NodeId
from exo.shared.types.events import ChunkGenerated, Event, IndexedEvent
from exo.shared.types.state import State


class EventMsg(FrozenModel):
    """An indexed event, published by the master that sequenced it."""

    epoch: Epoch
    event: IndexedEvent


class CommandMsg(FrozenModel):
    command: Command
    origin: NodeId | None
    resubmitted: bool = False
    """Re-submitted after a merge dropped it (``cluster.resubmit``): a refusal of it is
    logged (``CommandRefused``), so that its id ends in the log all the same."""


class LocalEventsMsg(FrozenModel):
    """Events about one node (its runners, downloads, info), in the order they happened."""

    node_id: NodeId
    events: list[Event]


class Ack(FrozenModel):
    accepted: bool
    """False: the asked node is not (or no longer) the master."""


class CatchUpRequest(FrozenModel):
    """From a follower: where its log ends and how it got there."""

    last_idx: int = Field(ge=-1)
    lineage: Lineage


class CatchUpReply(FrozenModel):
    base: State | None
    """Set when the follower must start again from this state (the master's current
    state, at ``last_idx``): its log is older than the master keeps, or it diverged."""
    events: list[IndexedEvent]
    """The events after the follower's log (or after ``base``), one page at most."""
    last_idx: int
    """The master's last index: more pages follow while the follower is below it."""
    lineage: Lineage
    commands: list[CommandId] = Field(default_factory=list[CommandId])
    """With a base: the commands behind the master's last events (the last
    ``REMEMBERED_COMMANDS``, oldest first), which the base's state does not say: a node
    that starts again from the base and later becomes the master must still know them,
    or it would apply a client's retry of one of them a second time."""


HEARTBEATS = Topic("cluster/heartbeat", Heartbeat)
EVENTS = Topic("cluster/events", EventMsg)
CHUNKS = Topic("cluster/chunks", ChunkGenerated)
COMMANDS = Endpoint("cluster/commands", CommandMsg, Ack)
LOCAL_EVENTS = Endpoint("cluster/local_events", LocalEventsMsg, Ack)
CATCH_UP = Endpoint("cluster/catch_up", CatchUpRequest, CatchUpReply)
