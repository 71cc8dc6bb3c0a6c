"""A request's images on their way into the prompt (runner/prompt_images.py), with Gemma 3's
real encoder (a tiny transformers checkpoint): who refuses them and why, and markers that do
not pair with the images are the request's error (a 400), never an answer without them."""

from pathlib import Path

import pytest

from exo.shared.models.model_cards import ModelId
from exo.shared.types.text_generation import InputMessage, TextGenerationTaskParams
from exo.worker.engines.models.gemma3_mm import Gemma3Encoder
from exo.worker.engines.tests.gemma3_models import BOI, IMAGE, TOKENS, png, save_tiny_gemma3
from exo.worker.runner.prompt_images import (
    ImageError,
    encode_images,
    expand_markers,
    image_refusal,
    request_images,
)

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Gemma3Encoder:
    return Gemma3Encoder.load(save_tiny_gemma3(transformers, tmp_path_factory.mktemp("g3")))


def _params(n_images: int, prompt_ids: list[int] | None = None) -> TextGenerationTaskParams:
    images = [png((20, 20), i) for i in range(n_images)]
    message = InputMessage(role="user", content="look", images=images)
    return TextGenerationTaskParams(model=ModelId("m"), input=[message], prompt_ids=prompt_ids)


def test_who_refuses_images(encoder: Gemma3Encoder) -> None:
    assert image_refusal(None, False, _params(0)) is None  # no images: nothing to refuse
    refusal = image_refusal(None, False, _params(1))
    assert refusal is not None and "cannot read images" in refusal
    tensor = image_refusal(encoder, True, _params(1))
    assert tensor is not None and "tensor-parallel" in tensor
    ids = image_refusal(encoder, False, _params(1, [1, 2]))
    assert ids is not None and "token ids" in ids
    assert image_refusal(encoder, False, _params(2)) is None


def test_markers_expand_and_must_pair_with_the_images(encoder: Gemma3Encoder) -> None:
    images = request_images(_params(2))
    assert len(images) == 2 and encoder.tokens_for(images[0]) == TOKENS
    marker = encoder.marker
    text = expand_markers(encoder, f"a{marker}b{marker}c", images)
    assert text.count(marker) == 2 and text.startswith("a\n\n")
    assert expand_markers(None, "plain", images) == "plain"
    with pytest.raises(ImageError, match="1 image markers"):
        expand_markers(encoder, f"a{marker}b", images)
    with pytest.raises(ImageError, match="2 images"):
        encode_images(encoder, [1, BOI, *[IMAGE] * TOKENS, 2], images)
    spans = encode_images(encoder, [1, BOI, *[IMAGE] * TOKENS, 2, *[IMAGE] * TOKENS], images)
    assert spans is not None and [s.start for s in spans.spans] == [2, 7]
    assert [s.sha256 for s in spans.spans] == [im.sha256 for im in images]


def test_the_encoder_reads_its_token_texts_from_the_folder(tmp_path: Path) -> None:
    folder = save_tiny_gemma3(transformers, tmp_path)
    (folder / "tokenizer.json").write_text(
        '{"added_tokens": [{"id": 258, "content": "<boi>"}, {"id": 260, "content": "<img>"}]}'
    )
    encoder = Gemma3Encoder.load(folder)
    assert encoder.marker == "<boi>"
    assert encoder.expand("<boi>", [png((5, 5), 0)]).count("<img>") == TOKENS
