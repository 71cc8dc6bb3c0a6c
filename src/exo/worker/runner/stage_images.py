"""A prefill chunk's images between pipeline stages.

The first stage merges the image embeddings into the token embeddings itself; the later
stages still need where the images are (Gemma 3's bidirectional image attention), the
chunk's M-RoPE positions (Qwen-VL) and the DeepStack features of their layers (Qwen3-VL).
They travel after the step's header (whose last field is the description's length, 0 for no
images) and before the activations:

    description  int64 [bidirectional, has positions, n features, feature layers...,
                        span starts and lengths...]
    positions    int64 [3, n]                 (if any)
    features     [sum of span lengths, D]     one per feature layer, in the stage's dtype
"""

import torch
from torch import Tensor

from exo.worker.engines.images import ChunkImages
from exo.worker.runner.stage_link import StageLink


def images_meta(images: ChunkImages | None) -> Tensor:
    """The description of a chunk's images (empty without images)."""
    if images is None:
        return torch.zeros(0, dtype=torch.int64)
    layers = [layer for layer, _ in images.deepstack]
    spans = [v for span in images.spans for v in span]
    head = [int(images.bidirectional), int(images.positions is not None), len(layers)]
    return torch.tensor([*head, *layers, *spans], dtype=torch.int64)


def send_images(images: ChunkImages | None, meta: Tensor, link: StageLink) -> None:
    """A chunk's images to the next stage (nothing without images)."""
    if images is None:
        return
    positions = [] if images.positions is None else [images.positions.to(torch.int64)]
    link.send(meta, *positions, *(features for _, features in images.deepstack))


def receive_images(
    length: int, n_new: int, hidden: int, dtype: torch.dtype, link: StageLink
) -> ChunkImages:
    """A chunk's images as the previous stage sent them (no embeddings: they are merged)."""
    meta = torch.empty(length, dtype=torch.int64)
    link.recv_into(meta)
    values = [int(v) for v in meta.tolist()]
    bidirectional, has_positions, n_layers = bool(values[0]), bool(values[1]), values[2]
    layers = values[3 : 3 + n_layers]
    flat = values[3 + n_layers :]
    spans = tuple((flat[i], flat[i + 1]) for i in range(0, len(flat), 2))
    positions = None
    if has_positions:
        positions = torch.empty(3, n_new, dtype=torch.int64)
        link.recv_into(positions)
    rows = sum(n for _, n in spans)
    deepstack: list[tuple[int, Tensor]] = []
    for layer in layers:
        features = torch.empty(rows, hidden, dtype=dtype)
        link.recv_into(features)
        deepstack.append((layer, features))
    return ChunkImages(spans, None, bidirectional, positions, tuple(deepstack))
