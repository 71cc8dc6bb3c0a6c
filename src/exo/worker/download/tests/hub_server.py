"""A local stand-in for the Hugging Face hub, on 127.0.0.1, for tests.

It serves the paths ``huggingface_hub`` 2.4 calls (read from its source):
* ``GET /api/models/{repo}[/revision/{rev}]?blobs=true``: ``id``, ``sha`` and ``siblings``
  with ``rfilename``, ``size``, ``blobId`` and, for LFS files, ``lfs {sha256, size,
  pointerSize}`` (``HfApi.model_info(files_metadata=True)``);
* ``HEAD /{repo}/resolve/{rev}/{file}``: ``X-Repo-Commit``, ``ETag`` (the sha256 for LFS
  files), ``Content-Length`` (``get_hf_file_metadata``);
* ``GET`` of the same with ``Range: bytes=N-`` (206 + ``Content-Range``) (``http_get``);
* ``GET /api/models?search=``: ``[{"id": ...}]`` (``HfApi.list_models``).
Errors carry ``X-Error-Code`` as the hub does (``RepoNotFound``, ``EntryNotFound``,
``GatedRepo``). Faults for tests: a file cut mid-way, corrupted bytes, a gated repo, and a
hostile hub: a claimed commit or file names that lead out of the cache (``HubRepo.sha``
and file names with ``..``).
"""

import hashlib
import json
import re
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
    gated: bool = False  # answers 401 without a token, 403 with a wrong one
    token: str = "hf_good_token"
    sha: str | None = None
    """A hostile hub: the commit it claims (e.g. ``../../victim``) instead of the real one."""

    @property
    def commit(self) -> str:
        if self.sha is not None:
            return self.sha
        h = hashlib.sha1()
        for name in sorted(self.files):
            h.update(name.encode())
            h.update(sha256_hex(self.files[name]).encode())
        return h.hexdigest()


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
    url: str = ""

    def add_folder(self, repo_id: str, folder: Path, gated: bool = False) -> HubRepo:
        files = {
            str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
        }
        repo = HubRepo(files=files, gated=gated)
        self.repos[repo_id] = repo
        return repo

    def weight_gets(self, repo_id: str) -> list[str]:
        """Files of a repo fetched with GET (whole or from an offset), in order."""
        return [
            r.file for r in self.requests
            if r.method == "GET" and r.repo == repo_id and r.file is not None
            and r.file.endswith((".safetensors", ".gguf"))
        ]


def _sibling(name: str, data: bytes) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "rfilename": name,
        "size": len(data),
        "blobId": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
    }
    if len(data) >= _LFS_MIN:
        entry["lfs"] = {"size": len(data), "sha256": sha256_hex(data),
                        "pointerSize": 134}
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
            "siblings": [_sibling(n, d) for n, d in sorted(repo.files.items())],
        }
        self._json(body, head)

    def _resolve(self, repo_id: str, rev: str, file: str, head: bool) -> None:
        hub = self._hub
        repo = self._repo(repo_id, head)
        if repo is None:
            return
        if rev not in ("main", repo.commit):
            return self._error(404, "RevisionNotFound", head)
        data = repo.files.get(file)
        if data is None:
            return self._error(404, "EntryNotFound", head)
        start = 0
        rng = self.headers.get("Range")
        if rng and (m := re.match(r"bytes=(\d+)-(\d*)", rng)):
            start = int(m.group(1))
            end = int(m.group(2)) + 1 if m.group(2) else len(data)
        else:
            end = len(data)
        hub.requests.append(HubRequest(self.command, repo_id, file, start, rng))
        etag = sha256_hex(data) if len(data) >= _LFS_MIN else _sibling(file, data)["blobId"]
        body = data[start:end]
        cut = not head and file in hub.cut_once
        corrupt = not head and file in hub.corrupt_once
        hub.cut_once.discard(file) if cut else None
        hub.corrupt_once.discard(file) if corrupt else None
        self.send_response(206 if rng else 200)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(body)))
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.end_headers()
        if head:
            return
        if corrupt:
            body = bytes(b ^ 0xFF for b in body)
        if cut:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if hub.bytes_per_s is None:
            self.wfile.write(body)
            return
        step = 64 << 10
        for i in range(0, len(body), step):
            self.wfile.write(body[i : i + step])
            time.sleep(step / hub.bytes_per_s)

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
