"""The dashboard's layout in a real chromium, at phone and desktop widths, against a
scripted node whose state has two nodes with the same hostname: distinct node titles, a
memory label beside (not over) its bar, a header and views that fit a phone's width, a
temperature field that shows its whole placeholder, and no stats under a failed answer."""

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, Route, ViewportSize, expect

from exo.api.dashboard.tests.browser import CHROMIUM, Browser, Tab
from exo.api.main import create_app
from exo.api.settings import ApiSettings
from exo.api.tests.scripted_node import NODE_ID, ScriptedNode, ServedApp
from exo.shared.types.common import NodeId
from exo.shared.types.memory import Memory
from exo.shared.types.profiling import NodeInfo

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("close_pages"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"no chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)"),
]

TWIN = NodeId("b7e3c2a9-0000-4000-8000-000000000002")
PHONE: ViewportSize = {"width": 390, "height": 800}
DESKTOP: ViewportSize = {"width": 1280, "height": 800}


@pytest.fixture(scope="module")
def served() -> Iterator[ServedApp]:
    node = ScriptedNode()
    infos = {
        NODE_ID: NodeInfo(hostname="vm", cpu_count=4, memory_total=Memory.from_mb(16000),
                          memory_available=Memory.from_mb(5000), addresses=["192.168.1.7/24"]),
        TWIN: NodeInfo(hostname="vm", cpu_count=2, memory_total=Memory.from_mb(8000),
                       memory_available=Memory.from_mb(7000)),
    }  # fmt: skip
    node.set_state(node.state().model_copy(update={"nodes": infos}))
    app = ServedApp(create_app(node, ApiSettings(port=0)), node)
    app.start()
    yield app
    app.stop()


def open_at(browser: Browser, url: str, size: ViewportSize) -> Tab:
    tab = browser.open("about:blank")
    tab.page.set_viewport_size(size)
    tab.page.goto(url)
    return tab


def fits_width(page: Page) -> bool:
    """Nothing sticks out to the right of the viewport (no sideways scrolling)."""
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


@pytest.mark.parametrize("size", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_the_cluster_view_names_twins_apart_and_fits(
    served: ServedApp, browser: Browser, tmp_path: Path, size: ViewportSize
) -> None:
    tab = open_at(browser, served.url + "/#cluster", size)
    page = tab.page
    titles = page.locator(".node .hostname")
    expect(titles).to_have_count(2)
    names = sorted(titles.all_inner_texts())
    assert names == ["vm (b7e3c2a9)", "vm (node-tes)"], names
    for bar in page.locator(".node .bar.memory").all():
        label = bar.locator(".bar-label").bounding_box()
        track = bar.locator(".track").bounding_box()
        assert label is not None and track is not None
        assert label["y"] + label["height"] <= track["y"] + 0.5, (label, track)
    header = page.locator("header.top").bounding_box()
    assert header is not None and header["x"] + header["width"] <= size["width"]
    for part in ("#conn", "#tabs a >> nth=-1"):
        box = page.locator(part).bounding_box()
        assert box is not None and box["x"] + box["width"] <= size["width"], (part, box)
    assert fits_width(page)
    tab.shot(tmp_path, f"cluster-{size['width']}")
    assert tab.errors == []


# The width the temperature field's placeholder takes in the field's own font, and the room
# the field has for it (its content box, less the number spinner's ~16 px).
PLACEHOLDER_ROOM = """() => {
  const input = document.querySelector("#temperature");
  const style = getComputedStyle(input);
  const context = document.createElement("canvas").getContext("2d");
  context.font = `${style.fontSize} ${style.fontFamily}`;
  const text = context.measureText(input.placeholder).width;
  const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight) - 16;
  return [text, room];
}"""


def failed_answer(route: Route) -> None:
    """A stream that fails before its first token (as when the runner dies)."""
    error = {"error": {"message": "no runner is ready", "type": "server_error"}}
    route.fulfill(status=200, headers={"content-type": "text/event-stream"},
                  body=f"data: {json.dumps(error)}\n\n")


@pytest.mark.parametrize("size", [PHONE, DESKTOP], ids=["phone", "desktop"])
def test_the_chat_view_fits_and_a_failed_answer_has_no_stats(
    served: ServedApp, browser: Browser, tmp_path: Path, size: ViewportSize
) -> None:
    tab = open_at(browser, served.url + "/#chat", size)
    page = tab.page
    page.route("**/v1/chat/completions", failed_answer)
    expect(page.locator("#model-picker option").first).to_be_attached()
    text, room = page.evaluate(PLACEHOLDER_ROOM)
    assert text <= room, (text, room)
    page.click("#new-chat")
    page.fill("#prompt", "hi")
    page.click("#send")
    message = page.locator(".msg.assistant").last
    expect(message.locator(".chat-error")).to_have_text("no runner is ready")
    expect(page.locator("#send")).to_be_enabled()
    assert message.locator(".stats").count() == 0, message.inner_text()
    assert fits_width(page)
    tab.shot(tmp_path, f"chat-{size['width']}")
    assert tab.errors == []
