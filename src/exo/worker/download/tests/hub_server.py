"""A local stand-in for the Hugging Face hub, on 127.0.0.1, for tests.

It serves the paths ``huggingface_hub`` 2.4 calls (read from its source):
* ``GET /api/models/{repo}[/revision/{rev}]?blobs=true``: ``id``, ``sha`` and ``siblings``
  with ``rfilename``, ``size``, ``blobId`` and, for LFS files, ``lfs {sha256, size,
  pointerSize}`` (``HfApi.model_info(files_metadata=True)``);
* ``HEAD /{repo}/resolve/{rev}/{file}``: ``X-Repo-Commit``, ``ETag`` (the sha256 for LFS
  files), ``Content-Length`` (``get_hf_file_metadata``);
* ``GET`` of the same with ``Range: bytes=N-`` or ``bytes=N-M`` (206 + ``Content-Range``)
  (``http_get``, and the shard-only GGUF download's tensor ranges);
* ``GET /api/models?search=``: ``[{"id": ...}]`` (``HfApi.list_models``).
Errors carry ``X-Error-Code`` as the hub does (``RepoNotFound``, ``EntryNotFound``,
``GatedRepo``). Faults for tests: a file cut mid-way, corrupted bytes, a gated repo, and a
hostile hub: a claimed commit or file names that lead out of the cache (``HubRepo.sha``
and file names with ``..``); a hub that ignores ``Range`` (answers 200 with the whole
body) and a cut in the middle of a ranged answer. Files in ``HubRepo.disk`` are streamed
from disk (big generated models are never held in memory).
"""

import hashlib
import json
import re
import sys
import threading
import time
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

_LFS_MIN = 1024  # files at least this big are served as LFS files (like weights)


@dataclass
class HubRepo:
    files: dict[str, bytes]
    disk: dict[str, Path] = field(default_factory=dict[str, Path])
    """Files served from disk, streamed (a big file is never read whole into memory)."""
    gated: bool = False  # answers 401 without a token, 403 with a wrong one
    token: str = "hf_good_token"
    sha: str | None = None
    """A hostile hub: the commit it claims (e.g. ``../../victim``) instead of the real one."""

    @property
    def commit(self) -> str:
        if self.sha is not None:
            return self.sha
        h = hashlib.sha1()
        for name in sorted(self.names()):
            h.update(name.encode())
            h.update(self.sha256(name).encode())
        return h.hexdigest()

    def names(self) -> list[str]:
        return sorted({*self.files, *self.disk})

    def size(self, name: str) -> int:
        return len(self.files[name]) if name in self.files else self.disk[name].stat().st_size

    def sha256(self, name: str) -> str:
        return sha256_hex(self.files[name]) if name in self.files else _file_sha256(self.disk[name])

    def chunks(self, name: str, start: int, end: int) -> Generator[bytes]:
        """The bytes [start, end) of a file, in chunks of at most 1 MiB."""
        if name in self.files:
            yield self.files[name][start:end]
            return
        with self.disk[name].open("rb") as fh:
            fh.seek(start)
            left = end - start
            while left > 0 and (block := fh.read(min(left, 1 << 20))):
                left -= len(block)
                yield block


_FILE_DIGESTS: dict[tuple[Path, int, int], str] = {}


