"""One real node process with the embedded model, driven through its HTTP API."""

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exo.tests.node_process import NodeProcess, running_node, wait_until

pytestmark = pytest.mark.slow

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
FAST_RETRIES = {"EXO_INSTANCE_BACKOFF_BASE_S": "0.2", "EXO_INSTANCE_BACKOFF_MAX_S": "2"}
# The node runs what a user gets: the kernels' default activation format (8-bit), not the
# 16-bit one the suite's conftest pins for its float-bound tests.
USER_DEFAULTS = {**FAST_RETRIES, "EXO_ACTIVATIONS": ""}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    with running_node(tmp_path_factory.mktemp("single"), env=USER_DEFAULTS) as n:
        yield n


def client(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def ask(node: NodeProcess, prompt: str, max_tokens: int = 24) -> str:
    reply = client(node).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}],
        temperature=0, max_tokens=max_tokens,
    )
    return reply.choices[0].message.content or ""


def test_greedy_generation_is_deterministic_and_coherent(node: NodeProcess) -> None:
    first = ask(node, "What is the capital of France? Answer in one word.")
    second = ask(node, "What is the capital of France? Answer in one word.")
    assert first == second
    assert "paris" in first.lower()


def test_streaming_equals_non_streaming(node: NodeProcess) -> None:
    prompt = "Name three primary colors."
    whole = ask(node, prompt, max_tokens=20)
    stream = client(node).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}],
        temperature=0, max_tokens=20, stream=True,
    )
    parts: list[str] = []
    finish: str | None = None
    for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(parts) == whole
    assert finish in ("stop", "length")


def test_usage_and_finish_reason(node: NodeProcess) -> None:
    reply = client(node).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to one hundred."}],
        temperature=0, max_tokens=5,
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    assert reply.usage.prompt_tokens > 5


def test_unknown_model_and_bad_parameters_are_4xx(node: NodeProcess) -> None:
    r = httpx.post(node.url + "/v1/chat/completions", json={
        "model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 404 and "no-such-model" in r.text
    r = httpx.post(node.url + "/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 9})
    assert 400 <= r.status_code < 500 and "temperature" in r.text
    r = httpx.post(node.url + "/v1/chat/completions", content=b"{not json",
                   headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500


def test_runner_killed_mid_stream_errors_fast_and_recovers(node: NodeProcess) -> None:
    wait_until(node.serving, 60, "a serving instance")
    (runner_pid,) = node.runner_pids()
    stream = client(node).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a long story about a cat."}],
        temperature=0, max_tokens=2000, stream=True,
    )
    killed_at: list[float] = []
    got_error_at: float | None = None
    received = 0
    with pytest.raises(openai.APIError) as raised:
        for _chunk in stream:
            received += 1
            if received == 3:
                os.kill(runner_pid, signal.SIGKILL)
                killed_at.append(time.monotonic())
    got_error_at = time.monotonic()
    assert killed_at, "the stream ended before the runner was killed"
    assert got_error_at - killed_at[0] < 2.0
    assert "Runner shutdown" in str(raised.value) or "Terminated" in str(raised.value)
    # The instance heals by itself: a new runner, and the next request succeeds.
    wait_until(lambda: node.serving() and node.runner_pids() not in ([], [runner_pid]), 90,
               "a new runner to serve")
    assert "paris" in ask(node, "What is the capital of France? Answer in one word.").lower()
    state = node.state()
    assert len(state["runners"]) == 1, state["runners"]


def test_disconnect_cancels_generation(node: NodeProcess) -> None:
    wait_until(node.serving, 90, "a serving instance")
    with httpx.stream("POST", node.url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 3000, "stream": True, "temperature": 0,
    }) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                break
    # The client is gone: the runner must stop generating within a second.
    wait_until(lambda: all(r["kind"] == "RunnerReady" for r in node.state()["runners"].values())
               and not node.state()["tasks"], 1.0, "the runner to stop generating")


def test_concurrent_streams_match_sequential(node: NodeProcess) -> None:
    prompts = [f"Give me a fact about the number {i}." for i in range(8)]
    alone = [ask(node, p, max_tokens=12) for p in prompts]
    results: dict[int, str] = {}

    def run(i: int) -> None:
        results[i] = ask(node, prompts[i], max_tokens=12)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [results.get(i) for i in range(8)] == alone


def test_shutdown_leaves_no_runner(tmp_path: Path) -> None:
    with running_node(tmp_path) as n:
        runners = n.runner_pids()
        assert len(runners) == 1
        assert n.stop() == 0
    wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                               for p in runners), 10, "the runner to exit")
    assert "Traceback" not in n.log()


