"""Gemma 3's vision tower against transformers' own: a tiny random
Gemma3ForConditionalGeneration saved as safetensors; our pixels match its Pillow image
processor's, our soft tokens match its image features (float32)."""

import io
from pathlib import Path

import pytest
import torch
from PIL import Image

from exo.api.images import decode_image
from exo.shared.types.text_generation import InputImage
from exo.worker.engines.models.gemma3_vision import (
    Gemma3Vision,
    chunk_end,
    image_attention_mask,
    image_spans,
    merge_images,
    pixel_values,
)

transformers = pytest.importorskip("transformers")

TOKENS = 4  # a 4x4 patch grid pooled to 2x2


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = transformers.Gemma3Config(
        text_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                     "vocab_size": 300, "sliding_window": 16, "max_position_embeddings": 512},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                       "num_attention_heads": 2, "image_size": 64, "patch_size": 16},
        mm_tokens_per_image=TOKENS, image_token_index=260, boi_token_index=258,
        eoi_token_index=259,
    )  # fmt: skip
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # random, not the initialiser's zeros: every path counts
        for p in model.model.multi_modal_projector.parameters():
            p.normal_(0.0, 0.5)
    out = tmp_path_factory.mktemp("gemma3-vision")
    model.save_pretrained(out)
    return out


def _image(size: tuple[int, int], seed: int) -> InputImage:
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (size[1], size[0], 3), generator=g, dtype=torch.uint8)
    out = io.BytesIO()
    Image.fromarray(data.numpy()).save(out, format="PNG")
    return decode_image(out.getvalue())


IMAGES = [((64, 64), 1), ((97, 41), 2), ((30, 130), 3)]


def test_pixels_match_the_gemma3_image_processor(folder: Path) -> None:
    vision = Gemma3Vision.load(folder)
    processor = transformers.Gemma3ImageProcessorPil(size={"height": 64, "width": 64})
    for size, seed in IMAGES:
        image = _image(size, seed)
        pil = Image.open(io.BytesIO(image.data)).convert("RGB")
        theirs = processor(images=[pil], return_tensors="pt")["pixel_values"][0]
        ours = pixel_values(image, vision.config)
        assert ours.shape == theirs.shape == (3, 64, 64)
        torch.testing.assert_close(ours, theirs.float(), atol=1e-5, rtol=0)


def test_soft_tokens_match_transformers(folder: Path) -> None:
    vision = Gemma3Vision.load(folder)
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(folder).eval()
    images = [_image(size, seed) for size, seed in IMAGES]
    pixels = torch.stack([pixel_values(im, vision.config) for im in images])
    with torch.no_grad():
        theirs = model.model.get_image_features(pixel_values=pixels).pooler_output
    ours = vision(images)
    assert ours.shape == (3, TOKENS, 64)
    scale = float(theirs.abs().max())
    assert scale > 0
    torch.testing.assert_close(ours, theirs, atol=1e-3 * scale, rtol=0)
    # Different pictures, different tokens.
    assert not torch.allclose(ours[0], ours[1])


IMAGE_TOKEN = 260


def test_merged_images_and_mask_give_transformers_logits(folder: Path) -> None:
    """Our soft tokens merged at the placeholders and our image-aware masks, run through
    transformers' own text model, give the logits of its full multimodal forward."""
    vision = Gemma3Vision.load(folder)
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(
        folder, attn_implementation="sdpa"
    ).eval()
    images = [_image(size, seed) for size, seed in IMAGES[:2]]
    ids = [2, 5, 6, 258, *[IMAGE_TOKEN] * TOKENS, 259, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    ids += [258, *[IMAGE_TOKEN] * TOKENS, 259, 17, 18]
    tokens = torch.tensor([ids])
    pixels = torch.stack([pixel_values(im, vision.config) for im in images])
    with torch.no_grad():
        theirs = model(
            input_ids=tokens, pixel_values=pixels, token_type_ids=(tokens == IMAGE_TOKEN).long()
        ).logits[0]
        spans = image_spans(ids, IMAGE_TOKEN)
        assert spans == [(4, TOKENS), (20, TOKENS)]
        hidden = model.model.language_model.embed_tokens(tokens)[0]
        merged = merge_images(hidden, tokens[0], vision(images), IMAGE_TOKEN)
        window = model.config.text_config.sliding_window
        masks = {
            "full_attention": image_attention_mask(len(ids), spans)[None, None],
            "sliding_attention": image_attention_mask(len(ids), spans, window)[None, None],
        }
        out = model.model.language_model(inputs_embeds=merged[None], attention_mask=masks)
        ours = model.lm_head(out.last_hidden_state)[0]
    scale = float(theirs.abs().max())
    torch.testing.assert_close(ours, theirs, atol=1e-3 * scale, rtol=0)
    # Without the image blocks (plain causal), the answer differs: the mask matters.
    causal = {k: torch.ones(len(ids), len(ids)).tril().bool()[None, None] for k in masks}
    with torch.no_grad():
        plain = model.model.language_model(inputs_embeds=merged[None], attention_mask=causal)
    assert not torch.allclose(model.lm_head(plain.last_hidden_state)[0], theirs, atol=1e-3 * scale)


def test_chunks_never_split_an_image() -> None:
    spans = [(4, 4), (20, 4)]
    assert chunk_end(0, 6, spans) == 4  # would cut the first image: stop before it
    assert chunk_end(4, 2, spans) == 8  # the image begins the chunk: take it whole
    assert chunk_end(8, 8, spans) == 16
    assert chunk_end(16, 8, spans) == 24  # ends exactly after the second image
    mask = image_attention_mask(10, [(2, 3)])
    assert bool(mask[2, 4]) and bool(mask[3, 2]) and not bool(mask[1, 2]) and not bool(mask[4, 5])
