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
    reply = oa(node).chat.completions.create(
        model=MODEL, messages=USER, max_tokens=3, temperature=0
    )
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


def test_ollama_generate_continues_from_context(node: NodeProcess) -> None:
    c = ollama.Client(host=node.url, timeout=120)
    options = {"temperature": 0, "num_predict": 24}
    first = c.generate(model=MODEL, prompt="My cat is called Whiskers. Say hello to my cat.",
                       options=options)
    assert first.context and first.prompt_eval_count and first.eval_count
    assert len(first.context) == first.prompt_eval_count + first.eval_count
    question = "What is my cat called?"
    plain = c.generate(model=MODEL, prompt=question, options=options)
    assert plain.context is not None and plain.prompt_eval_count is not None
    assert "whiskers" not in (plain.response or "").lower()
    follow = c.generate(model=MODEL, prompt=question, options=options, context=first.context)
    # The prompt is the earlier tokens, then the new prompt templated as without them.
    assert follow.prompt_eval_count == len(first.context) + plain.prompt_eval_count
    assert follow.context is not None
    n = len(first.context)
    assert follow.context[:n] == first.context
    assert follow.context[n : n + plain.prompt_eval_count] == plain.context[: plain.prompt_eval_count]
    assert follow.response != plain.response and "whiskers" in (follow.response or "").lower()
    streamed = list(c.generate(model=MODEL, prompt=question, options=options,
                               context=first.context, stream=True))
    assert "".join(p.response or "" for p in streamed) == follow.response
    assert streamed[-1].context == follow.context


def test_ollama_context_the_runner_refuses_is_400(node: NodeProcess) -> None:
    c = ollama.Client(host=node.url, timeout=120)
    with pytest.raises(ollama.ResponseError) as vocab:
        c.generate(model=MODEL, prompt="hi", context=[1, 49152])
    assert vocab.value.status_code == 400 and "context" in vocab.value.error
    assert "49152" in vocab.value.error
    with pytest.raises(ollama.ResponseError) as long:
        c.generate(model=MODEL, prompt="lorem ipsum " * 100, context=[198] * 1900)
    assert long.value.status_code == 400 and "from 'context'" in long.value.error
    assert c.generate(model=MODEL, prompt="hi", options={"num_predict": 2}).done


COUNT: list[Any] = [
    {"role": "user", "content": "Count from 1 to 10."},
    {"role": "assistant", "content": "1, 2, 3, 4,"},
]


def test_claude_and_ollama_continue_an_assistant_prefill(node: NodeProcess) -> None:
    reply = claude(node).messages.create(
        model=MODEL, max_tokens=8, messages=COUNT, extra_body=GREEDY
    )
    assert reply.content[0].type == "text"
    assert reply.content[0].text.startswith(" 5, 6"), reply.content[0].text
    with claude(node).messages.stream(
        model=MODEL, max_tokens=8, messages=COUNT, extra_body=GREEDY
    ) as stream:
        assert "".join(stream.text_stream) == reply.content[0].text
    chat = ollama.Client(host=node.url, timeout=120).chat(
        model=MODEL, messages=COUNT, options={"temperature": 0, "num_predict": 8}
    )
    assert (chat.message.content or "").startswith(" 5, 6"), chat.message.content
    # OpenAI chat opens a new turn after the assistant's message.
    fresh = oa(node).chat.completions.create(
        model=MODEL, messages=COUNT, max_tokens=8, temperature=0
    )
    assert (fresh.choices[0].message.content or "").startswith("1, 2, 3,")
