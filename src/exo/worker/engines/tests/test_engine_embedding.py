"""`Engine.embedding`: mean-pooled final hidden states of the embedded model, unit length;
and the runner's embed tasks beside text generation."""

import math
from pathlib import Path

import pytest
import torch

from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.types.chunks import ErrorChunk, TokenChunk
from exo.shared.types.common import CommandId
from exo.shared.types.events import ChunkGenerated, Event
from exo.shared.types.tasks import TaskId, TextGeneration
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.instances import InstanceId
from exo.worker.engines.engine import Engine, load_engine
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.runner.generation import Generation


@pytest.fixture(scope="module")
def engine(gguf_path: Path, tokenizer_cache: Path) -> Engine:
    return load_engine(gguf_path, threads=1, cache_dir=tokenizer_cache)


def test_embedding_is_unit_length_deterministic_and_pooled(
    engine: Engine, dense_model: LlamaModel
) -> None:
    ids = engine.tokenizer.encode("The sea is calm tonight.", add_special_tokens=True)
    first = engine.embedding(ids)
    assert len(first) == engine.config.hidden
    assert math.isclose(math.sqrt(sum(x * x for x in first)), 1.0, rel_tol=1e-5)
    assert engine.embedding(ids) == first  # the same text, the same vector
    other = engine.embedding(engine.tokenizer.encode("def f(x): return x", add_special_tokens=True))
    assert other != first and len(other) == len(first)
    # The mean of the normed final hidden states, checked on the exact model by hand.
    with torch.inference_mode():
        h = dense_model.embed(torch.tensor([ids]))
        cache = dense_model.new_cache(1, len(ids))
        h = dense_model.forward_layers(h, StepInputs.single(0, 0, len(ids)), cache)[0]
        assert dense_model.final_norm is not None
        rms = h.pow(2).mean(-1, keepdim=True).add(dense_model.eps).rsqrt()
        mean = (h * rms * dense_model.final_norm).mean(0)
        reference = (mean / mean.norm()).tolist()
    cosine = sum(a * b for a, b in zip(first, reference, strict=True))
    assert cosine > 0.99  # the fast format is close to the exact one


def _task(name: str, text: str, **params: object) -> TextGeneration:
    return TextGeneration(
        task_id=TaskId(name),
        instance_id=InstanceId("instance"),
        command_id=CommandId(name),
        task_params=TextGenerationTaskParams.model_validate(
            {"model": EMBEDDED_MODEL_ID, "input": [InputMessage(role="user", content=text)],
             "raw_prompt": text, **params}
        ),
    )  # fmt: skip


def _chunks(events: list[Event], name: str) -> list[TokenChunk | ErrorChunk]:
    return [e.chunk for e in events if isinstance(e, ChunkGenerated) and e.command_id == name]


def _run(gen: Generation, embed_after_step: int | None) -> tuple[str, list[float] | None]:
    """A greedy text request; an embed task submitted after that many steps, if any."""
    events = gen.submit(_task("text", "The capital of France is", temperature=0.0, max_tokens=8))
    vector: list[float] | None = None
    steps = 0
    while gen.active:
        if steps == embed_after_step:
            (chunk,) = _chunks(gen.submit(_task("vec", "The sea", embed=True)), "vec")
            assert isinstance(chunk, TokenChunk) and chunk.finish_reason == "stop"
            vector = chunk.embedding
        events.extend(gen.step())
        steps += 1
    text = "".join(c.text for c in _chunks(events, "text") if isinstance(c, TokenChunk))
    return text, vector


def test_runner_embeds_between_steps_without_touching_running_requests(engine: Engine) -> None:
    gen = Generation(engine, max_batch=2)
    alone, _ = _run(gen, None)
    beside, vector = _run(gen, 2)
    assert alone and beside == alone  # the running request's cache is untouched
    ids = engine.tokenizer.encode("The sea", add_special_tokens=True)
    assert vector == engine.embedding(ids)
    # Over the request's context: refused, or cut to fit when asked.
    (refused,) = _chunks(gen.submit(_task("vec", "one two three " * 4, embed=True, num_ctx=8)),
                         "vec")  # fmt: skip
    assert isinstance(refused, ErrorChunk) and refused.error_code == "context_length_exceeded"
    cut_events = gen.submit(
        _task("vec", "one two three " * 4, embed=True, num_ctx=8, truncate=True)
    )
    (cut,) = _chunks(cut_events, "vec")
    assert isinstance(cut, TokenChunk) and cut.prompt_tokens == 8 and cut.embedding is not None
