"""Chat rendering: a final assistant message continued (a prefill), and the plain rendering
of a model whose files carry no chat template, through the runner's generation."""

from dataclasses import replace
from pathlib import Path

import pytest
from loguru import logger

from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.types.chunks import ErrorChunk, TokenChunk
from exo.shared.types.common import CommandId
from exo.shared.types.events import ChunkGenerated, Event
from exo.shared.types.tasks import TaskId, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.instances import InstanceId
from exo.worker.engines.engine import Engine, load_engine
from exo.worker.engines.tokenizer import ChatTemplateError, EngineTokenizer
from exo.worker.runner.generation import Generation

COUNT = [
    InputMessage(role="user", content="Count from 1 to 10."),
    InputMessage(role="assistant", content="1, 2, 3, 4,"),
]


@pytest.fixture(scope="module")
def engine(gguf_path: Path, tokenizer_cache: Path) -> Engine:
    return load_engine(gguf_path, threads=1, cache_dir=tokenizer_cache)


def _plain(tokenizer: EngineTokenizer) -> EngineTokenizer:
    """The same vocabulary without a chat template."""
    return EngineTokenizer(tokenizer.backend, replace(tokenizer.meta, chat_template=None))


def _answer(engine: Engine, messages: list[InputMessage], **params: object) -> list[Event]:
    task = TextGeneration(
        task_id=TaskId("t"),
        instance_id=InstanceId("instance"),
        command_id=CommandId("c"),
        task_params=TextGenerationTaskParams.model_validate(
            {"model": EMBEDDED_MODEL_ID, "input": messages, "temperature": 0.0,
             "max_tokens": 12, **params}
        ),
    )  # fmt: skip
    gen = Generation(engine, max_batch=1)
    events = gen.submit(task)
    while gen.active:
        events.extend(gen.step())
    return events


def _chunks(events: list[Event]) -> list[TokenChunk | ErrorChunk]:
    return [e.chunk for e in events if isinstance(e, ChunkGenerated)]


def _text(events: list[Event]) -> str:
    chunks = _chunks(events)
    assert all(isinstance(c, TokenChunk) for c in chunks), chunks
    return "".join(c.text for c in chunks if isinstance(c, TokenChunk))


def test_a_continued_final_message_keeps_its_turn_open(tokenizer: EngineTokenizer) -> None:
    chat = [m.model_dump() for m in COUNT]
    closed = tokenizer.render_chat(chat)
    assert closed.endswith("1, 2, 3, 4,<|im_end|>\n<|im_start|>assistant\n")
    open_ = tokenizer.render_chat(chat, continue_final=True)
    assert open_.endswith("<|im_start|>assistant\n1, 2, 3, 4,")
    assert open_ == closed.removesuffix("<|im_end|>\n<|im_start|>assistant\n")


def test_continuing_a_message_the_template_hides_is_an_error(
    tokenizer: EngineTokenizer,
) -> None:
    hiding = EngineTokenizer(
        tokenizer.backend,
        replace(tokenizer.meta, chat_template="{% for m in messages %}[{{ m['role'] }}]{% endfor %}"),
    )
    with pytest.raises(ChatTemplateError, match="cannot continue"):
        hiding.render_chat([m.model_dump() for m in COUNT], continue_final=True)


def test_the_runner_continues_a_prefill(engine: Engine) -> None:
    continued = _text(_answer(engine, COUNT, continue_final_message=True))
    assert continued.startswith(" 5, 6"), continued
    # Without the flag (OpenAI chat) the model opens a new turn and starts again.
    assert _text(_answer(engine, COUNT)).startswith("1, 2, 3, 4,")


def test_a_model_without_a_template_is_rendered_plainly(tokenizer: EngineTokenizer) -> None:
    plain = _plain(tokenizer)
    assert plain.fallback and not tokenizer.fallback
    chat = [{"role": "system", "content": "Be brief."}, *(m.model_dump() for m in COUNT)]
    assert plain.render_chat(chat) == (
        "Be brief.\n\nUser: Count from 1 to 10.\nAssistant: 1, 2, 3, 4,\nAssistant:"
    )
    assert plain.render_chat(chat, continue_final=True).endswith("Assistant: 1, 2, 3, 4,")


def test_the_runner_answers_without_a_template_and_says_so_once(engine: Engine) -> None:
    plain = Engine(config=engine.config, model=engine.model, tokenizer=_plain(engine.tokenizer))
    lines: list[str] = []
    sink = logger.add(lines.append, level="WARNING", format="{message}")
    try:
        for _ in range(2):
            text = _text(_answer(plain, [InputMessage(role="user", content="Hello!")]))
            assert text.strip()
    finally:
        logger.remove(sink)
    assert sum("no chat template" in line for line in lines) == 1, lines
