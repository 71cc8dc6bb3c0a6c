"""A weight file fetched into the Hugging Face cache layout, resumable across restarts.

The bytes go to ``blobs/<sha256>.exo-partial``; a later attempt (after a cut connection,
a cancel or a restart of the node) continues it with ``Range: bytes=N-``. A complete file
is checked against the hub's sha256, moved to ``blobs/<sha256>`` and linked from
``snapshots/<commit>/<path>`` as ``huggingface_hub`` does, so other tools find it.
"""

import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx2
from huggingface_hub import constants as hf_constants
from huggingface_hub import hf_hub_url
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from exo.shared.models.model_cards import HubFile, HubSource
from exo.worker.download.hub_names import (
    UnsafeName,
    check_hub_source,
    inside,
    repo_id_problem,
)

PARTIAL_SUFFIX = ".exo-partial"
_CHUNK = 1 << 20
_MAX_STALLS = 5


@dataclass(frozen=True)
class HubSettings:
    """Where the hub is and how to reach it (read from the environment at each use)."""

    cache_dir: Path
    endpoint: str | None = None
    token: str | None = None
    offline: bool = False

    @classmethod
    def from_env(cls, cache_dir: Path | None = None) -> "HubSettings":
        env = os.environ
        default_cache = Path(env.get("HF_HUB_CACHE") or hf_constants.HF_HUB_CACHE)
        return cls(
            cache_dir=cache_dir or default_cache,
            endpoint=env.get("HF_ENDPOINT") or None,
            token=env.get("HF_TOKEN") or None,
            offline=env.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"),
        )


class DownloadError(Exception):
    """A download that failed; ``status`` set when retrying cannot help (404, 403, 507)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class DownloadCancelled(Exception):
    pass


def repo_folder(cache_dir: Path, repo_id: str) -> Path:
    """The repo's folder in the cache (raises UnsafeName for a malformed repo id)."""
    problem = repo_id_problem(repo_id)
    if problem is not None:
        raise UnsafeName(problem)
    return inside(cache_dir, f"models--{repo_id.replace('/', '--')}")


def snapshot_dir(cache_dir: Path, hub: HubSource) -> Path:
    """The pinned commit's folder (raises UnsafeName for any unsafe name in ``hub``)."""
    check_hub_source(hub)
    return inside(cache_dir, f"models--{hub.repo_id.replace('/', '--')}", "snapshots", hub.revision)


def snapshot_path(cache_dir: Path, hub: HubSource, f: HubFile) -> Path:
    """Where ``f`` lives in the snapshot: its folder resolved inside the cache, the name
    itself not followed (it is a link to a blob)."""
    folder = snapshot_dir(cache_dir, hub)
    parent = PurePosixPath(f.path).parent
    where = inside(folder, *parent.parts) if parent.parts else folder
    return where / PurePosixPath(f.path).name


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def fetch_lfs_file(
    hub: HubSource,
    f: HubFile,
    settings: HubSettings,
    on_bytes: Callable[[int], None],
    cancelled: threading.Event,
) -> Path:
    """Fetch (or finish) one LFS file; returns its snapshot path. Raises DownloadError
    for a file that fails its check twice, or what the hub or the network raised."""
    assert f.sha256 is not None
    link = snapshot_path(settings.cache_dir, hub, f)  # checks every name first
    blob = inside(repo_folder(settings.cache_dir, hub.repo_id), "blobs", f.sha256)
    if not (blob.exists() and blob.stat().st_size == f.size):
        for attempt in (1, 2):
            part = blob.with_name(f.sha256 + PARTIAL_SUFFIX)
            _fill(hub, f, part, settings, on_bytes, cancelled)
            if sha256_of(part) == f.sha256:
                os.replace(part, blob)
                break
            part.unlink(missing_ok=True)
            if attempt == 2:
                raise DownloadError(f"{hub.repo_id}: {f.path} failed its sha256 check twice")
            on_bytes(-f.size)
    link.parent.mkdir(parents=True, exist_ok=True)
    link = snapshot_path(settings.cache_dir, hub, f)  # no link planted meanwhile
    tmp = link.with_name(link.name + ".tmp-link")
    tmp.unlink(missing_ok=True)
    os.symlink(os.path.relpath(blob, link.parent), tmp)
    os.replace(tmp, link)
    return link


def _fill(
    hub: HubSource,
    f: HubFile,
    part: Path,
    settings: HubSettings,
    on_bytes: Callable[[int], None],
    cancelled: threading.Event,
) -> None:
    """Append to ``part`` until it has ``f.size`` bytes; a cut connection resumes from
    the last byte written (up to 5 times in a row without progress)."""
    part.parent.mkdir(parents=True, exist_ok=True)
    url = hf_hub_url(hub.repo_id, f.path, revision=hub.revision, endpoint=settings.endpoint)
    headers = build_hf_headers(token=settings.token or False)
    session = get_session()
    have = part.stat().st_size if part.exists() else 0
    if have > f.size:
        part.unlink()
        have = 0
    on_bytes(have)
    stalls = 0
    while have < f.size:
        if cancelled.is_set():
            raise DownloadCancelled()
        try:
            request = {**headers, "Range": f"bytes={have}-"}
            with session.stream("GET", url, headers=request, follow_redirects=True,
                                timeout=httpx2.Timeout(30.0)) as r:
                hf_raise_for_status(r)
                mode = "ab"
                if r.status_code == 200 and have:  # the server ignored the Range
                    on_bytes(-have)
                    have, mode = 0, "wb"
                with part.open(mode) as out:
                    for chunk in r.iter_bytes():
                        if cancelled.is_set():
                            raise DownloadCancelled()
                        out.write(chunk)
                        have += len(chunk)
                        on_bytes(len(chunk))
                        stalls = 0
        except (httpx2.TransportError, httpx2.RemoteProtocolError):
            stalls += 1
            if stalls > _MAX_STALLS:
                raise
            time.sleep(min(0.5 * 2**stalls, 8.0))


