"""The dashboard in a real chromium against a real node serving the embedded model:
the page, this node, chat (streaming, stats, stop, storage, hostile answers), launching
and deleting an instance, and a killed runner's error and recovery."""

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Locator, Route, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from exo.api.dashboard.tests.browser import (
    CHROMIUM,
    Browser,
    Tab,
    update_docs_screenshot,
)
from exo.tests.node_process import NodeProcess, running_node, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("close_pages"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"no chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)"),
]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
FAST_RETRIES = {"EXO_INSTANCE_BACKOFF_BASE_S": "0.2", "EXO_INSTANCE_BACKOFF_MAX_S": "2"}
LONG_PROMPT = "Tell me a very long story."
STATS = re.compile(r"^TTFT \d+ ms · [\d.]+ tok/s · (\d+) tokens?")
# Records every runner status text the page ever shows (the models view, even hidden).
WATCH_STATUSES = """() => {
  window.__statuses = [];
  const seen = () => document.querySelectorAll('.runner-status').forEach((e) => {
    const list = window.__statuses;
    if (list[list.length - 1] !== e.textContent) list.push(e.textContent);
  });
  new MutationObserver(seen).observe(document.body,
    {subtree: true, childList: true, characterData: true});
}"""

SHOWED_RECOVERY = """() => {
  const s = window.__statuses || [];
  return s.length > 0 && s[s.length - 1] === 'ready'
    && s.some((x) => !x.startsWith('ready') && !x.startsWith('running'));
}"""


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with running_node(tmp_path_factory.mktemp("dash-node"), env=FAST_RETRIES) as n:
        yield n


def answer(tab: Tab) -> Locator:
    return tab.page.locator(".msg.assistant").last


def start_chat(tab: Tab, prompt: str, max_tokens: int, temperature: str = "0") -> None:
    page = tab.page
    wait_until(lambda: page.locator(f'#model-picker option[value="{MODEL}"]').count() == 1
               or bool(tab.errors), 30, "the model picker")
    assert not tab.errors, tab.errors
    page.click("#new-chat")
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#temperature", temperature)
    page.locator("#model-picker").select_option(MODEL)
    page.fill("#prompt", prompt)
    page.click("#send")


def wait_streaming(node: NodeProcess, tab: Tab, chars: int = 20) -> None:
    """Until the answer shows ``chars`` characters and is still streaming."""
    wait_until(lambda: len(answer(tab).locator(".markdown").inner_text()) >= chars, 60,
               "the answer to stream")
    assert tab.page.locator("#stop").is_visible(), "the answer ended before the test acted"


def test_the_page_loads_and_shows_this_node(node: NodeProcess, browser: Browser,
                                             tmp_path: Path) -> None:
    tab = browser.open(node.url + "/")
    node_id = node.get("/node_id").json()
    info = node.state()["nodes"][node_id]
    card = tab.page.locator(f'.node[data-node-id="{node_id}"]')
    expect(card.locator(".hostname")).to_have_text(info["hostname"])
    expect(card).to_contain_text("this node")
    expect(card).to_contain_text("master")
    expect(card.locator(".bar.memory")).to_contain_text(re.compile(r"RAM \d.* / \d.*B"))
    expect(tab.page.locator("#conn")).to_have_text("live")
    expect(tab.page.locator("#banner")).to_be_hidden()
    tab.page.click("text=Downloads")
    expect(tab.page.locator("#view-downloads")).to_contain_text("Downloads")
    tab.shot(tmp_path, "downloads")
    tab.page.click("text=Cluster")
    tab.shot(tmp_path, "cluster")
    assert tab.errors == []


def test_chat_streams_an_answer_with_stats_and_keeps_it(node: NodeProcess, browser: Browser,
                                                        tmp_path: Path) -> None:
    wait_until(node.serving, 90, "a serving instance")
    tab = browser.open(node.url + "/#chat")
    expect(tab.page.locator("#model-picker optgroup[label=running] option")).to_have_text(MODEL)
    start_chat(tab, "Write a Python function that adds two numbers, in a code block.", 80)
    lengths: set[int] = set()
    deadline = time.monotonic() + 60
    while tab.page.locator("#stop").is_visible() and time.monotonic() < deadline:
        lengths.add(len(answer(tab).locator(".markdown").inner_text()))
        time.sleep(0.03)
    assert len(lengths - {0}) >= 2, f"the answer did not arrive in pieces: {lengths}"
    stats = answer(tab).locator(".stats")
    expect(stats).to_have_text(STATS)
    matched = STATS.match(stats.inner_text())
    assert matched is not None
    tokens = int(matched.group(1))
    assert 2 <= tokens <= 80
    text = answer(tab).locator(".markdown").text_content() or ""
    assert text.strip()
    tab.shot(tmp_path, "chat")
    update_docs_screenshot(tab)
    # Kept in the browser's storage: there after a reload, with its title.
    tab.page.reload()
    expect(tab.page.locator(".conversation-list li.active")).to_contain_text("Write a Python")
    expect(answer(tab).locator(".markdown")).to_have_text(text)
    assert tab.errors == []


