"""Reading a GGUF file's metadata: typed keys, and the rotary scaling llama.cpp stores."""

from exo.worker.engines.config import RopeScaling
from exo.worker.engines.gguf_reader import MetadataValue

Meta = dict[str, MetadataValue]


def get(meta: Meta, key: str) -> MetadataValue:
    if key not in meta:
        raise ValueError(f"GGUF metadata lacks {key!r}")
    return meta[key]


def meta_int(meta: Meta, key: str, default: int | None = None) -> int:
    value = meta.get(key, default) if default is not None else get(meta, key)
    if not isinstance(value, int):
        raise ValueError(f"GGUF metadata {key!r} should be an integer, got {value!r}")
    return value


def meta_float(meta: Meta, key: str, default: float) -> float:
    value = meta.get(key, default)
    if not isinstance(value, int | float):
        raise ValueError(f"GGUF metadata {key!r} should be a number, got {value!r}")
    return float(value)


def rope_scaling(meta: Meta, arch: str) -> RopeScaling | None:
    kind = meta.get(f"{arch}.rope.scaling.type")
    factor = meta_float(meta, f"{arch}.rope.scaling.factor", 1.0)
    if kind == "linear" and factor != 1.0:
        return RopeScaling(kind="linear", factor=factor)
    if kind not in (None, "none", "linear"):
        raise ValueError(f"rope scaling {kind!r} is not supported")
    return None  # llama3-style scaling ships as the `rope_freqs.weight` tensor instead
