"""How much memory a runner needs for a shard: pure arithmetic, no files, no torch.

    runner = weights in their running format + KV cache at the configured maximum + overhead

Running format (the engine's memory-faithful load, `worker/engines/materialise.py`): GGUF block
types keep the file's bytes (Q4_0 included, since the kernels run its blocks); float matrices
(F32 / F16 / BF16) become q8 blocks (34 bytes per 32 values) where the compiled CPU kernels run,
and stay in the activation dtype elsewhere. The KV cache holds keys and values of every layer,
slot and position in the activation dtype (float32 on a CPU); MLA models (DeepSeek, Kimi)
cache one latent of kv_lora_rank + qk_rope_head_dim values a position and layer instead. The
overhead is the resident memory of a runner process before it loads weights (Python, torch, the engine, its kernels),
measured on Linux x86 with torch 2.13 (see the test that checks this estimate).
"""

from dataclasses import dataclass

from exo.shared.constants import EXO_MAX_CONTEXT_TOKENS

RUNNER_OVERHEAD_BYTES = (
    256 * 2**20
)  # measured: 240 MiB after imports + ~16 MiB of first-use buffers

# Running bytes per file byte for the matrices of each file format (CPU with the kernels).
_RATIO_WITH_KERNELS: dict[str, float] = {
    "F32": 34 / 128,
    "F16": 34 / 64,
    "BF16": 34 / 64,
}


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int
    kv_cache: int
    overhead: int
    vision: int = 0
    """The vision tower and one image's encoding (the first pipeline stage of a vision model)."""

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.overhead + self.vision


def running_weight_bytes(file_bytes: int, file_format: str, *, kernels: bool = True) -> int:
    """Bytes of weights in memory for `file_bytes` of weights stored as `file_format`.

    Without the kernels (no AVX2, a GPU) float matrices run in the activation dtype: 16-bit
    on a GPU (ratio 1 for F16 / BF16 files); quantised blocks are kept as they are.
    """
    fmt = file_format.upper()
    if kernels:
        return round(file_bytes * _RATIO_WITH_KERNELS.get(fmt, 1.0))
    return round(file_bytes * (0.5 if fmt == "F32" else 1.0))


def runner_max_seq(context_length: int) -> int:
    """The positions per request a runner serves (and sizes its KV cache for)."""
    return min(context_length, EXO_MAX_CONTEXT_TOKENS)


KV_PAGE = 64  # positions per KV cache page (worker/engines/kv_cache.py)
# bytes of a cached key or value element: the engine's default float16 cache (kv_cache.py; on a
# GPU the model's bfloat16 / float16); a node run with EXO_KV_CACHE=f32 holds twice the estimate
KV_DTYPE_BYTES = 2


def kv_cache_bytes(
    n_layers: int,
    kv_heads: int,
    head_dim: int,
    max_seq: int,
    max_batch: int,
    dtype_bytes: int = KV_DTYPE_BYTES,
) -> int:
    """Keys and values of `n_layers` layers, `max_batch` slots of `max_seq` positions (whole
    pages: the cache grows in pages of KV_PAGE positions)."""
    positions = -(-max_seq // KV_PAGE) * KV_PAGE
    return 2 * n_layers * kv_heads * head_dim * positions * max_batch * dtype_bytes


def mla_kv_bytes_per_token(
    n_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, dtype_bytes: int = 4
) -> int:
    """MLA's cache of one position over `n_layers` layers: the latent and the shared rotary
    key (kv_lora_rank + qk_rope_head_dim values, rounded up to even: the page holds it as two
    halves), the engine's `models/mla.py`."""
    return n_layers * 2 * (-(-(kv_lora_rank + qk_rope_head_dim) // 2)) * dtype_bytes


def latent_cache_bytes(bytes_per_position: int, max_seq: int, max_batch: int) -> int:
    """A cache of `bytes_per_position` a position (its layers together; MLA's latents), for
    `max_batch` slots of `max_seq` positions in whole pages."""
    positions = -(-max_seq // KV_PAGE) * KV_PAGE
    return bytes_per_position * positions * max_batch


def estimate_runner_memory(
    *,
    weight_file_bytes: int,
    file_format: str,
    n_layers: int,
    kv_heads: int,
    head_dim: int,
    max_seq: int,
    max_batch: int,
    kernels: bool = True,
    kv_dtype_bytes: int = KV_DTYPE_BYTES,
    overhead: int = RUNNER_OVERHEAD_BYTES,
    kv_bytes_per_position: int = 0,
    vision_bytes: int = 0,
) -> MemoryEstimate:
    """The memory of a runner holding `n_layers` layers whose weights take `weight_file_bytes`
    in the file, with its KV cache grown to `max_batch` x `max_seq`: keys and values of
    `kv_heads` heads, or `kv_bytes_per_position` a position for its layers when not 0 (MLA)."""
    kv = kv_cache_bytes(n_layers, kv_heads, head_dim, max_seq, max_batch, kv_dtype_bytes)
    if kv_bytes_per_position:
        kv = latent_cache_bytes(kv_bytes_per_position, max_seq, max_batch)
    return MemoryEstimate(
        weights=running_weight_bytes(weight_file_bytes, file_format, kernels=kernels),
        kv_cache=kv,
        overhead=overhead,
        vision=vision_bytes,
    )