def sse_body(*chunks: dict[str, Any]) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)


HOSTILE = [
    '<img src=x onerror="window.__pwned=1">',
    "\n\n<script>window.__pwned=2</script>\n\n",
    "[click me](javascript:window.__pwned=3) and [fine](https://example.org/a)\n\n",
    "```html\n</code></pre><img src=y onerror=window.__pwned=4>\n```\n\n",
    "**<svg onload=window.__pwned=5>** `<iframe src=javascript:alert(1)>`",
]
HOSTILE_ERROR = "<img src=z onerror=window.__pwned=6> runner died"


def test_a_hostile_answer_cannot_inject_markup(node: NodeProcess, browser: Browser,
                                               tmp_path: Path) -> None:
    tab = browser.open(node.url + "/#chat")
    deltas = [{"id": "chatcmpl-hostile", "choices": [{"index": 0, "delta": {"content": part}}]}
              for part in HOSTILE]
    body = sse_body(*deltas, {"error": {"message": HOSTILE_ERROR}})
    def hostile_answer(route: Route) -> None:
        route.fulfill(status=200, headers={"content-type": "text/event-stream"}, body=body)

    tab.page.route("**/v1/chat/completions", hostile_answer)
    start_chat(tab, "Say something nasty.", 50)
    message = answer(tab)
    expect(message.locator(".chat-error")).to_have_text(HOSTILE_ERROR)
    expect(message).to_contain_text('<img src=x onerror="window.__pwned=1">')
    expect(message).to_contain_text("<script>window.__pwned=2</script>")
    assert tab.page.evaluate("window.__pwned") is None
    assert message.locator("img, script, svg, iframe, object, embed").count() == 0
    links = message.locator("a")
    assert links.count() == 1 and links.get_attribute("href") == "https://example.org/a"
    assert links.get_attribute("rel") == "noopener noreferrer nofollow"
    expect(message.locator("pre[data-lang=html] code")).to_contain_text("</code></pre><img")
    tab.shot(tmp_path, "hostile-answer")

    # Node-supplied strings too: a hostname and a download error from a hostile state.
    state = node.state()
    node_id = node.get("/node_id").json()
    state["nodes"][node_id]["hostname"] = "<img src=h onerror=window.__pwned=7>"
    state["downloads"] = {node_id: {"evil<script>": {
        "kind": "DownloadFailed", "error_message": "<b onmouseover=window.__pwned=8>x</b>"}}}
    snapshot = {"node_id": node_id, "master_id": node_id, "state": state}
    evil = browser.open("about:blank")
    def hostile_state(route: Route) -> None:
        route.fulfill(status=200, headers={"content-type": "text/event-stream"},
                      body=f"event: state\ndata: {json.dumps(snapshot)}\n\n")

    evil.page.route("**/events", hostile_state)
    evil.page.goto(node.url + "/#downloads")
    expect(evil.page.locator(".downloads")).to_contain_text("failed: <b onmouseover")
    expect(evil.page.locator(".downloads")).to_contain_text("evil<script>")
    evil.page.click("text=Cluster")
    expect(evil.page.locator(".node .hostname")).to_have_text("<img src=h onerror=window.__pwned=7>")
    assert evil.page.evaluate("window.__pwned") is None
    assert evil.page.locator("main img, main script, main b").count() == 0


