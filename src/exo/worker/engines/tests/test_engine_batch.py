"""Continuous batching on the embedded model: batch == alone, joins and leaves, failures."""

import pytest
import torch

from exo.worker.engines.batch import BatchGenerator, StepOutput
from exo.worker.engines.kv_cache import KVCache
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.sampling import GREEDY, SamplingParams
from exo.worker.engines.tokenizer import EngineTokenizer

QUESTIONS = ["What is the capital of France?", "Name a fruit.", "Count to five, please."]


def _prompts(tokenizer: EngineTokenizer) -> list[list[int]]:
    return [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]


def _run(gen: BatchGenerator, max_steps: int = 100) -> dict[str, list[StepOutput]]:
    outputs: dict[str, list[StepOutput]] = {}
    for _ in range(max_steps):
        if not gen.active:
            break
        for out in gen.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert not gen.active
    return outputs


def _tokens(outs: list[StepOutput]) -> list[int]:
    return [o.token_id for o in outs if o.token_id is not None]


def _alone(model: LlamaModel, prompt: list[int], n: int) -> list[int]:
    gen = BatchGenerator(model, 1, 128, eos_token_ids=[2])
    gen.add("alone", prompt, SamplingParams(temperature=0.0, max_tokens=n))
    return _tokens(_run(gen)["alone"])


