# ruff: noqa: RUF001 (DeepSeek's markers are written with full-width bars)
"""The MoE families' formats for tests: their documented output examples, and small chat
templates written in each family's style (our own text, not the models' templates: those
are not available offline). Each template writes the family's markers, which is what the
format is recognised by."""

import json
from collections.abc import Iterator

from exo.shared.chat_formats import NativeFormat

WEATHER = {"city": "Paris", "days": 3}

# harmony (openai/harmony's documentation): reasoning, then the answer; a call.
HARMONY_ANSWER = (
    '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic.<|end|>'
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4."
)
HARMONY_CALL = (
    "<|channel|>analysis<|message|>Need to use function get_weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    f"<|message|>{json.dumps(WEATHER)}<|call|>"
)
# The recipient may stand in the role part of the header.
HARMONY_CALL_IN_ROLE = (
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
    f"<|message|>{json.dumps(WEATHER)}"
)
# DeepSeek V3 / R1 (the V3 card's template), V3.1 (its template).
DEEPSEEK3_CALL = (
    "<think>\nThe user wants weather.\n</think>\n\nLet me check."
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
    f"```json\n{json.dumps(WEATHER)}\n```<｜tool▁call▁end｜>"
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>"
    "<｜tool▁calls▁end｜>"
)
DEEPSEEK31_CALL = (
    "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    f"{json.dumps(WEATHER)}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)
# Kimi K2 (its tool-call guidance).
KIMI_CALL = (
    "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    f"<|tool_call_argument_begin|>{json.dumps(WEATHER)}<|tool_call_end|>"
    "<|tool_calls_section_end|>"
)
# GLM-4.5 (its template's tool instructions): values are JSON when they parse.
GLM_CALL = (
    "<think>The user wants weather.</think>\nLet me check.\n<tool_call>get_weather\n"
    "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
)

# (format, output, text, reasoning) of each documented call example.
CALL_EXAMPLES: list[tuple[NativeFormat, str, str, str]] = [
    ("harmony", HARMONY_CALL, "", "Need to use function get_weather."),
    ("harmony", HARMONY_CALL_IN_ROLE, "", "Need the weather."),
    ("deepseek3", DEEPSEEK3_CALL, "Let me check.", "The user wants weather.\n"),
    ("deepseek31", DEEPSEEK31_CALL, "Let me check.", ""),
    ("kimi", KIMI_CALL, "Let me check.", ""),
    ("glm", GLM_CALL, "Let me check.\n", "The user wants weather."),
]

_HARMONY_TEMPLATE = (
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}"
    "{% if tools %}{{ '\\n' }}# Tools\n{% for t in tools %}{{ t.function.name }}\n{% endfor %}{% endif %}"
    "<|end|>"
    "{% for m in messages %}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<|start|>assistant to=functions."
    "{{ c.function.name }}<|channel|>commentary json<|message|>"
    "{{ c.function.arguments | tojson }}<|call|>{% endfor %}"
    "{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
_DEEPSEEK_BODY = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{% elif m.tool_calls %}<｜Assistant｜><｜tool▁calls▁begin｜>"
    "{% for c in m.tool_calls %}<｜tool▁call▁begin｜>function<｜tool▁sep｜>"
    "{{ c.function.name }}\n```json\n{{ c.function.arguments }}\n```<｜tool▁call▁end｜>"
    "{% endfor %}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    "{% elif m.role == 'tool' %}<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>"
    "{{ m.content }}<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"
    "{% else %}<｜Assistant｜>{{ m.content }}<｜end▁of▁sentence｜>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<｜Assistant｜>"
    "{% if enable_thinking is defined and not enable_thinking %}</think>{% else %}<think>\n"
    "{% endif %}{% endif %}"
)
# V3.1's takes no tools (the runner offers them in a system prompt, in V3.1's syntax).
_DEEPSEEK31_TEMPLATE = _DEEPSEEK_BODY.replace(
    "function<｜tool▁sep｜>{{ c.function.name }}\n```json\n{{ c.function.arguments }}\n```",
    "{{ c.function.name }}<｜tool▁sep｜>{{ c.function.arguments }}",
)
_DEEPSEEK3_TEMPLATE = (
    "{% if tools %}## Tools\n{% for t in tools %}{{ t.function.name }}: "
    "{{ t.function.parameters | tojson }}\n{% endfor %}{% endif %}" + _DEEPSEEK_BODY
)
_KIMI_TEMPLATE = (
    "{% set ids = [] %}"
    "{% if tools %}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>"
    "{% endif %}{% for m in messages %}<|im_{{ m.role }}|>{{ m.role }}<|im_middle|>"
    "{% if m.tool_calls %}<|tool_calls_section_begin|>{% for c in m.tool_calls %}"
    "{% set _ = ids.append('functions.' ~ c.function.name ~ ':' ~ loop.index0) %}"
    "<|tool_call_begin|>{{ ids | last }}"
    "<|tool_call_argument_begin|>{{ c.function.arguments | tojson }}<|tool_call_end|>"
    "{% endfor %}<|tool_calls_section_end|>{% elif m.role == 'tool' %}## Return of "
    "{{ ids | first }}\n{{ m.content }}{% else %}{{ m.content }}{% endif %}<|im_end|>"
    "{% endfor %}{% if add_generation_prompt %}<|im_assistant|>assistant<|im_middle|>"
    "{% endif %}"
)
_GLM_TEMPLATE = (
    "[gMASK]<sop>{% if tools %}<|system|>\n# Tools\n{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}Call: <tool_call>{name}\n<arg_key>{key}</arg_key>\n<arg_value>{value}"
    "</arg_value>\n</tool_call>{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }}\n"
    "{% for k, v in c.function.arguments.items() %}<arg_key>{{ k }}</arg_key>\n"
    "<arg_value>{{ v if v is string else v | tojson }}</arg_value>\n{% endfor %}</tool_call>"
    "{% endfor %}{% else %}{{ m.content }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}\n<think></think>{% endif %}"
    "{% endif %}"
)
TEMPLATES: dict[NativeFormat, str] = {
    "harmony": _HARMONY_TEMPLATE,
    "deepseek3": _DEEPSEEK3_TEMPLATE,
    "deepseek31": _DEEPSEEK31_TEMPLATE,
    "kimi": _KIMI_TEMPLATE,
    "glm": _GLM_TEMPLATE,
}


def splits(text: str) -> Iterator[list[str]]:
    """``text`` whole, a character at a time, and in odd chunks (1, 2, 3, 5, 7, ...)."""
    yield [text]
    yield list(text)
    sizes, pieces, at = [1, 2, 3, 5, 7, 11, 13], [], 0
    while at < len(text):
        size = sizes[len(pieces) % len(sizes)]
        pieces.append(text[at : at + size])
        at += size
    yield pieces
