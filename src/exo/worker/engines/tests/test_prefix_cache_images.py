"""The prefix cache keys an image's positions on the image's pixel hash: two prompts with
the same tokens but pictures one pixel apart share only the chunks before the image."""

import io

import pytest
import torch
from PIL import Image

from exo.api.images import decode_image
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.prefix_cache import ImageSpan, PrefixCache, image_keyed

CHUNK = 64


def _hash(last_pixel: int) -> str:
    image = Image.new("RGB", (8, 8), (50, 60, 70))
    image.putpixel((7, 7), (50, 60, last_pixel))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return decode_image(out.getvalue()).sha256


def _cache() -> PrefixCache:
    kv = KVCache(1, 2, 512, 1, 4, dtype=torch.float32, device=torch.device("cpu"))
    return PrefixCache(kv, CHUNK)


def _retain(cache: PrefixCache, key: list[int | str]) -> None:
    pages = list(range(4))
    for p in pages:
        cache.cache.pages[p] = torch.zeros(1)
    cache.retain(key, len(key), pages)


def test_a_different_picture_reuses_only_the_chunks_before_it() -> None:
    tokens = [7] * 70 + [9] * CHUNK + [8] * 66  # 200 positions, the image at 70..133
    first, other = _hash(70), _hash(71)
    assert first != other
    cache = _cache()
    _retain(cache, image_keyed(tokens, [ImageSpan(70, CHUNK, first)]))
    hit = cache.take(image_keyed(tokens, [ImageSpan(70, CHUNK, other)]))
    assert hit is not None and hit[0] == CHUNK  # the text before the image only
    cache = _cache()
    _retain(cache, image_keyed(tokens, [ImageSpan(70, CHUNK, first)]))
    same = cache.take(image_keyed(tokens, [ImageSpan(70, CHUNK, first)]))
    assert same is not None and same[0] == 3 * CHUNK  # the same picture: every whole chunk


def test_a_span_outside_the_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        image_keyed([1, 2, 3], [ImageSpan(2, 5, _hash(0))])
