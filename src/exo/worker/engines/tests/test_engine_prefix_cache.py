"""A conversation's next turn reuses the keys/values of the turn before (whole prefill chunks
of the shared start), and answers exactly as it would from scratch."""

import torch

from exo.worker.engines.batch import BatchGenerator, StepOutput
from exo.worker.engines.config import LlamaConfig
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tokenizer import EngineTokenizer

CHUNK = 16


class Counting:
    """The model, counting the prompt positions each forward pass computes."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.computed = 0

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
        self.computed += tokens.numel()
        return self.model.forward(tokens, step, cache, every_position)


def _turns(tokenizer: EngineTokenizer) -> tuple[list[int], list[int]]:
    first = [{"role": "user", "content": "Tell me three facts about the Moon, please."}]
    second = [*first, {"role": "assistant", "content": "It orbits the Earth."},
              {"role": "user", "content": "And one about the Sun?"}]
    return tokenizer.encode_chat(first), tokenizer.encode_chat(second)


def _answer(gen: BatchGenerator, rid: str, prompt: list[int], n: int = 6) -> list[int]:
    gen.add(rid, prompt, SamplingParams(temperature=0.7, seed=5, max_tokens=n))
    outs: list[StepOutput] = []
    for _ in range(200):
        if not gen.active:
            break
        outs.extend(gen.step())
    assert not gen.active
    return [o.token_id for o in outs if o.token_id is not None]


def test_the_next_turn_prefills_only_past_the_shared_whole_chunks(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    first, second = _turns(tokenizer)
    shared = next(
        (i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b), len(first)
    )
    reusable = min(shared, len(first)) // CHUNK * CHUNK
    assert reusable >= CHUNK, "the test needs turns sharing a whole chunk"

    model = Counting(fast_model)
    gen = BatchGenerator(model, 2, 256, eos_token_ids=[], prefill_chunk=CHUNK)
    _answer(gen, "turn1", first)
    before = model.computed
    with_cache = _answer(gen, "turn2", second)
    prefilled = model.computed - before - (len(with_cache) - 1)  # less the decode steps
    assert prefilled == len(second) - reusable

    # Exactly the answer the turn gets from scratch (same chunks, same seed).
    fresh = BatchGenerator(fast_model, 2, 256, eos_token_ids=[], prefill_chunk=CHUNK,
                           prefix_cache=False)
    assert with_cache == _answer(fresh, "turn2", second)


def test_an_unrelated_prompt_reuses_nothing_and_entries_stay_within_the_budget(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    first, _ = _turns(tokenizer)
    model = Counting(fast_model)
    gen = BatchGenerator(model, 1, 64, eos_token_ids=[], prefill_chunk=CHUNK)
    _answer(gen, "a", first[:40])
    assert gen.prefixes is not None and gen.prefixes.pages_held > 0
    other = [t + 1 for t in first[:40]]
    before = model.computed
    _answer(gen, "b", other, n=3)
    assert model.computed - before == len(other) + 2  # the whole prompt, then 2 decode steps
    # One slot of 64 positions is the whole budget: what is kept never passes it.
    assert gen.prefixes.pages_held <= gen.prefixes.budget_pages
    assert len(gen.cache.pages) <= gen.prefixes.budget_pages


def test_a_failed_request_keeps_nothing(fast_model: LlamaModel, tokenizer: EngineTokenizer) -> None:
    first, _ = _turns(tokenizer)
    gen = BatchGenerator(fast_model, 1, 256, eos_token_ids=[], prefill_chunk=CHUNK)
    gen.add("x", first, SamplingParams(temperature=0.0, max_tokens=50))
    gen.step()
    gen.step()
    assert gen.cancel("x")  # a cancelled request's prompt is kept (its cache is sound)
    assert gen.prefixes is not None and gen.prefixes.pages_held > 0
    gen.prefixes.clear()
    assert gen.cache.pages == {}
