"""The dashboard's HTTP side against a scripted node behind a real server: the page and
Ollama's line at ``/``, the assets, ``/events``, and the API key."""

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest

from exo.api.dashboard.assets import STATIC_DIR, asset_names, total_size
from exo.api.dashboard.routes import OLLAMA_ROOT_TEXT, SnapshotEncoder, state_events
from exo.api.main import create_app
from exo.api.settings import ApiSettings
from exo.api.tests.scripted_node import NODE_ID, ScriptedNode, ServedApp
from exo.shared.types.memory import Memory
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.state import State

KEY = "dashboard-test-key"
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


@pytest.fixture(scope="module")
def open_server() -> Iterator[ServedApp]:
    served = serve(ScriptedNode())
    yield served
    served.stop()


def serve(node: ScriptedNode, **settings: Any) -> ServedApp:
    served = ServedApp(create_app(node, ApiSettings.model_validate({"port": 0, **settings})), node)
    served.start()
    return served


def test_browsers_get_the_page_with_a_strict_policy(open_server: ServedApp) -> None:
    response = httpx.get(open_server.url + "/", headers={"accept": BROWSER_ACCEPT})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/dashboard/js/main.js">' in response.text
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert response.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("accept", [None, "*/*", "application/json"])
def test_other_clients_get_ollamas_line(open_server: ServedApp, accept: str | None) -> None:
    headers = {"accept": accept} if accept else {}
    with httpx.Client() as client:
        client.headers.pop("accept", None)
        response = client.get(open_server.url + "/", headers=headers)
    assert response.status_code == 200
    assert response.text == OLLAMA_ROOT_TEXT
    assert response.headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize("accept", ["*/*", BROWSER_ACCEPT])
def test_head_root_answers_200(open_server: ServedApp, accept: str) -> None:
    response = httpx.head(open_server.url + "/", headers={"accept": accept})
    assert response.status_code == 200
    assert response.content == b""


def test_every_asset_is_served_with_its_type(open_server: ServedApp) -> None:
    names = asset_names()
    assert {"index.html", "style.css", "js/main.js", "js/markdown.js"} <= set(names)
    for name, path in names.items():
        response = httpx.get(f"{open_server.url}/dashboard/{name}")
        assert response.status_code == 200, name
        assert response.content == path.read_bytes()
        expected = {"js": "text/javascript", "css": "text/css", "html": "text/html",
                    "svg": "image/svg+xml"}[name.rsplit(".", 1)[1]]
        assert response.headers["content-type"].startswith(expected), name


@pytest.mark.parametrize(
    "name", ["nope.js", "../routes.py", "..%2Froutes.py", "js/../../assets.py", "tests/__init__.py"]
)
def test_unknown_assets_are_404_with_a_json_reason(open_server: ServedApp, name: str) -> None:
    response = httpx.get(f"{open_server.url}/dashboard/{name}")
    assert response.status_code == 404
    assert "detail" in response.json()


def test_assets_are_small_and_have_no_inline_script() -> None:
    assert total_size() < 500 * 1024
    html = (STATIC_DIR / "index.html").read_text()
    assert all('src="' in tag for tag in re.findall(r"<script[^>]*>", html))
    for path in asset_names().values():
        text = path.read_text()
        # No third-party origin anywhere: everything is served by the node.
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text), path
        assert "innerHTML" not in text and "insertAdjacentHTML" not in text, path


def read_events(url: str, count: int, timeout: float = 10.0, **kw: Any) -> list[dict[str, Any]]:
    """The first ``count`` state events of ``GET /events``."""
    events: list[dict[str, Any]] = []
    with httpx.stream("GET", url + "/events", timeout=timeout, **kw) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: ") and event == "state":
                events.append(json.loads(line[len("data: "):]))
                if len(events) == count:
                    break
    return events


def test_events_start_with_the_whole_state(open_server: ServedApp) -> None:
    [first] = read_events(open_server.url, 1)
    assert first["node_id"] == str(NODE_ID)
    assert first["master_id"] == str(NODE_ID)
    assert first["state"]["nodes"][str(NODE_ID)]["hostname"] == "test-host"


