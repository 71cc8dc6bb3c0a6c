"""Sampling: greedy equivalences, seeds, filters and penalties as `sampling.py` defines them."""

import pytest
import torch

from exo.worker.engines.sampling import (
    GREEDY,
    RequestSampler,
    SamplingParams,
    apply_penalties,
    argmax_rows,
    finite_rows,
    sample_token,
)

CPU = torch.device("cpu")


def _logits(seed: int = 0, vocab: int = 50) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_top_k_one_is_greedy() -> None:
    for seed in range(5):
        z = _logits(seed)
        params = SamplingParams(temperature=1.3, top_k=1, seed=seed)
        assert sample_token(z, params, torch.Generator().manual_seed(seed)) == int(z.argmax())
        assert sample_token(z, GREEDY, None) == int(z.argmax())


def test_same_seed_same_tokens_other_seed_other_tokens() -> None:
    def draw(seed: int) -> list[int]:
        sampler = RequestSampler(SamplingParams(temperature=1.0, seed=seed), [1, 2], 50, CPU)
        return [sampler(_logits(i)) for i in range(30)]

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_filters_keep_only_the_allowed_tokens() -> None:
    z = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    gen = torch.Generator().manual_seed(0)
    top_p = {sample_token(z, SamplingParams(top_p=0.7), gen) for _ in range(200)}
    assert top_p == {0, 1}  # 0.5 < 0.7 needs the second token, not the third
    min_p = {sample_token(z, SamplingParams(min_p=0.25), gen) for _ in range(200)}
    assert min_p == {0, 1, 2}  # 0.05 < 0.25 * 0.5
    top_k = {sample_token(z, SamplingParams(top_k=2), gen) for _ in range(200)}
    assert top_k == {0, 1}


def test_penalties_change_logits_as_defined() -> None:
    z = torch.tensor([2.0, -2.0, 1.0, 0.5])
    seen = torch.tensor([True, True, False, True])
    counts = torch.tensor([0.0, 0.0, 0.0, 3.0])
    rep = apply_penalties(z, SamplingParams(repetition_penalty=2.0), seen, counts)
    assert rep.tolist() == [1.0, -4.0, 1.0, 0.25]
    pres = apply_penalties(z, SamplingParams(presence_penalty=0.5), seen, counts)
    assert pres.tolist() == [2.0, -2.0, 1.0, 0.0]
    freq = apply_penalties(z, SamplingParams(frequency_penalty=0.5), seen, counts)
    assert freq.tolist() == [2.0, -2.0, 1.0, -1.0]
    assert z.tolist() == [2.0, -2.0, 1.0, 0.5]  # the input is not modified


def test_sampler_counts_its_own_tokens() -> None:
    params = SamplingParams(temperature=0.0, frequency_penalty=10.0, repetition_penalty=1.0)
    sampler = RequestSampler(params, [], 4, CPU)
    z = torch.tensor([3.0, 2.5, 0.0, 0.0])
    assert [sampler(z) for _ in range(3)] == [0, 1, 2]  # each pick is penalised next time


def test_invalid_params_are_rejected() -> None:
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(min_p=2.0)


def test_extreme_temperature_and_penalties_still_sample() -> None:
    """Found by fuzzing the API: a tiny temperature overflowed the logits into NaN."""
    logits = torch.tensor([1.0, 3.0, 2.0])
    for params in (
        SamplingParams(temperature=1e-300),
        SamplingParams(temperature=5e-324, top_p=0.5),
        SamplingParams(temperature=1.0, top_k=2, min_p=0.5),
    ):
        assert sample_token(logits, params, torch.Generator().manual_seed(0)) == 1


def test_argmax_rows_is_torch_argmax_ties_and_nan_included() -> None:
    """The batch's greedy argmax (numpy on the CPU) picks what torch's argmax picks."""
    z = torch.randn(6, 300, generator=torch.Generator().manual_seed(3))
    z[1, 7] = z[1, 250] = 50.0  # a tie: the first one
    z[2] = 0.0  # all equal: index 0
    z[3, 11] = z[3, 90] = float("nan")  # NaN counts as the largest, the first one
    z[4, 299] = float("inf")
    z[5, :] = float("-inf")
    rows = [5, 0, 3, 1, 2, 4]
    want = [int(z[r].argmax()) for r in rows]
    assert want[:4] == [0, want[1], 11, 7]
    assert argmax_rows(z, rows) == want
    assert argmax_rows(z.double(), rows) == want  # the torch path for other dtypes
    assert argmax_rows(z, []) == []


def test_a_greedy_row_with_banned_ids_takes_the_batch_argmax_unless_it_is_banned() -> None:
    """ignore_eos's banned ids keep a greedy row on the batch's one argmax (batch.py takes it
    where `takes_argmax`, else runs the sampler, which masks the banned ids first): the tokens
    are the masked argmax's in every case, ties with a banned id before or after included."""
    banned = [3, 7]
    sampler = RequestSampler(GREEDY, [], 20, CPU, banned)
    assert sampler.is_plain_greedy
    z = torch.randn(8, 20, generator=torch.Generator().manual_seed(5))
    z[0, 3] = 9.0  # the argmax is banned: the next best
    z[1, 3] = z[1, 12] = 9.0  # a banned id tied before the first allowed maximum
    z[2, 2] = z[2, 7] = 9.0  # a banned id tied after it
    z[3, 7] = z[3, 3] = 9.0  # only banned ids at the maximum
    z[4] = 0.0  # all equal: index 0
    picked = argmax_rows(z, range(8))
    assert [sampler.takes_argmax(t) for t in picked[:4]] == [False, False, True, False]
    for row, token in zip(z, picked, strict=True):
        masked = int(row.index_fill(0, torch.tensor(banned), float("-inf")).argmax())
        chosen = token if sampler.takes_argmax(token) else sampler(row)
        assert chosen == masked not in banned


def test_finite_rows_finds_every_broken_row_and_only_those() -> None:
    logits = torch.randn(6, 1000, generator=torch.Generator().manual_seed(0))
    logits[1, 17] = float("nan")
    logits[2, 999] = float("inf")
    logits[3, 0] = float("-inf")
    logits[4, 5], logits[4, 6] = float("inf"), float("-inf")  # their sum is NaN
    # finite, yet their sum overflows float32: a finite row all the same
    logits[5, :] = 3e38
    assert finite_rows(logits) == [True, False, False, False, False, True]
    assert finite_rows(logits[:1]) == [True]
    with pytest.raises(ValueError, match="logits must be"):
        finite_rows(logits[0])
