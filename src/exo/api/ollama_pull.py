"""Ollama ``POST /api/pull``: the download machinery (``/download/start`` on this node),
answered with Ollama's pull status lines while the model's files arrive.

A hub model (``org/repo`` or ``org/repo:QUANT``, or a catalogue name) gets its card, then
its download starts on the node that took the request; the stream says ``pulling
manifest``, then ``pulling <digest>`` with ``total`` / ``completed`` bytes as the node
reports progress, then ``verifying sha256 digest`` (the downloader checks each file's
sha256 before it enters the cache), ``writing manifest`` and ``success``. A failure is an
``{"error": ...}`` line (or the HTTP error when not streamed). A model whose files are
already here (the embedded model, a local file) answers ``success`` at once. A client that
leaves does not cancel the download (``/download/cancel`` does).
"""

from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.responses import Response

from exo.api.download_wait import DownloadWatch
from exo.api.errors import ApiError
from exo.api.generation_service import GenerationService
from exo.api.ollama import NamedModelRequest, resolve
from exo.api.ollama_models import digest
from exo.api.streaming import ndjson
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.commands import DownloadAction
from exo.shared.types.common import NodeId
from exo.shared.types.state import State
from exo.shared.types.worker.downloads import (
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadProgress,
)

# How often a quiet download is looked at again (progress comes as state changes).
_POLL_S = 1.0
# How long a failure seen before the pull started is taken for an old one.
_STALE_S = 10.0


class PullRequest(NamedModelRequest):
    insecure: bool = False
    stream: bool = True


class PullFailed(Exception):
    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


def progress_of(state: State, node_id: NodeId, card: ModelCard) -> DownloadProgress | None:
    return state.downloads.get(node_id, {}).get(card.model_id)


async def pull_status(
    service: GenerationService, card: ModelCard, node_id: NodeId
) -> AsyncIterator[dict[str, Any]]:
    """The pull's status lines; raises PullFailed when the download fails for good (or keeps
    failing)."""
    handle = service.handle
    yield {"status": "pulling manifest"}
    if card.hub is None:  # nothing to fetch: the files are on this node
        yield {"status": "success"}
        return
    layer = "sha256:" + digest(card)
    title = f"pulling {layer[7:19]}"
    total = card.storage_size.in_bytes
    # A failure already in the state before this start is not this pull's answer.
    stale = progress_of(handle.state(), node_id, card)
    if not isinstance(stale, DownloadCompleted):
        await service.send(DownloadAction(action="start", node_id=node_id, model_card=card))
    stale = stale if isinstance(stale, DownloadFailed) else None
    # ... unless nothing else comes for a while (the restart failed again, unseen).
    stale_until = anyio.current_time() + _STALE_S
    watch = DownloadWatch(card.model_id, nodes={node_id})
    shown: tuple[int, int] | None = None
    while True:
        state = handle.state()
        progress = progress_of(state, node_id, card)
        if progress != stale or anyio.current_time() > stale_until:
            stale = None
            error = watch.observe(state, anyio.current_time())
            if error is not None:
                raise PullFailed(error)
        if isinstance(progress, DownloadCompleted):
            break
        if isinstance(progress, DownloadOngoing):
            total = progress.total_bytes or total
            if (progress.downloaded_bytes, total) != shown:
                shown = (progress.downloaded_bytes, total)
                yield {"status": title, "digest": layer, "total": total,
                       "completed": progress.downloaded_bytes}  # fmt: skip
        seen = progress

        def moved(s: State, seen: DownloadProgress | None = seen) -> bool:
            return progress_of(s, node_id, card) != seen

        try:
            await handle.wait_for_state(moved, timeout=_POLL_S)
        except TimeoutError:
            pass
    yield {"status": title, "digest": layer, "total": total, "completed": total}
    yield {"status": "verifying sha256 digest"}
    yield {"status": "writing manifest"}
    yield {"status": "success"}


def router(service: GenerationService) -> APIRouter:
    api = APIRouter()

    @api.post("/api/pull", response_model=None)
    async def pull(body: PullRequest) -> Response:
        card = await resolve(service, body.model_name)  # a known model, else a hub card
        lines = pull_status(service, card, service.handle.node_id)
        if not body.stream:
            last: dict[str, Any] = {}
            try:
                async for line in lines:
                    last = line
            except PullFailed as e:
                raise e.error from e
            return JSONResponse(last)

        async def stream() -> AsyncIterator[bytes]:
            try:
                async for line in lines:
                    yield ndjson(line)
            except PullFailed as e:
                yield ndjson({"error": e.error.message})

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    return api
