"""The family-neutral image values the batcher carries (`images.py`): a request's spans cut
into prefill chunks that never split an image, each chunk's share of the embeddings,
positions and DeepStack features, the merge at the placeholders, the features added after
their layer, and the mask that lets an image see itself."""

import pytest
import torch

from exo.worker.engines.images import (
    ChunkImages,
    ImageSpan,
    ImageSpans,
    add_deepstack,
    block_mask,
    chunk_end,
    merge_chunk,
    placeholder_runs,
)
from exo.worker.engines.models.attention import step_tensors
from exo.worker.engines.models.base import StepInputs

D = 3


def _spans(positions: bool = False, deepstack: bool = False) -> ImageSpans:
    # a 12-position prompt, images at 2..4 and 7..10
    rows = torch.arange(7 * D, dtype=torch.float32).view(7, D)
    return ImageSpans(
        spans=(ImageSpan(2, 3, "a" * 64), ImageSpan(7, 4, "b" * 64)),
        embeddings=rows,
        bidirectional=True,
        positions=torch.arange(36).view(3, 12) if positions else None,
        deepstack=((1, rows * 10),) if deepstack else (),
    )


def test_chunks_end_before_an_image_or_after_one_that_begins_them() -> None:
    spans = _spans()
    assert spans.cuts(4, 12) == [2, 6, 7, 11, 12]
    assert spans.cuts(100, 12) == [12]
    assert chunk_end(0, 3, [(2, 3)]) == 2 and chunk_end(2, 1, [(2, 3)]) == 5
    assert placeholder_runs([1, 9, 9, 2, 9, 3], 9) == [(1, 2), (4, 1)]


def test_a_chunk_gets_its_own_rows_positions_and_features() -> None:
    spans = _spans(positions=True, deepstack=True)
    none = spans.chunk(0, 2)
    assert none is not None and none.spans == () and none.positions is not None
    assert spans.chunk(5, 2) is not None  # (positions: every chunk has its share)
    second = spans.chunk(7, 5)
    assert second is not None and second.spans == ((0, 4),)
    assert second.embeddings is not None
    torch.testing.assert_close(second.embeddings, spans.embeddings[3:7])
    assert second.positions is not None and second.positions.tolist()[0] == [7, 8, 9, 10, 11]
    assert second.deepstack[0][0] == 1
    torch.testing.assert_close(second.deepstack[0][1], spans.embeddings[3:7] * 10)
    with pytest.raises(ValueError, match="splits an image"):
        spans.chunk(0, 4)
    assert _spans().chunk(0, 2) is None  # no image, no positions


def test_bad_spans_are_refused() -> None:
    with pytest.raises(ValueError, match="embeddings"):
        ImageSpans((ImageSpan(0, 2, "a" * 64),), torch.zeros(3, D))
    with pytest.raises(ValueError, match="overlap"):
        ImageSpans((ImageSpan(0, 2, "a" * 64), ImageSpan(1, 2, "b" * 64)), torch.zeros(4, D))
    with pytest.raises(ValueError, match="end of the prompt"):
        _spans().check(10)
    with pytest.raises(ValueError, match="one request"):
        StepInputs((0, 1), (0, 0), 4, ChunkImages(((0, 1),), None, True))


def test_merge_and_features_land_on_the_image_positions() -> None:
    spans = _spans(deepstack=True)
    chunk = spans.chunk(7, 5)
    assert chunk is not None
    hidden = torch.zeros(1, 5, D)
    merged = merge_chunk(hidden, chunk)
    torch.testing.assert_close(merged[0, :4], spans.embeddings[3:7])
    assert not merged[0, 4].any() and not hidden.any()
    assert merge_chunk(hidden, None) is hidden
    added = add_deepstack(merged, chunk, 1)
    torch.testing.assert_close(added[0, :4], spans.embeddings[3:7] * 11)
    assert add_deepstack(merged, chunk, 0) is merged  # not that layer's
    with pytest.raises(RuntimeError, match="first stage"):
        merge_chunk(hidden, ChunkImages(((0, 4),), None, True))


def test_an_image_sees_itself_both_ways_in_the_step_mask() -> None:
    blocks = ((2, 3),)
    seen = block_mask(torch.arange(6).view(1, 6), 6, blocks)[0]
    assert bool(seen[2, 4]) and bool(seen[4, 2]) and not bool(seen[1, 2]) and not bool(seen[5, 4])
    rope = torch.ones(16, 2, dtype=torch.complex64)
    images = ChunkImages(((2, 3),), None, True)
    t = step_tensors(StepInputs.single(0, 4, 6, images), rope, None, torch.device("cpu"), True)
    assert t.mask is not None and not t.is_causal
    # the query at position 6 (the chunk's 3rd) sees position 8, the image's last
    assert bool(t.mask[0, 0, 2, 8]) and not bool(t.mask[0, 0, 1, 9])
    plain = step_tensors(StepInputs.single(0, 0, 6), rope, None, torch.device("cpu"), True)
    assert plain.is_causal and plain.mask is None
    causal = ChunkImages(((2, 3),), None, False)  # (an M-RoPE family: causal images)
    assert causal.blocks(0) == ()
