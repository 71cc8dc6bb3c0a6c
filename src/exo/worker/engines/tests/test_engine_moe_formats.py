# ruff: noqa: RUF001 (DeepSeek's markers are written with full-width bars)
"""The MoE families' templates rendered (tools, earlier calls, harmony's reasoning levels)
and a forced call under the grammar written in each family's own syntax, its markers as
the vocabulary's special tokens. The embedded tokenizer gets the families' markers added as
special tokens; the templates are small ones in each family's style (``moe_formats``)."""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer

from exo.api.generation_events import TextDelta, ToolCallEvent
from exo.api.tests.moe_formats import TEMPLATES, WEATHER
from exo.api.tool_formats import output_parser
from exo.shared import chat_formats as cf
from exo.shared.chat_formats import NativeFormat, call_text
from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.types.chunks import TokenChunk
from exo.shared.types.common import CommandId
from exo.shared.types.events import ChunkGenerated
from exo.shared.types.tasks import TaskId, TextGeneration
from exo.shared.types.text_generation import (
    InputMessage,
    TextGenerationTaskParams,
    ToolCall,
    ToolSpec,
)
from exo.shared.types.worker.instances import InstanceId
from exo.worker.engines.chat_prompt import chat_prompt
from exo.worker.engines.engine import Engine, load_engine
from exo.worker.engines.grammar import GrammarCompiler, tool_call_grammar
from exo.worker.engines.tokenizer import EngineTokenizer
from exo.worker.runner.generation import Generation

MARKERS = [
    cf.H_START, cf.H_CHANNEL, cf.H_MESSAGE, cf.H_CONSTRAIN, cf.H_END, cf.H_CALL, cf.H_RETURN,
    cf.DS_CALLS_BEGIN, cf.DS_CALLS_END, cf.DS_CALL_BEGIN, cf.DS_CALL_END, cf.DS_SEP,
    cf.KIMI_SECTION_BEGIN, cf.KIMI_SECTION_END, cf.KIMI_CALL_BEGIN, cf.KIMI_ARGS,
    cf.KIMI_CALL_END, cf.GLM_CALL, cf.GLM_CALL_END, cf.GLM_KEY, cf.GLM_KEY_END, cf.GLM_VALUE,
    cf.GLM_VALUE_END,
]  # fmt: skip
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
TOOLS = [
    ToolSpec(name="get_time", parameters='{"type": "object", "properties": {}}'),
    ToolSpec(name="get_weather", description="weather", parameters=json.dumps(PARAMS)),
]
CALL = ToolCall(id="call_1", name="get_weather", arguments=json.dumps(WEATHER))
HISTORY = [
    InputMessage(role="user", content="weather?"),
    InputMessage(role="assistant", content="", tool_calls=[CALL]),
    InputMessage(role="tool", content="sunny", tool_call_id="call_1", name="get_weather"),
]


@pytest.fixture(scope="module")
def special_backend(tokenizer: EngineTokenizer) -> Tokenizer:
    backend = Tokenizer.from_str(tokenizer.backend.to_str())
    backend.add_special_tokens([AddedToken(m, special=True, normalized=False) for m in MARKERS])
    return backend


def _tokenizer(backend: Tokenizer, base: EngineTokenizer, fmt: NativeFormat) -> EngineTokenizer:
    return EngineTokenizer(backend, replace(base.meta, chat_template=TEMPLATES[fmt]))


def _render(tok: EngineTokenizer, **kwargs: Any) -> str:
    chat = chat_prompt(HISTORY, TOOLS, "auto", None, tok.meta.chat_template)
    return tok.render_chat(chat.messages, tools=chat.tools, template_kwargs=kwargs)


@pytest.mark.parametrize(
    ("effort", "level"),
    [("xhigh", "high"), ("max", "high"), ("none", "low"), ("minimal", "low"), ("medium", "medium")],
)
def test_harmony_reasoning_levels(
    special_backend: Tokenizer, tokenizer: EngineTokenizer, effort: str, level: str
) -> None:
    tok = _tokenizer(special_backend, tokenizer, "harmony")
    prompt = _render(tok, reasoning_effort=effort, enable_thinking=effort != "none")
    assert prompt.startswith(f"<|start|>system<|message|>Reasoning: {level}\n# Tools\n")
    assert _render(tok, enable_thinking=False).startswith("<|start|>system<|message|>Reasoning: low")
    assert _render(tok).startswith("<|start|>system<|message|>Reasoning: medium")


# What each template writes for the earlier call (arguments as the family writes them).
WRITTEN_CALL: dict[NativeFormat, str] = {
    "harmony": '<|start|>assistant to=functions.get_weather<|channel|>commentary json'
    '<|message|>{"city": "Paris", "days": 3}<|call|>',
    "deepseek3": '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n'
    '{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜>',
    "deepseek31": '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "days": 3}',
    # Kimi's template keeps the call ids in a list of its own (append) for the results.
    "kimi": '<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
    '{"city": "Paris", "days": 3}<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
    "<|im_tool|>tool<|im_middle|>## Return of functions.get_weather:0\nsunny",
    "glm": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
    "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
}
GENERATION_PROMPT: dict[NativeFormat, str] = {
    "harmony": "<|start|>assistant",
    "deepseek3": "<｜Assistant｜><think>\n",
    "deepseek31": "<｜Assistant｜><think>\n",
    "kimi": "<|im_assistant|>assistant<|im_middle|>",
    "glm": "<|assistant|>",
}


