"""Thinking apart from the answer, in every API, streamed and whole."""

from typing import Any, get_args

import anthropic
import ollama
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.shared import ReasoningEffort

from exo.api.generation_events import ReasoningDelta, TextDelta
from exo.api.reasoning import ReasoningSplitter
from exo.api.tests.scripted_node import Script, ScriptedNode, ServedApp, small_card

OUTPUT = "<think>\nLet me see: 2+2.</think>\n\nIt is 4."
THOUGHT, ANSWER = "Let me see: 2+2.", "It is 4."
TOKENS = ["<th", "ink>\nLet me", " see: 2+2.</", "think>\n\nIt", " is 4."]
USER: list[Any] = [{"role": "user", "content": "2+2?"}]


def split(pieces: list[str]) -> tuple[str, str]:
    splitter = ReasoningSplitter()
    events = [e for p in pieces for e in splitter.feed(p)] + splitter.finish()
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    answer = "".join(e.text for e in events if isinstance(e, TextDelta))
    return thought, answer


@settings(max_examples=50, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(OUTPUT)), max_size=10))
def test_any_split(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    pieces = [OUTPUT[a:b] for a, b in zip([0, *points], [*points, len(OUTPUT)], strict=True)]
    assert split(pieces) == (THOUGHT, ANSWER)


def test_no_thought_and_unclosed_thought() -> None:
    assert split(["Plain ", "<think> is text here"]) == ("", "Plain <think> is text here")
    assert split(["<think>still going"]) == ("still going", "")
    assert split(["  ", "<thi", "nk>a</think>b"]) == ("a", "b")


# A chat template that thinks (Ollama refuses think=true for a model whose template does not).
THINKING_TEMPLATE = "{% if enable_thinking %}<think>{% endif %}{{ messages[-1]['content'] }}"


@pytest.fixture
def node() -> ScriptedNode:
    card = small_card("test-org/model-1", ["m1"])
    return ScriptedNode(cards=[card.model_copy(update={"chat_template": THINKING_TEMPLATE})])


@pytest.fixture
def thinking(server: ServedApp, node: ScriptedNode) -> ServedApp:
    node.script = Script(tokens=TOKENS)
    return server


def test_openai_reasoning_content(thinking: ServedApp, node: ScriptedNode) -> None:
    client = openai.OpenAI(base_url=f"{thinking.url}/v1", api_key="x", max_retries=0)
    whole: Any = client.chat.completions.create(model="m1", messages=USER, reasoning_effort="low")
    message = whole.choices[0].message
    assert message.content == ANSWER and message.model_extra["reasoning_content"] == THOUGHT
    assert node.generations[-1].task_params.template_kwargs == {
        "enable_thinking": True,
        "reasoning_effort": "low",
    }
    chunks: Any = list(client.chat.completions.create(model="m1", messages=USER, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content", "") for d in deltas) == THOUGHT
    assert "".join(d.content or "" for d in deltas) == ANSWER


def test_claude_thinking_blocks(thinking: ServedApp, node: ScriptedNode) -> None:
    client = anthropic.Anthropic(base_url=thinking.url, api_key="x", max_retries=0)
    whole = client.messages.create(
        model="m1",
        max_tokens=50,
        messages=USER,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert [b.type for b in whole.content] == ["thinking", "text"]
    assert whole.content[0].type == "thinking" and whole.content[0].thinking == THOUGHT
    assert node.generations[-1].task_params.template_kwargs == {"enable_thinking": True}
    with client.messages.stream(model="m1", max_tokens=50, messages=USER) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == THOUGHT
    assert final.content[1].type == "text" and final.content[1].text == ANSWER


def test_responses_reasoning_items(thinking: ServedApp) -> None:
    client = openai.OpenAI(base_url=f"{thinking.url}/v1", api_key="x", max_retries=0)
    whole = client.responses.create(model="m1", input="2+2?", reasoning={"effort": "high"})
    assert [i.type for i in whole.output] == ["reasoning", "message"]
    assert whole.output_text == ANSWER
    with client.responses.stream(model="m1", input="2+2?") as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.reasoning_text.delta" in kinds
    reasoning = final.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == THOUGHT and final.output_text == ANSWER


def test_ollama_thinking(thinking: ServedApp, node: ScriptedNode) -> None:
    client = ollama.Client(host=thinking.url)
    whole = client.chat(model="m1", messages=USER, think=True, stream=False)
    assert whole.message.thinking == THOUGHT and whole.message.content == ANSWER
    assert node.generations[-1].task_params.template_kwargs == {"enable_thinking": True}
    parts = list(client.generate(model="m1", prompt="2+2?", stream=True))
    assert "".join(p.thinking or "" for p in parts) == THOUGHT
    assert "".join(p.response or "" for p in parts) == ANSWER


def test_reasoning_tokens_count_the_thought() -> None:
    splitter = ReasoningSplitter()
    for i, piece in enumerate(TOKENS, start=1):
        splitter.feed(piece, i)
    splitter.finish(len(TOKENS))
    # The fourth token closes the thought.
    assert splitter.reasoning_tokens == 4
    unclosed = ReasoningSplitter()
    for i, piece in enumerate(["<think>", "a", "b"], start=1):
        unclosed.feed(piece, i)
    unclosed.finish(3)
    assert unclosed.reasoning_tokens == 3
    plain = ReasoningSplitter()
    plain.feed("Hello", 1)
    plain.finish(1)
    assert plain.reasoning_tokens == 0


def test_responses_usage_counts_reasoning_tokens(thinking: ServedApp) -> None:
    client = openai.OpenAI(base_url=f"{thinking.url}/v1", api_key="x", max_retries=0)
    whole = client.responses.create(model="m1", input="2+2?")
    assert whole.usage is not None
    assert whole.usage.output_tokens == len(TOKENS)
    assert whole.usage.output_tokens_details.reasoning_tokens == 4
    with client.responses.stream(model="m1", input="2+2?") as stream:
        final = stream.get_final_response()
    assert final.usage is not None and final.usage.output_tokens_details.reasoning_tokens == 4


def test_responses_usage_without_thought_has_no_reasoning_tokens(server: ServedApp) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    whole = client.responses.create(model="m1", input="hi")
    assert whole.usage is not None and whole.usage.output_tokens_details.reasoning_tokens == 0


def test_every_reasoning_effort_of_the_sdk_is_accepted(server: ServedApp, node: ScriptedNode) -> None:
    efforts = [e for e in get_args(get_args(ReasoningEffort)[0]) if e is not None]
    assert {"xhigh", "max"} <= set(efforts)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)
    for effort in efforts:
        client.chat.completions.create(model="m1", messages=USER, reasoning_effort=effort)
        kwargs = node.generations[-1].task_params.template_kwargs
        assert kwargs["reasoning_effort"] == effort
        client.responses.create(model="m1", input="hi", reasoning={"effort": effort})
        assert node.generations[-1].task_params.template_kwargs["reasoning_effort"] == effort
