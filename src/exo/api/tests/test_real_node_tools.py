"""Tool loops and structured output on one real node serving the embedded model, with
the official clients: the 135M model cannot call tools on its own, so turn one forces a
call (constrained decoding writes it in SmolLM2's format), turn two answers from the
tool's result. Structured output must always parse and validate."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import ollama
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exo.tests.node_process import NodeProcess, running_node

pytestmark = [pytest.mark.slow]

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
FUNCTION: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather forecast of a city",
    "parameters": PARAMS,
}
QUESTION = "What will the weather be in Paris for the next 2 days?"
RESULT = "Sunny, 25 degrees."


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    tmp: Path = tmp_path_factory.mktemp("api-tools")
    with running_node(tmp, timeout=300) as n:
        yield n


def oa(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="x", max_retries=0, timeout=180)


def valid_arguments(arguments: str | dict[str, Any]) -> dict[str, Any]:
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(value, PARAMS)
    return value


def test_openai_chat_two_turn_tool_loop(node: NodeProcess) -> None:
    client = oa(node)
    tools: Any = [{"type": "function", "function": FUNCTION}]
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=tools,
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    valid_arguments(call.function.arguments)
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": RESULT})
    second = client.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, max_tokens=30, temperature=0
    )
    assert second.choices[0].message.content
    assert second.choices[0].finish_reason in ("stop", "length")
    # Streamed, a forced named call arrives as tool_calls deltas.
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": QUESTION}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60,
        temperature=0,
        stream=True,
    )
    deltas = [c.choices[0].delta for c in stream if c.choices]
    streamed = [tc for d in deltas for tc in d.tool_calls or []]
    assert streamed and streamed[0].function is not None
    assert streamed[0].function.name == "get_weather"
    valid_arguments(streamed[0].function.arguments or "")


def test_responses_two_turn_tool_loop(node: NodeProcess) -> None:
    client = oa(node)
    tools: Any = [{"type": "function", **FUNCTION}]
    first = client.responses.create(
        model=MODEL,
        input=QUESTION,
        tools=tools,
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    valid_arguments(calls[0].arguments)
    history: Any = [
        {"role": "user", "content": QUESTION},
        {
            "type": "function_call",
            "call_id": calls[0].call_id,
            "name": calls[0].name,
            "arguments": calls[0].arguments,
        },
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": RESULT},
    ]
    second = client.responses.create(
        model=MODEL, input=history, tools=tools, max_output_tokens=30, temperature=0
    )
    assert second.output_text
    with client.responses.stream(
        model=MODEL,
        input=QUESTION,
        tools=tools,
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
    ) as stream:
        final = stream.get_final_response()
    streamed = [item for item in final.output if item.type == "function_call"]
    assert streamed and streamed[0].name == "get_weather"
    valid_arguments(streamed[0].arguments)


def test_claude_two_turn_tool_loop(node: NodeProcess) -> None:
    client = anthropic.Anthropic(base_url=node.url, api_key="x", max_retries=0, timeout=180)
    tools: Any = [
        {"name": "get_weather", "description": FUNCTION["description"], "input_schema": PARAMS}
    ]
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    # Greedy: Claude's default temperature is 1, and a sampled call may run past max_tokens.
    first = client.messages.create(
        model=MODEL, max_tokens=60, messages=messages, tools=tools, tool_choice={"type": "any"},
        extra_body={"temperature": 0},
    )
    assert first.stop_reason == "tool_use"
    uses = [b for b in first.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather"
    valid_arguments(uses[0].input)
    messages.append({"role": "assistant", "content": [b.model_dump() for b in first.content]})
    messages.append(
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": RESULT}],
        }
    )
    second = client.messages.create(
        model=MODEL, max_tokens=30, messages=messages, tools=tools, extra_body={"temperature": 0}
    )
    assert second.content and second.content[0].type == "text"
    with client.messages.stream(
        model=MODEL,
        max_tokens=60,
        extra_body={"temperature": 0},
        messages=[{"role": "user", "content": QUESTION}],
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as stream:
        final = stream.get_final_message()
    streamed = [b for b in final.content if b.type == "tool_use"]
    assert streamed and streamed[0].name == "get_weather"
    valid_arguments(streamed[0].input)


def test_ollama_two_turn_tool_loop(node: NodeProcess) -> None:
    tools: list[Any] = [{"type": "function", "function": FUNCTION}]
    # Ollama has no tool_choice: exo takes OpenAI's as an extension.
    r = httpx.post(
        node.url + "/api/chat",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": QUESTION}],
            "tools": tools,
            "tool_choice": "required",
            "stream": False,
            "options": {"num_predict": 60, "temperature": 0},
        },
        timeout=180,
    )
    assert r.status_code == 200, r.text
    message = r.json()["message"]
    call = message["tool_calls"][0]["function"]
    assert call["name"] == "get_weather"
    valid_arguments(call["arguments"])
    client = ollama.Client(host=node.url, timeout=180)
    second = client.chat(
        model=MODEL,
        messages=[
            {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": "", "tool_calls": message["tool_calls"]},
            {"role": "tool", "content": RESULT, "tool_name": "get_weather"},
        ],
        tools=tools,
        options={"num_predict": 30, "temperature": 0},
    )
    assert second.message.content


SCHEMAS = st.fixed_dictionaries(
    {
        "type": st.just("object"),
        "properties": st.dictionaries(
            st.sampled_from(["name", "age", "tags", "ok", "score"]),
            st.sampled_from(
                [
                    {"type": "string", "maxLength": 12},
                    {"type": "integer"},
                    {"type": "boolean"},
                    {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
                    {"enum": ["red", "green"]},
                ]
            ),
            min_size=1,
            max_size=3,
        ),
    }
).map(lambda s: {**s, "required": sorted(s["properties"]), "additionalProperties": False})


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(schema=SCHEMAS)
def test_structured_output_always_validates(node: NodeProcess, schema: dict[str, Any]) -> None:
    reply = oa(node).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        max_tokens=120,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content or ""), schema)


CLOSED: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_structured_output_in_responses_and_ollama(node: NodeProcess) -> None:
    response = oa(node).responses.create(
        model=MODEL,
        input="Describe a cat.",
        text={"format": {"type": "json_schema", "name": "cat", "schema": CLOSED}},
        max_output_tokens=60,
        temperature=0,
    )
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), CLOSED)
    client = ollama.Client(host=node.url, timeout=180)
    # Ollama's default sampling. Such an object takes about 20 tokens; its age has at most
    # 16 digits (unbounded, one CI run got 50 digits and "length"); 100 leaves room for
    # escapes in the name.
    reply = client.generate(
        model=MODEL, prompt="A dog.", format=CLOSED, options={"num_predict": 100}
    )
    assert reply.done_reason == "stop", reply.response
    jsonschema.validate(json.loads(reply.response or ""), CLOSED)
    # "json": any object; it parses whenever the model finished it.
    free = client.generate(
        model=MODEL, prompt="A JSON object about a dog.", format="json", options={"num_predict": 60}
    )
    if free.done_reason == "stop":
        assert isinstance(json.loads(free.response or ""), dict)
    else:
        assert (free.response or "").startswith("{")
