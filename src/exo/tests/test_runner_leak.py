"""Runner crashes must not leak runner processes: the node's children are exactly its
live runners, however often a runner is killed."""

import os
import signal
from pathlib import Path

import pytest

from exo.tests.node_process import running_node, wait_until

pytestmark = [pytest.mark.slow]

FAST = {"EXO_INSTANCE_BACKOFF_BASE_S": "0.3", "EXO_INSTANCE_BACKOFF_MAX_S": "2"}


def _replaced(pids: list[int], killed: list[int]) -> bool:
    """A runner runs and it is none of the killed ones (one read of the process list: two
    reads could see it change in between)."""
    return bool(pids) and pids[0] not in killed


def test_killed_runners_leave_no_stray_processes(tmp_path: Path) -> None:
    with running_node(tmp_path, env=FAST, timeout=180) as node:
        killed: list[int] = []
        for _ in range(3):
            wait_until(lambda: len(node.runner_pids()) == 1, 60, "exactly one runner process")
            (pid,) = node.runner_pids()
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            wait_until(lambda: _replaced(node.runner_pids(), killed), 90, "a replacement runner")
            wait_until(node.serving, 120, "the node to serve again")
        state = node.state()
        assert len(state["runners"]) == 1, state["runners"]
        # Give a stray process time to show up, then count: one live runner, no more.
        wait_until(lambda: len(node.runner_pids()) == 1, 30,
                   f"one runner process, not {node.runner_pids()}")
        for _ in range(20):
            assert len(node.runner_pids()) == 1, node.runner_pids()
            assert node.serving()


def test_a_single_node_in_cluster_mode_places_its_start_model_once(tmp_path: Path) -> None:
    with running_node(tmp_path, "--listen", "tcp/127.0.0.1:0", env=FAST, timeout=180) as node:
        assert len(node.state()["instances"]) == 1
        for _ in range(20):  # a second placement would show within a few heartbeats
            assert len(node.state()["instances"]) == 1
        assert node.log().count("InstanceCreated") <= 1
