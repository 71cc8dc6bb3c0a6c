"""How a shard is held (the storage plan for a device) and the one log line of a load."""

import ctypes
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import torch
from loguru import logger

from exo.worker.engines.cpu_kernels import QKernels
from exo.worker.engines.linear import WeightFormat, fp16_packing_available
from exo.worker.engines.materialise import StoragePlan, kernel_plan, kind_of, running_bytes
from exo.worker.engines.models.base import ShardModel
from exo.worker.engines.qtensor import QuantTensor, Weight
from exo.worker.engines.weights import ShardWeights


def load_plan(
    device: torch.device,
    dtype: torch.dtype,
    kernels: QKernels | None,
    weight_format: WeightFormat | None,
) -> StoragePlan:
    """Memory-faithful on a CPU (file blocks kept; see `materialise.py`). An explicit
    `weight_format` and other devices get plain tensors in `dtype` (wider than the file's
    blocks for quantised files: the load log says so)."""
    if weight_format is not None or device.type != "cpu":
        return StoragePlan(dtype=dtype)
    packs_fp16 = kernels is None and dtype == torch.float32 and fp16_packing_available()
    return kernel_plan(dtype, kernels is not None, torch.float16 if packs_fp16 else None)


def named_weights(record: object, name: str = "") -> Iterator[tuple[str, Weight]]:
    """The weights of a layer record by field name, through nested records and lists (an MoE
    layer's attention, router and experts: "ffn.experts.gate", once per expert)."""
    if isinstance(record, Weight):
        yield name, record
    elif isinstance(record, list | tuple):
        for item in cast(Sequence[object], record):
            yield from named_weights(item, name)
    elif hasattr(record, "__dataclass_fields__"):
        for field, value in vars(record).items():
            yield from named_weights(value, f"{name}.{field}" if name else field)


def shard_bytes(weights: ShardWeights) -> int:
    """Bytes of the shard's weights as loaded (a tied head counted once)."""
    seen: set[int] = set()
    total = 0

    def add(w: Weight | None) -> None:
        nonlocal total
        if w is not None and id(w) not in seen:
            seen.add(id(w))
            total += running_bytes(w)

    for layer in weights.layers:
        for _, w in named_weights(layer):
            add(w)
    for w in (weights.embed, weights.lm_head, weights.final_norm, weights.rope_freq_factors):
        add(w)
    return total


def _is_matrix(w: object) -> bool:
    return isinstance(w, QuantTensor) or (isinstance(w, torch.Tensor) and w.dim() == 2)


def describe_load(path: Path, weights: ShardWeights, model: ShardModel, seconds: float) -> str:
    kinds: Counter[str] = Counter()
    for layer in weights.layers:
        for field, w in named_weights(layer):
            if _is_matrix(w):
                kinds[f"{field}:{kind_of(w)}"] += 1
    if weights.embed is not None:
        kinds[f"embed:{kind_of(weights.embed)}"] += 1
    if weights.lm_head is not None:
        kinds[f"head:{kind_of(weights.lm_head)}"] += 1
    kernels = model.kernels_used()
    per_pos = model.kv_bytes_per_position()
    return (
        f"loaded {path.name} layers [{weights.start_layer}, {weights.end_layer}) in "
        f"{seconds:.2f} s; file format {weights.source_format}; "
        f"running weights {shard_bytes(weights) / 2**20:.1f} MiB; "
        f"formats {dict(sorted(kinds.items()))}; kernels {dict(sorted(kernels.items()))}; "
        f"KV cache {per_pos} bytes per position ({model.kv_dtype}), grown with use"
    )


def release_freed_memory() -> None:
    """Hand memory freed during a load back to the system (glibc keeps freed heap pages)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.malloc_trim(0)


def log_load(path: Path, weights: ShardWeights, model: ShardModel, seconds: float) -> None:
    logger.info(describe_load(path, weights, model, seconds))