def test_greedy_batch_equals_each_request_alone(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    prompts = _prompts(tokenizer)
    gen = BatchGenerator(fast_model, 4, 128, eos_token_ids=[2])
    gen.add("a", prompts[0], SamplingParams(temperature=0.0, max_tokens=8))
    outputs: dict[str, list[StepOutput]] = {}
    for step in range(40):  # b joins after two steps, c after four: they share decode steps
        if step == 2:
            gen.add("b", prompts[1], SamplingParams(temperature=0.0, max_tokens=6))
        if step == 4:
            gen.add("c", prompts[2], SamplingParams(temperature=0.0, max_tokens=8))
        for out in gen.step():
            outputs.setdefault(out.request_id, []).append(out)
        if step > 4 and not gen.active:
            break
    for rid, prompt, n in (("a", prompts[0], 8), ("b", prompts[1], 6), ("c", prompts[2], 8)):
        assert _tokens(outputs[rid]) == _alone(fast_model, prompt, n), rid
        assert outputs[rid][-1].finish_reason in ("stop", "length")
        assert all(o.finish_reason is None for o in outputs[rid][:-1])


def test_finish_reasons_and_more_requests_than_slots(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    prompts = _prompts(tokenizer)
    gen = BatchGenerator(fast_model, 2, 128, eos_token_ids=[2])
    first = _alone(fast_model, prompts[0], 3)
    gen.add("length", prompts[0], SamplingParams(temperature=0.0, max_tokens=3))
    gen.add("stop", prompts[0], SamplingParams(temperature=0.0, stop_token_ids=(first[1],)))
    gen.add("waits", prompts[1], SamplingParams(temperature=0.0, max_tokens=2))
    assert gen.active == 3
    outputs = _run(gen)
    assert [o.finish_reason for o in outputs["length"]] == [None, None, "length"]
    assert _tokens(outputs["stop"]) == first[:2] and outputs["stop"][-1].finish_reason == "stop"
    assert len(outputs["waits"]) == 2  # ran once a slot was free


def test_cache_length_limit_finishes_with_length(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    prompt = _prompts(tokenizer)[0]
    gen = BatchGenerator(fast_model, 1, len(prompt) + 3, eos_token_ids=[])
    gen.add("r", prompt, SamplingParams(temperature=0.0, max_tokens=100))
    outs = _run(gen)["r"]
    assert len(outs) == 4 and outs[-1].finish_reason == "length"


def test_cancel_frees_the_slot_and_others_continue(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    prompts = _prompts(tokenizer)
    gen = BatchGenerator(fast_model, 3, 128, eos_token_ids=[2])
    for rid, prompt in zip("xyz", prompts, strict=True):
        gen.add(rid, prompt, SamplingParams(temperature=0.0, max_tokens=6))
    gen.step()
    gen.step()
    assert gen.cancel("x") and not gen.cancel("x") and gen.running == 2
    outputs = _run(gen)
    assert "x" not in outputs
    for rid, prompt in zip("yz", prompts[1:], strict=True):  # moved slots, same tokens
        assert _tokens(outputs[rid]) == _alone(fast_model, prompt, 6)[2:]


def test_a_failing_request_does_not_break_the_others(
    fast_model: LlamaModel, tokenizer: EngineTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = _prompts(tokenizer)
    gen = BatchGenerator(fast_model, 3, 128, eos_token_ids=[2])
    gen.add("ok", prompts[0], SamplingParams(temperature=0.0, max_tokens=5))
    gen.add("bad", prompts[1], SamplingParams(temperature=0.7, seed=1, max_tokens=5))
    gen.step()

    def broken_multinomial(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("sampling exploded")

    monkeypatch.setattr(torch, "multinomial", broken_multinomial)
    outputs = _run(gen)
    assert outputs["bad"][-1].finish_reason == "error" and outputs["bad"][-1].token_id is None
    assert "sampling exploded" in (outputs["bad"][-1].error or "")
    assert _tokens(outputs["ok"]) == _alone(fast_model, prompts[0], 5)[1:]


def test_a_failing_decode_row_is_isolated(
    fast_model: LlamaModel, tokenizer: EngineTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = _prompts(tokenizer)
    gen = BatchGenerator(fast_model, 2, 128, eos_token_ids=[2])
    gen.add("ok", prompts[0], SamplingParams(temperature=0.0, max_tokens=4))
    gen.add("bad", prompts[2], SamplingParams(temperature=0.0, max_tokens=4))
    gen.step()
    bad_slot = 1
    real_forward = fast_model.forward

    def forward(tokens: torch.Tensor, step: StepInputs, cache: KVCache) -> torch.Tensor:
        if bad_slot in step.slots:
            raise RuntimeError("device lost")
        return real_forward(tokens, step, cache)

    monkeypatch.setattr(fast_model, "forward", forward)
    outputs = _run(gen)
    assert outputs["bad"][-1].finish_reason == "error"
    assert _tokens(outputs["ok"]) == _alone(fast_model, prompts[0], 4)[1:]


def test_add_validates_requests(fast_model: LlamaModel) -> None:
    gen = BatchGenerator(fast_model, 1, 16)
    with pytest.raises(ValueError):
        gen.add("empty", [], GREEDY)
    with pytest.raises(ValueError):
        gen.add("vocab", [49152], GREEDY)
    with pytest.raises(ValueError):
        gen.add("long", list(range(16)), GREEDY)
    gen.add("dup", [1, 2], GREEDY)
    with pytest.raises(ValueError):
        gen.add("dup", [1, 2], GREEDY)


def test_long_prompts_are_prefilled_in_chunks_while_others_decode(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    short, long = _prompts(tokenizer)[1], _prompts(tokenizer)[2]  # long: 3 chunks of <= 16
    assert 32 < len(long) <= 48
    gen = BatchGenerator(fast_model, 2, 128, eos_token_ids=[], prefill_chunk=16)
    gen.add("short", short[:16], SamplingParams(temperature=0.0, max_tokens=20))
    gen.step()
    gen.add("long", long, SamplingParams(temperature=0.0, max_tokens=3))
    per_step = [sorted(o.request_id for o in gen.step()) for _ in range(5)]
    assert per_step == [
        ["short"],
        ["short"],
        ["long", "short"],
        ["long", "short"],
        ["long", "short"],
    ]
    unchunked = _alone(fast_model, long, 3)  # one 40-token prefill
    gen2 = BatchGenerator(fast_model, 1, 128, eos_token_ids=[], prefill_chunk=16)
    gen2.add("long", long, SamplingParams(temperature=0.0, max_tokens=3))
    assert _tokens(_run(gen2)["long"]) == unchunked
