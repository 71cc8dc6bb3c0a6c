"""A real node process fetching models from the local stand-in hub (HF_ENDPOINT)."""

import itertools
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import ollama
import openai
import pytest

from exo.tests.node_process import NodeProcess, running_node, wait_until
from exo.worker.download.tests.hub_models import SMOL_FILE, SMOL_REPO
from exo.worker.download.tests.hub_server import FakeHub, HubRepo

pytestmark = [pytest.mark.slow]



@pytest.fixture
def node(smol_hub: FakeHub, tmp_path: Path) -> Generator[NodeProcess]:
    env = {"HF_ENDPOINT": smol_hub.url, "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
           "HF_TOKEN": ""}
    with running_node(tmp_path, "--model", "none", env=env, wait_ready=False) as proc:
        yield proc


def _client(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", timeout=300)


def _ask(node: NodeProcess, model: str) -> str:
    reply = _client(node).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hi"}], max_tokens=8,
        temperature=0,
    )
    return reply.choices[0].message.content or ""


def _download_states(node: NodeProcess, model: str) -> list[dict[str, Any]]:
    return [m[model] for m in node.state()["downloads"].values() if model in m]


def test_an_unknown_hub_model_gets_a_card_downloads_and_answers(
    smol_hub: FakeHub, node: NodeProcess
) -> None:
    model = f"{SMOL_REPO}:Q4_1"
    assert _ask(node, model).strip()
    [done] = _download_states(node, model)
    assert done["kind"] == "DownloadCompleted"
    assert done["path"].endswith(SMOL_FILE)
    assert "/snapshots/" + smol_hub.repos[SMOL_REPO].commit in done["path"]
    full = [r for r in smol_hub.requests if r.file == SMOL_FILE
            and r.range_header in (None, "bytes=0-") and r.method == "GET"]
    assert len(full) == 1  # the card read the head with a Range request; one download
    listed = {m["model_id"]: m for m in node.get("/models").json()}
    assert listed[model]["hub"]["revision"] == smol_hub.repos[SMOL_REPO].commit
    assert listed[model]["downloads"]  # where it is downloaded


def test_a_model_that_cannot_be_fetched_fails_the_waiting_request_at_once(
    smol_hub: FakeHub, node: NodeProcess
) -> None:
    model = f"{SMOL_REPO}:Q4_1"
    added = httpx.post(node.url + "/models/add", json={"model": model}, timeout=60)
    assert added.status_code == 200, added.text
    # The file goes from the hub after the card pinned its commit: the download gets 404.
    del smol_hub.repos[SMOL_REPO].files[SMOL_FILE]
    calls: list[float] = []

    def on_request(request: httpx2.Request) -> None:
        calls.append(time.monotonic())

    client = openai.OpenAI(
        base_url=node.url + "/v1", api_key="x", timeout=300,
        http_client=httpx2.Client(event_hooks={"request": [on_request]}),
    )
    outcome: list[BaseException | float] = []

    def request() -> None:
        try:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
        except BaseException as e:
            outcome.append(e)
        outcome.append(time.monotonic())

    thread = threading.Thread(target=request)
    thread.start()
    wait_until(lambda: any(d["kind"] == "DownloadFailed" for d in _download_states(node, model)),
               120, "the download to fail", interval=0.05)
    failed_at = time.monotonic()
    thread.join(60)
    error, answered_at = outcome
    assert isinstance(error, openai.NotFoundError), error
    assert "cannot be obtained" in str(error) and SMOL_REPO in str(error)
    assert len(calls) == 1  # not retried
    [failed] = _download_states(node, model)
    assert failed["status"] == 404
    assert isinstance(answered_at, float) and answered_at - failed_at < 2.0
    wait_until(lambda: not node.state()["instances"], 30, "the failed instance to be deleted")


def test_unknown_repos_and_bad_names_are_clear_errors(node: NodeProcess) -> None:
    client = _client(node)
    with pytest.raises(openai.NotFoundError, match="not found on the hub"):
        client.chat.completions.create(
            model="nobody/no-such-model", messages=[{"role": "user", "content": "hi"}]
        )
    r = httpx.post(node.url + "/models/add", json={"model": "not a name"}, timeout=30)
    assert r.status_code == 400 and "org/repo" in r.json()["detail"]
    r = httpx.post(node.url + "/models/add", json={"model": f"{SMOL_REPO}:Q9_X"}, timeout=30)
    assert r.status_code == 404 and "Q9_X" in r.json()["detail"]
    found = node.get("/models/search", params={"q": "smollm2"}).json()
    assert {"id": SMOL_REPO} in found


