"""The pure runner-memory estimate (its agreement with measured RSS: test_engine_memory.py)."""

from exo.shared.models.memory import (
    KV_PAGE,
    RUNNER_OVERHEAD_BYTES,
    estimate_runner_memory,
    kv_cache_bytes,
    running_weight_bytes,
)


def test_running_weights_follow_the_engines_formats() -> None:
    assert running_weight_bytes(64_000, "BF16") == 34_000  # q8 blocks: 34 bytes per 32 values
    assert running_weight_bytes(128_000, "F32") == 34_000
    assert running_weight_bytes(18_000, "Q4_0") == 18_000  # run as the file holds it
    assert running_weight_bytes(50_000, "Q4_K") == 50_000  # the file's bytes
    assert running_weight_bytes(64_000, "F16", kernels=False) == 64_000  # fbgemm float16


def test_the_kv_cache_counts_whole_pages() -> None:
    per_position = 2 * 30 * 3 * 64 * 2  # k and v, 30 layers, 3 kv heads, hd 64, float16
    assert kv_cache_bytes(30, 3, 64, KV_PAGE, 1) == per_position * KV_PAGE
    assert kv_cache_bytes(30, 3, 64, KV_PAGE + 1, 2) == per_position * 2 * KV_PAGE * 2


def test_the_total_adds_weights_cache_and_overhead() -> None:
    e = estimate_runner_memory(
        weight_file_bytes=10**9, file_format="Q8_0", n_layers=32, kv_heads=8, head_dim=128,
        max_seq=4096, max_batch=4,
    )  # fmt: skip
    assert e.weights == 10**9 and e.kv_cache == 2 * 32 * 8 * 128 * 4096 * 4 * 2
    assert e.total == e.weights + e.kv_cache + RUNNER_OVERHEAD_BYTES
