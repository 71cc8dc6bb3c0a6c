"""Opening a node's log at start: a log that cannot be trusted stops the node with one
line that names the file and says how to recover, never a traceback or a silent start
from a state the cluster never had.

* a row that does not match its checksum, or a file that is not a log: damaged;
* a log that ends before the mark the election store keeps (a 0-byte or truncated
  ``events.db`` beside an ``election.json`` that saw it hold more): truncated.

A log that is not there at all (moved aside, or a first start) is a fresh one: the node
catches up from the cluster."""

from pathlib import Path

from exo.cluster.store import ElectionStore
from exo.master.event_log import LogCorrupt, LogUnavailable, SqliteEventLog
from exo.shared.types.state import State


def _recovery(path: Path) -> str:
    return (f"move it aside (mv {path} {path}.bad) and start again: the node then catches "
            "up from the cluster")


def open_log(cluster_dir: Path) -> tuple[SqliteEventLog, ElectionStore, State]:
    """The node's log, its election store and the state the log holds; ``SystemExit``
    with one line when the log cannot be trusted."""
    path = cluster_dir / "events.db"
    store = ElectionStore(cluster_dir / "election.json")
    persisted = store.load()
    fresh = not path.exists()
    try:
        log = SqliteEventLog(path)
        state = log.restore()
    except LogCorrupt as e:
        raise SystemExit(f"exo: the event log {path} is damaged ({e.detail}); "
                         f"{_recovery(path)}") from None
    except LogUnavailable as e:
        raise SystemExit(f"exo: {e}") from None
    if fresh:
        store.forget_log()
    elif (last := log.last_idx()) < persisted.log_at_least:
        log.close()
        holds = "is empty" if last < 0 else f"ends at event {last}"
        raise SystemExit(
            f"exo: the event log {path} {holds} but "
            f"{cluster_dir / 'election.json'} records that it held at least "
            f"{persisted.log_at_least + 1} events: it was truncated or replaced; "
            f"{_recovery(path)}"
        )
    log.on_written = store.mark_log
    return log, store, state
