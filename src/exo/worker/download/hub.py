"""Downloading the files of one shard from the Hugging Face hub, with ``huggingface_hub``.

Files land in the standard Hugging Face cache layout (``models--org--name/blobs`` and
``snapshots/<commit>/``), so a model another tool already fetched is found there and not
fetched again; every file comes from the commit the card pins. Small files go through
``huggingface_hub.hf_hub_download``; weights (LFS files) through ``resumable``, which
keeps a partial file across restarts and continues it with a Range request. Every file is
checked (size, and the sha256 the hub reports for LFS files; a corrupted file is fetched
again), disk space is checked before any byte is fetched, nothing half-written is ever
in the snapshot, and errors say what to do.
"""

import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from huggingface_hub import hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import tqdm as hf_tqdm

from exo.shared.models.hub_files import (
    SAFETENSORS_INDEX,
    mmproj_file,
    model_gguf_files,
    safetensors_files_for_layers,
    support_files,
)
from exo.shared.models.model_cards import HubFile, HubSource, ModelCard
from exo.worker.download.hub_names import (
    UnsafeName,
    check_hub_source,
    file_name_problem,
    hub_source_problem,
    inside,
)
from exo.worker.download.resumable import (
    PARTIAL_SUFFIX,
    DownloadCancelled,
    DownloadError,
    HubSettings,
    fetch_lfs_file,
    repo_folder,
    sha256_of,
    snapshot_dir,
    snapshot_path,
)
from exo.worker.download.shard_gguf import delete_gguf_shards, locate_gguf_shard

ByteCallback = Callable[[int], None]


def explain(error: BaseException, repo_id: str, settings: HubSettings) -> DownloadError:
    """A clear, classified error for anything the hub or the disk threw at us."""
    token_hint = "set HF_TOKEN" if settings.token is None else "the HF_TOKEN given has no access"
    match error:
        case DownloadError():
            return error
        case UnsafeName():
            return DownloadError(f"{repo_id}: refused: {error}", 400)
        case GatedRepoError():
            return DownloadError(f"{repo_id} is gated on the hub: {token_hint} "
                                 "(a token of an account that accepted its terms)", 403)
        case RepositoryNotFoundError():
            return DownloadError(f"{repo_id} was not found on the hub "
                                 f"(if it is private, {token_hint})", 404)
        case RevisionNotFoundError():
            return DownloadError(f"{repo_id}: the pinned revision is gone from the hub", 404)
        case LocalEntryNotFoundError() if settings.offline:
            return DownloadError(f"{repo_id} is not in the local cache and HF_HUB_OFFLINE=1 "
                                 "forbids downloading it", 404)
        case LocalEntryNotFoundError():
            return DownloadError(f"{repo_id}: the hub is unreachable and the files are not "
                                 "in the local cache; retrying")
        case EntryNotFoundError():
            return DownloadError(f"{repo_id}: a file is missing on the hub: {error}", 404)
        case HfHubHTTPError() if error.response.status_code in (401, 403):
            return DownloadError(f"{repo_id}: access denied by the hub "
                                 f"({error.response.status_code}): {token_hint}", 403)
        case OSError() if getattr(error, "errno", None) == 28:
            return DownloadError(f"{repo_id}: no space left on the device: {error}", 507)
        case _:
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            return DownloadError(f"{repo_id}: download failed ({type(error).__name__}: "
                                 f"{first_line}); retrying")


def _fetch(
    hub: HubSource,
    path: str,
    settings: HubSettings,
    on_bytes: ByteCallback | None = None,
    force: bool = False,
) -> Path:
    check_hub_source(hub)
    if file_name_problem(path) is not None or path not in {f.path for f in hub.files}:
        raise UnsafeName(f"{path!r} is not a safe file of {hub.repo_id}'s listing")
    kwargs: dict[str, Any] = {}
    if on_bytes is not None:
        kwargs["tqdm_class"] = _counting_bar(on_bytes)
    return Path(
        hf_hub_download(
            hub.repo_id,
            path,
            revision=hub.revision,
            cache_dir=settings.cache_dir,
            endpoint=settings.endpoint,
            token=settings.token or False,
            local_files_only=settings.offline,
            force_download=force,
            **kwargs,
        )
    )


