"""The APIs against one real node serving the embedded model, through official clients:
what only a real runner can show (its context, its token counts, its stop matching)."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import ollama
import openai
import pytest

from exo.tests.node_process import NodeProcess, running_node

pytestmark = [pytest.mark.slow]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
GREEDY: dict[str, Any] = {"temperature": 0}
USER: list[Any] = [{"role": "user", "content": "Write one sentence about the sea."}]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp: Path = tmp_path_factory.mktemp("api-real")
    with running_node(tmp, timeout=300) as n:
        yield n


def oa(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=120)


def claude(node: NodeProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0, timeout=120)


def test_prompt_over_the_context_is_400_in_each_api(node: NodeProcess) -> None:
    long: list[Any] = [{"role": "user", "content": "lorem ipsum " * 1500}]
    with pytest.raises(openai.BadRequestError) as info:
        oa(node).chat.completions.create(model=MODEL, messages=long, max_tokens=5)
    body: Any = info.value.body
    assert body["code"] == "context_length_exceeded" and "2048" in body["message"]
    with pytest.raises(openai.BadRequestError):
        list(oa(node).chat.completions.create(model=MODEL, messages=long, stream=True))
    with pytest.raises(anthropic.BadRequestError):
        claude(node).messages.create(model=MODEL, max_tokens=5, messages=long, stream=True)
    with pytest.raises(ollama.ResponseError) as ol:
        ollama.Client(host=node.url, timeout=120).chat(
            model=MODEL, messages=USER, options={"num_ctx": 8}, stream=False
        )
    assert ol.value.status_code == 400
    # The node still serves.
    reply = oa(node).chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
    assert reply.choices[0].finish_reason == "length"


def test_claude_counts_and_stop_sequences(node: NodeProcess) -> None:
    client = claude(node)
    free = client.messages.create(model=MODEL, max_tokens=24, messages=USER, extra_body=GREEDY)
    assert free.content[0].type == "text"
    text = free.content[0].text
    counted = client.messages.count_tokens(model=MODEL, messages=USER)
    assert counted.input_tokens == free.usage.input_tokens > 5
    with client.messages.stream(
        model=MODEL, max_tokens=24, messages=USER, extra_body=GREEDY
    ) as stream:
        start = next(e for e in stream if e.type == "message_start")
        assert start.message.usage.input_tokens == counted.input_tokens
        stream.until_done()
    # A stop string from the middle of the greedy answer: the runner stops there and
    # says which one matched.
    words = text.split()
    assert len(words) >= 4, text
    stop = " " + words[3]
    stopped = client.messages.create(
        model=MODEL, max_tokens=24, messages=USER, extra_body=GREEDY, stop_sequences=["@@", stop]
    )
    assert stopped.stop_reason == "stop_sequence"
    assert stopped.stop_sequence == stop
    assert stopped.content[0].type == "text"
    assert stopped.content[0].text == text[: text.index(stop)]


def test_logprobs_whole_and_streamed(node: NodeProcess) -> None:
    reply = oa(node).chat.completions.create(
        model=MODEL, messages=USER, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3
    )
    choice = reply.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    entries = choice.logprobs.content
    assert "".join(e.token for e in entries) == choice.message.content
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-4)
    streamed = oa(node).chat.completions.create(
        model=MODEL, messages=USER, max_tokens=8, temperature=0, logprobs=True, stream=True
    )
    tokens = [
        e.token
        for chunk in streamed
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content
        for e in chunk.choices[0].logprobs.content
    ]
    assert tokens == [e.token for e in entries]


def test_seed_is_reproducible(node: NodeProcess) -> None:
    def sample(seed: int) -> str:
        reply = oa(node).chat.completions.create(
            model=MODEL, messages=USER, max_tokens=16, temperature=1.0, seed=seed
        )
        return reply.choices[0].message.content or ""

    first = sample(1234)
    assert sample(1234) == first
    # n choices with a seed are the choices of seed, seed + 1, ...
    both = oa(node).chat.completions.create(
        model=MODEL, messages=USER, max_tokens=16, temperature=1.0, seed=1234, n=2
    )
    assert both.choices[0].message.content == first
    assert both.choices[1].message.content == sample(1235)
