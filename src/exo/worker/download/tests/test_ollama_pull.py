"""Ollama's /api/pull on a real node, downloading from the local stand-in hub, through the
official ollama client."""

import json
from collections.abc import Generator
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from exo.tests.node_process import NodeProcess, running_node
from exo.worker.download.tests.hub_models import SMOL_FILE, SMOL_REPO
from exo.worker.download.tests.hub_server import FakeHub

pytestmark = [pytest.mark.slow]



@pytest.fixture
def node(smol_hub: FakeHub, tmp_path: Path) -> Generator[NodeProcess]:
    env = {"HF_ENDPOINT": smol_hub.url, "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_TOKEN": ""}
    with running_node(tmp_path, env=env) as proc:
        yield proc


def test_pull_streams_progress_then_success(
    smol_hub: FakeHub, node: NodeProcess, tmp_path: Path
) -> None:
    model = f"{SMOL_REPO}:Q4_1"
    size = len(smol_hub.repos[SMOL_REPO].files[SMOL_FILE])
    smol_hub.bytes_per_s = 30e6  # ~90 MB: a few seconds, several progress lines
    client = ollama.Client(host=node.url, timeout=300)
    lines = list(client.pull(model, stream=True))
    statuses = [line.status for line in lines]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    pulling = [
        line
        for line in lines
        if line.status and line.status.startswith("pulling ") and line.status != "pulling manifest"
    ]
    completed = [line.completed or 0 for line in pulling]
    assert len(pulling) >= 3 and completed == sorted(completed)
    assert all(line.total == size and line.digest for line in pulling)
    assert completed[-1] == size and any(0 < c < size for c in completed)
    assert list((tmp_path / "hf-cache").rglob(SMOL_FILE))
    # Pulled already: success at once, and the model serves.
    smol_hub.bytes_per_s = None
    again = client.pull(model, stream=False)
    assert again.status == "success"
    assert client.generate(model=model, prompt="Hi", options={"num_predict": 2}).done


def test_pull_errors(node: NodeProcess) -> None:
    client = ollama.Client(host=node.url, timeout=120)
    with pytest.raises(ollama.ResponseError) as info:
        client.pull("smol-org/no-such-repo", stream=False)
    assert info.value.status_code == 404
    # Streamed, a failure before the first line is the HTTP error too.
    with pytest.raises(ollama.ResponseError):
        list(client.pull("smol-org/no-such-repo", stream=True))
    r = httpx.post(node.url + "/api/pull", json={}, timeout=30)
    assert r.status_code == 400 and "model" in r.json()["error"]
    # The embedded model is here already.
    here = "HuggingFaceTB/SmolLM2-135M-Instruct"
    statuses: list[Any] = [p.status for p in client.pull(here, stream=True)]
    assert statuses == ["pulling manifest", "success"]
    # Without "stream" in the body (curl), Ollama streams.
    r = httpx.post(node.url + "/api/pull", json={"model": here}, timeout=30)
    assert r.headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(line)["status"] for line in r.text.splitlines()] == statuses


def test_a_download_that_fails_for_good_ends_the_stream_with_its_error(
    smol_hub: FakeHub, node: NodeProcess
) -> None:
    model = f"{SMOL_REPO}:Q4_1"
    r = httpx.post(node.url + "/models/add", json={"model": model}, timeout=60)
    assert r.status_code == 200, r.text  # the card is known; now the files are refused
    smol_hub.repos[SMOL_REPO].gated = True
    r = httpx.post(node.url + "/api/pull", json={"model": model}, timeout=120)
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert r.status_code == 200 and lines[0] == {"status": "pulling manifest"}
    assert "error" in lines[-1] and SMOL_REPO in lines[-1]["error"]
    with pytest.raises(ollama.ResponseError) as info:
        list(ollama.Client(host=node.url, timeout=120).pull(model, stream=True))
    assert SMOL_REPO in info.value.error
