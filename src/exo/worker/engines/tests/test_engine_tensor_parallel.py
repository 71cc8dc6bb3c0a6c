"""Tensor-parallel slicing: three ranks with a summing all-reduce reproduce the whole model."""

import threading
from pathlib import Path

import pytest
import torch
from torch import Tensor

from exo.worker.engines.linear import WeightFormat
from exo.worker.engines.llama import AllReduce, LlamaModel, StepInputs
from exo.worker.engines.safetensors_loader import load_hf_shard
from exo.worker.engines.weights import ShardWeights, slice_layer, slice_shard

from .kernel_skip import skip_without_kernels
from .tiny_models import write_tiny_model

pytest.importorskip("transformers")

WORLD = 3
PROMPT = [5, 9, 33, 70, 101, 12]


class ThreadedAllReduce:
    """An all-reduce (sum) between ranks running in threads of one process."""

    def __init__(self, world: int) -> None:
        self._barrier = threading.Barrier(world)
        self._parts: list[Tensor | None] = [None] * world
        self._sum: Tensor | None = None

    def for_rank(self, rank: int) -> AllReduce:
        def all_reduce(x: Tensor) -> Tensor:
            self._parts[rank] = x
            if self._barrier.wait() == 0:
                self._sum = torch.stack([p for p in self._parts if p is not None]).sum(0)
            self._barrier.wait()
            out = self._sum
            self._barrier.wait()  # everyone has read it before the next call overwrites it
            assert out is not None
            return out

        return all_reduce


def _run(model: LlamaModel) -> list[Tensor]:
    cache = model.new_cache(1, 16)
    with torch.inference_mode():
        first = model.forward(torch.tensor([PROMPT]), StepInputs.single(0, 0, len(PROMPT)), cache)
        nxt = first.argmax(-1, keepdim=True)
        second = model.forward(nxt, StepInputs.single(0, len(PROMPT), 1), cache)
    return [first, second]


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory: pytest.TempPathFactory) -> ShardWeights:
    folder: Path = tmp_path_factory.mktemp("tiny-llama")
    write_tiny_model(folder, "qwen2")  # qkv biases: sliced with their heads
    return load_hf_shard(folder, 0, 3)


@pytest.mark.parametrize("fmt", ["dense", "q8"])
def test_three_way_slicing_with_summing_hook_equals_unsliced(
    tiny_weights: ShardWeights, fmt: WeightFormat
) -> None:
    skip_without_kernels(fmt)
    expected = _run(LlamaModel(tiny_weights, weight_format="dense"))
    reduce = ThreadedAllReduce(WORLD)
    results: list[list[Tensor]] = [[] for _ in range(WORLD)]
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            sliced = slice_shard(tiny_weights, rank, WORLD)
            model = LlamaModel(sliced, weight_format=fmt, all_reduce=reduce.for_rank(rank))
            results[rank] = _run(model)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    tol = 1e-4 if fmt == "dense" else 2e-2
    for rank_logits in results:
        for got, want in zip(rank_logits, expected, strict=True):
            torch.testing.assert_close(got, want, atol=tol, rtol=0.0)


def test_slicing_rejects_indivisible_heads(tiny_weights: ShardWeights) -> None:
    with pytest.raises(ValueError, match="divide"):
        slice_layer(tiny_weights.layers[0], tiny_weights.config, 0, 2)  # 3 kv heads
