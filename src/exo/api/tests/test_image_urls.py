"""http(s) image URLs on a node that fetches them (image_url_fetch): fetched from a loopback
server within the size and time limits, and a clear 400 in each API's shape when not."""

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx
import openai
import pytest

from exo.api.tests.conftest import ServeFn
from exo.api.tests.scripted_node import TEXT, ScriptedNode, ServedApp, default_cards, small_card
from exo.api.tests.test_images import image_bytes
from exo.shared.types.text_generation import InputMessage

PNG = image_bytes("PNG", (6, 4))
BIG = b"\0" * 5000
RELEASE = threading.Event()


class _Images(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/slow.png":
            RELEASE.wait(10)
        body = {"/cat.png": PNG, "/big.png": BIG, "/slow.png": PNG}.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except BrokenPipeError:  # the node gave up on the slow one first
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def images_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    RELEASE.set()
    server.shutdown()


@pytest.fixture
def node() -> ScriptedNode:
    vision = small_card("test-org/vision-1", ["v1"]).model_copy(update={"vision": True})
    return ScriptedNode(cards=[*default_cards(), vision])


@pytest.fixture
def fetching(node: ScriptedNode, serve: ServeFn) -> ServedApp:
    return serve(node, image_url_fetch=True, image_url_max_bytes=4000, image_url_timeout_s=1.0)


def _user(node: ScriptedNode) -> InputMessage:
    return [m for m in node.generations[-1].task_params.input if m.role == "user"][-1]


def _chat(url: str) -> Any:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]


def test_urls_are_fetched_in_each_api(
    fetching: ServedApp, node: ScriptedNode, images_url: str
) -> None:
    client = openai.OpenAI(base_url=f"{fetching.url}/v1", api_key="x", max_retries=0, timeout=10)
    answer = client.chat.completions.create(model="v1", messages=_chat(f"{images_url}/cat.png"))
    assert answer.choices[0].message.content == TEXT
    assert [(i.width, i.height, i.data) for i in _user(node).images] == [(6, 4, PNG)]
    item: Any = [
        {"role": "user", "content": [{"type": "input_image", "image_url": f"{images_url}/cat.png"}]}
    ]
    assert client.responses.create(model="v1", input=item).output_text == TEXT
    assert _user(node).images[0].data == PNG
    claude = anthropic.Anthropic(base_url=fetching.url, api_key="x", max_retries=0)
    block: Any = {"type": "image", "source": {"type": "url", "url": f"{images_url}/cat.png"}}
    claude.messages.create(
        model="v1", max_tokens=5, messages=[{"role": "user", "content": [block]}]
    )
    assert _user(node).images[0].data == PNG


@pytest.mark.parametrize(("path", "words"), [("/missing.png", "answered 404"),
                                             ("/big.png", "larger than 4000 bytes"),
                                             ("/slow.png", "within 1.0 s")])  # fmt: skip
def test_a_failed_fetch_is_a_400(
    fetching: ServedApp, images_url: str, path: str, words: str
) -> None:
    r = httpx.post(f"{fetching.url}/v1/chat/completions", json={"model": "v1", "messages": _chat(images_url + path)}, timeout=10)  # fmt: skip
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    block = {"type": "image", "source": {"type": "url", "url": images_url + path}}
    body = {"model": "v1", "max_tokens": 5, "messages": [{"role": "user", "content": [block]}]}
    r = httpx.post(f"{fetching.url}/v1/messages", json=body, timeout=10)
    assert r.status_code == 400 and r.json()["type"] == "error" and words in r.text


def test_off_by_default(server: ServedApp, images_url: str) -> None:
    r = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "v1", "messages": _chat(f"{images_url}/cat.png")})  # fmt: skip
    assert r.status_code == 400 and "image_url_fetch is off" in r.json()["error"]["message"]
