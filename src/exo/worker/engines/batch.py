"""Continuous batching over a preallocated KV cache.

Requests join and leave between steps. `step()` first prefills (each prompt in chunks of at most
`prefill_chunk` tokens; a request's first token comes from its last chunk), then runs one batched
decode step over the requests that already had a token. A step runs whole chunks, oldest request
first, of at most `prefill_turn` tokens in all (at least one chunk; by default `prefill_chunk`, a
serving runner takes `SERVE_PREFILL_TURN`): several short prompts share a step, a long one takes
a chunk per step, and the running requests' decode steps go on between
its chunks instead of waiting for its whole prompt. The step returns one `StepOutput` per request
that produced a token (or failed). Chunk boundaries depend only on the prompt, so a request's tokens
do not depend on what it is batched with. With `pack_prefill` (a model whose rows compute apart,
`engine.rows_apart`), a turn's chunks at the same positions (same start and length: requests that
arrive together with prompts of one length, the whole chunks of long prompts) run in one forward,
so the weights stream once for all of them: the same shapes per row as alone, the same bits.

Slots stay compact: running requests always occupy cache slots 0..n-1, so a decode step attends
over a plain slice of the cache. When a request leaves, the request in the highest slot moves
into the hole (one copy of its cached keys/values, once).

A failure is confined to its request: a prefill that raises fails only that request; a batched
decode that raises is retried one request at a time, so only the culprits fail. Logits that are
not finite (NaN or infinite: broken weights, an overflow) fail the request they belong to.

A request may ask for its prompt's log-probabilities (`SamplingParams.prompt_logprob_sink`): its
prefill then takes the logits of every position (not only the last), skips the prefix cache (the
reused positions would have none), and with `max_tokens` 0 it ends after the prefill with no
token (finish_reason "length").
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from exo.worker.engines.images import ImageSpans
from exo.worker.engines.kv_cache import KVCache, pages_for
from exo.worker.engines.models.base import StepInputs, StepModel
from exo.worker.engines.prefix_cache import KeyItem, PrefixCache
from exo.worker.engines.sampling import (
    RequestSampler,
    SamplingParams,
    argmax_rows,
    finite_rows,
    prompt_logprobs,
)

FinishReason = Literal["stop", "length", "error"]


@dataclass(frozen=True)
class StepOutput:
    """One new token of one request. `token_id` is None when finish_reason is "error", and
    for a request of `max_tokens` 0 (its prompt scored, finish_reason "length").

    With finish_reason "stop", `token_id` is the stop token itself (not text to show).
    """

    request_id: str
    token_id: int | None
    finish_reason: FinishReason | None
    error: str | None = None


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    sampler: RequestSampler
    stop_ids: frozenset[int]
    slot: int = -1
    cached: int = 0  # tokens whose keys/values are in the cache
    generated: int = 0
    pending: int = -1  # the last sampled token, fed to the model by the next decode step
    arrival: int = 0  # the order of `add` calls: prefill goes oldest first
    images: ImageSpans | None = None  # the prompt's images (their chunks are never split)

    @property
    def prefilling(self) -> bool:
        return self.cached < len(self.prompt)

    @property
    def scores_prompt(self) -> bool:
        return self.sampler.params.prompt_logprob_sink is not None


def _packs(turn: list[_Request], chunk_len: Callable[[_Request], int]) -> list[list[_Request]]:
    """A prefill turn's chunks in forwards, oldest first: chunks at the same positions (same
    start, same length) go in one forward, which computes each row as it would alone; a chunk
    with images or whose prompt is scored goes alone (those take a one-row forward)."""
    packs: dict[tuple[int, int], list[_Request]] = {}
    out: list[list[_Request]] = []
    for r in turn:
        if r.images is not None or r.scores_prompt:
            out.append([r])
            continue
        key = (r.cached, chunk_len(r))
        if key not in packs:
            packs[key] = []
            out.append(packs[key])
        packs[key].append(r)
    return out


SERVE_PREFILL_TURN = 64
"""The prompt tokens a serving runner's step prefills. On a CPU a forward is compute-bound from a
few dozen rows on (a row costs about what streaming the weights once does), so a larger turn
saves little: at 64 tokens the weights streamed once more per turn are a few percent of the
prefill. A smaller turn lets a burst's first tokens out one by one: 8 prompts of ~40 tokens that
arrive together get them after 1, 2, ... 8 prompts' prefill (a step each) instead of all after
the 8. Measured (CPU, 1 thread, 8 equal chat prompts: SmolLM2 58 tokens, the 1B shape 40): the
4th first token after 54-58% of the CPU the one-step prefill took; the last one 12-18% later
than there, since the first requests' decode steps (their tokens) run in between."""


