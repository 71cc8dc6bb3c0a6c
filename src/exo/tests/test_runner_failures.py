"""Runners that fail or stall, in a real node: bounded retries, deadlines, no loops."""

import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from exo.tests.node_process import running_node, wait_until
from exo.worker.download.embedded import find_embedded_gguf

pytestmark = pytest.mark.slow

FAST = {"EXO_INSTANCE_BACKOFF_BASE_S": "0.3", "EXO_INSTANCE_BACKOFF_MAX_S": "5"}
_CREATED = re.compile(r"^(\S+ \S+) .*creating runner for instance (\S+) \(attempt (\d+)\)", re.M)


def _broken_model(tmp_path: Path) -> Path:
    """A GGUF file that is whole (so no check before the runner can tell) but lacks a
    tensor the model needs: every load fails in the runner."""
    source = find_embedded_gguf()
    assert source is not None
    data = source.read_bytes()
    name = b"blk.3.attn_q.weight"
    assert data.count(name) == 1
    path = tmp_path / "broken-model.gguf"
    path.write_bytes(data.replace(name, b"blk.3.attn_Q.weight"))
    return path


def test_a_load_that_fails_on_its_file_is_given_up_at_once(tmp_path: Path) -> None:
    """A bad model file fails every load the same way: no retries with backoff (which
    made clients wait 29-41 s); the instance is given up after one attempt, with the
    reason. Retries with backoff stay for failures that may pass (unit: test_plan_backoff)."""
    model = _broken_model(tmp_path)
    with running_node(tmp_path, "--model", str(model), wait_ready=False) as node:
        wait_until(lambda: "giving up on instance" in node.log(), 60, "the instance to be abandoned")
        wait_until(lambda: not node.state()["instances"], 10, "the instance to be deleted")
        log = node.log()
        created = _CREATED.findall(log)
        assert [int(attempt) for _, _, attempt in created] == [1]
        assert "not retried: it would fail the same way" in log and "ValueError" in log
        assert node.state()["runners"] == {}
        wait_until(lambda: node.runner_pids() == [], 20, "no runner process left")
        # A request for that model places it once more; when that fails the same way, the
        # client is told why within seconds (a 503 naming the problem, no hang, no 500).
        started = time.monotonic()
        r = httpx.post(node.url + "/v1/chat/completions", timeout=180, json={
            "model": "broken-model", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503, r.text
        assert "ValueError" in r.text, r.text
        assert time.monotonic() - started < 20
        assert len(_CREATED.findall(node.log())) == 2


def test_runner_stalled_in_load_is_failed_by_its_deadline(tmp_path: Path) -> None:
    env = {**FAST, "EXO_RUNNER_LOAD_TIMEOUT_S": "15"}
    with running_node(tmp_path, "--model", "none", env=env, wait_ready=False) as node:
        r = httpx.post(node.url + "/place_instance", timeout=30,
                       json={"model": "HuggingFaceTB/SmolLM2-135M-Instruct"})
        assert r.status_code < 300, r.text

        def loading() -> bool:
            return any(s["kind"] == "RunnerLoading" for s in node.state()["runners"].values())

        wait_until(loading, 60, "the runner to start loading", interval=0.005)
        (pid,) = node.runner_pids()
        os.kill(pid, signal.SIGSTOP)  # a runner hung in the middle of its load
        wait_until(lambda: "runner stalled: no progress for 15 s while loading" in node.log(), 40,
                   "the load deadline to fail the runner")
        wait_until(lambda: not os.path.exists(f"/proc/{pid}") or _is_zombie(pid), 15,
                   "the stalled runner to be killed")
        # And the instance heals with a new runner.
        wait_until(node.serving, 90, "a new runner to serve")


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
