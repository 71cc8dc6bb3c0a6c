"""What the native-MoE tests share: each family's generated tiny quantised file, the kernels
of one build (skipping where this CPU cannot run it), a model built on them, and the MoE
feed-forward layers inside it."""

from pathlib import Path
from typing import Any, TypeVar

import torch

from exo.modelgen import Request, generate
from exo.worker.engines.cpu_kernels import QKernels
from exo.worker.engines.engine import load_family, load_shard_weights
from exo.worker.engines.load_report import load_plan
from exo.worker.engines.models.base import BuildOptions, ShardModel
from exo.worker.engines.models.moe import MoeFeedForward

FAMILIES = {"qwen3moe": "Q4_K_M", "deepseek2": "Q4_K_M", "glm4moe": "Q8_0", "gpt-oss": "MXFP4"}
CPU = torch.device("cpu")
T = TypeVar("T")


def tiny_files(folder: Path) -> dict[str, Path]:
    return {
        arch: generate(Request(arch, "tiny", quant, folder / f"{arch}-{quant}.gguf"))
        for arch, quant in FAMILIES.items()
    }




def built_model(path: Path, kernels: QKernels) -> ShardModel:
    family, config = load_family(path)
    plan = load_plan(CPU, torch.float32, kernels, None)
    weights = load_shard_weights(path, 0, config.n_layers, plan=plan)
    return family.build(weights, BuildOptions("q8", torch.float32, CPU, kernels=kernels))


def parts_of(obj: Any, kind: type[T], seen: set[int] | None = None) -> list[T]:
    """Every ``kind`` reachable from ``obj`` through the model's own objects and lists."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, kind):
        return [obj]
    if isinstance(obj, (list, tuple)):
        items = list(obj)  # pyright: ignore[reportUnknownArgumentType]
    elif type(obj).__module__.startswith("exo.") and hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return []
    return [m for item in items for m in parts_of(item, kind, seen)]


def moe_layers(model: ShardModel) -> list[MoeFeedForward]:
    return parts_of(model, MoeFeedForward)
