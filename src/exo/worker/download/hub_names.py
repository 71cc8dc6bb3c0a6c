"""Names that come from the hub or the wire and end up in paths, checked before any use.

A hub (or a mirror, or a node holding the cluster secret) could answer a revision of
``../../x`` or a file name of ``../escape/a.gguf``; the cache paths are built from those
names, so each one is checked here, and every path is resolved and kept inside its root
(``inside``) before anything is written or deleted.
"""

import re
from pathlib import Path, PurePosixPath

from exo.shared.models.model_cards import HubFile, HubSource

_REVISION = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_REPO_PART = re.compile(r"^[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?$")
_QUANT = re.compile(r"^[\w.-]{1,64}$")
_MAX_PATH = 1024


class UnsafeName(ValueError):
    """A name from the hub or the wire that would leave its folder (or is malformed)."""


def repo_id_problem(repo_id: str) -> str | None:
    """Why ``repo_id`` is not a hub repo id (``org/name``, the hub's own rules), or None."""
    parts = repo_id.split("/")
    if len(parts) != 2:
        return f"{repo_id!r} is not a hub repo id (org/name)"
    for part in parts:
        if not _REPO_PART.match(part) or ".." in part or "--" in part:
            return (
                f"{repo_id!r} is not a hub repo id: each part is letters, digits, '-', '_' "
                "or '.', at most 96 long, with no '..' or '--' and not starting or ending "
                "with '-' or '.'"
            )
    return None


def file_name_problem(name: str) -> str | None:
    """Why a file name of a repo is unsafe: not a plain relative path inside the repo."""
    if not name or len(name) > _MAX_PATH or "\\" in name or "\0" in name:
        return f"unsafe file name {name!r} (empty, too long, or with a backslash or NUL)"
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith("/"):
        return f"unsafe file name {name!r} (absolute)"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return f"unsafe file name {name!r} (a '.', '..' or empty part)"
    if re.match(r"^[A-Za-z]:", name):
        return f"unsafe file name {name!r} (a drive letter)"
    return None


def hub_source_problem(hub: HubSource) -> str | None:
    """Why a card's hub source cannot be used to build cache paths, or None."""
    problem = repo_id_problem(hub.repo_id)
    if problem is not None:
        return problem
    if not _REVISION.match(hub.revision):
        return f"{hub.repo_id}: the revision {hub.revision!r} is not a 40-hex-digit commit"
    if hub.gguf_quant is not None and not _QUANT.match(hub.gguf_quant):
        return f"{hub.repo_id}: unsafe quant name {hub.gguf_quant!r}"
    for f in hub.files:
        problem = hub_file_problem(f)
        if problem is not None:
            return f"{hub.repo_id}: {problem}"
    return None


def hub_file_problem(f: HubFile) -> str | None:
    problem = file_name_problem(f.path)
    if problem is not None:
        return problem
    if f.size < 0:
        return f"{f.path}: a negative size ({f.size})"
    if f.sha256 is not None and not _SHA256.match(f.sha256):
        return f"{f.path}: the sha256 {f.sha256!r} is not 64 hex digits"
    return None


def check_hub_source(hub: HubSource) -> None:
    """Raise UnsafeName when any name in ``hub`` is unsafe."""
    problem = hub_source_problem(hub)
    if problem is not None:
        raise UnsafeName(problem)


def inside(root: Path, *parts: str) -> Path:
    """``root / parts``, resolved (links followed), refused unless it stays in ``root``."""
    base = root.resolve()
    target = base.joinpath(*parts).resolve()
    if not target.is_relative_to(base):
        raise UnsafeName(f"refusing a path outside {base}: {'/'.join(parts)}")
    return target
