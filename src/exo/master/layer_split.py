"""Splitting a model's layers over the nodes of a pipeline. Pure."""

from collections.abc import Sequence


def split_layers(n: int, weights: Sequence[int], caps: Sequence[int]) -> list[int]:
    """``n`` layers in proportion to ``weights`` (largest remainder), each in 1..cap.

    Requires ``len(weights) <= n <= sum(caps)`` and every cap >= 1."""
    total = sum(weights)
    if total <= 0:
        weights, total = [1] * len(weights), len(weights)
    layers = [min(max(n * w // total, 1), c) for w, c in zip(weights, caps, strict=True)]
    ids = range(len(layers))

    def above_quota(i: int) -> int:
        # layers[i] - n * w / total, scaled by total to stay in integers.
        return layers[i] * total - n * weights[i]

    while sum(layers) > n:
        i = max((i for i in ids if layers[i] > 1), key=lambda i: (above_quota(i), -i))
        layers[i] -= 1
    while sum(layers) < n:
        i = max((i for i in ids if layers[i] < caps[i]), key=lambda i: (-above_quota(i), -i))
        layers[i] += 1
    return layers
