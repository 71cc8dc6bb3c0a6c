"""Request limits on a real node: a huge body gets a 413 before anything reads it whole;
a prompt far longer than the model's context gets a 400 naming the limit before any
runner tokenises it; max_tokens is capped at the context."""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from exo.shared.constants import EXO_MAX_CONTEXT_TOKENS
from exo.tests.node_process import NodeProcess, running_node

pytestmark = [pytest.mark.slow]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
LIMIT = 1_000_000


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp: Path = tmp_path_factory.mktemp("limits")
    with running_node(tmp, "--model", "none", env={"EXO_MAX_BODY_BYTES": str(LIMIT)},
                      wait_ready=False) as n:
        yield n


def _chat(content: str) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}]}


def test_a_body_over_the_limit_is_413_json(node: NodeProcess) -> None:
    r = httpx.post(node.url + "/v1/chat/completions", json=_chat("x" * (LIMIT + 10)), timeout=30)
    assert r.status_code == 413, r.text
    assert str(LIMIT) in r.json()["error"]["message"]


def test_a_chunked_body_over_the_limit_is_413_json(node: NodeProcess) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "' + MODEL.encode() + b'", "messages": [{"role": "user", "content": "'
        for _ in range(LIMIT // 10_000 + 2):
            yield b"y" * 10_000
        yield b'"}]}'

    r = httpx.post(node.url + "/v1/chat/completions", content=chunks(), timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert "too large" in r.text


def test_claude_and_ollama_get_413_too(node: NodeProcess) -> None:
    big = "z" * (LIMIT + 10)
    r = httpx.post(node.url + "/v1/messages", timeout=30, json={
        "model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": big}]})
    assert r.status_code == 413 and r.json()["type"] == "error", r.text
    r = httpx.post(node.url + "/api/chat", json=_chat(big), timeout=30)
    assert r.status_code == 413 and "error" in r.json(), r.text


def test_a_prompt_far_over_the_context_is_400_naming_the_limit(node: NodeProcess) -> None:
    # Under the body limit, but no tokenizer fits 900,000 characters in the served context.
    r = httpx.post(node.url + "/v1/chat/completions", json=_chat("word " * 180_000), timeout=30)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert str(EXO_MAX_CONTEXT_TOKENS) in message and "context" in message


def test_a_small_body_passes_the_limits(node: NodeProcess) -> None:
    body = {**_chat("hello " * 1000), "model": "no-such-model"}
    r = httpx.post(node.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 404, r.text  # it got through to the model lookup