def test_openai_responses_api(node: NodeProcess) -> None:
    c = client(node)
    whole = c.responses.create(model=MODEL, input="What is the capital of France? One word.",
                               temperature=0, max_output_tokens=16)
    assert "paris" in whole.output_text.lower()
    deltas: list[str] = []
    with c.responses.stream(model=MODEL, input="What is the capital of France? One word.",
                            temperature=0, max_output_tokens=16) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
    assert "".join(deltas) == whole.output_text


def test_anthropic_messages_api(node: NodeProcess) -> None:
    import anthropic

    c = anthropic.Anthropic(base_url=node.url, api_key="unused", max_retries=0, timeout=60)
    message = c.messages.create(
        model=MODEL, max_tokens=16, system="You answer in one word.",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        extra_body={"temperature": 0},
    )
    text = "".join(b.text for b in message.content if b.type == "text")
    assert "paris" in text.lower()
    assert message.usage.output_tokens > 0
    with c.messages.stream(
        model=MODEL, max_tokens=16, system="You answer in one word.",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        extra_body={"temperature": 0},
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text
    assert final.stop_reason in ("end_turn", "max_tokens")


def test_ollama_api(node: NodeProcess) -> None:
    import ollama

    c = ollama.Client(host=node.url, timeout=60)
    options = {"temperature": 0, "num_predict": 16}
    messages = [{"role": "user", "content": "What is the capital of France? One word."}]
    reply = c.chat(model=MODEL, messages=messages, options=options)
    assert "paris" in (reply.message.content or "").lower()
    streamed = "".join(part.message.content or "" for part in c.chat(
        model=MODEL, messages=messages, options=options, stream=True))
    assert streamed == reply.message.content
    generated = c.generate(model=MODEL, prompt="The capital of France is", options=options)
    assert generated.done and generated.response
    assert any(m.model == MODEL for m in c.list().models)
    assert c.show(MODEL).modelinfo is not None or c.show(MODEL).details is not None


_ENDPOINTS = ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/api/chat",
              "/api/generate", "/place_instance"]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_BODY = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from([MODEL, "default", "nope", ""]) | _JSON,
        "messages": st.just([{"role": "user", "content": "hi"}]) | _JSON,
        "input": st.just("hi") | _JSON,
        "prompt": st.just("hi") | _JSON,
        "max_tokens": st.integers(-2, 3) | _JSON,
        "max_output_tokens": st.integers(-2, 3) | _JSON,
        "temperature": st.floats(-1, 3) | st.sampled_from([1e-300, 5e-324]) | _JSON,
        "repetition_penalty": st.sampled_from([1e-300, 1e300]) | _JSON,
        "stream": st.booleans() | _JSON,
        "options": st.just({"num_predict": 2}) | _JSON,
    },
)


def test_fuzzed_requests_never_get_a_5xx_and_the_node_keeps_serving(node: NodeProcess) -> None:
    wait_until(node.serving, 90, "a serving instance")
    seen: list[int] = []

    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(endpoint=st.sampled_from(_ENDPOINTS), body=_BODY)
    def post(endpoint: str, body: dict[str, object]) -> None:
        # Keep any generation short: a bounded fuzz, not a load test.
        limit = {"/api/generate": "options", "/api/chat": "options",
                 "/v1/responses": "max_output_tokens"}.get(endpoint, "max_tokens")
        body.setdefault(limit, {"num_predict": 2} if limit == "options" else 2)
        r = httpx.post(node.url + endpoint, json=body, timeout=60)
        seen.append(r.status_code)
        assert r.status_code < 500, (endpoint, body, r.text)

    post()
    assert any(400 <= s < 500 for s in seen)
    assert "paris" in ask(node, "What is the capital of France? Answer in one word.").lower()