# Renders markdown features and random hostile text in the page; returns what it found.
RENDER_CHECK = """async (samples) => {
  const { renderMarkdown } = await import("/dashboard/js/markdown.js");
  const allowed = new Set(["P", "BR", "PRE", "CODE", "H3", "H4", "H5", "H6", "HR", "BLOCKQUOTE",
    "UL", "OL", "LI", "STRONG", "EM", "A"]);
  const bad = [];
  const alphabet = ["<", ">", "&", '"', "'", "`", "*", "_", "[", "]", "(", ")", "#", "-", "\\n",
    " ", "a", "1.", "script", "img", "onerror=", "javascript:", "http://x", "~~~", "```"];
  let seed = 7;
  const random = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
  for (let n = 0; n < 300; n++) {
    let text = "";
    for (let k = 0; k < 40; k++) text += alphabet[Math.floor(random() * alphabet.length)];
    samples.push(text);
  }
  const rendered = samples.map((text) => {
    const box = document.createElement("div");
    box.append(renderMarkdown(text));
    for (const el of box.querySelectorAll("*")) {
      if (!allowed.has(el.tagName)) bad.push(`${el.tagName} from ${JSON.stringify(text)}`);
      for (const attr of el.attributes) {
        if (attr.name.startsWith("on") || attr.name === "style") bad.push(`${attr.name} from ${text}`);
      }
      if (el.tagName === "A" && !/^(https?:|mailto:)/.test(el.getAttribute("href"))) {
        bad.push(`link ${el.getAttribute("href")}`);
      }
    }
    return box.innerHTML;
  });
  return { bad, first: rendered.slice(0, 4) };
}"""


def test_markdown_renders_its_features_and_only_safe_elements(node: NodeProcess,
                                                                browser: Browser) -> None:
    tab = browser.open(node.url + "/#chat")
    samples = [
        "# Title\n\nSome *em*, **strong**, `code` and [a link](https://example.org).",
        "- one\n- two\n\n1. first\n2. second",
        "```python\nprint('<b>hi</b>')\n```",
        "> quoted\n\n---",
    ]
    found = tab.page.evaluate(RENDER_CHECK, samples)
    assert found["bad"] == []
    first = found["first"]
    assert first[0] == ('<h3>Title</h3><p>Some <em>em</em>, <strong>strong</strong>, '
                        '<code>code</code> and <a href="https://example.org" target="_blank" '
                        'rel="noopener noreferrer nofollow">a link</a>.</p>')
    assert first[1] == ("<ul><li>one</li><li>two</li></ul><ol><li>first</li><li>second</li></ol>")
    assert first[2] == ('<pre data-lang="python"><code class="language-python">'
                        "print('&lt;b&gt;hi&lt;/b&gt;')</code></pre>")
    assert first[3] == "<blockquote><p>quoted</p></blockquote><hr>"
    assert tab.errors == []


def test_downloads_show_progress_speed_and_eta(node: NodeProcess, browser: Browser,
                                              tmp_path: Path) -> None:
    mib = 1024 * 1024
    node_id = node.get("/node_id").json()
    state = node.state()
    state["downloads"] = {node_id: {
        "org/with-speed": {"kind": "DownloadOngoing", "downloaded_bytes": 50 * mib,
                           "total_bytes": 200 * mib, "speed_bytes_per_s": 10 * mib, "eta_s": 15},
        "org/plain": {"kind": "DownloadOngoing", "downloaded_bytes": 3 * mib,
                      "total_bytes": 4 * mib},
        "org/done": {"kind": "DownloadCompleted", "path": "/models/done.gguf"},
        "org/failed": {"kind": "DownloadFailed", "error_message": "hub unreachable"},
    }}
    snapshot = {"node_id": node_id, "master_id": node_id, "state": state}
    tab = browser.open("about:blank")

    def with_downloads(route: Route) -> None:
        route.fulfill(status=200, headers={"content-type": "text/event-stream"},
                      body=f"event: state\ndata: {json.dumps(snapshot)}\n\n")

    tab.page.route("**/events", with_downloads)
    tab.page.goto(node.url + "/#downloads")
    rows = tab.page.locator(".downloads tbody tr")
    expect(rows).to_have_count(4)
    speed = tab.page.locator('tr[data-model-id="org/with-speed"]')
    expect(speed.locator(".bar")).to_have_attribute("aria-valuenow", "25")
    expect(speed).to_contain_text("50.0 MB / 200.0 MB")
    expect(speed).to_contain_text("10.0 MB/s · 15 s left")
    expect(tab.page.locator('tr[data-model-id="org/plain"]')).to_contain_text("3.00 MB / 4.00 MB")
    expect(tab.page.locator('tr[data-model-id="org/done"]')).to_contain_text("complete")
    expect(tab.page.locator('tr[data-model-id="org/failed"]')).to_contain_text(
        "failed: hub unreachable")
    tab.shot(tmp_path, "downloads")


