"""Finding a model's files on this node: a local source, the models folder, or the
Hugging Face cache (for hub models); and the card of a model file a user names.
Nothing here requires the hub."""

import json
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from exo.shared.models.embedded import EMBEDDED_MODEL_ID
from exo.shared.models.model_cards import ModelCard, ModelId, config_takes_images, is_mmproj
from exo.shared.types.memory import Memory
from exo.shared.types.worker.downloads import (
    DownloadCompleted,
    DownloadFailed,
    DownloadProgress,
)
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.folder_check import folder_problem
from exo.worker.download.hub import locate_hub_model
from exo.worker.download.vision_card import local_vision_fields
from exo.worker.engines.gguf_reader import GGUFFile

INVALID_FILE_STATUS = 422
"""The status of a local model file that is there but cannot be loaded as it is."""


def locate_model(
    card: ModelCard, models_dir: Path, hub_cache: Path | None = None,
    extra_dirs: Sequence[Path] = (), layers: tuple[int, int] | None = None,
) -> Path | None:
    """What the engine loads (a GGUF file or a safetensors folder), if this node has it:
    hub models in the Hugging Face cache or in a models folder laid out like one (with
    ``layers``: every file the shard holding those layers reads)."""
    if card.hub is not None:
        for cache in [*([hub_cache] if hub_cache is not None else []), *extra_dirs]:
            found = locate_hub_model(card, cache, layers)
            if found is not None:
                return found
    for path in _candidates(card, models_dir):
        if path.is_file() or (path.is_dir() and any(path.glob("*.safetensors"))):
            return path
    return None


def _candidates(card: ModelCard, models_dir: Path) -> list[Path]:
    candidates: list[Path] = []
    if card.model_id == EMBEDDED_MODEL_ID:
        # The card names the file inside its package (or a path on another node):
        # this node's own copy is the one to load.
        embedded = find_embedded_gguf()
        if embedded is not None:
            candidates.append(embedded)
    if card.source:
        candidates.append(Path(card.source))
    candidates.append(models_dir / card.model_id.replace("/", "--"))
    return candidates


def locate_progress(
    card: ModelCard, models_dir: Path, hub_cache: Path | None = None,
    extra_dirs: Sequence[Path] = (), layers: tuple[int, int] | None = None,
) -> DownloadProgress:
    found = locate_model(card, models_dir, hub_cache, extra_dirs, layers)
    if found is not None:
        problem = local_problem(found) if card.hub is None else None
        if problem is not None:  # no retry fixes a broken local file: say so at once
            return DownloadFailed(error_message=problem, status=INVALID_FILE_STATUS)
        if card.hub is not None and layers is not None:
            return DownloadCompleted(path=str(found), start_layer=layers[0], end_layer=layers[1])
        return DownloadCompleted(path=str(found))
    where = ", ".join(str(p) for p in _candidates(card, models_dir))
    return DownloadFailed(
        error_message=f"model files for {card.model_id} not found (looked in {where}); "
        "this node has no download source for it",
        status=404,
    )


def local_problem(path: Path) -> str | None:
    """Why a local model (a GGUF file or a safetensors folder) cannot be loaded as it is."""
    return folder_problem(path) if path.is_dir() else gguf_problem(path)


def gguf_problem(path: Path) -> str | None:
    """Why a local GGUF file cannot be loaded as it is (None: it holds every byte its
    header promises). A cut-off copy fails every load; found here, before any runner."""
    if path.suffix.lower() != ".gguf" or not path.is_file():
        return None
    try:
        gguf = GGUFFile(path)
    except (ValueError, OSError, KeyError, IndexError, struct.error) as e:
        return f"model file {path} is not a readable GGUF file ({type(e).__name__}: {e})"
    try:
        needed = max((t.offset + t.n_bytes for t in gguf.tensors.values()), default=0)
    finally:
        gguf.close()
    size = path.stat().st_size
    if size < needed:
        return (
            f"model file {path} is truncated: it has {size} bytes, its tensors need "
            f"{needed} (copy or download it again)"
        )
    return None


def card_from_path(path: Path) -> ModelCard:
    """Read the model's shape from its metadata. Raises ValueError with a clear message."""
    from exo.worker.engines.model_facts import model_facts  # torch: only when a file is named

    if not path.exists():
        raise ValueError(f"model file not found: {path}")
    try:
        facts = model_facts(path)
    except Exception as e:
        raise ValueError(f"cannot read model metadata from {path}: {e}") from e
    c = facts.config
    name = path.name.removesuffix(".gguf") if path.is_file() else path.name
    return ModelCard(
        model_id=ModelId(name),
        n_layers=c.n_layers,
        hidden_size=c.hidden,
        num_heads=c.heads,
        num_kv_heads=c.kv_heads,
        storage_size=Memory(in_bytes=facts.weight_bytes),
        context_length=c.context_length,
        architecture=c.architecture,
        source=str(path.resolve()),
        aliases=[name.lower()],
        chat_template=c.chat_template,
        head_dim=c.head_dim,
        weight_format=facts.weight_format,
        embedding_bytes=facts.embedding_bytes,
        head_bytes=facts.head_bytes,
        layer_bytes=list(facts.layer_bytes),
        kv_bytes_per_token=facts.kv_bytes_per_token,
        n_experts=facts.n_experts,
        experts_per_token=facts.experts_per_token,
        total_params=facts.total_params,
        active_params=facts.active_params,
        vision=takes_images(path),
        **local_vision_fields(path),
    )


def takes_images(path: Path) -> bool:
    """A safetensors folder whose config has a vision tower, or a GGUF file beside an mmproj
    file (llama.cpp's vision projector)."""
    if path.is_dir():
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return False
        return isinstance(config, dict) and config_takes_images(cast(dict[str, object], config))
    return any(is_mmproj(p.name) for p in path.parent.glob("*.gguf") if p != path)
