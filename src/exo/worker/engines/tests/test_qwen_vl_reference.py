"""Qwen2.5-VL and Qwen3-VL against transformers' own (float32): tiny random models saved as
safetensors; our patches match its Pillow image processor's on odd-size images, our image
tokens and DeepStack features match its tower's, our first logits match its multimodal
forward (within 1e-3 of their range) and 16 greedy tokens match its `generate`."""

from pathlib import Path
from typing import Any

import pytest
import torch

from exo.worker.engines.models.qwen_vl_encoder import QwenVision, QwenVLEncoder
from exo.worker.engines.models.qwen_vl_processor import image_patches
from exo.worker.engines.models.qwen_vl_vision import tokens_of
from exo.worker.engines.tests.qwen_vl_models import (
    END,
    IMAGE,
    START,
    greedy,
    load_ours,
    pil,
    png,
    qwen3_config,
    qwen25_config,
    write_model,
)

transformers = pytest.importorskip("transformers")

# (width, height), seed: odd sizes, one rounding down to a single merge block row, one RGBA
IMAGES = [((230, 150), 1), ((97, 41), 2), ((61, 190), 3)]


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def folder(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = qwen25_config() if request.param == "qwen2_5_vl" else qwen3_config()
    return write_model(config, tmp_path_factory.mktemp(request.param))


def _reference(folder: Path) -> Any:
    config = transformers.AutoConfig.from_pretrained(folder)
    cls = (
        transformers.Qwen3VLForConditionalGeneration
        if config.model_type == "qwen3_vl"
        else transformers.Qwen2_5_VLForConditionalGeneration
    )
    return cls.from_pretrained(folder, attn_implementation="sdpa").eval()


def _theirs(folder: Path, images: list[Any]) -> Any:
    proc = transformers.AutoImageProcessor.from_pretrained(folder, backend="pil")
    return proc(images=[pil(im) for im in images], return_tensors="pt")


def test_patches_match_the_pillow_image_processor(folder: Path) -> None:
    vision = QwenVision.load(folder)
    images = [png(size, seed) for size, seed in IMAGES] + [png((45, 70), 4, "RGBA")]
    theirs = _theirs(folder, images)
    ours = [image_patches(im, vision.processing) for im in images]
    assert [list(g) for _, g in ours] == theirs["image_grid_thw"].tolist()
    torch.testing.assert_close(torch.cat([p for p, _ in ours]), theirs["pixel_values"].float(),
                               atol=1e-5, rtol=0)  # fmt: skip
    assert all(
        vision.tokens(im) == tokens_of(g, 2) for im, (_, g) in zip(images, ours, strict=True)
    )


def test_image_tokens_and_deepstack_match_transformers(folder: Path) -> None:
    vision = QwenVision.load(folder)
    model = _reference(folder)
    images = [png(size, seed) for size, seed in IMAGES]
    theirs = _theirs(folder, images)
    with torch.no_grad():
        out = model.model.get_image_features(theirs["pixel_values"], theirs["image_grid_thw"])
    ours = vision.encode(images)
    expected = torch.cat(out.pooler_output)
    scale = float(expected.abs().max())
    assert ours.embeds.shape == expected.shape and scale > 0
    torch.testing.assert_close(ours.embeds, expected, atol=1e-4 * scale, rtol=0)
    deepstack = getattr(out, "deepstack_features", None) or []
    assert len(ours.deepstack) == len(deepstack) == (2 if "qwen3" in folder.name else 0)
    for mine, their in zip(ours.deepstack, deepstack, strict=True):
        torch.testing.assert_close(mine, torch.cat(their), atol=1e-4 * scale, rtol=0)
    # one picture differing in one pixel gives other tokens
    assert not torch.allclose(ours.embeds[:10], vision.encode([png((230, 150), 9)]).embeds[:10])


def _prompt(vision: QwenVision, images: list[Any]) -> list[int]:
    n1, n2 = (vision.tokens(im) for im in images)
    return [5, 6, 7, START, *[IMAGE] * n1, END, 8, 9, 10, START, *[IMAGE] * n2, END, 11, 12]


def test_first_logits_and_16_greedy_tokens_match_transformers(folder: Path) -> None:
    encoder, model, reference = QwenVLEncoder.load(folder), load_ours(folder), _reference(folder)
    vision = encoder.vision
    images = [png(size, seed) for size, seed in IMAGES[:2]]
    ids = _prompt(vision, images)
    theirs = _theirs(folder, images)
    tokens = torch.tensor([ids])
    inputs = {"input_ids": tokens, "pixel_values": theirs["pixel_values"],
              "image_grid_thw": theirs["image_grid_thw"],
              "mm_token_type_ids": (tokens == IMAGE).int(), "attention_mask": torch.ones_like(tokens)}  # fmt: skip
    with torch.no_grad():
        expected = reference(**inputs).logits[0, -1]
        generated = reference.generate(**inputs, max_new_tokens=16, do_sample=False)[0, len(ids) :]
    first, ours = greedy(model, encoder, ids, images, 16)
    span = float(expected.max() - expected.min())
    torch.testing.assert_close(first, expected, atol=1e-3 * span, rtol=0)
    top2 = expected.topk(2).values
    assert float(top2[0] - top2[1]) > 1e-2 * span  # a peaked distribution: greedy means something
    assert ours == generated.tolist()
    # the images matter: another picture gives another answer
    other = [png((230, 150), 7), images[1]]
    assert greedy(model, encoder, _prompt(vision, other), other, 4)[1] != ours[:4]
