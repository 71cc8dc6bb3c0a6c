"""Qwen2.5-VL and Qwen3-VL through the engine (loader, vision loader, batcher) against
transformers' own: the expanded prompt, the first logits and 16 greedy tokens match; chunked
prefill (an image never split, DeepStack and M-RoPE positions per chunk) gives the same
tokens; an image request decodes beside text-only and other image requests (each row its own
M-RoPE delta) to the tokens it gets alone."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from exo.shared.types.text_generation import InputImage
from exo.worker.engines.batch import BatchGenerator
from exo.worker.engines.engine import load_model, load_vision
from exo.worker.engines.images import ImageSpans
from exo.worker.engines.models.base import ShardModel, StepInputs
from exo.worker.engines.models.qwen_vl_encoder import QwenVLEncoder
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tests.qwen_vl_models import (
    END,
    IMAGE,
    START,
    pil,
    png,
    qwen3_config,
    qwen25_config,
    write_model,
)

transformers = pytest.importorskip("transformers")
MARK = "<|vision_start|><|image_pad|><|vision_end|>"
IMAGES = [png((230, 150), 1), png((61, 190), 3)]


@dataclass(frozen=True)
class _Loaded:
    folder: Path
    model: ShardModel  # float weights, as transformers runs them
    quantised: ShardModel  # the default running format (Q8_0 blocks, C kernels)
    encoder: QwenVLEncoder

    def batcher(self, chunk: int = 512, batch: int = 1, model: ShardModel | None = None
                ) -> BatchGenerator:  # fmt: skip
        return BatchGenerator(model or self.model, batch, 512, prefill_chunk=chunk)


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> _Loaded:
    config = qwen25_config() if request.param == "qwen2_5_vl" else qwen3_config()
    folder = write_model(config, tmp_path_factory.mktemp(request.param))
    cache = tmp_path_factory.mktemp("cache")
    _, model = load_model(folder, cache_dir=cache, weight_format="dense")
    _, quantised = load_model(folder, cache_dir=cache)
    encoder = load_vision(folder)
    assert isinstance(encoder, QwenVLEncoder)
    return _Loaded(folder, model, quantised, encoder)


def _ids(encoder: QwenVLEncoder, images: list[InputImage], texts: list[int]) -> list[int]:
    """[5, 6, 7, image, 8, 9, image, ..., *texts]: placeholders as the encoder expands them."""
    text = "".join(f"ab{MARK}" for _ in images)
    expanded = encoder.expand(text, images)
    ids: list[int] = [5, 6, 7]
    for image in images:
        ids += [START, *[IMAGE] * encoder.vision.tokens(image), END, 8, 9]
    assert expanded == "".join(
        f"ab<|vision_start|>{'<|image_pad|>' * encoder.vision.tokens(im)}<|vision_end|>"
        for im in images
    )
    return ids + texts


def _tokens(gen: BatchGenerator, requests: dict[str, tuple[list[int], ImageSpans | None]],
            n: int = 16) -> dict[str, list[int]]:  # fmt: skip
    for rid, (ids, spans) in requests.items():
        gen.add(rid, ids, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), spans)
    out: dict[str, list[int]] = {rid: [] for rid in requests}
    while gen.active:
        for o in gen.step():
            assert o.finish_reason != "error", o.error
            if o.token_id is not None:
                out[o.request_id].append(o.token_id)
    return out


def _reference(folder: Path, ids: list[int], images: list[InputImage]) -> tuple[Any, list[int]]:
    config = transformers.AutoConfig.from_pretrained(folder)
    model = getattr(transformers, config.architectures[0]).from_pretrained(folder).eval()
    pixels = transformers.AutoImageProcessor.from_pretrained(folder, backend="pil")(
        images=[pil(im) for im in images], return_tensors="pt"
    )
    tokens = torch.tensor([ids])
    kwargs = {"pixel_values": pixels["pixel_values"], "image_grid_thw": pixels["image_grid_thw"],
              "mm_token_type_ids": (tokens == IMAGE).int(), "attention_mask": torch.ones_like(tokens)}  # fmt: skip
    with torch.no_grad():
        logits = model(input_ids=tokens, **kwargs).logits[0, -1]
        out = model.generate(input_ids=tokens, **kwargs, max_new_tokens=16, do_sample=False)
    return logits, out[0, len(ids) :].tolist()


def test_the_engine_answers_as_transformers(engine: _Loaded) -> None:
    ids = _ids(engine.encoder, IMAGES, [10, 11, 12])
    spans = engine.encoder.encode(ids, IMAGES)
    assert spans.rope_delta < 0 and spans.positions is not None
    assert len(spans.deepstack) == (2 if "qwen3" in engine.folder.name else 0)
    theirs, their_tokens = _reference(engine.folder, ids, IMAGES)
    with torch.inference_mode():
        step = StepInputs.single(0, 0, len(ids), spans.chunk(0, len(ids)))
        ours = engine.model.forward(torch.tensor([ids]), step, engine.model.new_cache(1, 512))[0]
    span = float(theirs.max() - theirs.min())
    torch.testing.assert_close(ours, theirs, atol=1e-3 * span, rtol=0)
    assert _tokens(engine.batcher(), {"a": (ids, spans)})["a"] == their_tokens


@pytest.mark.parametrize("quantised", [False, True])
def test_chunked_prefill_and_mixed_batches_give_the_same_tokens(engine: _Loaded,
                                                                quantised: bool) -> None:  # fmt: skip
    enc = engine.encoder
    model = engine.quantised if quantised else engine.model
    ids = _ids(enc, IMAGES, [10, 11, 12])
    spans = enc.encode(ids, IMAGES)
    alone = _tokens(engine.batcher(model=model), {"a": (ids, spans)})["a"]
    assert _tokens(engine.batcher(chunk=7, model=model), {"a": (ids, spans)})["a"] == alone
    other_ids = _ids(enc, IMAGES[1:], [13, 14])
    other = enc.encode(other_ids, IMAGES[1:])
    assert other.rope_delta != spans.rope_delta
    text = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    other_alone = _tokens(engine.batcher(model=model), {"b": (other_ids, other)})["b"]
    text_alone = _tokens(engine.batcher(model=model), {"t": (text, None)})["t"]
    mixed = _tokens(engine.batcher(chunk=64, batch=3, model=model),
                    {"a": (ids, spans), "b": (other_ids, other), "t": (text, None)})  # fmt: skip
    assert mixed == {"a": alone, "b": other_alone, "t": text_alone}


def test_bad_prompts_are_refused_clearly(engine: _Loaded) -> None:
    enc = engine.encoder
    with pytest.raises(ValueError, match=r"1 image markers .* for 2 images"):
        enc.expand(f"x{MARK}y", IMAGES)
    ids = _ids(enc, IMAGES[:1], [10])
    with pytest.raises(ValueError, match="placeholder runs"):
        enc.encode(ids[:-5] + ids[-4:], IMAGES[:1])  # one placeholder short
