"""A master whose disk is full, through the real HTTP API of a real node (in process,
cluster mode, a switch in front of its log that fails writes as a full disk does), and
on a real tmpfs filled to the last byte where this machine lets a test mount one.

``POST /place_instance`` and ``DELETE /instance`` answered 200 and were never applied.
Now they answer 507 with a JSON body, the node stays up and read-only, and the same
requests succeed once there is room again.
"""

import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncGenerator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest

from exo.api.settings import ApiSettings
from exo.cluster.config import ClusterConfig
from exo.main import Node, NodeConfig
from exo.master.event_log import EventLog, LogUnavailable
from exo.shared.tests.builders import model_card
from exo.shared.types.common import CommandId
from exo.shared.types.events import IndexedEvent
from exo.shared.types.state import State
from exo.shared.types.state_queries import instances_of

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CARD = model_card()  # a model no node holds files for: no runner is ever started


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def running_node(data_dir: Path) -> AsyncGenerator[Node]:
    config = NodeConfig(
        data_dir=data_dir,
        api=ApiSettings(port=0),
        models=[CARD],
        info_interval_s=0.5,
        cluster=ClusterConfig(secret="disk-full", listen=["tcp/127.0.0.1:0"],
                              node_timeout_s=2.0),
    )
    node = Node(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(node.run)
        with anyio.fail_after(60):
            await node.started.wait()
            await node.wait_ready()
            await node.wait_for_state(lambda s: node.node_id in s.nodes, 60)
        try:
            yield node
        finally:
            tg.cancel_scope.cancel()


class _FullDisk:
    """The node's own log, behind a switch that makes every write fail as a full disk
    does (injected into the running master)."""

    def __init__(self, inner: EventLog) -> None:
        self.inner = inner
        self.full = False

    def append(self, event: IndexedEvent, state_after: State) -> None:
        if self.full:
            raise LogUnavailable("cannot write the event log: database or disk is full")
        self.inner.append(event, state_after)

    def read_from(self, idx: int, limit: int) -> list[IndexedEvent]:
        return self.inner.read_from(idx, limit)

    def snapshot(self) -> State | None:
        return self.inner.snapshot()

    def restore(self) -> State:
        return self.inner.restore()

    def command_ids(self, limit: int) -> list[CommandId]:
        return self.inner.command_ids(limit)


def _full_disk(node: Node) -> _FullDisk:
    assert node.cluster is not None
    master = node.cluster.sequencer.master
    assert master is not None
    disk = _FullDisk(master.log)
    master.log = disk
    return disk


async def _place(client: httpx.AsyncClient) -> httpx.Response:
    return await client.post("/place_instance", json={"model": CARD.model_id}, timeout=60)


async def _delete(client: httpx.AsyncClient, instance_id: str) -> httpx.Response:
    return await client.delete(f"/instance/{instance_id}", timeout=60)


async def test_a_full_log_is_a_507_and_the_node_recovers_by_itself(tmp_path: Path) -> None:
    async with running_node(tmp_path / "data") as node, httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{node.api_port}"
    ) as client:
        disk = _full_disk(node)
        disk.full = True
        refused = await _place(client)
        assert refused.status_code == 507, refused.text
        assert "event log cannot be written" in refused.json()["detail"]
        assert instances_of(node.state(), CARD.model_id) == []
        assert (await client.get("/health")).status_code == 200  # up, and read-only
        disk.full = False
        placed = await _place(client)
        assert placed.status_code == 200, placed.text
        (instance,) = instances_of(node.state(), CARD.model_id)
        disk.full = True
        refused = await _delete(client, instance.instance_id)
        assert refused.status_code == 507, refused.text
        assert instance.instance_id in node.state().instances
        disk.full = False
        deleted = await _delete(client, instance.instance_id)
        assert deleted.status_code == 200, deleted.text
        assert instance.instance_id not in node.state().instances


@pytest.fixture
def small_tmpfs() -> Iterator[Path]:
    """A 2 MiB tmpfs, or a skip where this machine refuses to mount one."""
    mount_point = Path(tempfile.mkdtemp(prefix="exo-tmpfs-"))
    try:
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        shutil.rmtree(mount_point, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here: {e}")
    if result.returncode != 0:
        shutil.rmtree(mount_point, ignore_errors=True)
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=10)
        shutil.rmtree(mount_point, ignore_errors=True)


def _fill(folder: Path) -> Path:
    """Take every free byte of the filesystem under ``folder``."""
    ballast = folder / "ballast"
    with ballast.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            pass
    return ballast


async def test_a_full_tmpfs_is_a_507_and_the_node_recovers(small_tmpfs: Path) -> None:
    async with running_node(small_tmpfs / "data") as node, httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{node.api_port}"
    ) as client:
        ballast = _fill(small_tmpfs)
        refused = await _place(client)
        assert refused.status_code == 507, refused.text
        ballast.unlink()  # space came back
        placed = await _place(client)
        assert placed.status_code == 200, placed.text
        assert instances_of(node.state(), CARD.model_id)
