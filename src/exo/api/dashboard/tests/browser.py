"""Debian's chromium driven by Playwright for the dashboard's browser tests.

Skips (with the reason) where chromium or Playwright is missing; ``.ci/run`` installs
chromium. Never downloads a browser: Playwright drives ``/usr/bin/chromium``.
"""

import os
import shutil
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import (
    BrowserContext,
    ConsoleMessage,
    Page,
    ViewportSize,
    sync_playwright,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
REPO_ROOT = Path(__file__).resolve().parents[5]
DOCS_SCREENSHOT = REPO_ROOT / "docs" / "dashboard.png"
# Set to 1 to (re)write the README's screenshot from the chat test.
UPDATE_DOCS_ENV = "EXO_UPDATE_DOCS_SCREENSHOT"


def require_browser() -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium; .ci/run does)")


@dataclass
class Tab:
    """A page and what it reported: console errors and uncaught exceptions."""

    page: Page
    errors: list[str] = field(default_factory=list[str])

    def shot(self, directory: Path, name: str) -> Path:
        path = directory / f"{name}.png"
        self.page.screenshot(path=str(path))
        return path


@dataclass
class Browser:
    context: BrowserContext

    def close_pages(self) -> None:
        """Close every page: each holds a /events stream, and chromium keeps at most six
        connections per host (HTTP/1.1), so pages left open starve later ones."""
        for page in self.context.pages:
            page.close()

    def open(self, url: str) -> Tab:
        page = self.context.new_page()
        page.set_default_timeout(30_000)
        tab = Tab(page)

        def console(message: ConsoleMessage) -> None:
            if message.type == "error":
                tab.errors.append(message.text)

        def uncaught(error: Exception) -> None:
            tab.errors.append(f"uncaught: {error}")

        page.on("console", console)
        page.on("pageerror", uncaught)
        page.goto(url)
        return tab


@contextmanager
def chromium(profile_dir: Path) -> Generator[Browser]:
    """A fresh chromium profile in ``profile_dir``."""
    require_browser()
    shutil.rmtree(profile_dir, ignore_errors=True)
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile_dir), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
            viewport=VIEWPORT, env={**os.environ, "TZ": "UTC"},
        )
        try:
            yield Browser(context)
        finally:
            context.close()


def update_docs_screenshot(tab: Tab) -> None:
    """Write the README's screenshot, only when asked (CI must not dirty the tree)."""
    if os.environ.get(UPDATE_DOCS_ENV) == "1":
        DOCS_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        tab.page.screenshot(path=str(DOCS_SCREENSHOT))
