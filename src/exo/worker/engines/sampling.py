"""Choosing the next token: penalties, temperature, top-k / top-p / min-p, seeded sampling.

Order, for one request's logits z [V]:

1. repetition penalty r (prompt and output tokens):  z_t <- z_t / r if z_t > 0 else z_t * r
2. presence p and frequency f penalties (output tokens, count c_t):  z_t <- z_t - p [c_t > 0] - f c_t
3. the request's logit bias (OpenAI ``logit_bias``: z_t <- z_t + b_t), then a grammar's mask
4. temperature 0: argmax (greedy). Otherwise z <- z / temperature, then
5. top-k (keep the k largest), softmax, min-p (drop p_t < min_p * max p), top-p (keep the
   smallest most-likely set of mass >= top_p), renormalise, draw one token with the request's
   own `torch.Generator` when it has a seed (the global generator otherwise).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy
import torch
from torch import Tensor

GREEDY_BELOW_TEMPERATURE = 1e-5


class TokenConstraint(Protocol):
    """Which tokens may come next (a grammar): masks logits, then follows the choice."""

    def mask(self, logits: Tensor) -> Tensor:
        """logits [V] with every token the grammar forbids at -inf."""
        ...

    def accept(self, token: int) -> None: ...


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 256
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    # Structured output: one request's grammar state (not shared between requests).
    constraint: TokenConstraint | None = field(default=None, compare=False)
    # Log-probabilities: each sampled token's, with this many alternatives, are appended
    # to ``logprob_sink`` (the caller's list, read as tokens come out).
    top_logprobs: int | None = None
    logprob_sink: list["TokenLogprobs"] | None = field(default=None, compare=False)
    # The prompt's own log-probabilities (every token after the first, each given the ones
    # before it, with ``top_logprobs`` alternatives), appended as the prefill computes them.
    prompt_logprob_sink: list["TokenLogprobs"] | None = field(default=None, compare=False)
    # OpenAI's logit_bias: (token id, bias) pairs added to the logits before sampling.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # llama-server's extension: the model's end-of-sequence tokens are never sampled (so they
    # cannot end the answer), for a fixed output length; `stop_token_ids` still stop it. Not
    # under a `constraint` (a grammar ends the answer when it is complete).
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0 <= self.min_p <= 1:
            raise ValueError("min_p must be in [0, 1]")
        if self.max_tokens < (0 if self.prompt_logprob_sink is not None else 1):
            raise ValueError("max_tokens must be >= 1 (0 only to score the prompt)")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")

    @property
    def greedy(self) -> bool:
        # Below this temperature sampling is argmax anyway, and dividing by it overflows.
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


@dataclass(frozen=True)
class TokenLogprobs:
    """A sampled token's log-probability under the model, and the most likely tokens'."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


GREEDY = SamplingParams(temperature=0.0)


def apply_penalties(
    logits: Tensor, params: SamplingParams, seen: Tensor, output_counts: Tensor
) -> Tensor:
    """Penalised copy of logits [V]; seen [V] bool (prompt or output), output_counts [V] float."""
    z = logits.float().clone()
    r = params.repetition_penalty
    if r != 1.0:
        z = torch.where(seen, torch.where(z > 0, z / r, z * r), z)
    if params.presence_penalty != 0.0:
        z = z - params.presence_penalty * (output_counts > 0).float()
    if params.frequency_penalty != 0.0:
        z = z - params.frequency_penalty * output_counts
    return z


