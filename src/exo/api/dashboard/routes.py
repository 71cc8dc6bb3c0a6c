"""Routes of the dashboard: the page at ``/``, its assets, and the ``/events`` stream."""

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from exo.api.dashboard.assets import SECURITY_HEADERS, asset_names, content_type
from exo.api.errors import ApiError
from exo.api.generation_service import GenerationService
from exo.api.handle import NodeHandle
from exo.shared.types.common import NodeId
from exo.shared.types.state import State

# Ollama's answer to ``GET /`` (its clients use ``HEAD /`` as a heartbeat).
OLLAMA_ROOT_TEXT = "Ollama is running"
# At most one state event per this many seconds: a busy cluster changes state often.
EVENTS_MIN_INTERVAL_S = 0.25
# A comment line this often keeps proxies and the browser from timing the stream out.
EVENTS_KEEPALIVE_S = 10.0
# How often the stream looks for a change that comes without a state change (the master).
_POLL_S = 1.0


def wants_html(request: Request) -> bool:
    """A browser navigating to the page (it asks for ``text/html`` first)."""
    return "text/html" in request.headers.get("accept", "")


def snapshot(handle: NodeHandle, state: State) -> dict[str, Any]:
    master = handle.master_id()
    return {
        "node_id": str(handle.node_id),
        "master_id": None if master is None else str(master),
        "state": state.model_dump(mode="json"),
    }


def state_event(data: dict[str, Any]) -> bytes:
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: state\ndata: {payload}\n\n".encode()


class SnapshotEncoder:
    """Encodes each state once for all of a node's streams (every open tab has one)."""

    def __init__(self, handle: NodeHandle) -> None:
        self._handle = handle
        self._last: tuple[State, NodeId | None, bytes] | None = None

    def __call__(self, state: State) -> bytes:
        master = self._handle.master_id()
        last = self._last
        if last is not None and last[0] is state and last[1] == master:
            return last[2]
        encoded = state_event(snapshot(self._handle, state))
        self._last = (state, master, encoded)
        return encoded


async def state_events(
    handle: NodeHandle,
    min_interval_s: float = EVENTS_MIN_INTERVAL_S,
    keepalive_s: float = EVENTS_KEEPALIVE_S,
    poll_s: float = _POLL_S,
    encode: Callable[[State], bytes] | None = None,
) -> AsyncIterator[bytes]:
    """The whole state at once, then again whenever it (or the master) changes, at most
    once per ``min_interval_s``; a comment line after ``keepalive_s`` of quiet."""
    encode = encode or SnapshotEncoder(handle)
    sent_state: State | None = None
    sent_master = handle.master_id()
    last_sent = time.monotonic()
    yield b"retry: 1000\n\n"
    while True:
        state = handle.state()
        master = handle.master_id()
        if state is not sent_state or master != sent_master:
            yield encode(state)
            sent_state, sent_master, last_sent = state, master, time.monotonic()
            await anyio.sleep(min_interval_s)
            continue
        try:
            await handle.wait_for_state(
                lambda s, seen=sent_state: s is not seen, timeout=poll_s
            )
        except TimeoutError:
            if time.monotonic() - last_sent >= keepalive_s:
                yield b": keep-alive\n\n"
                last_sent = time.monotonic()


def router(service: GenerationService) -> APIRouter:
    api = APIRouter()
    handle = service.handle
    assets = asset_names()
    index = assets["index.html"]
    encode = SnapshotEncoder(handle)

    @api.api_route("/", methods=["GET", "HEAD"], response_model=None)
    async def root(request: Request) -> Response:
        if wants_html(request):
            return Response(
                index.read_bytes(), media_type=content_type(index), headers=SECURITY_HEADERS
            )
        return PlainTextResponse(OLLAMA_ROOT_TEXT)

    @api.get("/dashboard/{name:path}")
    async def asset(name: str) -> Response:
        path = assets.get(name)
        if path is None:
            raise ApiError(404, f"no dashboard file {name!r}")
        return Response(path.read_bytes(), media_type=content_type(path), headers=SECURITY_HEADERS)

    @api.get("/events")
    async def events() -> StreamingResponse:
        return StreamingResponse(
            state_events(handle, encode=encode),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    return api
