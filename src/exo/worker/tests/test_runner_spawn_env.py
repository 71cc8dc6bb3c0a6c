"""A runner process starts with its thread pools' sizes and OpenMP's wait policy in its
environment: its parent's main module (with torch) is imported before the runner's own code
runs, so setting them there would be too late."""

import os
import sys
from pathlib import Path

import anyio
import pytest

from exo.shared.types.events import Event
from exo.shared.types.worker.instances import BoundInstance
from exo.utils.channels import channel
from exo.worker.runner.bootstrap import POOL_VARS
from exo.worker.runner.runner_supervisor import RunnerSupervisor
from exo.worker.runner.settings import RunnerSettings
from exo.worker.tests.test_distributed_runners import make_instance

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # spawns a runner process


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/environ")
async def test_a_runner_is_spawned_with_its_pool_sizes_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in POOL_VARS:
        monkeypatch.delenv(var, raising=False)
    instance = make_instance("pipeline", 1)
    ((node, runner),) = instance.shard_assignments.node_to_runner.items()
    send, receive = channel[Event]()
    settings = RunnerSettings(cache_dir=tmp_path / "cache", models_dir=tmp_path / "models",
                              threads=3)  # fmt: skip
    supervisor = RunnerSupervisor.create(
        BoundInstance(instance=instance, bound_runner_id=runner, bound_node_id=node), send, settings
    )

    async def drain() -> None:
        async for _ in receive:
            pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(drain)
        tg.start_soon(supervisor.run)
        with anyio.fail_after(30):
            while supervisor.pid is None:
                await anyio.sleep(0.01)
        # what the process was started with (/proc keeps the environment given at exec;
        # later changes to os.environ in the child do not show here)
        start_env = Path(f"/proc/{supervisor.pid}/environ").read_bytes().split(b"\0")
        assert b"OMP_WAIT_POLICY=PASSIVE" in start_env
        assert b"OMP_NUM_THREADS=3" in start_env and b"MKL_NUM_THREADS=3" in start_env
        # the node's own environment is as it was
        assert not any(var in os.environ for var in POOL_VARS)
        await supervisor.stop()
        tg.cancel_scope.cancel()