def test_a_catalogue_name_gets_its_card_from_the_hub(smol_hub: FakeHub, node: NodeProcess) -> None:
    listed = {e["name"]: e for e in node.get("/models/catalogue").json()}
    assert listed["qwen3-0.6b"]["size_estimated"] is True
    assert listed["qwen3-0.6b"]["estimated_bytes"]["Q8_0"] > 0
    data = smol_hub.repos[SMOL_REPO].files[SMOL_FILE]
    smol_hub.repos["Qwen/Qwen3-0.6B-GGUF"] = HubRepo(files={"Qwen3-0.6B-Q8_0.gguf": data})
    r = httpx.post(node.url + "/models/add", json={"model": "qwen3-0.6b:q8_0"}, timeout=60)
    assert r.status_code == 200, r.text
    card = r.json()
    assert card["model_id"] == "Qwen/Qwen3-0.6B-GGUF:Q8_0"
    assert card["storage_size"]["in_bytes"] == len(data) and card["n_layers"] == 30
    assert card["hub"]["size_estimated"] is False


def test_downloads_start_cancel_and_delete_on_request(
    smol_hub: FakeHub, node: NodeProcess, tmp_path: Path
) -> None:
    model = f"{SMOL_REPO}:Q4_1"
    node_id = node.get("/node_id").json()
    smol_hub.bytes_per_s = 15e6  # ~90 MB: about 6 s
    r = httpx.post(node.url + "/download/start", json={"model": model}, timeout=60)
    assert r.status_code == 200, r.text

    def kind() -> str | None:
        states = _download_states(node, model)
        return states[0]["kind"] if states else None

    wait_until(lambda: any(d["kind"] == "DownloadOngoing" and d["downloaded_bytes"] > 0
                           for d in _download_states(node, model)), 60, "download progress")
    r = httpx.post(node.url + "/download/cancel", json={"model": model, "node_id": node_id},
                   timeout=30)
    assert r.status_code == 200, r.text
    wait_until(lambda: kind() == "DownloadPending", 30, "the download to stop")
    cache = tmp_path / "hf-cache"
    assert not list(cache.rglob(SMOL_FILE))
    smol_hub.bytes_per_s = None
    httpx.post(node.url + "/download/start", json={"model": model}, timeout=60)
    wait_until(lambda: kind() == "DownloadCompleted", 120, "the download to complete")
    assert list(cache.rglob(SMOL_FILE))
    r = httpx.delete(f"{node.url}/download/{node_id}/{model}", timeout=30)
    assert r.status_code == 200, r.text
    wait_until(lambda: kind() is None and not list(cache.rglob(SMOL_FILE)), 30,
               "the files to be deleted")
    assert not list((cache).rglob("blobs/*"))  # the disk is freed, not just the link
    r = httpx.delete(f"{node.url}/download/nosuchnode/{model}", timeout=30)
    assert r.status_code == 404 and "nosuchnode" in r.json()["detail"]


def test_the_cli_serves_a_hub_model_and_shows_its_download(
    smol_hub: FakeHub, tmp_path: Path
) -> None:
    env = {"HF_ENDPOINT": smol_hub.url, "HF_HUB_CACHE": str(tmp_path / "hf-cache")}
    model = f"{SMOL_REPO}:Q4_1"
    with running_node(tmp_path, "--model", model, env=env) as proc:
        assert _ask(proc, model).strip()
        log = proc.log()
    assert f"ready: {model}" in log
    # Not a terminal: sparse lines, one per stage (and per 10% of a download or load).
    lines = [line for line in log.splitlines() if model in line and not line.startswith("20")]
    assert [ln for ln in lines if ln.startswith("downloading")]
    assert len([ln for ln in lines if ln.startswith("downloading")]) <= 11
    assert len([ln for ln in lines if ln.startswith("loading")]) <= 11
    assert all(a != b for a, b in itertools.pairwise(lines))
    assert "\r" not in log


def test_the_ollama_and_completions_apis_build_hub_cards_on_demand(
    smol_hub: FakeHub, node: NodeProcess
) -> None:
    client = ollama.Client(host=node.url, timeout=300)
    # Ollama names a hub GGUF as hf.co/org/repo:QUANT.
    reply = client.chat(
        model=f"hf.co/{SMOL_REPO}:Q4_1", messages=[{"role": "user", "content": "Say hi"}],
        options={"num_predict": 8, "temperature": 0},
    )
    assert (reply.message.content or "").strip()
    [done] = _download_states(node, f"{SMOL_REPO}:Q4_1")
    assert done["kind"] == "DownloadCompleted"
    shown = client.show(f"{SMOL_REPO}:Q4_1")
    assert shown.details is not None and shown.details.quantization_level == "Q4_1"
    assert shown.details.format == "gguf"
    for name in ("nobody/no-such-model", "hf.co/nobody/no-such-model:latest"):
        with pytest.raises(ollama.ResponseError, match="not found on the hub") as e:
            client.generate(model=name, prompt="hi")
        assert e.value.status_code == 404
    completions = _client(node).completions
    with pytest.raises(openai.NotFoundError, match="not found on the hub"):
        completions.create(model="nobody/no-such-model", prompt="hi", max_tokens=2)
    done_text = completions.create(model=f"{SMOL_REPO}:Q4_1", prompt="Hi", max_tokens=4)
    assert done_text.choices[0].text is not None