def test_stop_cancels_a_long_answer_within_a_second(node: NodeProcess, browser: Browser,
                                                    tmp_path: Path) -> None:
    wait_until(node.serving, 90, "a serving instance")
    tab = browser.open(node.url + "/#chat")
    start_chat(tab, LONG_PROMPT, 3000)
    wait_streaming(node, tab)
    tab.page.click("#stop")
    clicked = time.monotonic()
    wait_until(lambda: all(r["kind"] == "RunnerReady" for r in node.state()["runners"].values())
               and not node.state()["tasks"], 1.0, "the runner to stop generating")
    stopped_after = time.monotonic() - clicked
    expect(answer(tab).locator(".stopped")).to_be_visible()
    expect(answer(tab).locator(".stats")).to_contain_text("TTFT")
    expect(tab.page.locator("#send")).to_be_enabled()
    length = len(answer(tab).locator(".markdown").inner_text())
    time.sleep(0.5)
    assert len(answer(tab).locator(".markdown").inner_text()) == length
    assert stopped_after < 1.0
    tab.shot(tmp_path, "chat-stopped")


def test_launching_and_deleting_an_instance_updates_the_view(
    node: NodeProcess, browser: Browser, tmp_path: Path
) -> None:
    wait_until(node.serving, 90, "a serving instance")
    tab = browser.open(node.url + "/#models")
    page = tab.page
    instance = page.locator(".instance")
    expect(instance).to_have_count(1)
    expect(instance.locator(".badge")).to_have_text("serving")
    expect(instance.locator(".shards")).to_contain_text("layers 0-29 of 30")
    instance.locator("button.delete").click()
    expect(page.locator("#no-instances")).to_be_visible()
    assert node.state()["instances"] == {}

    entry = page.locator("details.model", has_text=MODEL)
    entry.locator("summary").click()
    expect(entry.locator(".fit")).to_have_text("fits on 1 node(s)")
    expect(entry.locator(".preview").first).to_contain_text("layers 0-29 of 30")
    tab.shot(tmp_path, "models-preview")
    page.evaluate(WATCH_STATUSES)
    entry.locator("button.launch").click()
    expect(entry.locator(".launch-message")).to_have_text("placed on 1 node(s)")
    expect(instance).to_have_count(1)
    expect(instance.locator(".badge")).to_have_text("serving", timeout=90_000)
    seen = page.evaluate("window.__statuses")
    assert seen[-1] == "ready" and len(seen) >= 2, seen
    tab.shot(tmp_path, "models")
    assert tab.errors == []


def test_a_killed_runner_shows_its_error_then_recovers(node: NodeProcess, browser: Browser,
                                                       tmp_path: Path) -> None:
    wait_until(node.serving, 90, "a serving instance")
    tab = browser.open(node.url + "/#chat")
    tab.page.evaluate(WATCH_STATUSES)
    start_chat(tab, LONG_PROMPT, 3000)
    wait_streaming(node, tab)
    [runner] = node.runner_pids()
    os.kill(runner, signal.SIGKILL)
    error = answer(tab).locator(".chat-error")
    expect(error).to_be_visible(timeout=10_000)
    assert error.inner_text().strip()
    tab.shot(tmp_path, "chat-runner-killed")
    tab.page.click("text=Models")
    expect(tab.page.locator(".instance .badge")).to_have_text("serving", timeout=90_000)
    wait_until(lambda: node.runner_pids() not in ([], [runner]), 30, "a new runner")
    # The badge may still say "serving" from before the kill when the new runner starts: wait
    # for the page to have shown the failure and then the new runner ready (the asserts below
    # say which of the two it did not show, if it never does).
    try:
        tab.page.wait_for_function(SHOWED_RECOVERY, timeout=60_000)
    except PlaywrightTimeoutError:
        pass
    seen = tab.page.evaluate("window.__statuses")
    print("runner statuses shown:", seen)
    assert seen[-1] == "ready", seen
    assert any(not s.startswith(("ready", "running")) for s in seen), seen
    failures = [s for s in seen if s.startswith("failed: ")]
    if failures:  # shown once (the state stream is throttled): then kept on the instance
        expect(tab.page.locator(".instance .last-failure")).to_contain_text(
            failures[-1].removeprefix("failed: "))
    tab.shot(tmp_path, "models-recovered")
