"""A catalogue of popular open models: names people type, the hub repos they stand for,
and the GGUF repos and quants people use. Pure data.

No sizes or shapes are written here: a card is built from the hub's metadata when a
model is first used (``config.json`` or the GGUF header, file sizes from the hub). The
only size known offline is an estimate from the parameter count in the model's name and
the format's bits per weight, marked as an estimate.
"""

from dataclasses import dataclass

from exo.shared.types.common import FrozenModel

# Bits per weight of common formats (block scales included), for offline estimates.
BITS_PER_WEIGHT: dict[str, float] = {
    "BF16": 16.0, "F16": 16.0, "Q8_0": 8.5, "Q6_K": 6.56, "Q5_K_M": 5.69, "Q4_K_M": 4.85,
    "Q4_0": 4.5, "Q3_K_M": 3.91, "Q2_K": 3.35,
}


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    """What users type (``qwen3-8b``); ``name:QUANT`` picks a GGUF quant."""
    repo_id: str
    """The safetensors repo on the hub."""
    params_b: float
    """Parameters, in billions, as the model's name says."""
    gguf_repo: str | None = None
    gguf_quants: tuple[str, ...] = ("Q4_K_M", "Q8_0")


def _e(name: str, repo: str, params_b: float, gguf: str | None) -> CatalogueEntry:
    return CatalogueEntry(name=name, repo_id=repo, params_b=params_b, gguf_repo=gguf)


CATALOGUE: tuple[CatalogueEntry, ...] = (
    _e("llama-3.2-1b", "meta-llama/Llama-3.2-1B-Instruct", 1.0,
       "bartowski/Llama-3.2-1B-Instruct-GGUF"),
    _e("llama-3.2-3b", "meta-llama/Llama-3.2-3B-Instruct", 3.0,
       "bartowski/Llama-3.2-3B-Instruct-GGUF"),
    _e("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 8.0,
       "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF"),
    _e("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", 70.0,
       "bartowski/Meta-Llama-3.1-70B-Instruct-GGUF"),
    _e("llama-3.3-70b", "meta-llama/Llama-3.3-70B-Instruct", 70.0,
       "bartowski/Llama-3.3-70B-Instruct-GGUF"),
    _e("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct", 0.5, "Qwen/Qwen2.5-0.5B-Instruct-GGUF"),
    _e("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", 1.5, "Qwen/Qwen2.5-1.5B-Instruct-GGUF"),
    _e("qwen2.5-3b", "Qwen/Qwen2.5-3B-Instruct", 3.0, "Qwen/Qwen2.5-3B-Instruct-GGUF"),
    _e("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", 7.0, "Qwen/Qwen2.5-7B-Instruct-GGUF"),
    _e("qwen2.5-14b", "Qwen/Qwen2.5-14B-Instruct", 14.0, "Qwen/Qwen2.5-14B-Instruct-GGUF"),
    _e("qwen2.5-32b", "Qwen/Qwen2.5-32B-Instruct", 32.0, "Qwen/Qwen2.5-32B-Instruct-GGUF"),
    _e("qwen2.5-72b", "Qwen/Qwen2.5-72B-Instruct", 72.0, "Qwen/Qwen2.5-72B-Instruct-GGUF"),
    _e("qwen3-0.6b", "Qwen/Qwen3-0.6B", 0.6, "Qwen/Qwen3-0.6B-GGUF"),
    _e("qwen3-1.7b", "Qwen/Qwen3-1.7B", 1.7, "Qwen/Qwen3-1.7B-GGUF"),
    _e("qwen3-4b", "Qwen/Qwen3-4B", 4.0, "Qwen/Qwen3-4B-GGUF"),
    _e("qwen3-8b", "Qwen/Qwen3-8B", 8.0, "Qwen/Qwen3-8B-GGUF"),
    _e("qwen3-14b", "Qwen/Qwen3-14B", 14.0, "Qwen/Qwen3-14B-GGUF"),
    _e("qwen3-32b", "Qwen/Qwen3-32B", 32.0, "Qwen/Qwen3-32B-GGUF"),
    _e("mistral-7b", "mistralai/Mistral-7B-Instruct-v0.3", 7.0,
       "bartowski/Mistral-7B-Instruct-v0.3-GGUF"),
    _e("mistral-nemo-12b", "mistralai/Mistral-Nemo-Instruct-2407", 12.0,
       "bartowski/Mistral-Nemo-Instruct-2407-GGUF"),
    _e("mistral-small-24b", "mistralai/Mistral-Small-24B-Instruct-2501", 24.0,
       "bartowski/Mistral-Small-24B-Instruct-2501-GGUF"),
    _e("gemma-3-270m", "google/gemma-3-270m-it", 0.27, "ggml-org/gemma-3-270m-it-GGUF"),
    _e("gemma-3-1b", "google/gemma-3-1b-it", 1.0, "ggml-org/gemma-3-1b-it-GGUF"),
    _e("gemma-3-4b", "google/gemma-3-4b-it", 4.0, "ggml-org/gemma-3-4b-it-GGUF"),
    _e("gemma-3-12b", "google/gemma-3-12b-it", 12.0, "ggml-org/gemma-3-12b-it-GGUF"),
    _e("gemma-3-27b", "google/gemma-3-27b-it", 27.0, "ggml-org/gemma-3-27b-it-GGUF"),
)


class CatalogueListing(FrozenModel):
    """One catalogue entry as the API lists it."""

    name: str
    repo_id: str
    gguf_repo: str | None
    gguf_quants: list[str]
    estimated_bytes: dict[str, int]
    """Per format (BF16 and each quant): an estimate from the parameter count."""
    size_estimated: bool = True


def estimate_bytes(params_b: float, fmt: str) -> int:
    return int(params_b * 1e9 * BITS_PER_WEIGHT[fmt] / 8)


def hub_name(name: str) -> str | None:
    """``qwen3-8b`` -> ``Qwen/Qwen3-8B``; ``qwen3-8b:q4_k_m`` -> ``Qwen/Qwen3-8B-GGUF:Q4_K_M``.
    None when the name is not in the catalogue (or names a quant it has no GGUF repo for)."""
    base, _, quant = name.strip().lower().partition(":")
    for entry in CATALOGUE:
        if entry.name == base or entry.repo_id.lower() == base:
            if not quant:
                return entry.repo_id
            return f"{entry.gguf_repo}:{quant.upper()}" if entry.gguf_repo else None
    return None


def listing() -> list[CatalogueListing]:
    return [
        CatalogueListing(
            name=e.name,
            repo_id=e.repo_id,
            gguf_repo=e.gguf_repo,
            gguf_quants=list(e.gguf_quants),
            estimated_bytes={f: estimate_bytes(e.params_b, f) for f in ("BF16", *e.gguf_quants)},
        )
        for e in CATALOGUE
    ]
