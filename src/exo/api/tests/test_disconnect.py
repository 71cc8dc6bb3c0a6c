"""Clients that go away cancel their generation; slots and the queue."""

import threading
from typing import Any

import httpx
import pytest

from exo.api.tests.conftest import ServeFn
from exo.api.tests.helpers import parse_prometheus, sample, wait_until
from exo.api.tests.scripted_node import TEXT, Script, ScriptedNode, ServedApp
from exo.shared.types.commands import CancelCommand, Command, GenerateText

USER: list[Any] = [{"role": "user", "content": "hi"}]

STREAMS = [
    ("/v1/chat/completions", {"model": "m1", "messages": USER, "stream": True}),
    ("/v1/responses", {"model": "m1", "input": "hi", "stream": True}),
    ("/v1/messages", {"model": "m1", "max_tokens": 10**6, "messages": USER, "stream": True}),
    ("/api/chat", {"model": "m1", "messages": USER}),
    ("/api/generate", {"model": "m1", "prompt": "hi"}),
]


def cancelled(command_id: str) -> Any:
    def match(command: Command) -> bool:
        return isinstance(command, CancelCommand) and command.cancelled_command_id == command_id

    return match


@pytest.mark.parametrize(("path", "body"), STREAMS)
def test_disconnect_mid_stream_cancels(
    server: ServedApp, node: ScriptedNode, path: str, body: dict[str, Any]
) -> None:
    node.script = Script(endless=True, token_delay_s=0.01)
    with (
        httpx.Client(base_url=server.url, timeout=10.0) as http,
        http.stream("POST", path, json=body) as response,
    ):
        assert response.status_code == 200
        command_id = response.headers["x-exo-command-id"]
        lines = response.iter_lines()
        for _ in range(3):
            next(lines)
    # The connection is closed: the API stops listening and cancels the command.
    node.wait_for_command(cancelled(command_id))
    wait_until(lambda: node.open_responses() == 0, what="close_response")


def test_disconnect_while_waiting_for_a_whole_answer_cancels(
    server: ServedApp, node: ScriptedNode
) -> None:
    node.script = Script(endless=True, token_delay_s=0.01)
    body = {"model": "m1", "messages": USER}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=0.5)
    generate = node.wait_for_command(lambda c: isinstance(c, GenerateText))
    node.wait_for_command(cancelled(generate.command_id))
    wait_until(lambda: node.open_responses() == 0, what="close_response")


def test_requests_beyond_the_limit_queue(serve: ServeFn) -> None:
    # 4 s an answer: the second request queues behind it even on a loaded machine.
    node = ScriptedNode(script=Script(token_delay_s=0.5))
    server = serve(node, max_concurrent_requests=1, placement_timeout_s=30.0)
    results: list[str] = []

    def ask() -> None:
        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            json={"model": "m1", "messages": USER},
            timeout=30.0,
        )
        results.append(r.json()["choices"][0]["message"]["content"])

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()

    def queued() -> bool:
        samples = parse_prometheus(httpx.get(f"{server.url}/metrics").text)
        return sample(samples, "exo_api_queue_depth") == 1

    wait_until(queued, what="one request in the queue")
    # Only one generation runs at a time.
    assert sum(isinstance(c, GenerateText) for c in node.commands()) == 1
    for t in threads:
        t.join(30.0)
    assert results == [TEXT, TEXT]


def test_a_full_queue_refuses_with_429(serve: ServeFn) -> None:
    node = ScriptedNode(script=Script(endless=True, token_delay_s=0.01))
    server = serve(node, max_concurrent_requests=1, max_queued_requests=0)
    body = {"model": "m1", "messages": USER, "stream": True}
    with (
        httpx.Client(base_url=server.url, timeout=10.0) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as first,
    ):
        lines = first.iter_lines()  # kept: dropping it would close the connection
        next(lines)
        second = http.post("/v1/messages", json={**body, "max_tokens": 5})
        assert second.status_code == 429
        assert second.json()["error"]["type"] == "rate_limit_error"


def test_a_client_that_leaves_the_queue_is_forgotten(serve: ServeFn) -> None:
    node = ScriptedNode(script=Script(endless=True, token_delay_s=0.01))
    server = serve(node, max_concurrent_requests=1)
    body = {"model": "m1", "messages": USER, "stream": True}

    def depth() -> float:
        return sample(
            parse_prometheus(httpx.get(f"{server.url}/metrics").text), "exo_api_queue_depth"
        )

    with (
        httpx.Client(base_url=server.url, timeout=10.0) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as first,
    ):
        lines = first.iter_lines()
        next(lines)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{server.url}/api/generate", json={"model": "m1", "prompt": "x"}, timeout=0.3
            )
        wait_until(lambda: depth() == 0, what="the queue to empty")
        assert sum(isinstance(c, GenerateText) for c in node.commands()) == 1
