"""A runner that stops while idle and then gets a request: the request ends with an error
within the stall deadline, and the runner is replaced (a real node and runner process)."""

import os
import signal
import threading
import time
from pathlib import Path

import openai
import pytest

from exo.tests.node_process import running_node, wait_until

pytestmark = pytest.mark.slow

STEP_S = 5.0


def test_a_request_to_a_runner_stopped_while_idle_ends_with_an_error(tmp_path: Path) -> None:
    env = {"EXO_RUNNER_STEP_TIMEOUT_S": str(STEP_S)}
    with running_node(tmp_path, env=env) as node:
        (pid,) = node.runner_pids()
        os.kill(pid, signal.SIGSTOP)  # the runner hangs while it has nothing to do
        client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0,
                               timeout=120)
        model = next(iter(node.state()["instances"].values()))["shard_assignments"]["model_id"]
        outcome: list[BaseException | None] = []

        def stream() -> None:
            try:
                for _ in client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "Say hi"}],
                    max_tokens=8, stream=True,
                ):
                    pass
                outcome.append(None)
            except BaseException as e:
                outcome.append(e)

        started = time.monotonic()
        thread = threading.Thread(target=stream, daemon=True)
        thread.start()
        thread.join(STEP_S + 30)  # without a deadline the stream stays open for ever
        assert not thread.is_alive(), "the request to the stopped runner is still open"
        [error] = outcome
        assert isinstance(error, openai.APIError) and "stalled" in str(error), error
        assert time.monotonic() - started < STEP_S + 30
        wait_until(lambda: pid not in node.runner_pids(), 30, "the stopped runner to be killed")
        wait_until(lambda: node.serving() and node.runner_pids() != [], 120,
                   "a new runner to serve")
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4,
        )
        assert reply.choices[0].message.content
