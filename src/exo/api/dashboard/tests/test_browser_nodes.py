"""The dashboard in a real chromium against real nodes without a model: the API key
prompt, the reconnecting banner across a node restart, and a second node joining."""

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from exo.api.dashboard.tests.browser import CHROMIUM, Browser
from exo.cluster.tests.nodes import NodeGroup, NodeProc
from exo.tests.node_process import NodeProcess, free_port, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("close_pages"),
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"no chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)"),
]

KEY = "browser-test-key"


def start_node(tmp: Path, port: int, *args: str) -> NodeProcess:
    """A node alone on ``port`` (the same port again after a restart), no model."""
    data_dir = tmp / "node"
    log_path = tmp / f"node-{len(list(tmp.glob('node-*.log')))}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "EXO_DISCOVERY_INTERFACE": "none"}
    cmd = [sys.executable, "-m", "exo.cli", "--api-port", str(port), "--data-dir", str(data_dir),
           "--threads", "1", "--model", "none", *args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    node = NodeProcess(process, port, data_dir, log_path)

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"node exited early:\n{node.log()[-3000:]}")
        try:
            return node.get("/health").status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 60, "the node's API")
    return node


def test_the_key_prompt_and_the_reconnecting_banner(browser: Browser, tmp_path: Path) -> None:
    port = free_port()
    node = start_node(tmp_path, port, "--api-key", KEY)
    try:
        tab = browser.open(node.url + "/")
        page = tab.page
        dialog = page.locator("#key-dialog")
        expect(dialog).to_be_visible()
        tab.shot(tmp_path, "key-prompt")
        page.fill("#key-input", "not-the-key")
        page.click("#key-submit")
        expect(page.locator("#key-error")).to_have_text("The node refused that key.")
        expect(dialog).to_be_visible()
        page.fill("#key-input", KEY)
        page.click("#key-submit")
        expect(dialog).to_be_hidden()
        expect(page.locator(".node")).to_have_count(1)
        expect(page.locator("#conn")).to_have_text("live")
        assert page.evaluate("sessionStorage.getItem('exo.apiKey')") == KEY
        # Kept for the browser session: a reload asks nothing.
        page.reload()
        expect(page.locator(".node")).to_have_count(1)
        expect(dialog).to_be_hidden()

        # The node goes away: the banner says so; it comes back: the page recovers.
        assert node.stop() == 0
        expect(page.locator("#banner")).to_be_visible(timeout=15_000)
        expect(page.locator("#conn")).to_have_text("reconnecting")
        tab.shot(tmp_path, "reconnecting")
        node = start_node(tmp_path, port, "--api-key", KEY)
        expect(page.locator("#banner")).to_be_hidden(timeout=60_000)
        expect(page.locator("#conn")).to_have_text("live")
        expect(page.locator(".node")).to_have_count(1)
        expect(dialog).to_be_hidden()
    finally:
        node.stop()


def answers(proc: NodeProc) -> bool:
    if proc.process.poll() is not None:
        raise AssertionError(f"{proc.name} exited:\n{proc.log()[-3000:]}")
    try:
        return httpx.get(proc.url + "/state", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_second_node_appears_without_a_reload(browser: Browser, tmp_path: Path) -> None:
    group = NodeGroup(tmp_path)
    try:
        a = group.start("a")
        wait_until(lambda: answers(a), 60, "node a")
        tab = browser.open(a.url + "/")
        page = tab.page
        expect(page.locator(".node")).to_have_count(1)
        expect(page.locator(".badge.master")).to_have_count(1)
        b = group.start("b", [a.endpoint])
        wait_until(lambda: answers(b), 60, "node b")
        expect(page.locator(".node")).to_have_count(2, timeout=60_000)
        expect(page.locator(".badge.master")).to_have_count(1)
        expect(page.locator(".badge.self")).to_have_count(1)
        expect(page.locator(".links li").first).to_be_visible(timeout=30_000)
        expect(page.locator(".diagram line").first).to_be_attached()
        tab.shot(tmp_path, "cluster-two-nodes")
        # Placement previews now span both nodes: a layer range and memory on each.
        page.click("text=Models")
        entry = page.locator("details.model").first
        entry.locator("summary").click()
        two = entry.locator(".preview", has_text="pipeline, 2 node(s)")
        expect(two.locator("tbody tr")).to_have_count(2)
        expect(two.locator("tbody tr").first).to_contain_text(re.compile(r"layers 0-\d+ of \d+"))
        expect(two.locator("tbody tr").last).to_contain_text(re.compile(r"MB"))
        tab.shot(tmp_path, "models-two-nodes")
        assert tab.errors == []
    except BaseException:
        print(group.logs())
        raise
    finally:
        group.close()
