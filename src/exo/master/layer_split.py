"""Splitting a model's layers over the nodes of a pipeline: by count (`split_layers`), or by
the bytes of each layer when the card has them (`split_by_bytes`). Pure."""

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


def split_by_bytes(layer_bytes: Sequence[int], room: Sequence[int]) -> list[int]:
    """Consecutive layer counts, one per node, each >= 1: node i's cut falls at the layer
    boundary nearest to where its share of ``room`` ends in the cumulative bytes of the layers
    (a light dense first layer counts for little, a heavy MoE layer for much).

    Requires ``1 <= len(room) <= len(layer_bytes)``; ties go to the earlier boundary."""
    n, k = len(layer_bytes), len(room)
    if not 1 <= k <= n:
        raise ValueError(f"cannot split {n} layers over {k} nodes")
    weights = list(room) if sum(room) > 0 else [1] * k
    cumulative = [0]
    for b in layer_bytes:
        cumulative.append(cumulative[-1] + max(b, 0))
    total, room_total = cumulative[-1], sum(weights)
    bounds, room_so_far = [0], 0
    for r in range(k - 1):
        room_so_far += weights[r]
        target = total * room_so_far / room_total
        cuts = range(bounds[-1] + 1, n - (k - 1 - r) + 1)  # leave a layer for every later node
        bounds.append(min(cuts, key=lambda c: (abs(cumulative[c] - target), c)))
    bounds.append(n)
    return [bounds[i + 1] - bounds[i] for i in range(k)]
