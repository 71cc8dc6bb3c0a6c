"""Images through the engine, the same for every vision family.

A vision family's `VisionEncoder` (loaded where the first pipeline stage runs) does three
things for a request:

    text  = encoder.expand(rendered prompt, images)   each template image marker -> the family's
                                                      placeholder text (Gemma 3: <start_of_image>,
                                                      256 image tokens, <end_of_image>)
    ids   = tokenizer.encode(text)
    spans = encoder.encode(ids, images)               `ImageSpans`: where the placeholders are,
                                                      the images' embeddings, and (Qwen-VL) M-RoPE
                                                      positions and DeepStack features

The batcher carries a request's `ImageSpans` and cuts its prompt into prefill chunks that
never split an image (`chunk_end`); each chunk's share (`ChunkImages`, positions relative to
the chunk) rides on the step (`StepInputs.images`). There:

* the first stage replaces the placeholders' token embeddings by the image embeddings
  (`merge_chunk`, after the family's embedding scale: Gemma scales text only);
* every stage's attention lets an image's positions see the whole image when the family asks
  (`ChunkImages.bidirectional`, Gemma 3; `attention.step_tensors` builds the mask);
* positions ([3, n], M-RoPE) and DeepStack features (added to the hidden states after the
  named decoder layers) are for the families that have them (None / empty for Gemma 3); a
  pipeline sends a chunk's spans (and features) to the later stages with its activations.

The prefix cache keys an image's positions by the image's pixel hash
(`prefix_cache.image_keyed`) and cuts its entries only where a chunk of the prompt ends
(`cuts`), so a reused prefix is exactly what the request would have computed itself.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from exo.shared.types.text_generation import InputImage
from exo.worker.engines.prefix_cache import ImageSpan, KeyItem, image_keyed

__all__ = [
    "ChunkImages",
    "ImageSpan",
    "ImageSpans",
    "VisionEncoder",
    "chunk_end",
    "merge_chunk",
    "placeholder_runs",
]


@dataclass(frozen=True)
class ChunkImages:
    """The images of one prefill chunk of one request (a batch of one row), positions counted
    from the chunk's first token. Every span lies wholly inside the chunk."""

    spans: tuple[tuple[int, int], ...]  # (start, length) of each image's placeholders
    # [sum of lengths, D]: the images' embeddings, in order (first stage; None on the others)
    embeddings: Tensor | None
    bidirectional: bool  # an image's positions see the whole image (Gemma 3)
    positions: Tensor | None = None  # [3, n] M-RoPE positions of the chunk's tokens (Qwen-VL)
    # (global layer index, [sum of lengths, D]): added to the image positions' hidden states
    # after that decoder layer (Qwen3-VL DeepStack)
    deepstack: tuple[tuple[int, Tensor], ...] = ()

    def blocks(self, start: int) -> tuple[tuple[int, int], ...]:
        """The spans at absolute positions (the chunk starts at `start`) when the images
        attend bidirectionally; none otherwise."""
        return tuple((start + s, n) for s, n in self.spans) if self.bidirectional else ()


@dataclass(frozen=True)
class ImageSpans:
    """One request's images in its prompt: one small value the batcher carries.

    `spans` are in prompt order; `embeddings` holds every image's rows in the same order
    ([sum of lengths, D], float, the model's width). `positions` ([3, T] for the whole prompt)
    and `rope_delta` (a generated token at cache position p has M-RoPE position p + delta)
    are for M-RoPE families; `deepstack` pairs a global decoder layer with its features
    ([sum of lengths, D]) for Qwen3-VL."""

    spans: tuple[ImageSpan, ...]
    embeddings: Tensor
    bidirectional: bool = False
    positions: Tensor | None = None
    rope_delta: int = 0
    deepstack: tuple[tuple[int, Tensor], ...] = field(default=())

    def __post_init__(self) -> None:
        total = sum(s.length for s in self.spans)
        if int(self.embeddings.shape[0]) != total:
            raise ValueError(f"{total} image positions for {self.embeddings.shape[0]} embeddings")
        ends = [s.start + s.length for s in self.spans]
        if any(s.start < e for s, e in zip(self.spans[1:], ends, strict=False)):
            raise ValueError("image spans overlap or are out of order")

    def check(self, prompt_length: int) -> None:
        if self.spans and self.spans[-1].start + self.spans[-1].length > prompt_length:
            raise ValueError("an image span passes the end of the prompt")

    def chunk_end(self, start: int, chunk: int, length: int) -> int:
        """Where the prefill chunk from `start` ends: `chunk_end` over these spans, at most
        the prompt's `length`."""
        return min(length, chunk_end(start, chunk, [(s.start, s.length) for s in self.spans]))

    def cuts(self, chunk: int, length: int) -> list[int]:
        """Every position where a chunk of the prompt ends, from position 0."""
        out: list[int] = []
        at = 0
        while at < length:
            at = self.chunk_end(at, chunk, length)
            out.append(at)
        return out

    def cache_key(self, prompt: Sequence[int]) -> list[KeyItem]:
        return image_keyed(prompt, self.spans)

    def chunk(self, start: int, n: int) -> ChunkImages | None:
        """The share of positions [start, start + n) (None when no image is among them)."""
        rows = 0  # embedding rows of the images before this chunk
        spans: list[tuple[int, int]] = []
        first = -1
        for s in self.spans:
            if s.start + s.length <= start:
                rows += s.length
            elif s.start < start + n:
                if s.start < start or s.start + s.length > start + n:
                    raise ValueError(f"the chunk {start}+{n} splits an image at {s.start}")
                first = rows if first < 0 else first
                spans.append((s.start - start, s.length))
        positions = None if self.positions is None else self.positions[:, start : start + n]
        if not spans and positions is None:
            return None
        count = sum(n_ for _, n_ in spans)
        take = slice(first, first + count) if spans else slice(0, 0)
        return ChunkImages(
            spans=tuple(spans),
            embeddings=self.embeddings[take],
            bidirectional=self.bidirectional,
            positions=positions,
            deepstack=tuple((layer, f[take]) for layer, f in self.deepstack),
        )


