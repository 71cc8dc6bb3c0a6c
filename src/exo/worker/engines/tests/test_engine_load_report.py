"""The one log line of a load: formats per tensor kind, kernels (or why not), bytes, time."""

import re
from pathlib import Path

import pytest
import torch
from loguru import logger

from exo.modelgen.custom import llama_gguf
from exo.worker.engines.cpu_kernels import load_kernels
from exo.worker.engines.engine import load_engine, load_shard_weights
from exo.worker.engines.linear import choose_weight_format
from exo.worker.engines.llama import LlamaModel
from exo.worker.engines.load_report import describe_load, load_plan, shard_bytes


def test_the_load_line_names_formats_kernels_bytes_and_time(tmp_path: Path) -> None:
    path = llama_gguf(tmp_path / "m.gguf", "Q4_K_M")
    kernels = load_kernels()
    cpu = torch.device("cpu")
    weights = load_shard_weights(path, 0, 2, plan=load_plan(cpu, torch.float32, kernels, None))
    fmt = choose_weight_format(weights.source_format, cpu, torch.float32, kernels)
    model = LlamaModel(weights, weight_format=fmt, kernels=kernels)
    line = describe_load(path, weights, model, 1.25)
    assert "in 1.25 s" in line
    # llama.cpp's Q4_K_M mix: of 2 blocks, the last one's attn_v in Q6_K
    assert "'wq:Q4_K': 2" in line and "'wv:Q6_K': 1" in line and "'wv:Q4_K': 1" in line
    assert "'head:Q6_K': 1" in line
    if kernels is not None:
        # one call reads both types (re-laid in 8-row groups where an x86 build runs)
        groups = " (8-row groups)" if kernels.x86 else ""
        assert f"'qkv: Q4_K{groups} + Q6_K{groups} C kernel': 1" in line
        assert f"'qkv: Q4_K{groups} C kernel': 1" in line
    else:
        assert "Q4_K dequantised per call in torch (the compiled CPU kernels are not" in line
    mib = shard_bytes(weights) / 2**20
    assert f"running weights {mib:.1f} MiB" in line
    assert "KV cache 2048 bytes per position" in line  # k and v x 2 layers x 2 kv heads x 64 x 4


def test_load_engine_logs_the_line_once(gguf_path: Path, tokenizer_cache: Path) -> None:
    if load_kernels() is None:
        pytest.skip("the q4 kernel line needs the compiled kernels")
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO")
    try:
        load_engine(gguf_path, 28, 30, cache_dir=tokenizer_cache)
    finally:
        logger.remove(sink)
    loaded = [line for line in lines if "loaded " in line and "running weights" in line]
    assert len(loaded) == 1
    assert "'w_gate:Q4_1': 2" in loaded[0]
    # Q4_1 re-laid in 8-row groups where the AVX2 build runs
    assert re.search(r"'gate_up: Q4_1( \(8-row groups\))? C kernel': 2", loaded[0])
