"""Memory-faithful loading, measured in a fresh process (psutil), for each supported format.

For a generated model: running weights <= 1.15x their bytes in the file; the load's peak
resident memory over the memory before it <= 1.2x the running size (anonymous memory: library
code the load pages in for the first time is not counted, `memory_probe`'s `load_peak`); and
the pure estimate (`exo.shared.models.memory`) within 10% of the process's RSS with its KV
cache at the maximum, both as the engine sees the file and as placement sees it through the
model's card (the KV cache at a runner's maximum: EXO_RUNNER_MAX_BATCH requests of the served
context).
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from exo.master.placement_memory import pipeline_memory
from exo.modelgen.custom import Size, llama_gguf, llama_safetensors
from exo.shared.constants import EXO_RUNNER_MAX_BATCH
from exo.shared.models.memory import estimate_runner_memory, runner_max_seq
from exo.worker.download.local import card_from_path

pytestmark = [pytest.mark.slow]

SHAPE = Size(layers=6, hidden=1024, ffn=2816, heads=16, kv_heads=4, vocab=16384)
# What a runner serves and placement reserves: 8 requests of 2048 tokens (the file's context).
MAX_BATCH, MAX_SEQ = EXO_RUNNER_MAX_BATCH, runner_max_seq(2048)


def probe(path: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "EXO_KV_CACHE"}  # a node's default cache
    out = subprocess.run(
        [sys.executable, "-m", "exo.worker.engines.tests.memory_probe", str(path),
         str(MAX_BATCH), str(MAX_SEQ)],
        capture_output=True, text=True, timeout=240, env=env, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("recipe", ["Q4_K_M", "Q8_0", "F16", "BF16-safetensors"])
def test_load_is_memory_faithful_and_the_estimate_holds(tmp_path: Path, recipe: str) -> None:
    if recipe == "BF16-safetensors":
        path = llama_safetensors(tmp_path / "hf", SHAPE)
    else:
        path = llama_gguf(tmp_path / "m.gguf", recipe, SHAPE)
    r = probe(path)
    assert r["running"] <= 1.15 * r["file_bytes"], r
    assert r["load_peak"] <= 1.2 * r["running"], r
    estimate = estimate_runner_memory(
        weight_file_bytes=r["file_bytes"],
        file_format=r["file_format"],
        n_layers=r["n_layers"],
        kv_heads=r["kv_heads"],
        head_dim=r["head_dim"],
        max_seq=MAX_SEQ,
        max_batch=MAX_BATCH,
        kernels=r["kernels"],
    )
    assert r["kv_bytes"] == estimate.kv_cache
    assert abs(estimate.weights - r["running"]) <= 0.02 * r["running"], (estimate, r)
    assert abs(estimate.total - r["full"]) <= 0.10 * r["full"], (estimate.total, r)
    card = card_from_path(path)
    assert card.storage_size.in_bytes == r["file_bytes"], (card, r)
    placed = pipeline_memory(card, 0, card.n_layers)
    assert abs(placed - r["full"]) <= 0.10 * r["full"], (placed, r)