class NonFiniteLogits(ArithmeticError):
    """The model's logits for a request hold NaN or infinities."""

    def __init__(self) -> None:
        super().__init__(
            "the model produced non-finite logits (NaN or infinity): its weights or "
            "activations are broken, so no token can be chosen"
        )


def pages_needed(prompt_tokens: int, max_tokens: int, max_seq: int) -> int:
    """The most cache pages a request may hold: its prompt and every token it may generate."""
    return pages_for(min(max_seq, prompt_tokens + max_tokens))


class BatchGenerator:
    def __init__(
        self,
        model: StepModel,
        max_batch: int,
        max_seq: int,
        *,
        eos_token_ids: Sequence[int] = (),
        prefill_chunk: int = 512,
        prefix_cache: bool = True,
        pack_prefill: bool = False,
        prefill_turn: int | None = None,
    ) -> None:
        """`pack_prefill`: prompt chunks at the same positions share one forward (`_packs`);
        only for a model whose rows compute apart, bit for bit as alone (`engine.rows_apart`).
        `prefill_turn`: the prompt tokens one step prefills across requests (whole chunks,
        at least one; default `prefill_chunk`). A step's first tokens come out when the step
        ends, so a smaller turn gives a burst of requests their first tokens one after
        another instead of all at the end of one long step (`SERVE_PREFILL_TURN`)."""
        turn = prefill_chunk if prefill_turn is None else prefill_turn
        if max_batch < 1 or max_seq < 2 or prefill_chunk < 1 or turn < 1:
            raise ValueError(
                "need max_batch >= 1, max_seq >= 2, prefill_chunk >= 1 and prefill_turn >= 1"
            )
        self.model = model
        self.max_batch = max_batch
        self.max_seq = max_seq
        self.prefill_chunk = prefill_chunk
        self.prefill_turn = turn
        self.pack_prefill = pack_prefill
        self.eos_token_ids = frozenset(eos_token_ids)
        self.cache = model.new_cache(max_batch, max_seq)
        # Finished prompts' keys/values for the next turn; a plain cache only (the ranks of a
        # distributed model each hold their own, which this batcher does not see).
        self.prefixes = (
            PrefixCache(self.cache, prefill_chunk)
            if prefix_cache and type(self.cache) is KVCache
            else None
        )
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []  # _running[i].slot == i
        self._arrivals = 0

    # --- public API --------------------------------------------------------------------------

    @property
    def active(self) -> int:
        """Requests not finished yet (running or waiting for a slot)."""
        return len(self._running) + len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def add(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        images: ImageSpans | None = None,
    ) -> None:
        """Queue a request; it is prefilled by the next step that has a free slot for it.
        `images`: the prompt's encoded images (`images.py`), for a vision model."""
        if any(r.request_id == request_id for r in self._waiting + self._running):
            raise ValueError(f"request {request_id!r} is already active")
        self.check(prompt_ids, images)
        vocab = self.model.config.vocab
        asked = frozenset(params.stop_token_ids)
        # ignore_eos: the end-of-sequence tokens are not sampled (those asked for still stop);
        # under a grammar the grammar says when the answer ends, so it does not apply there
        ignore = params.ignore_eos and params.constraint is None
        eos = [t for t in self.eos_token_ids - asked if t < vocab]
        banned = sorted(eos) if ignore else []
        sampler = RequestSampler(params, prompt_ids, vocab, self.model.device, banned)
        stop_ids = asked | (frozenset() if ignore else self.eos_token_ids)
        self._arrivals += 1
        self._waiting.append(
            _Request(request_id, list(prompt_ids), sampler, stop_ids, arrival=self._arrivals,
                     images=images)
        )

    def check(self, prompt_ids: list[int], images: ImageSpans | None = None) -> None:
        """Raise ValueError where `add` would refuse this prompt."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        vocab = self.model.config.vocab
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if len(prompt_ids) >= self.max_seq:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens; this engine holds {self.max_seq}"
            )
        if images is not None:
            images.check(len(prompt_ids))

    def cancel(self, request_id: str) -> bool:
        """Drop a request; True if it was active."""
        for r in self._waiting:
            if r.request_id == request_id:
                self._waiting.remove(r)
                return True
        for r in self._running:
            if r.request_id == request_id:
                self._release(r)
                return True
        return False

    def step(self) -> list[StepOutput]:
        """Prefill chunks of new requests, then one decode step; one output per new token."""
        outputs: list[StepOutput] = []
        decoding = [r for r in self._running if not r.prefilling]
        while self._waiting and len(self._running) < self.max_batch:
            r = self._waiting.pop(0)
            r.slot = len(self._running)
            self._running.append(r)
            self._reuse_prefix(r)
        if self.prefixes is not None:
            self.prefixes.trim(sum(self._pages_needed(r) for r in self._running))
        with torch.inference_mode():
            turn = self._prefill_turn()
            for group in _packs(turn, self._chunk_len) if self.pack_prefill else [[r] for r in turn]:
                outputs.extend(self._prefill_pack(group))
            if decoding:
                outputs.extend(self._decode(decoding))
        return outputs

    def _prefill_turn(self) -> list[_Request]:
        """The prefilling requests that run their next chunk this step, oldest first: whole
        chunks while their tokens total at most `prefill_turn` (always at least one), so the
        decoding requests wait for at most one turn's worth of prefill between two tokens."""
        chosen: list[_Request] = []
        spent = 0
        for r in sorted((r for r in self._running if r.prefilling), key=lambda r: r.arrival):
            n = self._chunk_len(r)
            if chosen and spent + n > self.prefill_turn:
                break
            chosen.append(r)
            spent += n
        return chosen

    # --- internals ---------------------------------------------------------------------------

    def _chunk_len(self, r: _Request) -> int:
        """The length of r's next prefill chunk (an image is never split between two)."""
        if r.images is None:
            return min(self.prefill_chunk, len(r.prompt) - r.cached)
        return r.images.chunk_end(r.cached, self.prefill_chunk, len(r.prompt)) - r.cached

    def _cache_key(self, r: _Request) -> tuple[list[KeyItem], list[int] | None]:
        """r's prompt as the prefix cache compares it, and where its chunks end (None: at
        multiples of the chunk size)."""
        if r.images is None:
            return list[KeyItem](r.prompt), None
        return r.images.cache_key(r.prompt), r.images.cuts(self.prefill_chunk, len(r.prompt))

    def _prefill_pack(self, rows: list[_Request]) -> list[StepOutput]:
        """The next chunks of `rows` (all at the same positions, `_packs`) in one forward: the
        weights stream once for all of them. If it raises, one request at a time, so only the
        culprits fail. Each row computes as it would alone (the kernels are row by row)."""
        if len(rows) == 1:
            out = self._prefill_chunk(rows[0])
            return [] if out is None else [out]
        n, start = self._chunk_len(rows[0]), rows[0].cached
        try:
            tokens = torch.tensor([r.prompt[start : start + n] for r in rows],
                                  device=self.model.device)  # fmt: skip
            step = StepInputs(tuple(r.slot for r in rows), (start,) * len(rows), n)
            logits = self.model.forward(tokens, step, self.cache)  # [B, V]
        except Exception:
            return [o for r in rows for o in self._prefill_pack([r])]
        finite = finite_rows(logits)
        outputs: list[StepOutput] = []
        for i, r in enumerate(rows):
            r.cached += n
            try:
                out = self._after_prefill(r, logits[i], finite[i])
            except Exception as e:  # confined to this request
                out = self._fail(r, e)
            if out is not None:
                outputs.append(out)
        return outputs

    def _prefill_chunk(self, r: _Request) -> StepOutput | None:
        """The next chunk of r's prompt; its first token once the prompt is all cached."""
        try:
            n = self._chunk_len(r)
            chunk = r.prompt[r.cached : r.cached + n]
            tokens = torch.tensor([chunk], device=self.model.device)
            images = None if r.images is None else r.images.chunk(r.cached, n)
            step = StepInputs.single(r.slot, r.cached, n, images)
            # Only `forward` is used (a pipeline leader stands in for the model); the logits
            # of a chunk that is not the last are not needed, but cost little next to it.
            if r.scores_prompt:
                last = self._score_chunk(r, self.model.forward(tokens, step, self.cache, True)[0])
            else:
                last = self.model.forward(tokens, step, self.cache)[0]
            r.cached += n
            return None if r.prefilling else self._after_prefill(r, last, finite_rows(last[None])[0])
        except Exception as e:  # confined to this request
            return self._fail(r, e)

    def _after_prefill(self, r: _Request, last: torch.Tensor, finite: bool) -> StepOutput | None:
        """After a chunk of r's prompt (`last`: its last position's logits [V]): nothing while
        the prompt goes on, else its first token (or the end, for a prompt scored alone)."""
        if r.prefilling:
            return None
        if not finite:
            raise NonFiniteLogits()
        if r.sampler.params.max_tokens == 0:  # the prompt's scores were all it wanted
            self._release(r)
            return StepOutput(r.request_id, None, "length")
        return self._emit(r, r.sampler(last))

    def _score_chunk(self, r: _Request, logits: torch.Tensor) -> torch.Tensor:
        """Record the log-probabilities of the prompt tokens that a chunk's logits [n, V]
        predict (the token after each position); the last position's logits [V]."""
        sink = r.sampler.params.prompt_logprob_sink
        assert sink is not None
        n = int(logits.shape[0])
        targets = r.prompt[r.cached + 1 : r.cached + n + 1]
        if not all(finite_rows(logits[: len(targets)])):
            raise NonFiniteLogits()
        if targets:
            top = r.sampler.params.top_logprobs or 0
            sink.extend(prompt_logprobs(logits[: len(targets)], targets, top))
        return logits[-1]

    def _decode(self, rows: list[_Request]) -> list[StepOutput]:
        try:
            logits = self._decode_logits(rows)
        except Exception as e:
            if len(rows) == 1:
                return [self._fail(rows[0], e)]
            outputs: list[StepOutput] = []
            for r in rows:  # find the culprit(s): one row at a time
                outputs.extend(self._decode([r]))
            return outputs
        for r in rows:
            r.cached += 1
        return self._sample_rows(rows, logits)

    def _decode_logits(self, rows: list[_Request]) -> torch.Tensor:
        tokens = torch.tensor([[r.pending] for r in rows], device=self.model.device)  # [B, 1]
        deltas = tuple(0 if r.images is None else r.images.rope_delta for r in rows)
        step = StepInputs(tuple(r.slot for r in rows), tuple(r.cached for r in rows), 1,
                          rope_deltas=deltas if any(deltas) else ())  # fmt: skip
        return self.model.forward(tokens, step, self.cache)  # [B, V]

    def _sample_rows(self, rows: list[_Request], logits: torch.Tensor) -> list[StepOutput]:
        greedy_rows = [i for i, r in enumerate(rows) if r.sampler.is_plain_greedy]
        # one argmax for every plain greedy row
        picked = argmax_rows(logits, greedy_rows)
        greedy = {
            i: t for i, t in zip(greedy_rows, picked, strict=True) if rows[i].sampler.takes_argmax(t)
        }
        finite = finite_rows(logits)
        outputs: list[StepOutput] = []
        for i, r in enumerate(rows):
            try:
                if not finite[i]:
                    raise NonFiniteLogits()
                token = greedy[i] if i in greedy else r.sampler(logits[i])
                outputs.append(self._emit(r, token))
            except Exception as e:
                outputs.append(self._fail(r, e))
        return outputs

    def _emit(self, r: _Request, token: int) -> StepOutput:
        r.generated += 1
        r.pending = token
        finish: FinishReason | None = None
        if token in r.stop_ids:
            finish = "stop"
        elif r.generated >= r.sampler.params.max_tokens or r.cached >= self.max_seq:
            finish = "length"
        if finish is not None:
            self._release(r)
        return StepOutput(r.request_id, token, finish)

    def _fail(self, r: _Request, e: Exception) -> StepOutput:
        if r in self._running:
            self._release(r, keep_prefix=False)
        return StepOutput(r.request_id, None, "error", f"{type(e).__name__}: {e}")

    def _reuse_prefix(self, r: _Request) -> None:
        if self.prefixes is None or r.scores_prompt:
            return
        key, cuts = self._cache_key(r)
        hit = self.prefixes.take(key, cuts)
        if hit is not None:
            r.cached, pages = hit
            self.cache.attach(r.slot, pages)

    def _pages_needed(self, r: _Request) -> int:
        return pages_needed(len(r.prompt), r.sampler.params.max_tokens, self.max_seq)

    def _release(self, r: _Request, keep_prefix: bool = True) -> None:
        """Free r's slot; the request in the last slot moves into it (slots stay 0..n-1).
        The whole chunks of r's prompt are kept for a next request that starts the same."""
        if self.prefixes is not None:
            pages = self.cache.detach(r.slot)
            if keep_prefix:
                key, cuts = self._cache_key(r)
                self.prefixes.retain(key, r.cached, pages, cuts)
            else:
                self.cache.free(pages)
        last = self._running.pop()
        if last is r:
            self.cache.release(r.slot)
        else:
            self.cache.move_slot(last.slot, r.slot, last.cached)
            last.slot = r.slot
            self._running[r.slot] = last
