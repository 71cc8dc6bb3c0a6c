"""Shard-only GGUF downloads: a node that holds layers [start, end) of a GGUF model fetches
the file's header, then with HTTP Range requests only its tensors (``blk.N.*`` of its layers,
the embedding on the first stage and on the last when the head is tied, ``output`` and
``output_norm`` on the last, every other non-layer tensor everywhere), and keeps them as one
valid GGUF file: the metadata unchanged, plus ``exo.shard.*`` keys naming the layer range,
repo, commit and file it came from.

The file lives at ``<cache>/exo-shards/models--org--name/<commit>/layers-S-E/<file>``
(every path through ``hub_names.inside``). It is written in order into
``<file>.exo-partial``: its layout is fixed by the header, so a cut connection or a restart
continues from the bytes held. Tensors a cached shard of the same file already holds are
copied from it, not fetched. Verified: the header's tensor table (offsets within the file's
size, no overlaps, sizes matching type and shape), each range's size and position, and the
finished file's own table against its size. The hub gives no per-range hash: the sha256 of a
file is checked only when the node fetches the whole file.
"""

import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import httpx2
from huggingface_hub import hf_hub_url
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from exo.shared.models.hub_files import mmproj_file, model_gguf_files
from exo.shared.models.model_cards import HubFile, HubSource, ModelCard
from exo.worker.download.gguf_index import (
    GGUFIndex,
    LyingHeader,
    TruncatedHead,
    check_index,
    kv_string,
    kv_strings,
    kv_u32,
    model_tensor_list,
    read_gguf_index,
    shard_layout,
)
from exo.worker.download.hub_names import UnsafeName, check_hub_source, inside
from exo.worker.download.resumable import (
    PARTIAL_SUFFIX,
    DownloadCancelled,
    DownloadError,
    HubSettings,
)

SHARD_DIR = "exo-shards"
_HEAD_FIRST = 8 << 10
_HEAD_MAX = 256 << 20
_COPY = 1 << 20
_MAX_STALLS = 5
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_SPLIT = re.compile(r"-\d{5}-of-\d{5}(\.gguf)$")


class RangeIgnored(Exception):
    """The hub answered a Range request with the whole file (200)."""


@dataclass(frozen=True)
class _Part:
    file: HubFile
    index: GGUFIndex


@dataclass(frozen=True)
class _Segment:
    """Bytes [dest, dest + length) of the shard file: literal bytes, or a tensor's bytes
    from a hub file (``remote``) or from a cached shard file (``local``)."""

    dest: int
    length: int
    literal: bytes = b""
    remote: HubFile | None = None
    local: Path | None = None
    source: int = 0


def gguf_files(hub: HubSource) -> list[HubFile]:
    """The model's GGUF file or parts (a vision model's mmproj file is not one of them)."""
    return model_gguf_files(hub.files)


def _repo_dir(cache_dir: Path, hub: HubSource) -> Path:
    check_hub_source(hub)
    return inside(cache_dir, SHARD_DIR, f"models--{hub.repo_id.replace('/', '--')}", hub.revision)


def _file_name(hub: HubSource) -> str:
    files = gguf_files(hub)
    if not files:
        raise DownloadError(f"{hub.repo_id}: the card lists no GGUF file", 404)
    return _SPLIT.sub(r"\1", PurePosixPath(files[0].path).name)


def shard_path(cache_dir: Path, hub: HubSource, start: int, end: int) -> Path:
    """Where the shard of layers [start, end) of the card's GGUF file is kept."""
    return inside(_repo_dir(cache_dir, hub), f"layers-{start}-{end}", _file_name(hub))


def _head_path(cache_dir: Path, hub: HubSource, path: str) -> Path:
    return inside(_repo_dir(cache_dir, hub), "heads", *PurePosixPath(path + ".head").parts)


