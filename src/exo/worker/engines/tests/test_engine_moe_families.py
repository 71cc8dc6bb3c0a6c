"""Qwen3-MoE and gpt-oss against transformers, from safetensors and GGUF, whole, split into
pipeline shards, as two tensor-parallel ranks, and batched.

Tiny random models built by transformers' own `Qwen3MoeForCausalLM` / `GptOssForCausalLM`
(`moe_models.py`: every feature of each family kept) are saved as safetensors and written as
llama.cpp-named GGUF files (F32 and Q8_0).
"""

import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from exo.worker.engines.batch import BatchGenerator
from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.engine import load_family, load_shard_weights
from exo.worker.engines.materialise import DENSE_PLAN, kernel_plan
from exo.worker.engines.models.base import (
    AllReduce,
    BuildOptions,
    ShardModel,
    StepInputs,
    no_all_reduce,
)
from exo.worker.engines.sampling import SamplingParams
from exo.worker.engines.weights import TensorParallel

from .kernel_skip import skip_without_kernels
from .moe_models import CASES, build_hf_model, write_gguf
from .test_engine_tensor_parallel import ThreadedAllReduce

pytest.importorskip("transformers")

PROMPT = [5, 9, 33, 70, 101, 12, 44, 7, 150, 3, 88, 61]  # longer than gpt-oss's window (6)
PROMPTS = [PROMPT, [17, 140, 64, 31, 99, 8, 120], [3, 4], [77] * 9, [150, 149, 1, 20, 60]]
FAMILIES = list(CASES)


class _Models:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hf: dict[str, Any] = {}

    def reference(self, name: str) -> Any:
        if name not in self.hf:
            self.hf[name] = build_hf_model(CASES[name], self.tmp / name)
        return self.hf[name]

    def path(self, name: str, source: str) -> Path:
        model = self.reference(name)
        if source == "safetensors":
            return self.tmp / name
        path = self.tmp / f"{name}-{source}.gguf"
        if not path.exists():
            write_gguf(model, CASES[name], path, source)  # type: ignore[arg-type]
        return path


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> _Models:
    return _Models(tmp_path_factory.mktemp("moe-models"))


def load(
    path: Path,
    fmt: str = "dense",
    layers: tuple[int, int] | None = None,
    tp: TensorParallel | None = None,
    all_reduce: AllReduce = no_all_reduce,
) -> ShardModel:
    family, config = load_family(path)
    start, end = layers or (0, config.n_layers)
    kernels = load_kernels() if fmt == "q8" else None
    plan = kernel_plan(torch.float32, True) if fmt == "q8" else DENSE_PLAN
    weights = load_shard_weights(path, start, end, plan=plan, tensor_parallel=tp)
    options = BuildOptions(
        weight_format="q8" if fmt == "q8" else "dense", kernels=kernels, all_reduce=all_reduce
    )
    return family.build(weights, options)


def greedy(model: ShardModel, prompt: list[int], n: int) -> tuple[list[int], list[Tensor]]:
    """n greedy tokens decoded one at a time on the cache, and the logits of each."""
    cache = model.new_cache(1, len(prompt) + n)
    tokens, logits_seen = list[int](), list[Tensor]()
    with torch.inference_mode():
        logits = model.forward(torch.tensor([prompt]), StepInputs.single(0, 0, len(prompt)), cache)
        for i in range(n):
            logits_seen.append(logits[0])
            tokens.append(int(logits[0].argmax()))
            step = StepInputs.single(0, len(prompt) + i, 1)
            logits = model.forward(torch.tensor([[tokens[-1]]]), step, cache)
    return tokens, logits_seen