class VisionEncoder(Protocol):
    """A vision family's image path (its tower and projector, loaded on the first stage)."""

    @property
    def image_token(self) -> int:
        """The placeholder token id an image's positions hold in the prompt."""
        ...

    @property
    def marker(self) -> str:
        """The text the chat template writes for each image (one per image, in order)."""
        ...

    def tokens_for(self, image: InputImage) -> int:
        """How many placeholder tokens `image` becomes (its embedding rows)."""
        ...

    def expand(self, text: str, images: Sequence[InputImage]) -> str:
        """The rendered prompt with each image marker replaced by the image's placeholder text
        (ValueError when the markers and images do not pair up)."""
        ...

    def encode(self, ids: Sequence[int], images: Sequence[InputImage]) -> ImageSpans:
        """The prompt's images (their placeholder runs in `ids`, in order) encoded."""
        ...


def chunk_end(start: int, chunk: int, spans: Sequence[tuple[int, int]]) -> int:
    """Where a prefill chunk starting at `start` ends so that no image is split: at
    `start + chunk`, or before the image that boundary would cut (after it when that image
    begins the chunk)."""
    end = start + chunk
    for s, length in spans:
        if s < end < s + length:
            return s if s > start else s + length
    return end


def placeholder_runs(ids: Sequence[int], token: int) -> list[tuple[int, int]]:
    """Each run of `token` in `ids`: (start, length)."""
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(ids):
        if ids[i] != token:
            i += 1
            continue
        j = i
        while j < len(ids) and ids[j] == token:
            j += 1
        runs.append((i, j - i))
        i = j
    return runs


def merge_chunk(hidden: Tensor, images: ChunkImages | None) -> Tensor:
    """hidden [1, T, D] (the chunk's token embeddings, scaled) with each image span's rows
    replaced by the image embeddings; unchanged without images."""
    if images is None or not images.spans:
        return hidden
    if images.embeddings is None:
        raise RuntimeError("this stage has no image embeddings to merge (not the first stage)")
    if hidden.shape[0] != 1:
        raise ValueError("images ride on a prefill chunk of one request")
    out = hidden.clone()
    rows = images.embeddings.to(device=hidden.device, dtype=hidden.dtype)
    at = 0
    for s, n in images.spans:
        out[0, s : s + n] = rows[at : at + n]
        at += n
    return out


def block_mask(positions: Tensor, kv_len: int, blocks: Sequence[tuple[int, int]]) -> Tensor:
    """[B, T, L] bool: query position p may see key j because both are in one image."""
    keys = torch.arange(kv_len, device=positions.device)
    seen = torch.zeros(*positions.shape, kv_len, dtype=torch.bool, device=positions.device)
    for s, n in blocks:
        q_in = (positions >= s) & (positions < s + n)  # [B, T]
        k_in = (keys >= s) & (keys < s + n)  # [L]
        seen |= q_in[..., None] & k_in
    return seen


def add_deepstack(hidden: Tensor, images: ChunkImages | None, layer: int) -> Tensor:
    """hidden [1, T, D] after global decoder `layer`, with that layer's DeepStack features
    added at the image positions (Qwen3-VL); unchanged when it has none."""
    if images is None or not images.deepstack:
        return hidden
    for at_layer, features in images.deepstack:
        if at_layer != layer:
            continue
        hidden = hidden.clone()
        rows = features.to(device=hidden.device, dtype=hidden.dtype)
        at = 0
        for s, n in images.spans:
            hidden[0, s : s + n] += rows[at : at + n]
            at += n
    return hidden
