"""A real node against a hostile stand-in hub, and malformed model names, through the
HTTP routes users call (the DELETE route, the OpenAI, Claude and Ollama APIs)."""

from collections.abc import Generator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from exo.tests.node_process import NodeProcess, running_node, wait_until
from exo.worker.download.tests.hub_models import GGUF_REPO
from exo.worker.download.tests.hub_server import FakeHub

pytestmark = [pytest.mark.slow]


@pytest.fixture
def node(hub: FakeHub, tmp_path: Path) -> Generator[NodeProcess]:
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_TOKEN": ""}
    with running_node(tmp_path, "--model", "none", env=env, wait_ready=False) as proc:
        wait_until(lambda: bool(proc.state()["nodes"]), 60, "the node in its own state")
        yield proc


def test_delete_of_a_model_whose_hub_claims_a_path_as_commit_removes_nothing(
    hub: FakeHub, node: NodeProcess, tmp_path: Path
) -> None:
    victim = tmp_path / "victim-dir"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    # From <cache>/models--org--name/snapshots/ three levels up is tmp_path.
    # A GGUF card reads only the file's head (no file lands in the cache on the way).
    hub.repos[GGUF_REPO].sha = "../../../victim-dir"
    [node_id] = node.state()["nodes"]
    r = httpx.delete(f"{node.url}/download/{node_id}/{GGUF_REPO}:Q8_0", timeout=60)
    assert r.status_code == 502, r.text
    assert "40-hex-digit commit" in r.text
    assert (victim / "precious.txt").read_text() == "keep me"


def test_a_model_name_with_dot_dot_is_a_400_in_every_api(node: NodeProcess) -> None:
    client = openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError, match="not a hub repo id"):
        client.chat.completions.create(model="../x", messages=[{"role": "user", "content": "hi"}])
    claude = anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0, timeout=30)
    with pytest.raises(anthropic.BadRequestError, match="not a hub repo id"):
        claude.messages.create(model="../x", max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}])
    r = httpx.post(node.url + "/api/chat", timeout=30, json={
        "model": "../x", "messages": [{"role": "user", "content": "hi"}], "stream": False})
    assert r.status_code == 400 and "not a hub repo id" in r.json()["error"]
    assert "retry-after" not in r.headers
