"""A long history written straight into a node's log, for catch-up tests and benchmarks:
``n`` events, one in a hundred a download report of the node (so the state, and its
snapshots, grow: a thousand models per 100,000 events), the others acknowledgements of
a task that does not exist (no change to the state)."""

from pathlib import Path

from exo.master.event_log import SqliteEventLog
from exo.shared.apply import event_apply
from exo.shared.models.model_cards import ModelId
from exo.shared.types.common import NodeId
from exo.shared.types.events import Event, IndexedEvent, NodeDownloadProgress, TaskAcknowledged
from exo.shared.types.state import State
from exo.shared.types.tasks import TaskId
from exo.shared.types.worker.downloads import DownloadOngoing

_NO_OP = TaskAcknowledged(task_id=TaskId("no-such-task"))


def history_event(node_id: NodeId, i: int, n: int) -> Event:
    if i % 100 == 0:
        return NodeDownloadProgress(
            node_id=node_id,
            model_id=ModelId(f"test-org/model-{i // 100}"),
            progress=DownloadOngoing(downloaded_bytes=i, total_bytes=n),
        )
    return _NO_OP


def write_history(data_dir: Path, n: int) -> NodeId:
    """Give ``data_dir`` a node id and a cluster log of ``n`` events; returns the id."""
    node_id = NodeId()
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "node_id").write_text(node_id)
    log = SqliteEventLog(data_dir / "cluster" / "events.db")
    state = State()
    batch: list[tuple[IndexedEvent, State]] = []
    for i in range(n):
        event = IndexedEvent(idx=i, event=history_event(node_id, i, n))
        # What apply would give, cheaply: most events change nothing but the index, and
        # the log only looks at the state where it takes a snapshot.
        if isinstance(event.event, NodeDownloadProgress):
            state = event_apply(event.event, state)
        if isinstance(event.event, NodeDownloadProgress) or (i + 1) % 1000 == 0:
            state = state.model_copy(update={"last_event_applied_idx": i})
        batch.append((event, state))
        if len(batch) == 10_000:
            log.append_many(batch)
            batch = []
    log.append_many(batch)
    log.close()
    return node_id
