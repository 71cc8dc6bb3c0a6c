"""The MoE families' reasoning and calls through the four APIs' official clients, streamed:
the scripted runner writes each format's documented example in odd chunks (markers split),
the card carries a template in the family's style, which picks the parser."""

import json
from typing import Any

import anthropic
import ollama
import openai
import pytest

from exo.api.tests.moe_formats import CALL_EXAMPLES, HARMONY_ANSWER, TEMPLATES, WEATHER, splits
from exo.api.tests.scripted_node import Script, ScriptedNode, ServedApp, small_card
from exo.shared.chat_formats import NativeFormat

DEADLINE_S = 10.0
PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
}
FUNCTION: dict[str, Any] = {"name": "get_weather", "description": "weather", "parameters": PARAMS}
USER: Any = [{"role": "user", "content": "weather?"}]
IDS = [f"{fmt}-{i}" for i, (fmt, *_) in enumerate(CALL_EXAMPLES)]


def _odd_chunks(text: str) -> list[str]:
    return list(splits(text))[2]


@pytest.fixture
def node() -> ScriptedNode:
    cards = [
        small_card(f"test-org/{fmt}-moe", [fmt]).model_copy(update={"chat_template": template})
        for fmt, template in TEMPLATES.items()
    ]
    return ScriptedNode(cards=cards)


def _script(node: ScriptedNode, output: str) -> None:
    chunks = _odd_chunks(output)
    node.script = Script(tokens=chunks, tool_tokens=chunks)


def _oa(server: ServedApp) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=DEADLINE_S
    )


@pytest.mark.parametrize(("fmt", "output", "text", "reasoning"), CALL_EXAMPLES, ids=IDS)
def test_openai_chat_streams_the_call(
    server: ServedApp, node: ScriptedNode, fmt: NativeFormat, output: str, text: str,
    reasoning: str,
) -> None:
    _script(node, output)
    tools: Any = [{"type": "function", "function": FUNCTION}]
    chunks: Any = list(
        _oa(server).chat.completions.create(model=fmt, messages=USER, tools=tools, stream=True)
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == text
    thought = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert thought == reasoning
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == WEATHER
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


@pytest.mark.parametrize(("fmt", "output", "text", "reasoning"), CALL_EXAMPLES, ids=IDS)
def test_responses_streams_the_call(
    server: ServedApp, node: ScriptedNode, fmt: NativeFormat, output: str, text: str,
    reasoning: str,
) -> None:
    _script(node, output)
    tools: Any = [{"type": "function", **FUNCTION}]
    with _oa(server).responses.stream(model=fmt, input="weather?", tools=tools) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    calls = [i for i in final.output if i.type == "function_call"]
    assert calls[0].name == "get_weather" and json.loads(calls[0].arguments) == WEATHER
    assert final.output_text == text
    thoughts = [i for i in final.output if i.type == "reasoning"]
    got = "".join(c.text for i in thoughts for c in i.content or [])
    assert got == reasoning


@pytest.mark.parametrize(("fmt", "output", "text", "reasoning"), CALL_EXAMPLES, ids=IDS)
def test_claude_streams_the_tool_use(
    server: ServedApp, node: ScriptedNode, fmt: NativeFormat, output: str, text: str,
    reasoning: str,
) -> None:
    _script(node, output)
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0,
                                 timeout=DEADLINE_S)
    tools: Any = [{"name": "get_weather", "description": "weather", "input_schema": PARAMS}]
    with client.messages.stream(model=fmt, max_tokens=50, messages=USER, tools=tools) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert any(
        e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events
    )
    assert final.stop_reason == "tool_use"
    uses = [b for b in final.content if b.type == "tool_use"]
    assert uses[0].name == "get_weather" and uses[0].input == WEATHER
    assert "".join(b.text for b in final.content if b.type == "text") == text
    assert "".join(b.thinking for b in final.content if b.type == "thinking") == reasoning


@pytest.mark.parametrize(("fmt", "output", "text", "reasoning"), CALL_EXAMPLES, ids=IDS)
def test_ollama_streams_the_call(
    server: ServedApp, node: ScriptedNode, fmt: NativeFormat, output: str, text: str,
    reasoning: str,
) -> None:
    _script(node, output)
    client = ollama.Client(host=server.url, timeout=DEADLINE_S)
    tools: Any = [{"type": "function", "function": FUNCTION}]
    think = True if reasoning else None
    parts = list(client.chat(model=fmt, messages=USER, tools=tools, stream=True, think=think))
    calls = [tc for p in parts for tc in p.message.tool_calls or []]
    assert calls[0].function.name == "get_weather"
    assert dict(calls[0].function.arguments) == WEATHER
    assert "".join(p.message.content or "" for p in parts) == text
    assert "".join(p.message.thinking or "" for p in parts) == reasoning


def test_harmony_reasoning_in_every_api(server: ServedApp, node: ScriptedNode) -> None:
    _script(node, HARMONY_ANSWER)
    thought, answer = 'User asks: "What is 2 + 2?" Simple arithmetic.', "2 + 2 = 4."
    chunks: Any = list(
        _oa(server).chat.completions.create(model="harmony", messages=USER, stream=True,
                                            reasoning_effort="xhigh")
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == thought
    assert "".join(d.content or "" for d in deltas) == answer
    with _oa(server).responses.stream(model="harmony", input="2+2?") as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.reasoning_text.delta" in kinds and final.output_text == answer
    client = anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0)
    with client.messages.stream(model="harmony", max_tokens=50, messages=USER) as claude:
        message = claude.get_final_message()
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].type == "thinking" and message.content[0].thinking == thought
    parts = list(ollama.Client(host=server.url).chat(model="harmony", messages=USER,
                                                      think=True, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == thought
    assert "".join(p.message.content or "" for p in parts) == answer
