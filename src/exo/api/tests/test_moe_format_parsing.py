"""The MoE families' output formats parsed from their documented examples, whole and
streamed in any split; the parser is picked by the chat template."""

import json

import pytest

from exo.api.generation_events import ReasoningDelta, TextDelta, ToolCallEvent
from exo.api.tests.moe_formats import (
    CALL_EXAMPLES,
    HARMONY_ANSWER,
    TEMPLATES,
    WEATHER,
    splits,
)
from exo.api.tool_formats import OutputParser, output_parser
from exo.shared.chat_formats import NativeFormat, call_text, calls_text, native_format
from exo.worker.engines.chat_prompt import forced_prefix


def _run(parser: OutputParser, pieces: list[str]) -> tuple[str, str, list[ToolCallEvent]]:
    events = [e for i, p in enumerate(pieces) for e in parser.feed(p, i + 1)]
    events += parser.finish(len(pieces))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    assert reasoning == "".join(parser.reasoning)
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert calls == parser.calls
    return text, reasoning, calls


def test_each_template_names_its_format() -> None:
    for fmt, template in TEMPLATES.items():
        assert native_format(template) == fmt
    assert native_format("{{ '<|im_start|>' }}<tool_call>") is None
    assert native_format(None) is None


@pytest.mark.parametrize(("fmt", "output", "text", "reasoning"), CALL_EXAMPLES)
def test_documented_calls_parse_in_any_split(
    fmt: NativeFormat, output: str, text: str, reasoning: str
) -> None:
    calls: list[ToolCallEvent] = []
    for pieces in splits(output):
        got = _run(output_parser(TEMPLATES[fmt], parse_tools=True), pieces)
        assert got[0] == text and got[1] == reasoning, pieces
        calls = got[2]
        assert calls[0].name == "get_weather" and json.loads(calls[0].arguments) == WEATHER
        assert [c.index for c in calls] == list(range(len(calls)))
    if fmt == "deepseek3":  # two calls in one section
        assert [c.name for c in calls] == ["get_weather", "get_time"]
        assert json.loads(calls[1].arguments) == {}


@pytest.mark.parametrize("fmt", list(TEMPLATES))
def test_calls_written_in_each_format_read_back(fmt: NativeFormat) -> None:
    arguments = {"query": "a < b", "n": [1, 2], "flag": True}
    output = "Sure. " + call_text(fmt, "search", arguments)
    if fmt == "harmony":
        output = "<|channel|>final<|message|>Sure. <|end|><|start|>assistant" + output
    for pieces in splits(output):
        text, _, calls = _run(output_parser(TEMPLATES[fmt], parse_tools=True), pieces)
        assert text == "Sure. " and len(calls) == 1
        assert calls[0].name == "search" and json.loads(calls[0].arguments) == arguments


def test_harmony_reasoning_then_answer_and_its_tokens() -> None:
    for pieces in splits(HARMONY_ANSWER):
        parser = output_parser(TEMPLATES["harmony"], parse_tools=False)
        text, reasoning, calls = _run(parser, pieces)
        assert text == "2 + 2 = 4." and calls == []
        assert reasoning == 'User asks: "What is 2 + 2?" Simple arithmetic.'
        # The thought ended within the pieces that reached its <|end|>.
        end = HARMONY_ANSWER.index("<|end|>") + len("<|end|>")
        seen = [sum(len(p) for p in pieces[: i + 1]) for i in range(len(pieces))]
        assert 0 < parser.reasoning_tokens <= next(i + 1 for i, n in enumerate(seen) if n >= end)


def test_harmony_without_a_header_is_plain_answer() -> None:
    for pieces in splits("Just text, <|not a header."):
        text, reasoning, _ = _run(output_parser(TEMPLATES["harmony"], False), pieces)
        assert text == "Just text, <|not a header." and reasoning == ""


def test_harmony_call_without_tools_offered_is_text_and_unclosed_thought_is_thought() -> None:
    text, _, calls = _run(output_parser(TEMPLATES["harmony"], False), [CALL_EXAMPLES[0][1]])
    assert calls == [] and json.loads(text) == WEATHER
    parser = output_parser(TEMPLATES["harmony"], False)
    _, reasoning, _ = _run(parser, ["<|channel|>analysis<|message|>Hmm, let me"])
    assert reasoning == "Hmm, let me" and parser.reasoning_tokens == 1


