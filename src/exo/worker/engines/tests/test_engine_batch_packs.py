"""Packed prefill: prompt chunks at the same positions run in one forward (the weights stream
once for all of them), each request getting the tokens it gets alone; a failure in a packed
forward stays with its request."""

from collections.abc import Callable

import pytest
import torch

from exo.worker.engines.batch import BatchGenerator, StepOutput
from exo.worker.engines.engine import Engine, rows_apart
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.tests.kernel_skip import skip_without_kernels
from exo.worker.engines.tests.test_engine_batch_interleave import CountingModel
from exo.worker.engines.tokenizer import EngineTokenizer

LENGTH = 12  # the packed prompts' length


class CountingEngineModel(CountingModel):
    """CountingModel with what an `Engine` reads of its model."""

    start_layer = 0

    @property
    def end_layer(self) -> int:
        return self.model.config.n_layers

    def kernels_used(self) -> dict[str, int]:
        return self.model.kernels_used()


def _prompts(tokenizer: EngineTokenizer) -> list[list[int]]:
    """Three distinct prompts of LENGTH tokens, and a shorter one."""
    texts = [f"Item {i} of the list is the {w} of the three" for i, w in enumerate("abc")]
    prompts = [tokenizer.encode(t, add_special_tokens=True)[:LENGTH] for t in texts]
    assert all(len(p) == LENGTH for p in prompts) and len({tuple(p) for p in prompts}) == 3
    return [*prompts, tokenizer.encode("A shorter one", add_special_tokens=True)]


PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=6),
    SamplingParams(temperature=0.8, seed=5, max_tokens=6),
    SamplingParams(temperature=0.0, max_tokens=6),
    SamplingParams(temperature=0.0, max_tokens=6),
]


def _run(gen: BatchGenerator) -> dict[str, list[StepOutput]]:
    got: dict[str, list[StepOutput]] = {}
    for _ in range(50):
        if not gen.active:
            break
        for o in gen.step():
            got.setdefault(o.request_id, []).append(o)
    assert not gen.active
    return got


def _tokens(outs: list[StepOutput]) -> list[int]:
    return [o.token_id for o in outs if o.token_id is not None]


def _alone(model: LlamaModel, prompt: list[int], params: SamplingParams) -> list[int]:
    gen = BatchGenerator(model, 1, 256, eos_token_ids=[])
    gen.add("alone", prompt, params)
    return _tokens(_run(gen)["alone"])


def _packed_run(model: LlamaModel, forward: Callable[..., torch.Tensor], prompts: list[list[int]],
                monkeypatch: pytest.MonkeyPatch) -> dict[str, list[StepOutput]]:
    """``prompts`` through a packing batcher of ``model`` whose forward is ``forward``."""
    monkeypatch.setattr(model, "forward", forward)
    gen = BatchGenerator(model, 3, 256, eos_token_ids=[], prefill_chunk=64, pack_prefill=True)
    for i, prompt in enumerate(prompts):
        gen.add(f"r{i}", prompt, PARAMS[0])
    return _run(gen)


def _assert_alone(model: LlamaModel, prompts: list[list[int]],
                  got: dict[str, list[StepOutput]], rows: tuple[int, ...]) -> None:
    """The requests ``rows`` got the tokens they get alone."""
    for i in rows:
        assert _tokens(got[f"r{i}"]) == _alone(model, prompts[i], PARAMS[0]), i


def test_equal_chunks_prefill_in_one_forward_and_keep_their_tokens(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    prompts = _prompts(tokenizer)
    counting = CountingModel(fast_model)
    gen = BatchGenerator(counting, 4, 256, eos_token_ids=[], prefill_chunk=64, pack_prefill=True)
    for i, (prompt, params) in enumerate(zip(prompts, PARAMS, strict=True)):
        gen.add(f"r{i}", prompt, params)
    first = gen.step()
    # the three prompts of one length in one forward; the shorter one alone
    assert sorted(counting.calls) == sorted([(3, LENGTH), (1, len(prompts[3]))])
    assert {o.request_id for o in first} == {"r0", "r1", "r2", "r3"}
    got = _run(gen)
    for i, (prompt, params) in enumerate(zip(prompts, PARAMS, strict=True)):
        mine = [o.token_id for o in first if o.request_id == f"r{i}"] + _tokens(got[f"r{i}"])
        assert mine == _alone(fast_model, prompt, params), i


def test_a_packed_forward_that_raises_fails_only_the_culprit(
    fast_model: LlamaModel, tokenizer: EngineTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = _prompts(tokenizer)[:3]
    poison = min(set(prompts[1]) - set(prompts[0]) - set(prompts[2]))  # in r1's prompt only
    real_forward = fast_model.forward

    def forward(
        tokens: torch.Tensor, step: StepInputs, cache: KVCache, every_position: bool = False
    ) -> torch.Tensor:
        if step.n_new > 1 and bool((tokens == poison).any()):
            raise RuntimeError("poisoned chunk")
        return real_forward(tokens, step, cache, every_position)

    got = _packed_run(fast_model, forward, prompts, monkeypatch)
    assert [o.finish_reason for o in got["r1"]] == ["error"]
    assert "poisoned chunk" in (got["r1"][0].error or "")
    monkeypatch.undo()
    _assert_alone(fast_model, prompts, got, (0, 2))


def test_non_finite_logits_of_one_packed_row_fail_that_request_only(
    fast_model: LlamaModel, tokenizer: EngineTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = _prompts(tokenizer)[:3]
    real_forward = fast_model.forward

    def forward(
        tokens: torch.Tensor, step: StepInputs, cache: KVCache, every_position: bool = False
    ) -> torch.Tensor:
        logits = real_forward(tokens, step, cache, every_position)
        if step.n_new > 1 and len(step.slots) == 3:  # the packed prefill: row 2 broken
            logits[2, 7] = float("nan")
        return logits

    got = _packed_run(fast_model, forward, prompts, monkeypatch)
    assert [o.finish_reason for o in got["r2"]] == ["error"]
    assert "non-finite" in (got["r2"][0].error or "")
    monkeypatch.undo()
    _assert_alone(fast_model, prompts, got, (0, 1))


def test_only_a_model_whose_rows_compute_apart_packs_its_prefill(
    fast_model: LlamaModel, dense_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    """F.linear's results move with the row count (the dense format): its batcher does not
    pack; the C kernels' do not, so the engine's batcher for them does."""
    skip_without_kernels("q4")
    assert rows_apart(fast_model) and not rows_apart(dense_model)
    for model, packs in ((fast_model, True), (dense_model, False)):
        counting = CountingEngineModel(model)
        engine = Engine(config=model.config, model=counting, tokenizer=tokenizer)  # type: ignore[arg-type]
        gen = engine.batch_generator(4, 256)
        assert gen.pack_prefill is packs
        for i, prompt in enumerate(_prompts(tokenizer)[:3]):
            gen.add(f"r{i}", prompt, PARAMS[0])
        gen.step()
        assert counting.calls == ([(3, LENGTH)] if packs else [(1, LENGTH)] * 3)
