"""Fixtures: a scripted node behind a real uvicorn server on 127.0.0.1."""

from collections.abc import Callable, Iterator

import pytest

from exo.api.main import create_app
from exo.api.settings import ApiSettings
from exo.api.tests.scripted_node import ScriptedNode, ServedApp

ServeFn = Callable[..., ServedApp]


@pytest.fixture
def node() -> ScriptedNode:
    return ScriptedNode()


@pytest.fixture
def serve() -> Iterator[ServeFn]:
    """``serve(node, **settings)`` starts a server; every one is stopped after the test."""
    started: list[ServedApp] = []

    def start(node: ScriptedNode, **settings: object) -> ServedApp:
        app = create_app(node, ApiSettings.model_validate({"port": 0, **settings}))
        served = ServedApp(app, node)
        served.start()
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


@pytest.fixture
def server(node: ScriptedNode, serve: ServeFn) -> ServedApp:
    return serve(node, placement_timeout_s=5.0)


@pytest.fixture(scope="module")
def shared_server() -> Iterator[ServedApp]:
    """One server for a module's tests that change nothing (errors, listings)."""
    node = ScriptedNode()
    served = ServedApp(create_app(node, ApiSettings(port=0, placement_timeout_s=5.0)), node)
    served.start()
    yield served
    served.stop()
