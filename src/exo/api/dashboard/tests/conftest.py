"""Fixtures of the dashboard's browser tests: one chromium per module, its pages closed
after each test that asks for them (``pytest.mark.usefixtures("close_pages")``)."""

from collections.abc import Iterator

import pytest

from exo.api.dashboard.tests.browser import Browser, chromium


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    with chromium(tmp_path_factory.mktemp("dash-profile")) as b:
        yield b


@pytest.fixture
def close_pages(browser: Browser) -> Iterator[None]:
    yield
    browser.close_pages()