@pytest.mark.parametrize("fmt", list(TEMPLATES))
def test_each_template_renders_tools_and_earlier_calls(
    special_backend: Tokenizer, tokenizer: EngineTokenizer, fmt: NativeFormat
) -> None:
    prompt = _render(_tokenizer(special_backend, tokenizer, fmt))
    assert WRITTEN_CALL[fmt] in prompt and "sunny" in prompt and "get_time" in prompt
    assert prompt.endswith(GENERATION_PROMPT[fmt])


def _forced_call(tok: EngineTokenizer, fmt: NativeFormat, forced: str | None) -> str:
    """The text a grammar-forced call of get_weather takes, token by token, checking that
    every token is allowed and the call ends there (``forced`` None: any tool's call)."""
    grammar = tool_call_grammar(fmt, TOOLS, forced, tok.backend.token_to_id)
    constraint = GrammarCompiler(tok, tok.vocab_size).constraint(grammar)
    text = call_text(fmt, "get_weather", WEATHER).removesuffix(cf.H_CALL)
    ids = tok.encode(text)
    first = constraint.allowed()
    assert first.nonzero()[0].tolist() == [ids[0]], "the call opens with its marker token"
    for token in ids:
        assert constraint.allowed()[token], tok.decode([token], skip_special_tokens=False)
        constraint.accept(token)
    assert constraint.allowed()[tok.eos_token_ids[0]]
    return tok.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("forced", ["get_weather", None])
@pytest.mark.parametrize("fmt", list(TEMPLATES))
def test_a_forced_call_under_the_grammar_is_a_call_in_the_models_syntax(
    special_backend: Tokenizer, tokenizer: EngineTokenizer, fmt: NativeFormat, forced: str | None
) -> None:
    tok = _tokenizer(special_backend, tokenizer, fmt)
    output = _forced_call(tok, fmt, forced)
    parser = output_parser(tok.meta.chat_template, parse_tools=True)
    events = [*parser.feed(output, 1), *parser.finish(1)]
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert not [e for e in events if isinstance(e, TextDelta) and e.text.strip()]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == WEATHER


@pytest.fixture(scope="module")
def engine(gguf_path: Path, tokenizer_cache: Path) -> Engine:
    return load_engine(gguf_path, threads=1, cache_dir=tokenizer_cache)


def _forced_special(engine: Engine, template: str | None) -> str:
    """The runner's text of two tokens forced (by logit_bias) to a special token."""
    tok = replace(engine.tokenizer.meta, chat_template=template)
    model = Engine(config=engine.config, model=engine.model,
                   tokenizer=EngineTokenizer(engine.tokenizer.backend, tok))
    special = engine.tokenizer.backend.token_to_id("<file_sep>")
    assert special is not None
    task = TextGeneration(
        task_id=TaskId("t"),
        instance_id=InstanceId("instance"),
        command_id=CommandId("c"),
        task_params=TextGenerationTaskParams.model_validate(
            {"model": EMBEDDED_MODEL_ID, "input": [{"role": "user", "content": "Hi"}],
             "temperature": 0.0, "max_tokens": 2, "logit_bias": {special: 100.0}}
        ),
    )  # fmt: skip
    gen = Generation(model, max_batch=1)
    events = gen.submit(task)
    while gen.active:
        events.extend(gen.step())
    chunks = [e.chunk for e in events if isinstance(e, ChunkGenerated)]
    return "".join(c.text for c in chunks if isinstance(c, TokenChunk))


def test_the_runner_keeps_the_special_tokens_these_formats_write(engine: Engine) -> None:
    """Harmony's, DeepSeek's, Kimi's and GLM's structure is special tokens: the runner's
    text keeps them (a model of another format still has them dropped)."""
    assert _forced_special(engine, TEMPLATES["harmony"]) == "<file_sep><file_sep>"
    assert _forced_special(engine, TEMPLATES["glm"]) == "<file_sep><file_sep>"
    assert _forced_special(engine, engine.tokenizer.meta.chat_template) == ""


def test_a_filtered_sequence_renders_as_json(tokenizer: EngineTokenizer) -> None:
    """DeepSeek R1 templates write ``tools | map(attribute='function') | tojson``."""
    template = "{{ tools | map(attribute='function') | map(attribute='name') | tojson }}"
    tok = EngineTokenizer(tokenizer.backend, replace(tokenizer.meta, chat_template=template))
    chat = chat_prompt(HISTORY, TOOLS, "auto", None, template)
    assert tok.render_chat(chat.messages, tools=chat.tools) == '["get_time", "get_weather"]'


def test_kimi_sees_its_own_call_ids() -> None:
    chat = chat_prompt(HISTORY, TOOLS, "auto", None, TEMPLATES["kimi"])
    assert chat.messages[1]["tool_calls"][0]["id"] == "functions.get_weather:0"
    assert chat.messages[2]["tool_call_id"] == "functions.get_weather:0"
    other = chat_prompt(HISTORY, TOOLS, "auto", None, TEMPLATES["glm"])
    assert other.messages[1]["tool_calls"][0]["id"] == "call_1"


def test_the_formats_turn_ends_stop_the_answer(
    special_backend: Tokenizer, tokenizer: EngineTokenizer
) -> None:
    harmony = _tokenizer(special_backend, tokenizer, "harmony")
    ends = {special_backend.token_to_id(cf.H_CALL), special_backend.token_to_id(cf.H_RETURN)}
    assert ends <= set(harmony.eos_token_ids)
    assert harmony.eos_token_ids[: len(tokenizer.eos_token_ids)] == tokenizer.eos_token_ids
    plain = EngineTokenizer(special_backend, tokenizer.meta)
    assert plain.eos_token_ids == tokenizer.eos_token_ids
