"""A node's start model (``--model``) and requests that arrive before it is placed: one
instance, however they race (found by probing: two instances 18 ms apart on one node)."""

import threading
from pathlib import Path

import httpx
import pytest

from exo.tests.node_process import running_node
from exo.worker.download.embedded import find_embedded_gguf

pytestmark = pytest.mark.slow


def test_requests_at_start_and_the_start_model_make_one_instance(tmp_path: Path) -> None:
    model = find_embedded_gguf()
    assert model is not None
    with running_node(tmp_path, "--listen", "tcp/127.0.0.1:0", "--model", str(model),
                      wait_ready=False) as node:
        # The API answers before the node is master: these requests wait for the model and
        # ask for it to be placed, while the CLI places it too.
        answers: list[int | str] = []

        def ask() -> None:
            try:
                r = httpx.post(node.url + "/v1/chat/completions", timeout=180, json={
                    "model": model.stem, "max_tokens": 2,
                    "messages": [{"role": "user", "content": "hi"}]})
                answers.append(r.status_code)
            except httpx.HTTPError as e:
                answers.append(repr(e))

        clients = [threading.Thread(target=ask) for _ in range(3)]
        for client in clients:
            client.start()
        for client in clients:
            client.join(200)
        assert answers == [200, 200, 200]
        assert len(node.state()["instances"]) == 1
        assert node.log().count("creating runner for instance") == 1