def keep_head(cache_dir: Path, hub: HubSource, path: str, data: bytes) -> None:
    """Keep the first bytes of a GGUF file read for its card: a shard download of the same
    commit continues from them (best effort: a name that is not safe keeps nothing)."""
    try:
        target = _head_path(cache_dir, hub, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
    except (ValueError, OSError):
        return


def _kept_head(cache_dir: Path, hub: HubSource, f: HubFile) -> bytes:
    try:
        target = _head_path(cache_dir, hub, f.path)
        data = target.read_bytes() if target.is_file() else b""
    except (ValueError, OSError):
        return b""
    return data if len(data) <= f.size else b""


def cached_shards(cache_dir: Path, hub: HubSource) -> list[tuple[int, int, Path]]:
    """Finished shard files of this repo, commit and file: (start, end, path)."""
    root = _repo_dir(cache_dir, hub)
    if not root.is_dir():
        return []
    name = _file_name(hub)
    found: list[tuple[int, int, Path]] = []
    for folder in sorted(root.iterdir()):
        m = re.fullmatch(r"layers-(\d+)-(\d+)", folder.name)
        path = folder / name
        if m is not None and not folder.is_symlink() and path.is_file() and not path.is_symlink():
            found.append((int(m.group(1)), int(m.group(2)), inside(root, folder.name, name)))
    return found


def locate_gguf_shard(card: ModelCard, cache_dir: Path, start: int, end: int) -> Path | None:
    """A finished shard file holding layers [start, end) (its range may be wider)."""
    assert card.hub is not None
    for lo, hi, path in cached_shards(cache_dir, card.hub):
        if lo <= start and end <= hi and _local_index(path) is not None and (
            start != 0 or mmproj_beside(card.hub, path)
        ):
            return path
    return None


def mmproj_beside(hub: HubSource, shard: Path) -> bool:
    """The first stage's shard file has the model's mmproj file (if it has one) beside it,
    whole, as the engine looks for it."""
    mmproj = mmproj_file(hub.files)
    if mmproj is None:
        return True
    try:
        beside = _beside(shard, mmproj)
        return beside.is_file() and beside.stat().st_size == mmproj.size
    except (ValueError, OSError):
        return False


def _beside(shard: Path, f: HubFile) -> Path:
    """Where a file of the repo's top folder goes beside a shard file (a link there may lead
    into the hub cache's blobs: the name is checked, the link not followed)."""
    name = PurePosixPath(f.path).name
    if name != f.path or name in ("", ".", ".."):
        raise UnsafeName(f"{f.path!r} is not a file name of the repo's top folder")
    return shard.parent / name


def place_mmproj(hub: HubSource, shard: Path, fetched: Path) -> None:
    """Link the verified mmproj file (in the hub cache) beside a first stage's shard file."""
    mmproj = mmproj_file(hub.files)
    assert mmproj is not None
    link = _beside(shard, mmproj)
    tmp = link.with_name(link.name + ".link")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(fetched.resolve())
    os.replace(tmp, link)


def delete_gguf_shards(cache_dir: Path, hub: HubSource) -> bool:
    """Free the disk of this commit's shard files (links in it are removed, never followed)."""
    root = _repo_dir(cache_dir, hub)
    if not root.is_dir() or root.is_symlink():
        return False
    shutil.rmtree(root, ignore_errors=True)
    return True


def wanted(name: str, start: int, end: int, n_layers: int, tied: bool) -> bool:
    """Does the shard of layers [start, end) hold this tensor?"""
    m = _BLOCK.match(name)
    if m is not None:
        return start <= int(m.group(1)) < end
    last = end == n_layers
    if name == "token_embd.weight":
        return start == 0 or (last and tied)
    if name.startswith(("output.", "output_norm.")):
        return last
    return True


@dataclass
class GGUFShardFetch:
    """One shard-only download; ``run`` returns the finished file's path."""

    card: ModelCard
    start: int
    end: int
    settings: HubSettings
    on_bytes: Callable[[int], None]
    cancelled: threading.Event
    on_total: Callable[[int], None] = lambda _: None

    def __post_init__(self) -> None:
        assert self.card.hub is not None
        self.hub: HubSource = self.card.hub
        self.session = get_session()
        self.headers = build_hf_headers(token=self.settings.token or False)

    def run(self) -> Path:
        """Raises RangeIgnored (the caller fetches the whole file), DownloadError for a
        lying header (422), DownloadCancelled, or what the network raised."""
        final = shard_path(self.settings.cache_dir, self.hub, self.start, self.end)
        if final.is_file() and _local_index(final) is not None:
            self.on_total(final.stat().st_size)
            self.on_bytes(final.stat().st_size)
            return final
        parts = [_Part(f, self._head(f)) for f in gguf_files(self.hub)]
        segments = self._plan(parts)
        total = segments[-1].dest + segments[-1].length
        self.on_total(total)
        part = final.with_name(final.name + PARTIAL_SUFFIX)
        final.parent.mkdir(parents=True, exist_ok=True)
        part = inside(final.parent, part.name)
        self._fill(part, segments, total)
        index = _local_index(part)
        if index is None or part.stat().st_size != total:
            part.unlink(missing_ok=True)
            raise DownloadError(f"{self.hub.repo_id}: the shard file failed its check; retrying")
        os.replace(part, final)
        return final

    def _url(self, f: HubFile) -> str:
        return hf_hub_url(
            self.hub.repo_id, f.path, revision=self.hub.revision, endpoint=self.settings.endpoint
        )

    def _head(self, f: HubFile) -> GGUFIndex:
        """The file's header, its table checked: what the card's read kept, continued with
        growing Range requests, each starting where the last ended (fetched once)."""
        data = _kept_head(self.settings.cache_dir, self.hub, f)
        while True:
            try:
                index = read_gguf_index(data)
            except TruncatedHead:
                want = min(max(_HEAD_FIRST, 2 * len(data)), _HEAD_MAX, f.size)
                if want <= len(data):
                    raise DownloadError(f"{self.hub.repo_id}: {f.path} has no complete GGUF "
                                        f"header in its first {len(data)} bytes", 422) from None
                more = self._get_range(f, len(data), want)
                if not more:
                    raise DownloadError(f"{self.hub.repo_id}: {f.path}: the hub sent no bytes "
                                        "of the header; retrying") from None
                data += more
                continue
            except ValueError as e:
                raise DownloadError(f"{self.hub.repo_id}: {f.path}: refused: {e}", 422) from e
            try:
                check_index(index, f.size, f"{self.hub.repo_id}: {f.path}")
            except LyingHeader as e:
                raise DownloadError(f"refused: {e}", 422) from e
            return index

    def _get_range(self, f: HubFile, start: int, end: int) -> bytes:
        headers = {**self.headers, "Range": f"bytes={start}-{end - 1}"}
        with self.session.stream("GET", self._url(f), headers=headers, follow_redirects=True,
                                 timeout=httpx2.Timeout(30.0)) as r:
            hf_raise_for_status(r)
            if r.status_code != 206:
                raise RangeIgnored()
            _check_content_range(r.headers.get("Content-Range"), start, f)
            return r.read()

    def _plan(self, parts: list[_Part]) -> list[_Segment]:
        names = {t.name for p in parts for t in p.index.tensors}
        tied = "output.weight" not in names
        n_layers = self.card.n_layers
        chosen = [
            (p, t) for p in parts for t in p.index.tensors
            if wanted(t.name, self.start, self.end, n_layers, tied)
        ]
        first = parts[0].index
        extra = [
            kv_u32("exo.shard.start_layer", self.start),
            kv_u32("exo.shard.end_layer", self.end),
            kv_string("exo.shard.repo", self.hub.repo_id),
            kv_string("exo.shard.revision", self.hub.revision),
            kv_string("exo.shard.file", parts[0].file.path),
            kv_strings("exo.shard.model_tensors",
                       [x for p in parts for x in model_tensor_list(p.index)]),
        ]
        kept = [t for _, t in chosen]
        header, offsets = shard_layout(first, kept, extra)
        reuse = self._reusable()
        segments = [_Segment(0, len(header), literal=header)]
        for (p, t), dest in zip(chosen, offsets, strict=True):
            end = segments[-1].dest + segments[-1].length
            if dest > end:
                segments.append(_Segment(end, dest - end, literal=b"\0" * (dest - end)))
            held = reuse.get((t.name, t.dims, t.qtype))
            if held is not None:
                segments.append(_Segment(dest, t.n_bytes, local=held[0], source=held[1]))
            else:
                source = p.index.data_start + t.offset
                segments.append(_Segment(dest, t.n_bytes, remote=p.file, source=source))
        return segments

    def _reusable(self) -> dict[tuple[str, tuple[int, ...], int], tuple[Path, int]]:
        """Tensors cached shards of the same file hold: where to copy each from."""
        found: dict[tuple[str, tuple[int, ...], int], tuple[Path, int]] = {}
        for _, _, path in cached_shards(self.settings.cache_dir, self.hub):
            index = _local_index(path)
            if index is None:
                continue
            for t in index.tensors:
                found[(t.name, t.dims, t.qtype)] = (path, index.data_start + t.offset)
        return found

    def _fill(self, part: Path, segments: list[_Segment], total: int) -> None:
        have = part.stat().st_size if part.exists() else 0
        if have > total:
            part.unlink()
            have = 0
        self.on_bytes(have)  # progress counts the file's bytes, fetched, copied or held
        with part.open("ab") as out:
            for seg in segments:
                if seg.dest + seg.length <= have:
                    continue
                skip = have - seg.dest
                if seg.remote is not None:
                    self._fetch(out, seg, skip)
                elif seg.local is not None:
                    self._copy(out, seg.local, seg.source + skip, seg.length - skip)
                else:
                    out.write(seg.literal[skip:])
                    self.on_bytes(seg.length - skip)
                have = seg.dest + seg.length
                out.flush()

    def _copy(self, out: BinaryIO, source: Path, offset: int, length: int) -> None:
        with source.open("rb") as src:
            src.seek(offset)
            while length > 0:
                self._check_cancel()
                block = src.read(min(length, _COPY))
                if not block:
                    raise DownloadError(f"{source} is shorter than its header says")
                out.write(block)
                self.on_bytes(len(block))
                length -= len(block)

    def _fetch(self, out: BinaryIO, seg: _Segment, skip: int) -> None:
        """Append a tensor's bytes [skip, length) from the hub; a cut connection resumes
        from the last byte written (up to 5 times in a row without progress)."""
        assert seg.remote is not None
        done, stalls = skip, 0
        while done < seg.length:
            self._check_cancel()
            before = done
            a, b = seg.source + done, seg.source + seg.length
            headers = {**self.headers, "Range": f"bytes={a}-{b - 1}"}
            try:
                with self.session.stream("GET", self._url(seg.remote), headers=headers,
                                         follow_redirects=True,
                                         timeout=httpx2.Timeout(30.0)) as r:
                    hf_raise_for_status(r)
                    if r.status_code != 206:
                        raise RangeIgnored()
                    _check_content_range(r.headers.get("Content-Range"), a, seg.remote)
                    for chunk in r.iter_bytes():
                        self._check_cancel()
                        chunk = chunk[: seg.length - done]
                        out.write(chunk)
                        done += len(chunk)
                        self.on_bytes(len(chunk))
                        stalls = 0
            except (httpx2.TransportError, httpx2.RemoteProtocolError):
                out.flush()
            if done == before:
                stalls += 1
                if stalls > _MAX_STALLS:
                    raise DownloadError(f"{self.hub.repo_id}: {seg.remote.path}: no bytes "
                                        "came back for a tensor's range; retrying")
                time.sleep(min(0.2 * 2**stalls, 4.0))

    def _check_cancel(self) -> None:
        if self.cancelled.is_set():
            raise DownloadCancelled()


def _check_content_range(header: str | None, start: int, f: HubFile) -> None:
    """A ranged answer must start where asked, of a file of the listed size."""
    m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+|\*)", header or "")
    if m is None or int(m.group(1)) != start or m.group(3) not in ("*", str(f.size)):
        raise DownloadError(f"{f.path}: the hub answered a Range request with the wrong "
                            f"bytes ({header!r}, asked from {start} of {f.size})")


def _local_index(path: Path) -> GGUFIndex | None:
    """The checked header of a shard file on disk (None: unreadable, cut or lying)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            want = 1 << 20
            while True:
                fh.seek(0)
                data = fh.read(want)
                try:
                    index = read_gguf_index(data)
                    break
                except TruncatedHead:
                    if len(data) < want or want >= _HEAD_MAX:
                        return None
                    want *= 4
        check_index(index, size, str(path))
        last = max((index.data_start + t.offset + t.n_bytes for t in index.tensors), default=0)
        return index if last <= size else None
    except (OSError, ValueError):
        return None
