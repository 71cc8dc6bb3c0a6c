"""The chat's images in a real chromium against the scripted node's real HTTP API: an image
pasted into the prompt or dropped on the composer shows as a thumbnail and goes out as an
OpenAI image_url part (a data URL of the same bytes), which the API decodes into the task;
a model whose card has no vision refuses the image with a clear message; the Models view
marks the models that take images."""

import base64
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Request, expect

from exo.api.dashboard.tests.browser import CHROMIUM, Browser, Tab
from exo.api.main import create_app
from exo.api.settings import ApiSettings
from exo.api.tests.scripted_node import ScriptedNode, ServedApp, small_card
from exo.api.tests.test_images import image_bytes
from exo.tests.node_process import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("close_pages"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"no chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)"),
]

VISION = "test-org/vision-1"
TEXT_ONLY = "test-org/model-1"
RED = image_bytes("PNG", (7, 5), color=200)
BLUE = image_bytes("JPEG", (9, 4), color=10)

# Dispatches a paste (on the prompt) or a drop (on the composer) carrying one image file.
GIVE_IMAGE = """([how, b64, type, name]) => {
  const raw = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([raw], name, { type }));
  const event = how === "paste"
    ? new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true })
    : new DragEvent("drop", { dataTransfer: data, bubbles: true, cancelable: true });
  document.querySelector(how === "paste" ? "#prompt" : "#chat-form").dispatchEvent(event);
}"""


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ScriptedNode, ServedApp]]:
    vision = small_card(VISION).model_copy(update={"vision": True})
    node = ScriptedNode(cards=[vision, small_card(TEXT_ONLY)])
    app = ServedApp(create_app(node, ApiSettings(port=0, placement_timeout_s=5.0)), node)
    app.start()
    yield node, app
    app.stop()


def give(tab: Tab, how: str, data: bytes, media: str, name: str) -> None:
    tab.page.evaluate(GIVE_IMAGE, [how, base64.b64encode(data).decode(), media, name])


def open_chat(browser: Browser, app: ServedApp, model: str) -> Tab:
    tab = browser.open(app.url + "/#chat")
    page = tab.page
    wait_until(lambda: page.locator(f'#model-picker option[value="{model}"]').count() == 1
               or bool(tab.errors), 30, "the model picker")
    assert not tab.errors, tab.errors
    page.click("#new-chat")
    page.locator("#model-picker").select_option(model)
    return tab


def test_pasted_and_dropped_images_are_sent_as_image_url_parts(
    served: tuple[ScriptedNode, ServedApp], browser: Browser, tmp_path: Path
) -> None:
    node, app = served
    tab = open_chat(browser, app, VISION)
    page = tab.page
    expect(page.locator("#prompt")).to_have_attribute("placeholder", re.compile("paste or drop an image"))
    give(tab, "paste", RED, "image/png", "red.png")
    give(tab, "drop", BLUE, "image/jpeg", "blue.jpg")
    thumbs = page.locator("#attachments img")
    expect(thumbs).to_have_count(2)
    expect(thumbs.first).to_have_attribute("src", "data:image/png;base64," + base64.b64encode(RED).decode())
    tab.shot(tmp_path, "attached")
    page.fill("#prompt", "What is in these pictures?")
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as sent:
        page.click("#send")
    request: Request = sent.value
    body: Any = request.post_data_json
    assert body["model"] == VISION
    content = body["messages"][-1]["content"]
    assert content[0] == {"type": "text", "text": "What is in these pictures?"}
    urls = [part["image_url"]["url"] for part in content[1:]]
    assert [part["type"] for part in content[1:]] == ["image_url", "image_url"]
    assert urls[0] == "data:image/png;base64," + base64.b64encode(RED).decode()
    assert urls[1].startswith("data:image/jpeg;base64,")
    assert base64.b64decode(urls[1].split(",", 1)[1]) == BLUE
    # The API decoded both into the task, in order; the answer streams back.
    wait_until(lambda: len(node.generations) > 0, 10, "the generation")
    images = node.generations[-1].task_params.input[-1].images
    assert [(i.format, i.width, i.height) for i in images] == [("PNG", 7, 5), ("JPEG", 9, 4)]
    expect(page.locator(".msg.assistant .markdown").last).not_to_be_empty()
    expect(page.locator("#attachments img")).to_have_count(0)
    expect(page.locator(".msg.user .sent-images img")).to_have_count(2)
    # A follow-up carries the earlier turn's images in its history.
    expect(page.locator("#stop")).to_be_hidden()
    page.fill("#prompt", "And now?")
    with page.expect_request(lambda r: r.url.endswith("/v1/chat/completions")) as again:
        page.click("#send")
    history: Any = again.value.post_data_json
    assert history["messages"][0]["content"][1]["image_url"]["url"] == urls[0]
    assert history["messages"][-1]["content"] == "And now?"
    assert tab.errors == []


def test_a_model_without_vision_says_so(
    served: tuple[ScriptedNode, ServedApp], browser: Browser
) -> None:
    _, app = served
    tab = open_chat(browser, app, TEXT_ONLY)
    page = tab.page
    expect(page.locator("#prompt")).not_to_have_attribute("placeholder", re.compile("image"))
    give(tab, "paste", RED, "image/png", "red.png")
    expect(page.locator("#attach-notice")).to_have_text(
        f"{TEXT_ONLY} does not take images: pick a vision model to send one"
    )
    expect(page.locator("#attachments img")).to_have_count(0)
    # Attached for a vision model, then the model changes: the images go, with the reason.
    page.locator("#model-picker").select_option(VISION)
    give(tab, "drop", RED, "image/png", "red.png")
    expect(page.locator("#attachments img")).to_have_count(1)
    expect(page.locator("#attach-notice")).to_be_hidden()
    page.locator("#model-picker").select_option(TEXT_ONLY)
    expect(page.locator("#attachments img")).to_have_count(0)
    expect(page.locator("#attach-notice")).to_contain_text("the attached images were removed")
    # Not an image, or not one the API decodes: named, not attached.
    page.locator("#model-picker").select_option(VISION)
    give(tab, "paste", b"%PDF-1.4", "application/pdf", "doc.pdf")
    expect(page.locator("#attach-notice")).to_have_text(
        "doc.pdf is not a PNG, JPEG, WebP or GIF image"
    )
    expect(page.locator("#attachments img")).to_have_count(0)
    assert tab.errors == []


def test_the_models_view_marks_vision_models(
    served: tuple[ScriptedNode, ServedApp], browser: Browser, tmp_path: Path
) -> None:
    """The catalogue's entry of a card with vision carries a "vision" badge; a text-only
    card's has none."""
    _, app = served
    tab = browser.open(app.url + "/#models")
    page = tab.page
    vision = page.locator(f'details.model[data-model-id="{VISION}"]')
    text_only = page.locator(f'details.model[data-model-id="{TEXT_ONLY}"]')
    expect(text_only).to_have_count(1)
    expect(vision.locator("summary .badge.vision")).to_have_text("vision")
    expect(text_only.locator(".badge.vision")).to_have_count(0)
    tab.shot(tmp_path, "vision-badge")
    assert tab.errors == []
