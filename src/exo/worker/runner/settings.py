"""What a runner process needs to know beyond its shard. Picklable (sent at spawn)."""

from dataclasses import dataclass
from pathlib import Path

from exo.shared.constants import EXO_RUNNER_MAX_BATCH


@dataclass(frozen=True)
class RunnerSettings:
    cache_dir: Path
    models_dir: Path
    hub_cache_dir: Path | None = None
    """The Hugging Face cache (standard layout) where hub models are downloaded."""
    extra_model_dirs: tuple[Path, ...] = ()
    """Read-only folders searched too (``--models-dir``; Hugging Face caches among them)."""
    threads: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    max_batch: int = EXO_RUNNER_MAX_BATCH
    log_level: str = "INFO"
