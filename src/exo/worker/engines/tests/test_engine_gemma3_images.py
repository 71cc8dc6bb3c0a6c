"""Gemma 3 with images through the engine (load, batcher, prefix cache) against transformers'
own Gemma3ForConditionalGeneration, a tiny random one saved as safetensors: the first logits
and 16 greedy tokens match; an image is never split between prefill chunks; two pictures one
pixel apart never share prefix-cache entries."""

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch import Tensor

from exo.shared.types.text_generation import InputImage
from exo.worker.engines.batch import BatchGenerator
from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.engine import load_model, load_vision
from exo.worker.engines.images import ImageSpans
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.models.base import ShardModel, StepInputs, StepModel
from exo.worker.engines.models.gemma3_mm import Gemma3Encoder
from exo.worker.engines.models.gemma3_vision import pixel_values
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tests.gemma3_models import IMAGE, png, prompt, save_tiny_gemma3

transformers = pytest.importorskip("transformers")

IDS = prompt([2, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18], [19, 20, 21])
IMAGES = [png((64, 64), 1), png((90, 50), 2)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_gemma3(transformers, tmp_path_factory.mktemp("gemma3-images"))


@dataclass(frozen=True)
class _Loaded:
    model: ShardModel
    vision: Gemma3Encoder

    def batcher(self, model: StepModel | None = None, chunk: int = 512) -> BatchGenerator:
        return BatchGenerator(model or self.model, 1, 128, prefill_chunk=chunk)


@pytest.fixture(scope="module")
def engine(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> _Loaded:
    cache = tmp_path_factory.mktemp("cache")
    _, model = load_model(folder, cache_dir=cache, weight_format="dense")
    vision = load_vision(folder)
    assert isinstance(vision, Gemma3Encoder)
    return _Loaded(model, vision)


def _reference(folder: Path, ids: list[int], images: list[InputImage],
               engine: _Loaded) -> tuple[Tensor, list[int]]:  # fmt: skip
    """transformers' first logits [V] and 16 greedy tokens."""
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(
        folder, attn_implementation="sdpa"
    ).eval()
    tokens = torch.tensor([ids])
    config = engine.vision.vision.config
    pixels = torch.stack([pixel_values(im, config) for im in images])
    kwargs = {"pixel_values": pixels, "token_type_ids": (tokens == IMAGE).long()}
    with torch.no_grad():
        logits = model(input_ids=tokens, **kwargs).logits[0, -1]
        out = model.generate(input_ids=tokens, **kwargs, max_new_tokens=16, do_sample=False)
    return logits, out[0, len(ids) :].tolist()


@dataclass
class _Recorder:
    """The model, with each forward's (start, new tokens, image spans in the chunk) kept."""

    inner: StepModel
    steps: list[tuple[int, int, tuple[tuple[int, int], ...]]] = field(
        default_factory=list[tuple[int, int, tuple[tuple[int, int], ...]]]
    )

    @property
    def config(self) -> LlamaConfig:
        return self.inner.config

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        return self.inner.new_cache(max_batch, max_seq)

    def forward(self, tokens: Tensor, step: StepInputs, cache: KVCache,
                every_position: bool = False) -> Tensor:  # fmt: skip
        spans = () if step.images is None else step.images.spans
        self.steps.append((step.starts[0], step.n_new, spans))
        return self.inner.forward(tokens, step, cache, every_position)


def _tokens(gen: BatchGenerator, rid: str, ids: list[int], spans: ImageSpans | None,
            n: int = 16) -> list[int]:  # fmt: skip
    gen.add(rid, ids, SamplingParams(temperature=0.0, max_tokens=n), spans)
    out: list[int] = []
    while gen.active:
        for o in gen.step():
            assert o.finish_reason != "error", o.error
            if o.token_id is not None:
                out.append(o.token_id)
    return out


def test_first_logits_and_greedy_tokens_match_transformers(folder: Path, engine: _Loaded) -> None:
    theirs, their_tokens = _reference(folder, IDS, IMAGES, engine)
    spans = engine.vision.encode(IDS, IMAGES)
    assert [(s.start, s.length) for s in spans.spans] == [(5, 4), (22, 4)]
    cache = engine.model.new_cache(1, 64)
    images = spans.chunk(0, len(IDS))
    with torch.inference_mode():
        step = StepInputs.single(0, 0, len(IDS), images)
        ours = engine.model.forward(torch.tensor([IDS]), step, cache)[0]
    scale = float(theirs.abs().max())
    torch.testing.assert_close(ours, theirs, atol=1e-3 * scale, rtol=0)
    gen = engine.batcher()
    assert _tokens(gen, "a", IDS, spans) == their_tokens
    # the images matter: without their embeddings and mask the answer is another
    with torch.inference_mode():
        plain = engine.model.forward(
            torch.tensor([IDS]), StepInputs.single(0, 0, len(IDS)), engine.model.new_cache(1, 64)
        )[0]
    assert (plain - theirs).abs().max() > 1e-2 * scale


def test_chunks_never_split_an_image(engine: _Loaded) -> None:
    spans = engine.vision.encode(IDS, IMAGES)
    whole = _tokens(engine.batcher(), "whole", IDS, spans)
    model = _Recorder(engine.model)
    gen = engine.batcher(model, chunk=3)
    assert _tokens(gen, "chunked", IDS, spans) == whole
    prefill = [(start, n) for start, n, _ in model.steps if n > 1 or start < len(IDS)]
    assert sum(n for _, n in prefill) == len(IDS)
    cuts = {start + n for start, n in prefill}
    for image in spans.spans:  # no chunk ends inside an image
        assert not any(image.start < c < image.start + image.length for c in cuts)
    # each image rode whole on one chunk
    assert [sp for _, _, sp in model.steps if sp] == [((0, 4),), ((0, 4),)]


def test_pictures_one_pixel_apart_share_no_cached_image_positions(engine: _Loaded) -> None:
    vision = engine.vision
    first, poked = IMAGES[0], png((64, 64), 1, poke=(63, 63))
    assert first.sha256 != poked.sha256
    ids = prompt([2, 5, 6, 7, 8, 9, 10, 11, 12, 13], [14, 15, 16, 17, 18, 19, 20, 21, 22, 23])
    image_start = vision.encode(ids, [first]).spans[0].start
    model = _Recorder(engine.model)
    gen = engine.batcher(model, chunk=8)

    def first_start(image: InputImage) -> tuple[int, list[int]]:
        model.steps.clear()
        tokens = _tokens(gen, image.sha256, ids, vision.encode(ids, [image]), 4)
        return model.steps[0][0], tokens

    assert first_start(first)[0] == 0
    start, tokens = first_start(poked)
    assert 0 < start <= image_start  # only the text before the picture was reused
    alone = _tokens(engine.batcher(), "alone", ids, vision.encode(ids, [poked]), 4)
    assert tokens == alone
    # the same picture again reuses past it (the chunks after it included)
    assert first_start(poked)[0] > image_start + 4
