"""What the batcher adds for OpenAI completions and logit_bias: the prompt's log-probabilities
from the prefill (against transformers' log_softmax, chunked or not, max_tokens 0), logit
bias (greedy included, a request's tokens the same alone or batched), and logits that are
not finite failing only their own request."""

from pathlib import Path

import pytest
import torch

from exo.modelgen.custom import Size, llama_gguf
from exo.worker.engines.batch import BatchGenerator, StepOutput
from exo.worker.engines.gguf_loader import load_gguf_shard
from exo.worker.engines.llama import LlamaModel
from exo.worker.engines.sampling import SamplingParams, TokenLogprobs
from exo.worker.engines.tests.hf_reference import transformers_llama
from exo.worker.engines.tests.nan_model import poison_token_embedding
from exo.worker.engines.tokenizer import EngineTokenizer

TEXT = "The quick brown fox jumps over the lazy dog. Paris is the capital of France."


def _run(gen: BatchGenerator, max_steps: int = 200) -> dict[str, list[StepOutput]]:
    outputs: dict[str, list[StepOutput]] = {}
    for _ in range(max_steps):
        if not gen.active:
            break
        for out in gen.step():
            outputs.setdefault(out.request_id, []).append(out)
    assert not gen.active
    return outputs


def _scores(model: LlamaModel, prompt: list[int], chunk: int, max_tokens: int = 0) -> tuple[
    list[TokenLogprobs], list[StepOutput]
]:  # fmt: skip
    sink: list[TokenLogprobs] = []
    gen = BatchGenerator(model, 2, 128, prefill_chunk=chunk)
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, top_logprobs=3, prompt_logprob_sink=sink
    )
    gen.add("scored", prompt, params)
    return sink, _run(gen)["scored"]


@pytest.fixture(scope="module")
def reference(gguf_path: Path, tokenizer: EngineTokenizer) -> tuple[list[int], torch.Tensor]:
    """The prompt and transformers' log-probabilities of each of its tokens after the first."""
    prompt = tokenizer.encode(TEXT, add_special_tokens=True)
    model = transformers_llama(gguf_path)
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0]  # [T, V]
    lp = torch.log_softmax(logits.float(), dim=-1)
    return prompt, lp[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]


def test_prompt_logprobs_match_transformers_chunked_or_not(
    dense_model: LlamaModel, reference: tuple[list[int], torch.Tensor]
) -> None:
    prompt, expected = reference
    whole, outs = _scores(dense_model, prompt, chunk=512)
    # max_tokens 0: the prompt scored, no token, finished by its length
    assert [(o.token_id, o.finish_reason) for o in outs] == [(None, "length")]
    assert [e.token for e in whole] == prompt[1:]
    ours = torch.tensor([e.logprob for e in whole])
    torch.testing.assert_close(ours, expected, atol=2e-3, rtol=1e-4)
    for e in whole:  # the alternatives are the most likely tokens, best first
        assert len(e.top) == 3 and e.top[0][1] >= e.top[1][1] >= e.top[2][1]
        assert e.top[0][1] >= e.logprob - 1e-5
    chunked, _ = _scores(dense_model, prompt, chunk=5)
    torch.testing.assert_close(torch.tensor([e.logprob for e in chunked]), ours, atol=1e-4, rtol=0)


def test_scoring_the_prompt_does_not_change_the_tokens(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Name a fruit."}])
    sink, outs = _scores(fast_model, prompt, chunk=7, max_tokens=6)
    assert len(sink) == len(prompt) - 1
    gen = BatchGenerator(fast_model, 1, 128, prefill_chunk=7)
    gen.add("plain", prompt, SamplingParams(temperature=0.0, max_tokens=6))
    plain = _run(gen)["plain"]
    assert [o.token_id for o in outs] == [o.token_id for o in plain]


def test_logit_bias_steers_greedy_and_stays_per_request(
    fast_model: LlamaModel, tokenizer: EngineTokenizer
) -> None:
    prompt = tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    forced = tokenizer.encode(" banana")[0]

    def tokens(outs: list[StepOutput]) -> list[int]:
        return [o.token_id for o in outs if o.token_id is not None]

    gen = BatchGenerator(fast_model, 1, 128)
    gen.add("free", prompt, SamplingParams(temperature=0.0, max_tokens=4))
    free = tokens(_run(gen)["free"])
    banned = SamplingParams(temperature=0.0, max_tokens=4, logit_bias=((free[0], -100.0),))
    pushed = SamplingParams(temperature=0.0, max_tokens=4, logit_bias=((forced, 100.0),))
    alone: dict[str, list[int]] = {}
    for name, params in (("banned", banned), ("pushed", pushed)):
        gen = BatchGenerator(fast_model, 1, 128)
        gen.add(name, prompt, params)
        alone[name] = tokens(_run(gen)[name])
    assert alone["banned"][0] != free[0] and free[0] not in alone["banned"]
    assert alone["pushed"] == [forced] * 4
    # the same requests batched together (and with an unbiased one) answer the same
    gen = BatchGenerator(fast_model, 3, 128)
    gen.add("free", prompt, SamplingParams(temperature=0.0, max_tokens=4))
    gen.add("banned", prompt, banned)
    gen.add("pushed", prompt, pushed)
    batched = {k: tokens(v) for k, v in _run(gen).items()}
    assert batched == {"free": free, **alone}


def test_logit_bias_outside_the_vocabulary_is_refused(dense_model: LlamaModel) -> None:
    gen = BatchGenerator(dense_model, 1, 64)
    vocab = dense_model.config.vocab
    with pytest.raises(ValueError, match="logit_bias"):
        gen.add("r", [1, 2], SamplingParams(max_tokens=1, logit_bias=((vocab, 1.0),)))


def test_non_finite_logits_fail_only_their_request(tmp_path: Path) -> None:
    """A token whose embedding is NaN poisons every prompt that holds it; the batcher fails
    that request with a clear error and the others in the same steps go on."""
    path = poison_token_embedding(llama_gguf(tmp_path / "nan.gguf", "F32", Size(layers=1)), 7)
    model = LlamaModel(load_gguf_shard(path, 0, 1), weight_format="dense")
    gen = BatchGenerator(model, 3, 64)
    gen.add("poisoned", [5, 7, 9], SamplingParams(temperature=0.0, max_tokens=4))
    gen.add("fine", [5, 8, 9], SamplingParams(temperature=0.0, max_tokens=4))
    outs = _run(gen)
    (failed,) = outs["poisoned"]
    assert failed.finish_reason == "error" and failed.error is not None
    assert "non-finite logits" in failed.error and "NaN" in failed.error
    assert len([o for o in outs["fine"] if o.token_id is not None]) == 4
    # A request that meets the poisoned token only while decoding fails there, alone.
    to_poison = SamplingParams(temperature=0.0, max_tokens=8, logit_bias=((7, 100.0),))
    gen.add("late", [5, 8, 9], to_poison)
    gen.add("fine", [5, 8, 9], SamplingParams(temperature=0.0, max_tokens=4))
    outs = _run(gen)
    assert outs["late"][-1].finish_reason == "error"
    assert [o.token_id for o in outs["late"][:-1]] == [7]
    assert len([o for o in outs["fine"] if o.token_id is not None]) == 4
