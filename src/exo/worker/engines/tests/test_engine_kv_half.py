"""The float16 KV cache, the default of a float32 model on the CPU (`kv_cache.py`): what picks
it, what it stores, and that the embedded model's logits stay within its rounding of the float32
cache's, in the torch path and the compiled decode attention alike, batched or alone.

(The other engine tests keep a float32 cache: conftest.py's `float32_kv_cache`.)"""

from pathlib import Path
from typing import cast

import pytest
import torch
from loguru import logger
from torch import Tensor

from exo.worker.engines.batch import BatchGenerator, StepOutput
from exo.worker.engines.cpu_kernels import QKernels, load_kernels
from exo.worker.engines.kv_cache import KVCache, kv_cache_dtype
from exo.worker.engines.llama import LlamaModel, StepInputs
from exo.worker.engines.load_report import describe_load
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.weights import ShardWeights

from .kernel_skip import skip_without_kernels

CPU = torch.device("cpu")
PROMPT = list(range(100, 160))
N_DECODE = 12


@pytest.fixture(scope="module")
def kernels() -> QKernels:
    skip_without_kernels("q8")  # the compiled decode attention comes with them
    return cast(QKernels, load_kernels())


def _model(
    weights: ShardWeights, kv: str, kernels: QKernels | None, monkeypatch: pytest.MonkeyPatch
) -> LlamaModel:
    """The embedded model, dequantised (the float reference's arithmetic), with a `kv` cache;
    `kernels`: the compiled decode attention (None: the torch path)."""
    monkeypatch.setenv("EXO_KV_CACHE", kv)
    return LlamaModel(weights, weight_format="dense", kernels=kernels)


def _decode(model: LlamaModel, forced: list[int] | None) -> tuple[list[int], list[Tensor]]:
    """PROMPT, then N_DECODE steps of one token (`forced`'s, or the greedy ones): each step's
    logits and the tokens fed."""
    cache = model.new_cache(1, 128)
    tokens: list[int] = []
    logits: list[Tensor] = []
    with torch.inference_mode():
        last = model.forward(torch.tensor([PROMPT]), StepInputs.single(0, 0, len(PROMPT)), cache)
        for i in range(N_DECODE):
            logits.append(last[0])
            tokens.append(int(last[0].argmax()) if forced is None else forced[i])
            step = StepInputs.single(0, len(PROMPT) + i, 1)
            last = model.forward(torch.tensor([[tokens[-1]]]), step, cache)
    return tokens, logits


def test_a_float32_cpu_model_gets_a_float16_cache_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("EXO_KV_CACHE", raising=False)
    assert kv_cache_dtype(torch.float32, CPU) == torch.float16
    monkeypatch.setenv("EXO_KV_CACHE", "f32")
    assert kv_cache_dtype(torch.float32, CPU) == torch.float32
    monkeypatch.setenv("EXO_KV_CACHE", " F16 ")
    assert kv_cache_dtype(torch.float32, CPU) == torch.float16
    # a model computing in another type, or off the CPU, keeps its own type
    assert kv_cache_dtype(torch.bfloat16, CPU) == torch.bfloat16
    assert kv_cache_dtype(torch.float32, torch.device("cuda")) == torch.float32
    messages: list[str] = []
    sink = logger.add(lambda m: messages.append(str(m)), level="WARNING")
    try:
        monkeypatch.setenv("EXO_KV_CACHE", "q8")
        assert kv_cache_dtype(torch.float32, CPU) == torch.float16
    finally:
        logger.remove(sink)
    assert any("EXO_KV_CACHE='q8' is not f16 or f32" in m for m in messages), messages


