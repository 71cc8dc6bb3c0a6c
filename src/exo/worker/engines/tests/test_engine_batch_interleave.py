"""Prefill interleaved with decode: a long prompt's chunks do not stall the running streams,
which keep their tokens; ignore_eos runs past the end-of-sequence token."""

import pytest
import torch

from exo.worker.engines.batch import BatchGenerator, StepOutput
from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tokenizer import EngineTokenizer

CHUNK = 16


class CountingModel:
    """The embedded model, recording each forward's rows and new tokens per row."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.calls: list[tuple[int, int]] = []  # (rows, n_new)

    @property
    def config(self) -> LlamaConfig:
        return self.model.config

    @property
    def device(self) -> torch.device:
        return self.model.device

    def new_cache(self, max_batch: int, max_seq: int) -> KVCache:
        return self.model.new_cache(max_batch, max_seq)

    def forward(
        self, tokens: torch.Tensor, step: StepInputs, cache: KVCache, every_position: bool = False
    ) -> torch.Tensor:
        self.calls.append((len(step.slots), step.n_new))
        return self.model.forward(tokens, step, cache, every_position)


def _long_prompt(tokenizer: EngineTokenizer, sentences: int) -> list[int]:
    text = " ".join(f"Sentence {i} is about the weather on day {i}." for i in range(sentences))
    return tokenizer.encode(text, add_special_tokens=True)


def _short_prompts(tokenizer: EngineTokenizer, n: int) -> list[list[int]]:
    return [tokenizer.encode(f"Item {i} of the list is", add_special_tokens=True) for i in range(n)]


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n)


def _alone(model: LlamaModel, prompt: list[int], params: SamplingParams) -> list[int]:
    gen = BatchGenerator(model, 1, 512, eos_token_ids=[], prefill_chunk=CHUNK)
    gen.add("alone", prompt, params)
    tokens: list[int] = []
    while gen.active:
        tokens.extend(o.token_id for o in gen.step() if o.token_id is not None)
    return tokens


def test_no_decode_row_waits_more_than_one_chunk_while_long_prompts_prefill(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    counting = CountingModel(fast_model)
    gen = BatchGenerator(counting, 8, 512, eos_token_ids=[], prefill_chunk=CHUNK)
    shorts = _short_prompts(tokenizer, 6)
    assert all(1 < len(p) <= CHUNK for p in shorts)
    for i, prompt in enumerate(shorts[:4]):
        gen.add(f"run{i}", prompt, _greedy(40))
    started: set[str] = set()
    while len(started) < 4:  # until the four are decoding
        started |= {o.request_id for o in gen.step()}
    longs = [_long_prompt(tokenizer, 12), _long_prompt(tokenizer, 9)]
    assert all(len(p) > 4 * CHUNK for p in longs)
    gen.add("long0", longs[0], _greedy(2))
    gen.add("late0", shorts[4], _greedy(2))
    gen.add("long1", longs[1], _greedy(2))
    gen.add("late1", shorts[5], _greedy(2))
    first_token: dict[str, int] = {}
    firsts: list[str] = []  # the requests in the order of their first tokens
    for step in range(40):
        counting.calls.clear()
        outs = gen.step()
        *prefills, decode = counting.calls
        assert decode[1] == 1 and decode[0] >= 4  # the running streams' decode step
        assert all(n > 1 for _, n in prefills)  # prompts here are never one token
        assert sum(rows * n for rows, n in prefills) <= CHUNK, step
        produced = {o.request_id for o in outs}
        assert {f"run{i}" for i in range(4)} <= produced  # every stream got its token
        for o in outs:
            if o.request_id not in first_token:
                first_token[o.request_id] = step
                firsts.append(o.request_id)
        if {"long0", "long1", "late0", "late1"} <= first_token.keys():
            break
    # oldest first: each prompt starts only after the ones added before it are prefilled
    assert [r for r in firsts if not r.startswith("run")] == ["long0", "late0", "long1", "late1"]
    assert first_token["long1"] - first_token["long0"] >= len(longs[1]) // CHUNK


def test_a_streams_tokens_are_unchanged_by_interleaved_prefills(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    stream = _short_prompts(tokenizer, 1)[0]
    seeded = SamplingParams(temperature=0.8, seed=11, max_tokens=30)
    longs = [_long_prompt(tokenizer, 10), _long_prompt(tokenizer, 7)]
    gen = BatchGenerator(fast_model, 4, 512, eos_token_ids=[], prefill_chunk=CHUNK)
    gen.add("stream", stream, _greedy(30))
    gen.add("seeded", stream, seeded)
    got: dict[str, list[StepOutput]] = {}
    for step in range(60):
        if step == 3:  # while both stream, two long prompts prefill chunk by chunk
            gen.add("long0", longs[0], _greedy(4))
            gen.add("long1", longs[1], _greedy(4))
        for o in gen.step():
            got.setdefault(o.request_id, []).append(o)
        if step > 3 and not gen.active:
            break
    assert not gen.active

    def tokens(rid: str) -> list[int]:
        return [o.token_id for o in got[rid] if o.token_id is not None]

    assert tokens("stream") == _alone(fast_model, stream, _greedy(30))
    assert tokens("seeded") == _alone(fast_model, stream, seeded)
    for i, prompt in enumerate(longs):
        assert tokens(f"long{i}") == _alone(fast_model, prompt, _greedy(4))


def test_ignore_eos_never_samples_the_end_token_and_runs_to_max_tokens(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    prompt = _short_prompts(tokenizer, 1)[0]
    first = _alone(fast_model, prompt, _greedy(1))[0]  # call it the end-of-sequence token
    gen = BatchGenerator(fast_model, 2, 512, eos_token_ids=[first])
    gen.add("eos", prompt, _greedy(8))
    gen.add("ignore", prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
    got: dict[str, list[StepOutput]] = {}
    while gen.active:
        for o in gen.step():
            got.setdefault(o.request_id, []).append(o)
    assert [(o.token_id, o.finish_reason) for o in got["eos"]] == [(first, "stop")]
    ignored = got["ignore"]
    assert len(ignored) == 8 and ignored[-1].finish_reason == "length"
    assert all(o.token_id is not None and o.token_id != first for o in ignored)
    # a stop token asked for still stops, even an end-of-sequence one
    asked = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, stop_token_ids=(first,))
    gen.add("asked", prompt, asked)
    outs = gen.step()
    assert [(o.token_id, o.finish_reason) for o in outs] == [(first, "stop")]


class OnlyToken:
    """A grammar at its end: only `token` (the end-of-sequence) may come next."""

    def __init__(self, token: int) -> None:
        self.token = token

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        masked = torch.full_like(logits.float(), float("-inf"))
        masked[self.token] = 0.0
        return masked

    def accept(self, token: int) -> None:
        assert token == self.token


def test_under_a_grammar_ignore_eos_lets_the_grammar_end_the_answer(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    prompt = _short_prompts(tokenizer, 1)[0]
    gen = BatchGenerator(fast_model, 1, 512, eos_token_ids=[7])
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, constraint=OnlyToken(7))
    gen.add("json", prompt, params)
    assert [(o.token_id, o.finish_reason) for o in gen.step()] == [(7, "stop")]


def _burst(tokenizer: EngineTokenizer) -> list[list[int]]:
    prompts = [tokenizer.encode(f"Question {i}: name the colour of the sea at dawn",
                                add_special_tokens=True) for i in range(4)]  # fmt: skip
    assert len({len(p) for p in prompts}) == 1  # one length: one pack, were they packed
    return prompts


def _run(gen: BatchGenerator, prompts: list[list[int]]) -> tuple[list[set[str]], dict[str, list[int]]]:
    """Each step's requests that got their first token; every request's tokens."""
    for i, prompt in enumerate(prompts):
        gen.add(f"r{i}", prompt, _greedy(6))
    firsts: list[set[str]] = []
    tokens: dict[str, list[int]] = {}
    while gen.active:
        out = [o for o in gen.step() if o.token_id is not None]
        firsts.append({o.request_id for o in out if o.request_id not in tokens})
        for o in out:
            tokens.setdefault(o.request_id, []).append(o.token_id)  # pyright: ignore[reportArgumentType]
    return firsts, tokens


def test_a_small_prefill_turn_lets_a_burst_start_one_request_a_step(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    """A turn that holds one prompt: the requests that arrived together get their first tokens
    a step apart, oldest first, with the tokens each gets alone; the default turn (a chunk)
    prefills all of them in the first step."""
    prompts = _burst(tokenizer)
    turn = len(prompts[0]) * 3 // 2
    firsts, tokens = _run(BatchGenerator(fast_model, 4, 256, eos_token_ids=[], prefill_turn=turn,
                                         pack_prefill=True), prompts)  # fmt: skip
    assert firsts[:4] == [{"r0"}, {"r1"}, {"r2"}, {"r3"}]
    whole_firsts, whole_tokens = _run(
        BatchGenerator(fast_model, 4, 256, eos_token_ids=[], pack_prefill=True), prompts
    )
    assert whole_firsts[0] == {"r0", "r1", "r2", "r3"}
    for i, prompt in enumerate(prompts):
        alone = BatchGenerator(fast_model, 1, 256, eos_token_ids=[])
        _, own = _run(alone, [prompt])
        assert tokens[f"r{i}"] == whole_tokens[f"r{i}"] == own["r0"]


def test_a_prefill_turn_below_one_token_is_refused(fast_model: LlamaModel) -> None:
    with pytest.raises(ValueError, match="prefill_turn"):
        BatchGenerator(fast_model, 1, 64, prefill_turn=0)
