"""Model folders a user points a node at (``--models-dir``, ``EXO_MODELS_DIRS``): GGUF
files, Hugging Face model folders, or a whole Hugging Face cache. Read only: nothing is
ever written there."""

import os
import re
from pathlib import Path

from loguru import logger

from exo.shared.models.hub_files import quant_of
from exo.shared.models.model_cards import ModelCard, ModelId, is_mmproj
from exo.worker.download.folder_check import folder_problem
from exo.worker.download.gguf_head import TruncatedHead, read_gguf_metadata
from exo.worker.download.gguf_index import SHARD_PREFIX
from exo.worker.download.local import card_from_path

_SHARD_HEAD = 64 << 20
_CACHE_REPO = re.compile(r"^models--(?P<org>[^-].*?)--(?P<name>.+)$")


def models_dirs_from_env() -> list[Path]:
    raw = os.environ.get("EXO_MODELS_DIRS", "")
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()]


def parse_memory(text: str) -> int:
    """``8GB``, ``512 MiB``, ``1.5g`` or plain bytes -> bytes. Raises ValueError."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*", text.lower())
    if m is None:
        raise ValueError(f"not a memory size: {text!r} (e.g. 8GB, 512MB, 1073741824)")
    number, prefix, binary = float(m.group(1)), m.group(2), m.group(3)
    base = 1024 if binary else 1000
    power = " kmgt".index(prefix) if prefix else 0
    value = int(number * base**power)
    if value <= 0:
        raise ValueError(f"a memory size must be positive: {text!r}")
    return value


def scan_models_dir(folder: Path) -> list[ModelCard]:
    """Cards for the models in a folder; unreadable ones are skipped with a warning."""
    if not folder.is_dir():
        raise ValueError(f"models dir not found: {folder}")
    cards: list[ModelCard] = []
    for path, model_id in _candidates(folder):
        if path.is_file() and is_gguf_shard(path):
            logger.info(f"{path} is a shard of a model (some of its layers): not listed")
            continue
        problem = folder_problem(path) if path.is_dir() else None
        if problem is not None:
            logger.warning(f"skipping {path}: {problem}")
            continue
        try:
            card = card_from_path(path)
        except ValueError as e:
            logger.warning(f"skipping {path}: {e}")
            continue
        if model_id is not None:
            card = card.model_copy(update={"model_id": model_id,
                                           "aliases": [*card.aliases, model_id.lower()]})
        cards.append(card)
    return cards


def is_gguf_shard(path: Path) -> bool:
    """A GGUF file a node wrote on purpose with some of a model's layers (``exo.shard.*``
    keys in its metadata): not a model of its own, and not a broken one."""
    want, head = 1 << 20, b""
    while True:
        try:
            with path.open("rb") as fh:
                head = fh.read(want)
            meta = read_gguf_metadata(head)
            return any(key.startswith(SHARD_PREFIX) for key in meta)
        except TruncatedHead:
            if len(head) < want or want >= _SHARD_HEAD:
                return False
            want *= 4
        except (OSError, ValueError):
            return False


def _candidates(folder: Path) -> list[tuple[Path, ModelId | None]]:
    found: list[tuple[Path, ModelId | None]] = []
    for entry in sorted(folder.iterdir()):
        cache = _CACHE_REPO.match(entry.name)
        if cache is not None and (entry / "snapshots").is_dir():
            repo = ModelId(f"{cache.group('org')}/{cache.group('name')}")
            found.extend(_snapshot_models(entry, repo))
        elif (entry.is_file() and entry.suffix == ".gguf" and _first_part(entry.name)) or (entry.is_dir() and (entry / "config.json").exists() and any(entry.glob("*.safetensors"))):
            found.append((entry, None))
    return found


def _snapshot_models(repo_dir: Path, repo: ModelId) -> list[tuple[Path, ModelId | None]]:
    """The newest snapshot of a cached repo: its safetensors folder or its GGUF files."""
    snapshots = sorted((repo_dir / "snapshots").iterdir(), key=lambda p: p.stat().st_mtime)
    if not snapshots:
        return []
    snap = snapshots[-1]
    if (snap / "config.json").exists() and any(snap.glob("*.safetensors")):
        return [(snap, repo)]
    return [
        (g, ModelId(f"{repo}:{quant_of(g.name) or g.stem}"))
        for g in sorted(snap.glob("*.gguf"))
        if _first_part(g.name)
    ]


def _first_part(name: str) -> bool:
    """The first (or only) part of a model's GGUF file: not a later part of a split file, and
    not a vision model's mmproj file (the projector beside a model, no model of its own)."""
    if is_mmproj(name):
        return False
    m = re.search(r"-(\d{5})-of-\d{5}\.gguf$", name)
    return m is None or m.group(1) == "00001"