@pytest.mark.parametrize("fmt", ["deepseek3", "deepseek31", "kimi", "glm"])
def test_a_malformed_call_stays_text(fmt: NativeFormat) -> None:
    good = call_text(fmt, "f", {"a": 1})
    broken = good.replace('{"a": 1}', '{"a": ').replace("<arg_value>1", "1")
    for pieces in splits("x " + broken):
        text, _, calls = _run(output_parser(TEMPLATES[fmt], parse_tools=True), pieces)
        assert calls == [] and text == "x " + broken


def test_glm_values_are_json_when_they_parse() -> None:
    output = (
        "<tool_call>f\n<arg_key>s</arg_key>\n<arg_value>hello world</arg_value>\n"
        '<arg_key>o</arg_key>\n<arg_value>{"k": [1]}</arg_value>\n</tool_call>'
    )
    _, _, calls = _run(output_parser(TEMPLATES["glm"], True), [output])
    assert json.loads(calls[0].arguments) == {"s": "hello world", "o": {"k": [1]}}


def test_markers_without_tools_offered_stay_text() -> None:
    text, _, calls = _run(output_parser(TEMPLATES["kimi"], False), [CALL_EXAMPLES[4][1]])
    assert calls == [] and text == CALL_EXAMPLES[4][1]


QWEN3_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if tools %}<tool_call>{% endif %}{% if enable_thinking is defined and not "
    "enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
)


def test_qwen3_moe_is_read_as_qwen3() -> None:
    """Qwen3-MoE shares Qwen3's template: <think> and Hermes calls, no special tokens."""
    assert native_format(QWEN3_TEMPLATE) is None
    output = (
        "<think>\nweather needed\n</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    )
    for pieces in splits(output):
        text, reasoning, calls = _run(output_parser(QWEN3_TEMPLATE, True), pieces)
        assert (text, reasoning) == ("", "weather needed\n")
        assert calls[0].name == "get_weather" and json.loads(calls[0].arguments) == WEATHER


@pytest.mark.parametrize("fmt", list(TEMPLATES))
def test_a_forced_calls_opening_continues_into_a_call(fmt: NativeFormat) -> None:
    """Without a grammar the prompt ends with the call's opening (the runner shows it as the
    answer's first text): the model's continuation makes the call."""
    prefix = forced_prefix(fmt, "get_weather")
    whole = call_text(fmt, "get_weather", WEATHER)
    assert whole.startswith(prefix) and forced_prefix(fmt, None) in prefix
    _, _, calls = _run(output_parser(TEMPLATES[fmt], True), [prefix, whole[len(prefix) :]])
    assert len(calls) == 1 and json.loads(calls[0].arguments) == WEATHER


def test_glm_47_compact_calls() -> None:
    """GLM-4.7 writes its pairs without newlines."""
    output = (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
    )
    for pieces in splits(output):
        _, _, calls = _run(output_parser(TEMPLATES["glm"], True), pieces)
        assert calls[0].name == "get_weather" and json.loads(calls[0].arguments) == WEATHER


def test_harmony_turn_ends_at_its_call() -> None:
    imagined = '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny"<|end|>'
    for pieces in splits(CALL_EXAMPLES[0][1] + imagined):
        text, _, calls = _run(output_parser(TEMPLATES["harmony"], True), pieces)
        assert text == "" and [c.name for c in calls] == ["get_weather"]


def test_a_header_that_never_ends_is_text() -> None:
    output = "<|channel|>final " + "word " * 100
    text, _, _ = _run(output_parser(TEMPLATES["harmony"], False), list(output))
    assert text == output


@pytest.mark.parametrize("fmt", ["deepseek3", "deepseek31", "kimi", "glm"])
def test_several_calls_of_a_turn_read_back(fmt: NativeFormat) -> None:
    written = calls_text(fmt, [("get_weather", WEATHER), ("get_time", {"zone": "CET"})])
    # DeepSeek and Kimi hold a turn's calls in one section.
    opening = written[: written.index(">") + 1]
    assert written.count(opening) == (2 if fmt == "glm" else 1)
    for pieces in splits(written):
        _, _, calls = _run(output_parser(TEMPLATES[fmt], True), pieces)
        assert [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("get_weather", WEATHER),
            ("get_time", {"zone": "CET"}),
        ]