def test_events_follow_state_changes() -> None:
    node = ScriptedNode()
    served = serve(node)
    try:
        placed: list[httpx.Response] = []

        def place() -> None:
            time.sleep(0.3)
            placed.append(httpx.post(served.url + "/place_instance", json={"model": "m1"}))

        thread = threading.Thread(target=place)
        thread.start()
        events = read_events(served.url, 2)
        thread.join()
        assert placed[0].status_code == 200
        assert events[0]["state"]["instances"] == {}
        [instance] = events[1]["state"]["instances"].values()
        assert instance["shard_assignments"]["model_id"] == "test-org/model-1"
    finally:
        served.stop()


def info(n: int) -> NodeInfo:
    return NodeInfo(hostname=f"host-{n}", cpu_count=1, memory_total=Memory.from_mb(100),
                    memory_available=Memory.from_mb(n))


@pytest.mark.asyncio
async def test_events_are_throttled_and_end_on_the_latest_state() -> None:
    node = ScriptedNode()
    stream = state_events(node, min_interval_s=0.2, keepalive_s=60, poll_s=0.05)
    received: list[bytes] = []

    async def consume() -> None:
        async for item in stream:
            received.append(item)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.sleep(0.05)
        for n in range(50):  # 50 changes in 0.5 s
            node.set_state(node.state().model_copy(update={"nodes": {NODE_ID: info(n)}}))
            await anyio.sleep(0.01)
        await anyio.sleep(0.5)
        tg.cancel_scope.cancel()
    states = [json.loads(item.split(b"data: ", 1)[1]) for item in received
              if item.startswith(b"event: state")]
    assert 2 <= len(states) <= 6, len(states)
    assert states[-1]["state"]["nodes"][str(NODE_ID)]["hostname"] == "host-49"


@pytest.mark.asyncio
async def test_a_quiet_stream_sends_keepalive_comments() -> None:
    node = ScriptedNode()
    received: list[bytes] = []
    with anyio.move_on_after(0.6):
        async for item in state_events(node, min_interval_s=0.01, keepalive_s=0.2, poll_s=0.05):
            received.append(item)
    assert received[0].startswith(b"retry:")
    assert received[1].startswith(b"event: state")
    assert received[2:] and all(item == b": keep-alive\n\n" for item in received[2:])


def test_with_an_api_key_the_page_is_open_and_the_data_is_not() -> None:
    served = serve(ScriptedNode(), api_key=KEY)
    try:
        page = httpx.get(served.url + "/", headers={"accept": BROWSER_ACCEPT})
        assert page.status_code == 200 and "<!doctype html>" in page.text
        assert httpx.head(served.url + "/").status_code == 200
        assert httpx.get(served.url + "/dashboard/js/main.js").status_code == 200
        refused = httpx.get(served.url + "/events")
        assert refused.status_code == 401 and "API key" in refused.json()["detail"]
        assert httpx.get(served.url + "/state").status_code == 401
        [first] = read_events(served.url, 1, headers={"authorization": f"Bearer {KEY}"})
        assert first["node_id"] == str(NODE_ID)
    finally:
        served.stop()


class CountingNode(ScriptedNode):
    """Counts the state waits in progress: one per live ``/events`` stream."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0

    async def wait_for_state(self, predicate: Callable[[State], bool], timeout: float) -> State:
        self.waiting += 1
        try:
            return await super().wait_for_state(predicate, timeout)
        finally:
            self.waiting -= 1


def test_a_stream_stops_as_soon_as_its_client_leaves() -> None:
    node = CountingNode()
    served = serve(node)
    try:
        assert read_events(served.url, 1)  # and the client closes the stream
        deadline = time.monotonic() + 3.0
        while node.waiting and time.monotonic() < deadline:
            time.sleep(0.02)
        assert node.waiting == 0, "the stream outlived its client"
    finally:
        served.stop()


def test_each_state_is_encoded_once_for_every_stream() -> None:
    node = ScriptedNode()
    encode = SnapshotEncoder(node)
    first = encode(node.state())
    assert encode(node.state()) is first
    node.set_state(node.state().model_copy(update={"nodes": {NODE_ID: info(3)}}))
    second = encode(node.state())
    assert second is not first and b'"hostname":"host-3"' in second