def hf_greedy(hf: Any, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("source", ["safetensors", "F32"])
def test_logits_match_transformers_at_every_position(
    models: _Models, name: str, source: str
) -> None:
    hf = models.reference(name)
    model = load(models.path(name, source))
    with torch.inference_mode():
        ref = hf(torch.tensor([PROMPT])).logits[0].float()
        ours = model.forward(
            torch.tensor([PROMPT]), StepInputs.single(0, 0, len(PROMPT)),
            model.new_cache(1, len(PROMPT)), every_position=True,
        )[0]  # fmt: skip
    span = float(ref.max() - ref.min())
    assert float((ours - ref).abs().max()) <= 1e-3 * span


@pytest.mark.parametrize("name", FAMILIES)
def test_a_prompt_in_chunks_matches_transformers_at_every_position(
    models: _Models, name: str
) -> None:
    """Chunks of 4 starting past gpt-oss's window (6) read only the keys their queries can
    see, the sinks path included."""
    hf = models.reference(name)
    model = load(models.path(name, "safetensors"))
    cache = model.new_cache(1, len(PROMPT))
    with torch.inference_mode():
        ref = hf(torch.tensor([PROMPT])).logits[0].float()
        ours = torch.cat([
            model.forward(
                torch.tensor([PROMPT[start : start + 4]]), StepInputs.single(0, start, 4),
                cache, every_position=True,
            )[0]
            for start in range(0, len(PROMPT), 4)
        ])  # fmt: skip
    span = float(ref.max() - ref.min())
    assert float((ours - ref).abs().max()) <= 1e-3 * span


@pytest.mark.parametrize("name", FAMILIES)
def test_32_greedy_tokens_match_transformers(models: _Models, name: str) -> None:
    ours, _ = greedy(load(models.path(name, "safetensors")), PROMPT, 32)
    assert ours == hf_greedy(models.reference(name), PROMPT, 32)


@pytest.mark.parametrize("name", FAMILIES)
def test_q8_gguf_greedy_matches_the_same_file_dequantised(models: _Models, name: str) -> None:
    skip_without_kernels("q8")
    path = models.path(name, "Q8_0")
    blocks, dense = load(path, "q8"), load(path)  # file blocks on the kernels | float32
    experts = [k for k in blocks.kernels_used() if k.startswith("expert")]
    assert experts and all("C kernel" in k for k in experts)  # the file's blocks, on the kernels
    for prompt in PROMPTS:
        assert greedy(blocks, prompt, 16)[0] == greedy(dense, prompt, 16)[0], prompt


def test_mxfp4_experts_of_a_gguf_load_and_run_through_the_streaming_path(models: _Models) -> None:
    skip_without_kernels("q8")
    path = models.path("gpt-oss", "MXFP4")
    blocks, dense = load(path, "q8"), load(path)
    experts = [k for k in blocks.kernels_used() if k.startswith("expert")]
    assert experts and all("MXFP4" in k for k in experts)  # dequantised a few rows at a time
    for prompt in PROMPTS[:2]:
        assert greedy(blocks, prompt, 16)[0] == greedy(dense, prompt, 16)[0], prompt


@pytest.mark.parametrize("name", FAMILIES)
def test_two_pipeline_shards_give_the_whole_models_tokens(models: _Models, name: str) -> None:
    path = models.path(name, "F32")
    whole, first, last = load(path), load(path, layers=(0, 2)), load(path, layers=(2, 3))
    caches = (first.new_cache(1, 64), last.new_cache(1, 64))
    ids, out = list(PROMPT), list[int]()
    with torch.inference_mode():
        for _ in range(8):
            n_new = len(PROMPT) if not out else 1
            step = StepInputs.single(0, len(ids) - n_new, n_new)
            hidden = first.forward_layers(
                first.embed(torch.tensor([ids[-n_new:]])), step, caches[0]
            )
            logits = last.head(last.forward_layers(hidden, step, caches[1])[:, -1])
            out.append(int(logits[0].argmax()))
            ids.append(out[-1])
    assert out == greedy(whole, PROMPT, 8)[0]


@pytest.mark.parametrize("name", FAMILIES)
def test_two_tensor_parallel_ranks_match_one(models: _Models, name: str) -> None:
    path = models.path(name, "safetensors")
    reduce = ThreadedAllReduce(2)
    ranks = [load(path, tp=TensorParallel(r, 2), all_reduce=reduce.for_rank(r)) for r in range(2)]
    results: list[list[int]] = [[], []]

    def run(r: int) -> None:
        results[r] = greedy(ranks[r], PROMPT, 8)[0]

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    expected = greedy(load(path), PROMPT, 8)[0]
    assert results[0] == results[1] == expected


@pytest.mark.parametrize("name", FAMILIES)
def test_a_batch_gives_each_request_its_own_result(models: _Models, name: str) -> None:
    skip_without_kernels("q8")
    model = load(models.path(name, "Q8_0"), "q8")
    a, b = PROMPTS[0], PROMPTS[1]
    alone = [greedy(model, p, 6)[1] for p in (a, b)]
    cache = model.new_cache(2, 64)
    with torch.inference_mode():
        la = model.forward(torch.tensor([a]), StepInputs.single(0, 0, len(a)), cache)
        lb = model.forward(torch.tensor([b]), StepInputs.single(1, 0, len(b)), cache)
        seen = [[la[0]], [lb[0]]]
        for i in range(5):  # decode steps of both rows together, at different positions
            toks = torch.tensor([[int(seen[0][-1].argmax())], [int(seen[1][-1].argmax())]])
            step = StepInputs((0, 1), (len(a) + i, len(b) + i), 1)
            both = model.forward(toks, step, cache)
            seen[0].append(both[0])
            seen[1].append(both[1])
    for row in range(2):
        for ours, ref in zip(seen[row], alone[row], strict=False):
            assert torch.equal(ours, ref)


def _generate(gen: BatchGenerator, requests: dict[str, list[int]], n: int) -> dict[str, list[int]]:
    for rid, prompt in requests.items():
        gen.add(rid, prompt, SamplingParams(temperature=0.0, max_tokens=n))
    out: dict[str, list[int]] = {rid: [] for rid in requests}
    for _ in range(200):
        if not gen.active:
            break
        for o in gen.step():
            if o.token_id is not None:
                out[o.request_id].append(o.token_id)
    assert not gen.active
    return out


@pytest.mark.parametrize("name", FAMILIES)
def test_the_batcher_and_its_prefix_cache_serve_moe_models(models: _Models, name: str) -> None:
    skip_without_kernels("q8")
    model = load(models.path(name, "Q8_0"), "q8")
    first = [(7 * i + 3) % 150 + 5 for i in range(40)]  # longer than two prefill chunks
    second = [*first, *PROMPTS[1]]  # the next turn: the first chunks are cached
    gen = BatchGenerator(model, 3, 128, eos_token_ids=[], prefill_chunk=16)
    _generate(gen, {"turn1": first}, 4)
    with_cache = _generate(gen, {"turn2": second, "a": PROMPTS[0], "b": PROMPTS[2]}, 8)
    fresh = BatchGenerator(model, 3, 128, eos_token_ids=[], prefill_chunk=16, prefix_cache=False)
    for rid, prompt in (("turn2", second), ("a", PROMPTS[0]), ("b", PROMPTS[2])):
        assert with_cache[rid] == _generate(fresh, {rid: prompt}, 8)[rid], rid


@pytest.mark.parametrize("name", FAMILIES)
def test_final_hidden_states_are_transformers_last_hidden_state(models: _Models, name: str) -> None:
    hf = models.reference(name)
    model = load(models.path(name, "safetensors"))
    with torch.inference_mode():
        ref = hf.model(torch.tensor([PROMPT])).last_hidden_state[0].float()
        ours = model.final_hidden(torch.tensor([PROMPT]))
    assert float((ours - ref).abs().max()) <= 1e-4 * float(ref.abs().max())
