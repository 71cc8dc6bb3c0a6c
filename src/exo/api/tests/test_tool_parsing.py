"""The streaming tool-call parser, fed every family's format in every split, and the
prompt side (tools into templates, forced call openings)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exo.api.generation_events import TextDelta, ToolCallEvent
from exo.api.tool_calls import ParsedEvent, ToolCallParser, parse_calls
from exo.shared.types.text_generation import InputMessage, ToolCall, ToolSpec
from exo.worker.engines.chat_prompt import chat_prompt, forced_prefix, tool_format

WEATHER: tuple[str, dict[str, object]] = ("get_weather", {"city": "Paris", "days": 2})
TIME: tuple[str, dict[str, object]] = ("get_time", {"zone": "CET"})

# (model output, text expected, calls expected)
CASES: dict[str, tuple[str, str, list[tuple[str, dict[str, object]]]]] = {
    "hermes": (
        'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
        '"days": 2}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
        '{"zone": "CET"}}\n</tool_call>',
        "Let me check.\n",
        [WEATHER, TIME],
    ),
    "smollm": (
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
        '{"name": "get_time", "arguments": {"zone": "CET"}}]</tool_call>',
        "",
        [WEATHER, TIME],
    ),
    "llama3_tag": (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
        '{"name": "get_time", "parameters": {"zone": "CET"}}',
        "",
        [WEATHER, TIME],
    ),
    "llama3_bare": (
        '  {"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}',
        "",
        [WEATHER],
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]',
        "",
        [WEATHER],
    ),
    "string_arguments": (
        '<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"CET\\"}"}</tool_call>',
        "",
        [TIME],
    ),
    "plain_text": (
        "The weather is <b>fine</b> {not json}.",
        "The weather is <b>fine</b> {not json}.",
        [],
    ),
    "malformed_call": (
        'Sure <tool_call>{"name": "get_weather", "arguments": {"city": </tool_call> ok',
        'Sure <tool_call>{"name": "get_weather", "arguments": {"city": </tool_call> ok',
        [],
    ),
    "unclosed_valid_call": (
        '<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}',
        "",
        [TIME],
    ),
    "bare_not_a_call": ('{"answer": 42}', '{"answer": 42}', []),
}


def run(pieces: list[str]) -> tuple[str, list[tuple[str, dict[str, object]]], list[ParsedEvent]]:
    parser = ToolCallParser()
    events: list[ParsedEvent] = []
    for piece in pieces:
        events.extend(parser.feed(piece))
    events.extend(parser.finish())
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [(e.name, json.loads(e.arguments)) for e in events if isinstance(e, ToolCallEvent)]
    return text, calls, events


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_format_whole_and_char_by_char(name: str) -> None:
    output, text, calls = CASES[name]
    for pieces in ([output], list(output)):
        got_text, got_calls, events = run(pieces)
        assert (got_text, got_calls) == (text, calls)
        indexes = [e.index for e in events if isinstance(e, ToolCallEvent)]
        assert indexes == list(range(len(calls)))


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(sorted(CASES)),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_any_split_gives_the_same_result(name: str, cuts: list[int]) -> None:
    output, text, calls = CASES[name]
    points = sorted({min(c, len(output)) for c in cuts})
    pieces = [output[a:b] for a, b in zip([0, *points], [*points, len(output)], strict=True)]
    got_text, got_calls, _ = run(pieces)
    assert (got_text, got_calls) == (text, calls)


def test_text_streams_before_a_call_and_markers_are_held() -> None:
    parser = ToolCallParser()
    assert parser.feed("Hello <tool") == [TextDelta("Hello ")]
    assert parser.feed("_call>{") == []
    events = parser.feed('"name": "f", "arguments": {}}</tool_call>')
    assert [type(e) for e in events] == [ToolCallEvent]
    assert parser.feed(" done") == [TextDelta(" done")]


def test_parse_calls_refuses_non_calls() -> None:
    assert parse_calls('{"name": 3}') is None
    assert parse_calls('[{"name": "f"}, 4]') is None
    assert parse_calls("") is None
    assert parse_calls('{"name": "f"}') == [("f", "{}")]


# ---------------------------------------------------------------- prompts

HERMES_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}{{ m.role }}:{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}"
    "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}|{% endfor %}"
)
SPEC = ToolSpec(name="get_weather", description="weather", parameters='{"type": "object"}')
HISTORY = [
    InputMessage(role="user", content="weather?"),
    InputMessage(
        role="assistant",
        content="",
        tool_calls=[ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}')],
    ),
    InputMessage(role="tool", content="sunny", tool_call_id="c1", name="get_weather"),
]


def test_native_templates_get_tools_and_calls() -> None:
    prompt = chat_prompt(HISTORY, [SPEC], "auto", None, HERMES_TEMPLATE)
    assert prompt.format == "hermes" and prompt.prefix == ""
    assert prompt.tools is not None and prompt.tools[0]["function"]["name"] == "get_weather"
    assistant = prompt.messages[1]
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert prompt.messages[2] == {
        "role": "tool",
        "content": "sunny",
        "tool_call_id": "c1",
        "name": "get_weather",
    }


def test_templates_without_tools_get_a_smollm_system_prompt() -> None:
    template = "{% for m in messages %}{{ m.role }}:{{ m.content }}|{% endfor %}"
    prompt = chat_prompt(HISTORY, [SPEC], "required", "get_weather", template)
    assert prompt.format == "smollm" and prompt.tools is None
    assert prompt.messages[0]["role"] == "system"
    assert "get_weather" in prompt.messages[0]["content"]
    assert prompt.messages[2]["content"].startswith('<tool_call>[{"name": "get_weather"')
    assert prompt.messages[3] == {
        "role": "user",
        "content": "<tool_response>\nsunny\n</tool_response>",
    }
    assert prompt.prefix == '<tool_call>[{"name": "get_weather", "arguments": '
    none = chat_prompt(HISTORY[:1], [SPEC], "none", None, template)
    assert none.messages == [{"role": "user", "content": "weather?"}] and none.prefix == ""


def test_forced_prefixes_parse_when_completed() -> None:
    for template, rest in (
        ("<tool_call>tools", '{"city": "Paris"}}\n</tool_call>'),
        ("<|python_tag|> tools", '{"city": "Paris"}}'),
        ("[TOOL_CALLS] tools", '{"city": "Paris"}}]'),
        ("tools", '{"city": "Paris"}}]</tool_call>'),
    ):
        fmt = tool_format(template)
        _, calls, _ = run([forced_prefix(fmt, "get_weather") + rest])
        assert calls == [("get_weather", {"city": "Paris"})], fmt