def _cpu_array(logits: Tensor) -> numpy.ndarray | None:
    """The logits as a numpy array sharing their memory, when they are CPU float32 without
    grad (numpy's reductions run on the calling thread); None otherwise."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad:
        return logits.numpy()
    return None


def argmax_rows(logits: Tensor, rows: Sequence[int]) -> list[int]:
    """The index of the largest logit in each of `rows` of logits [B, V], the first one on ties
    and on NaN (as torch's argmax). On the CPU this is numpy's argmax: at [8, 49152] torch's
    took ~420 us, numpy's ~30 us, a step's worth of overhead at batch 8."""
    if not rows:
        return []
    if (array := _cpu_array(logits)) is not None:
        # every row's argmax (cheaper than copying the rows asked for out first)
        best = array.argmax(-1)
        return [int(best[r]) for r in rows]
    return [int(t) for t in logits[list(rows)].argmax(-1).tolist()]


def sample_token(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token from (already penalised, biased and masked) logits [V] (steps 4-5 of the
    module docstring)."""
    if params.greedy:
        return int(logits.argmax())
    # Extreme temperatures or penalties overflow; keep every logit finite so that
    # softmax stays a distribution (an overflowed logit just dominates).
    z = torch.nan_to_num(logits.float() / params.temperature, nan=-1e30, posinf=1e30, neginf=-1e30)
    candidates: Tensor | None = None  # token ids of z when z is a top-k subset
    if 0 < params.top_k < z.shape[-1]:
        z, candidates = torch.topk(z, params.top_k)  # sorted, descending
    probs = torch.softmax(z, dim=-1)
    if params.min_p > 0:
        probs = torch.where(probs < params.min_p * probs.max(), 0.0, probs)
    if params.top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = torch.where(
            mass_before < params.top_p * sorted_probs.sum(), sorted_probs, 0.0
        )
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    choice = int(torch.multinomial(probs, 1, generator=generator))
    return int(candidates[choice]) if candidates is not None else choice


def token_logprobs(logits: Tensor, token: int, top: int) -> TokenLogprobs:
    """Log-probabilities of the model's own distribution (before penalties, temperature
    and constraints), as OpenAI reports them."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        values, ids = torch.topk(lp, min(top, lp.shape[-1]))
        best = tuple((int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprobs(token=token, logprob=float(lp[token]), top=best)


def prompt_logprobs(logits: Tensor, targets: Sequence[int], top: int) -> list[TokenLogprobs]:
    """Log-probabilities of ``targets`` [T] under logits [T, V] (row t predicts target t),
    with the ``top`` most likely tokens of each row: a prompt's scores, all rows at once."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    ids = torch.tensor(list(targets), dtype=torch.long, device=lp.device)
    chosen = lp.gather(1, ids[:, None])[:, 0].tolist()
    best: list[tuple[tuple[int, float], ...]] = [()] * len(chosen)
    if top > 0:
        values, tops = torch.topk(lp, min(top, lp.shape[-1]), dim=-1)
        best = [
            tuple((int(i), float(v)) for i, v in zip(row_ids, row_values, strict=True))
            for row_ids, row_values in zip(tops.tolist(), values.tolist(), strict=True)
        ]
    return [
        TokenLogprobs(token=t, logprob=float(v), top=b)
        for t, v, b in zip(targets, chosen, best, strict=True)
    ]


def finite_rows(logits: Tensor) -> list[bool]:
    """Whether each row of logits [B, V] is free of NaN and infinities (a model whose
    weights or activations overflowed).

    A row's sum is finite only if every value is (NaN and infinities carry into it), so one
    summing pass decides every ordinary row; only a row whose sum is not finite -- a broken
    one, or finite values so large that their sum overflows -- is checked value by value.
    At [8, 49152] on the CPU the sum takes about a tenth of `isfinite(...).all(...)`'s time,
    a step's worth of overhead at batch 8. On the CPU the sum is numpy's, on the calling
    thread (as `argmax_rows`): torch's hands a vocabulary's row to its thread pool and wakes
    a sleeping worker each decoding step (a serving runner on SmolLM2 at 2 threads showed 7%
    of py-spy's samples in it; its wall time per token moved within the machine's noise)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [B, V], got {list(logits.shape)}")
    if (array := _cpu_array(logits)) is not None:
        with numpy.errstate(over="ignore", invalid="ignore"):  # inf and NaN are the answer here
            sums = array.sum(-1)
        ok = [math.isfinite(x) for x in sums.tolist()]
    else:
        ok = [bool(x) for x in torch.isfinite(logits.sum(dim=-1)).tolist()]
    for i, fine in enumerate(ok):
        if not fine:
            ok[i] = bool(torch.isfinite(logits[i]).all())
    return ok


class RequestSampler:
    """The sampling state of one request: its generator and the token counts its penalties use."""

    def __init__(
        self,
        params: SamplingParams,
        prompt_ids: Sequence[int],
        vocab: int,
        device: torch.device,
        banned: Sequence[int] = (),
    ) -> None:
        """``banned``: token ids never sampled (the end-of-sequence ids under ignore_eos)."""
        self.params = params
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator(device=device).manual_seed(params.seed)
        self.seen: Tensor | None = None
        self.counts: Tensor | None = None
        self.bias: tuple[Tensor, Tensor] | None = None
        if params.logit_bias:
            ids, values = zip(*params.logit_bias, strict=True)
            if any(not 0 <= i < vocab for i in ids):
                raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
            self.bias = (
                torch.tensor(ids, dtype=torch.long, device=device),
                torch.tensor(values, dtype=torch.float32, device=device),
            )
        self.banned: Tensor | None = None
        self.banned_ids = frozenset(banned)
        if banned:
            if any(not 0 <= i < vocab for i in banned):
                raise ValueError(f"banned token ids must be in [0, {vocab})")
            self.banned = torch.tensor(list(banned), dtype=torch.long, device=device)
        if params.has_penalties:
            self.seen = torch.zeros(vocab, dtype=torch.bool, device=device)
            self.seen[torch.tensor(list(prompt_ids), dtype=torch.long, device=device)] = True
            self.counts = torch.zeros(vocab, dtype=torch.float32, device=device)

    @property
    def is_plain_greedy(self) -> bool:
        """Greedy without penalties, bias, constraint or logprobs: the batch can take one argmax
        for all such rows. A row with banned ids (ignore_eos) takes it too unless it lands on a
        banned id (`takes_argmax`): masking the banned ids to -inf cannot move a maximum that is
        not one of them, nor the first of tied maxima when none before it is banned."""
        p = self.params
        return (
            p.greedy
            and not p.has_penalties
            and not p.logit_bias
            and p.constraint is None
            and p.logprob_sink is None
        )

    def takes_argmax(self, token: int) -> bool:
        """Whether the batch's argmax `token` is this plain greedy row's token."""
        return token not in self.banned_ids

    def __call__(self, logits: Tensor) -> int:
        """The next token for logits [V]; records it for the penalties."""
        raw = logits
        if self.seen is not None and self.counts is not None:
            logits = apply_penalties(logits, self.params, self.seen, self.counts)
        if self.bias is not None:
            ids, values = self.bias
            logits = logits.float().index_add(0, ids, values)
        if self.banned is not None:
            logits = logits.float().index_fill(0, self.banned, float("-inf"))
        constraint = self.params.constraint
        if constraint is not None:
            logits = constraint.mask(logits)
        token = sample_token(logits, self.params, self.generator)
        if constraint is not None:
            constraint.accept(token)
        if self.params.logprob_sink is not None:
            self.params.logprob_sink.append(
                token_logprobs(raw, token, self.params.top_logprobs or 0)
            )
        self.record(token)
        return token

    def record(self, token: int) -> None:
        if self.seen is not None and self.counts is not None:
            self.seen[token] = True
            self.counts[token] += 1