def test_keys_are_rounded_once_when_stored_and_read_back_as_float32() -> None:
    cache = KVCache(2, 1, 200, 3, 8, dtype=torch.float16, device=CPU)
    torch.manual_seed(0)
    k, v = torch.randn(1, 70, 3, 8), torch.randn(1, 70, 3, 8)  # 70 positions: two pages
    cache.prepare((0,), (0,), 70)
    keys, values = cache.layer(1).write_and_read(k, v, 70)
    assert keys.dtype == torch.float32 and keys.shape == (1, 3, 70, 8)
    assert torch.equal(keys, k.half().float().transpose(1, 2))
    assert torch.equal(values, v.half().float().transpose(1, 2))
    assert cache.page_bytes == KVCache(2, 1, 200, 3, 8, dtype=torch.float32, device=CPU).page_bytes // 2


def test_the_model_reports_and_sizes_a_half_cache(
    gguf_path: Path, full_weights: ShardWeights, monkeypatch: pytest.MonkeyPatch
) -> None:
    half = _model(full_weights, "f16", None, monkeypatch)
    full = _model(full_weights, "f32", None, monkeypatch)
    assert half.kv_dtype == torch.float16 and full.kv_dtype == torch.float32
    assert half.kv_bytes_per_position() * 2 == full.kv_bytes_per_position()
    cache = half.new_cache(1, 64)
    cache.prepare((0,), (0,), 1)
    assert next(iter(cache.pages.values())).dtype == torch.float16
    line = describe_load(gguf_path, full_weights, half, 1.0)
    assert f"KV cache {half.kv_bytes_per_position()} bytes per position (torch.float16)" in line


@pytest.mark.parametrize("compiled", [False, True], ids=["torch", "compiled"])
def test_logits_stay_within_the_half_caches_rounding(
    full_weights: ShardWeights,
    kernels: QKernels,
    monkeypatch: pytest.MonkeyPatch,
    compiled: bool,
) -> None:
    """Teacher-forced on the float32 cache's greedy tokens: each step's logits (of a scale of
    ~25) move by ~5e-3 with the half cache (measured), the top token not at all; a half cache
    that stored keys or values wrongly (a swapped page, a truncation, an unscaled or misread
    half) moves them by whole units."""
    want_tokens, want = _decode(_model(full_weights, "f32", None, monkeypatch), None)
    model = _model(full_weights, "f16", kernels if compiled else None, monkeypatch)
    tokens, got = _decode(model, want_tokens)
    assert tokens == want_tokens
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert int(g.argmax()) == int(w.argmax()), step
        torch.testing.assert_close(g, w, atol=3e-2, rtol=0, msg=f"step {step}")
    if compiled:  # the compiled attention reads the same half cache as the torch path
        _, torch_path = _decode(_model(full_weights, "f16", None, monkeypatch), want_tokens)
        for step, (g, w) in enumerate(zip(got, torch_path, strict=True)):
            torch.testing.assert_close(g, w, atol=5e-3, rtol=0, msg=f"step {step}")


def _tokens(outs: list[StepOutput]) -> list[int]:
    return [o.token_id for o in outs if o.token_id is not None]


def test_a_request_gets_the_same_tokens_alone_or_in_a_batch(
    full_weights: ShardWeights, kernels: QKernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of a batch share no rounding: each row's keys are rounded by themselves."""
    model = _model(full_weights, "f16", kernels, monkeypatch)
    prompts = [PROMPT, PROMPT[5:40], list(range(300, 347))]
    greedy = SamplingParams(temperature=0.0, max_tokens=10)

    def alone(prompt: list[int]) -> list[int]:
        gen = BatchGenerator(model, 1, 128, eos_token_ids=[])
        gen.add("x", prompt, greedy)
        outs: list[StepOutput] = []
        while gen.active:
            outs.extend(gen.step())
        return _tokens(outs)

    gen = BatchGenerator(model, 4, 128, eos_token_ids=[])
    outputs: dict[str, list[StepOutput]] = {}
    for step in range(60):  # b joins after two steps, c after four: they share decode steps
        if step in (0, 2, 4):
            gen.add(str(step), prompts[step // 2], greedy)
        for out in gen.step():
            outputs.setdefault(out.request_id, []).append(out)
        if step > 4 and not gen.active:
            break
    for step, prompt in zip((0, 2, 4), prompts, strict=True):
        assert _tokens(outputs[str(step)]) == alone(prompt), step