def _counting_bar(on_bytes: ByteCallback) -> type[hf_tqdm]:
    """A silent progress bar class that reports every chunk ``huggingface_hub`` writes
    (it may raise to stop the download: the partial file is then discarded)."""

    class CountingBar(hf_tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            on_bytes(int(n or 0))
            return None

    return CountingBar


def shard_files(
    card: ModelCard, start_layer: int, end_layer: int, settings: HubSettings
) -> list[HubFile]:
    """The files a node holding layers [start_layer, end_layer) needs. For a sharded
    safetensors repo this reads the (small) index to map layers to files."""
    hub = card.hub
    assert hub is not None

    def read_index() -> dict[str, str]:
        try:
            return _weight_map(_fetch(hub, SAFETENSORS_INDEX, settings))
        except Exception as e:
            raise explain(e, hub.repo_id, settings) from e

    return _needed_files(card, start_layer, end_layer, read_index)


def _weight_map(index_path: Path) -> dict[str, str]:
    weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
    return weight_map


def _needed_files(
    card: ModelCard, start_layer: int, end_layer: int, read_index: Callable[[], dict[str, str]]
) -> list[HubFile]:
    hub = card.hub
    assert hub is not None
    if hub.gguf_quant is not None:  # the vision projector goes with the first stage's layers
        mmproj = mmproj_file(hub.files) if start_layer == 0 else None
        return [*model_gguf_files(hub.files), *([mmproj] if mmproj else [])]
    support = support_files(hub.files)
    weights = [f for f in hub.files if f.path.endswith(".safetensors") and "/" not in f.path]
    if len(weights) <= 1 or not any(f.path == SAFETENSORS_INDEX for f in hub.files):
        return support + weights
    wanted = safetensors_files_for_layers(read_index(), start_layer, end_layer, card.n_layers)
    return support + [f for f in weights if f.path in wanted]


def bytes_present(hub: HubSource, files: list[HubFile], cache_dir: Path) -> int:
    return sum(f.size for f in files if snapshot_path(cache_dir, hub, f).exists())


def check_disk(cache_dir: Path, needed: int, free: Callable[[Path], int] | None = None) -> None:
    """Fail before fetching a byte when the disk cannot hold what remains (+1%)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    available = free(cache_dir) if free is not None else shutil.disk_usage(cache_dir).free
    if needed * 1.01 > available:
        raise DownloadError(
            f"not enough free disk in {cache_dir}: the download needs {needed / 1e9:.2f} GB, "
            f"{available / 1e9:.2f} GB are free", 507,
        )


def download_files(
    card: ModelCard,
    files: list[HubFile],
    settings: HubSettings,
    on_bytes: ByteCallback,
    cancelled: threading.Event,
    free: Callable[[Path], int] | None = None,
) -> Path:
    """Fetch (or find) every file, verify it, and return what the engine loads: the
    snapshot folder (safetensors) or the first GGUF file. Raises DownloadError."""
    hub = card.hub
    assert hub is not None
    try:
        check_hub_source(hub)
        listed = {f.path for f in hub.files}
        if stray := [f.path for f in files if f.path not in listed]:
            raise UnsafeName(f"files outside the card's listing: {stray}")
        if not settings.offline:
            present = bytes_present(hub, files, settings.cache_dir)
            check_disk(settings.cache_dir, sum(f.size for f in files) - present, free)

        def count(n: int) -> None:
            if cancelled.is_set():
                raise DownloadCancelled()
            on_bytes(n)

        for f in files:
            if cancelled.is_set():
                raise DownloadCancelled()
            snap = snapshot_path(settings.cache_dir, hub, f)
            if f.sha256 is not None and not settings.offline and not snap.exists():
                # Weights: our own resumable fetch (a partial file survives a restart).
                fetch_lfs_file(hub, f, settings, count, cancelled)
                continue
            already = snap.exists()
            path = _in_cache(_fetch(hub, f.path, settings, count), settings.cache_dir)
            if already:
                on_bytes(f.size)
            if not _verified(path, f):
                _discard(path, hub, settings.cache_dir)
                if f.sha256 is not None and not settings.offline:
                    fetch_lfs_file(hub, f, settings, count, cancelled)
                    continue
                path = _in_cache(_fetch(hub, f.path, settings, count, force=True),
                                 settings.cache_dir)
                if not _verified(path, f):
                    _discard(path, hub, settings.cache_dir)
                    raise DownloadError(f"{hub.repo_id}: {f.path} failed its size check twice")
    except DownloadCancelled:
        raise
    except Exception as e:
        raise explain(e, hub.repo_id, settings) from e
    folder = snapshot_dir(settings.cache_dir, hub)
    ggufs = model_gguf_files(files)
    return folder / ggufs[0].path if ggufs else folder


def _verified(path: Path, f: HubFile) -> bool:
    if path.stat().st_size != f.size:
        return False
    return f.sha256 is None or sha256_of(path) == f.sha256


def _in_cache(path: Path, cache_dir: Path) -> Path:
    """``path`` (what ``huggingface_hub`` wrote), refused unless it and its target are
    inside the cache."""
    inside(cache_dir, str(path.parent))
    inside(cache_dir, str(path))
    return path


def _discard(path: Path, hub: HubSource, cache_dir: Path) -> None:
    """Remove a bad file: the snapshot link and the blob it points to (only a blob of
    the same repo: a link never takes a deletion out of it)."""
    blob = path.resolve()
    path.unlink(missing_ok=True)
    if blob != path and blob.parent == inside(repo_folder(cache_dir, hub.repo_id), "blobs"):
        blob.unlink(missing_ok=True)


def locate_hub_model(
    card: ModelCard, cache_dir: Path, layers: tuple[int, int] | None = None
) -> Path | None:
    """What the engine loads, when this node has the model's files in the cache: with
    ``layers``, every file (of the right size) that the shard holding them reads;
    without, the config and some weights."""
    hub = card.hub
    if hub is None or hub_source_problem(hub) is not None:
        return None
    folder = snapshot_dir(cache_dir, hub)
    if hub.gguf_quant is not None:
        ggufs = [f.path for f in model_gguf_files(hub.files)]
        split = len(ggufs) > 1  # parts are loaded as one shard file holding their tensors
        whole = bool(ggufs) and (folder / ggufs[0]).exists() and (
            layers is None or (not split and _shard_present(card, folder, layers))
        )
        if whole or layers is None:
            return folder / ggufs[0] if whole else None
        return locate_gguf_shard(card, cache_dir, *layers)
    if layers is not None:
        return folder if _shard_present(card, folder, layers) else None
    weights = [f.path for f in hub.files if f.path.endswith(".safetensors")]
    found = (folder / "config.json").exists() and any((folder / w).exists() for w in weights)
    return folder if found else None


class _NoIndex(Exception):
    pass


def _shard_present(card: ModelCard, folder: Path, layers: tuple[int, int]) -> bool:
    def read_index() -> dict[str, str]:
        try:
            return _weight_map(folder / SAFETENSORS_INDEX)
        except (OSError, ValueError, KeyError) as e:
            raise _NoIndex() from e

    try:
        files = _needed_files(card, layers[0], layers[1], read_index)
    except _NoIndex:
        return False
    return bool(files) and all(
        (folder / f.path).is_file() and (folder / f.path).stat().st_size == f.size for f in files
    )


def delete_hub_model(card: ModelCard, cache_dir: Path) -> bool:
    """Free the disk: the pinned snapshot and its blobs (other revisions stay). Raises
    UnsafeName for a card whose names would lead out of the cache; a link in the
    snapshot that points anywhere but the repo's blobs is removed, its target kept."""
    hub = card.hub
    if hub is None:
        return False
    shards = delete_gguf_shards(cache_dir, hub)
    folder = snapshot_dir(cache_dir, hub)
    if not folder.is_dir():
        return shards
    blobs = inside(repo_folder(cache_dir, hub.repo_id), "blobs")
    for link in folder.rglob("*"):
        target = link.resolve() if link.is_symlink() else None
        if target is not None and target.parent == blobs:
            target.unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
    for f in hub.files:  # partial downloads too
        if f.sha256 is not None:
            (blobs / f"{f.sha256}{PARTIAL_SUFFIX}").unlink(missing_ok=True)
    return True


__all__ = ["DownloadCancelled", "DownloadError", "repo_folder", "snapshot_dir"]