def _file_sha256(path: Path) -> str:
    st = path.stat()
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _FILE_DIGESTS:
        h = hashlib.sha256()
        with path.open("rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
        _FILE_DIGESTS[key] = h.hexdigest()
    return _FILE_DIGESTS[key]


# id -> (the bytes, their sha256): hashing a large file once, not on every request.
_DIGESTS: dict[int, tuple[bytes, str]] = {}


def sha256_hex(data: bytes) -> str:
    known = _DIGESTS.get(id(data))
    if known is None or known[0] is not data:
        known = (data, hashlib.sha256(data).hexdigest())
        _DIGESTS[id(data)] = known
    return known[1]


@dataclass
class HubRequest:
    method: str
    repo: str
    file: str | None
    range_start: int
    range_header: str | None = None
    sent: int = 0
    """Body bytes written to the client (what a node downloaded with this request)."""


@dataclass
class FakeHub:
    repos: dict[str, HubRepo] = field(default_factory=dict[str, HubRepo])
    requests: list[HubRequest] = field(default_factory=list[HubRequest])
    cut_once: set[str] = field(default_factory=set[str])
    """Files whose next GET stops after half of its bytes (the connection is cut)."""
    corrupt_once: set[str] = field(default_factory=set[str])
    """Files whose next GET serves flipped bytes (the right length, the wrong content)."""
    down: bool = False
    bytes_per_s: float | None = None
    """Serve file bodies at about this rate (None: as fast as possible)."""
    """Every request fails with 503 (the hub unreachable in all but name)."""
    ignore_range: bool = False
    """Answer every GET with 200 and the whole body, whatever ``Range`` asks."""
    cut_ranged_once: set[str] = field(default_factory=set[str])
    """Files whose next GET with a Range that does not start at 0 stops halfway."""
    url: str = ""

    def add_folder(
        self, repo_id: str, folder: Path, gated: bool = False, from_disk: bool = False
    ) -> HubRepo:
        paths = {str(p.relative_to(folder)): p for p in sorted(folder.rglob("*")) if p.is_file()}
        if from_disk:
            repo = HubRepo(files={}, disk=paths, gated=gated)
        else:
            repo = HubRepo(files={n: p.read_bytes() for n, p in paths.items()}, gated=gated)
        self.repos[repo_id] = repo
        return repo

    def bytes_sent(self, repo_id: str) -> int:
        """Body bytes of every GET of a repo's files (what its clients downloaded)."""
        return sum(r.sent for r in self.requests if r.method == "GET" and r.repo == repo_id)

    def weight_gets(self, repo_id: str) -> list[str]:
        """Files of a repo fetched with GET (whole or from an offset), in order."""
        return [
            r.file for r in self.requests
            if r.method == "GET" and r.repo == repo_id and r.file is not None
            and r.file.endswith((".safetensors", ".gguf"))
        ]


def _sibling(repo: HubRepo, name: str) -> dict[str, Any]:
    size = repo.size(name)
    if name in repo.files:
        blob_id = hashlib.sha1(b"blob %d\0" % size + repo.files[name]).hexdigest()
    else:  # a file on disk is big: any stable id does (it is an LFS file)
        blob_id = hashlib.sha1(repo.sha256(name).encode()).hexdigest()
    entry: dict[str, Any] = {"rfilename": name, "size": size, "blobId": blob_id}
    if size >= _LFS_MIN:
        entry["lfs"] = {"size": size, "sha256": repo.sha256(name), "pointerSize": 134}
    return entry


_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def _hub(self) -> FakeHub:
        assert isinstance(self.server, _Server)
        return self.server.hub

    def do_HEAD(self) -> None:
        self._handle(head=True)

    def do_GET(self) -> None:
        self._handle(head=False)

    def _handle(self, head: bool) -> None:
        hub = self._hub
        parsed = urlparse(self.path)
        path = unquote(parsed.path)
        raw = _RESOLVE.match(parsed.path)  # a revision is quoted whole (it may hold '/')
        if hub.down:
            return self._error(503, "Unavailable", head)
        if path == "/api/models":
            q = parse_qs(parsed.query).get("search", [""])[0].lower()
            found = [{"id": r, "modelId": r} for r in sorted(hub.repos) if q in r.lower()]
            return self._json(found, head)
        if m := _INFO.match(path):
            return self._info(m.group("repo"), m.group("rev"), head)
        if m := raw or _RESOLVE.match(path):
            return self._resolve(unquote(m.group("repo")), unquote(m.group("rev")),
                                 unquote(m.group("file")), head)
        self._error(404, "RepoNotFound", head)

    def _repo(self, repo_id: str, head: bool) -> HubRepo | None:
        repo = self._hub.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", head)  # the hub answers 401 without a token
            return None
        if repo.gated:
            auth = self.headers.get("Authorization", "")
            if auth != f"Bearer {repo.token}":
                self._error(403 if auth else 401, "GatedRepo", head)
                return None
        return repo

    def _info(self, repo_id: str, rev: str | None, head: bool) -> None:
        repo = self._repo(repo_id, head)
        if repo is None:
            return
        self._hub.requests.append(HubRequest(self.command, repo_id, None, 0))
        if rev not in (None, "main", repo.commit):
            return self._error(404, "RevisionNotFound", head)
        body = {
            "id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
            "siblings": [_sibling(repo, n) for n in repo.names()],
        }
        self._json(body, head)

    def _resolve(self, repo_id: str, rev: str, file: str, head: bool) -> None:
        hub = self._hub
        repo = self._repo(repo_id, head)
        if repo is None:
            return
        if rev not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound", head)
        if file not in repo.names():
            return self._error(404, "EntryNotFound", head)
        size = repo.size(file)
        rng = self.headers.get("Range")
        m = re.match(r"bytes=(\d+)-(\d*)", rng or "")
        if m is not None and not (hub.ignore_range and not head):
            start = int(m.group(1))
            end = min(int(m.group(2)) + 1, size) if m.group(2) else size
        else:
            rng, start, end = None, 0, size
        request = HubRequest(self.command, repo_id, file, start, rng)
        hub.requests.append(request)
        etag = repo.sha256(file) if size >= _LFS_MIN else _sibling(repo, file)["blobId"]
        cut_whole = not head and file in hub.cut_once
        cut_ranged = not head and start > 0 and file in hub.cut_ranged_once
        cut = cut_whole or cut_ranged
        corrupt = not head and file in hub.corrupt_once
        hub.cut_once.discard(file) if cut_whole else None
        hub.cut_ranged_once.discard(file) if cut_ranged else None
        hub.corrupt_once.discard(file) if corrupt else None
        self.send_response(206 if rng else 200)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if not head:
            self._body(request, repo.chunks(file, start, end), end - start, cut, corrupt)

    def _body(
        self, request: HubRequest, chunks: Generator[bytes], length: int, cut: bool,
        corrupt: bool,
    ) -> None:
        hub = self._hub
        limit = length // 2 if cut else length
        step = 64 << 10
        for chunk in chunks:
            for i in range(0, len(chunk), step):
                piece = chunk[i : i + step][: limit - request.sent]
                if corrupt:
                    piece = bytes(b ^ 0xFF for b in piece)
                self.wfile.write(piece)
                request.sent += len(piece)
                if hub.bytes_per_s is not None:
                    time.sleep(len(piece) / hub.bytes_per_s)
                if request.sent >= limit:
                    break
            if request.sent >= limit:
                break
        if cut:
            self.wfile.flush()
            self.close_connection = True

    def _json(self, body: Any, head: bool) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if not head:
            self.wfile.write(raw)

    def _error(self, status: int, code: str, head: bool) -> None:
        raw = json.dumps({"error": code}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if not head:
            self.wfile.write(raw)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: FakeHub

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-answer (a node stopped during its download, as the
        tests and `bench/split.py` do) is no fault of the stand-in: not printed. Anything
        else is, with its traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


@contextmanager
def serve_hub(hub: FakeHub) -> Generator[FakeHub]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.hub = hub
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
