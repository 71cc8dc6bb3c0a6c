"""Tool calls streamed through each API's official client: the scripted runner writes a
Hermes call a few characters at a time, the second turn answers from the result."""

import json
from typing import Any

import anthropic
import ollama
import openai
import pytest

from exo.api.tests.scripted_node import TEXT, Script, ScriptedNode, ServedApp

DEADLINE_S = 10.0
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
# Split at awkward places: inside the markers and the JSON.
TOOL_TOKENS = [
    "I will check. <to",
    "ol_ca",
    'll>\n{"na',
    'me": "get_weather", "argu',
    'ments": {"ci',
    'ty": "Paris"}}\n</tool',
    "_call>",
]
assert "".join(TOOL_TOKENS) == "I will check. " + CALL
PARAMS: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}}}
FUNCTION: dict[str, Any] = {"name": "get_weather", "description": "weather", "parameters": PARAMS}


@pytest.fixture
def tool_server(server: ServedApp, node: ScriptedNode) -> ServedApp:
    node.script = Script(tool_tokens=TOOL_TOKENS)
    return server


def oa(server: ServedApp) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=DEADLINE_S
    )


def test_openai_chat_streamed_calls_and_history(tool_server: ServedApp, node: ScriptedNode) -> None:
    tools: Any = [{"type": "function", "function": FUNCTION}]
    user: Any = [{"role": "user", "content": "weather?"}]
    chunks = list(
        oa(tool_server).chat.completions.create(model="m1", messages=user, tools=tools, stream=True)
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert text == "I will check. " and finishes == ["tool_calls"]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].id
    assert calls[0].function is not None and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments or "") == {"city": "Paris"}
    history: Any = [
        *user,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0].id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"},
    ]
    reply = oa(tool_server).chat.completions.create(model="m1", messages=history, tools=tools)
    assert reply.choices[0].message.content == TEXT
    sent = node.generations[-1].task_params
    assert sent.input[1].tool_calls[0].name == "get_weather"
    assert sent.input[2].role == "tool" and sent.input[2].tool_call_id == calls[0].id
    assert [t.name for t in sent.tools] == ["get_weather"]
    # tool_choice none: the call stays text.
    plain = oa(tool_server).chat.completions.create(
        model="m1", messages=user, tools=tools, tool_choice="none"
    )
    assert plain.choices[0].message.content == "I will check. " + CALL
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].finish_reason == "stop"


def test_responses_streamed_calls(tool_server: ServedApp) -> None:
    tools: Any = [{"type": "function", **FUNCTION}]
    with oa(tool_server).responses.stream(model="m1", input="weather?", tools=tools) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    types = [item.type for item in final.output]
    assert types == ["message", "function_call"]
    call = final.output[1]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert final.output_text == "I will check. "
    second = oa(tool_server).responses.create(
        model="m1",
        tools=tools,
        input=[
            {"role": "user", "content": "weather?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
    )
    assert second.output_text == TEXT


def test_claude_streamed_tool_use(tool_server: ServedApp, node: ScriptedNode) -> None:
    client = anthropic.Anthropic(
        base_url=tool_server.url, api_key="unused", max_retries=0, timeout=DEADLINE_S
    )
    tools: Any = [{"name": "get_weather", "description": "weather", "input_schema": PARAMS}]
    user: Any = [{"role": "user", "content": "weather?"}]
    with client.messages.stream(model="m1", max_tokens=50, messages=user, tools=tools) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert any(
        e.type == "content_block_delta" and e.delta.type == "input_json_delta" for e in events
    )
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use"]
    use = final.content[1]
    assert use.type == "tool_use" and use.input == {"city": "Paris"}
    whole = client.messages.create(model="m1", max_tokens=50, messages=user, tools=tools)
    assert whole.stop_reason == "tool_use" and whole.content[1].type == "tool_use"
    history: Any = [
        *user,
        {"role": "assistant", "content": [b.model_dump() for b in final.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
        },
    ]
    reply = client.messages.create(model="m1", max_tokens=50, tools=tools, messages=history)
    assert reply.content[0].type == "text" and reply.content[0].text == TEXT
    sent = node.generations[-1].task_params.input
    assert sent[1].tool_calls[0].id == use.id
    assert (sent[2].role, sent[2].name, sent[2].content) == ("tool", "get_weather", "sunny")


def test_ollama_tool_calls(tool_server: ServedApp) -> None:
    client = ollama.Client(host=tool_server.url, timeout=DEADLINE_S)
    tools: Any = [{"type": "function", "function": FUNCTION}]
    user: Any = [{"role": "user", "content": "weather?"}]
    whole = client.chat(model="m1", messages=user, tools=tools)
    assert whole.message.tool_calls is not None
    assert whole.message.tool_calls[0].function.name == "get_weather"
    assert whole.message.tool_calls[0].function.arguments == {"city": "Paris"}
    parts = list(client.chat(model="m1", messages=user, tools=tools, stream=True))
    streamed = [tc for p in parts for tc in p.message.tool_calls or []]
    assert len(streamed) == 1 and streamed[0].function.name == "get_weather"
    reply = client.chat(
        model="m1",
        tools=tools,
        messages=[
            *user,
            {"role": "assistant", "content": "", "tool_calls": whole.message.tool_calls},
            {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        ],
    )
    assert reply.message.content == TEXT
