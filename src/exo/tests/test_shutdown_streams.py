"""A node told to stop (SIGTERM, SIGINT) mid-stream ends every open stream with an error
event that says why, instead of cutting its clients off."""

import signal
import threading
from pathlib import Path

import httpx
import pytest

from exo.tests.node_process import running_node, wait_until

pytestmark = [pytest.mark.slow]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_streams_get_an_error_event_when_the_node_stops(tmp_path: Path, sig: signal.Signals) -> None:
    with running_node(tmp_path, timeout=180) as node:
        lines: list[str] = []
        errors: list[BaseException] = []

        def stream() -> None:
            try:
                with httpx.stream("POST", node.url + "/v1/chat/completions", timeout=120, json={
                    "model": MODEL, "stream": True, "max_tokens": 4000, "temperature": 0,
                    "messages": [{"role": "user", "content": "Count from 1 to 1000."}],
                }) as r:
                    for line in r.iter_lines():
                        lines.append(line)
            except httpx.HTTPError as e:  # a cut connection: what must not happen
                errors.append(e)

        reader = threading.Thread(target=stream)
        reader.start()
        wait_until(lambda: sum(line.startswith("data:") for line in lines) >= 3, 60,
                   "the stream to start")
        node.process.send_signal(sig)
        reader.join(60)
        assert not reader.is_alive()
        assert not errors, errors
        data = [line for line in lines if line.startswith("data:")]
        last = [line for line in data if line != "data: [DONE]"][-1]
        assert "error" in last and "shutting down" in last, data[-3:]
        assert node.process.wait(30) is not None
