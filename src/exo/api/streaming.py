"""Serving a generation over HTTP: streamed or whole, stopped when the client leaves.

``GenerationStream`` is an ASGI response that starts the generation itself, so an error
before the first byte (unknown instance, timeout, queue full) is still a proper HTTP
error, and a client that disconnects at any point -- queued, waiting for placement or
mid-stream -- cancels the generation.
"""

import json
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from loguru import logger
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from exo.api.errors import ApiError, send_error
from exo.api.generation import Generation, GenerationService, collect
from exo.api.generation_events import Failed, Finished, GenerationEvent
from exo.shared.models.model_cards import ModelCard
from exo.shared.types.common import CommandId
from exo.shared.types.text_generation import TextGenerationTaskParams

COMMAND_ID_HEADER = "x-exo-command-id"
# Status recorded for a request whose client left before any answer.
CLIENT_CLOSED_REQUEST = 499


def dumps(value: Mapping[str, Any] | list[Any]) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def sse(data: Mapping[str, Any] | str, event: str | None = None) -> bytes:
    """One server-sent event."""
    payload = data if isinstance(data, str) else dumps(data)
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {payload}\n\n".encode()


def ndjson(value: Mapping[str, Any]) -> bytes:
    return (dumps(value) + "\n").encode()


class StreamEncoder(Protocol):
    """Renders a generation's events in one API's streaming format."""

    def begin(self) -> list[bytes]: ...

    def encode(self, event: GenerationEvent) -> list[bytes]: ...


@dataclass
class Disconnect:
    happened: bool = False


async def _watch(receive: Receive, disconnect: Disconnect, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnect.happened = True
            scope.cancel()
            return


@asynccontextmanager
async def cancel_on_disconnect(receive: Receive) -> AsyncGenerator[Disconnect, None]:
    """Run the body until it ends or the client disconnects (then the body is cancelled
    and the block exits quietly with ``happened`` set). Call only after the request body
    was read."""
    disconnect = Disconnect()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch, receive, disconnect, tg.cancel_scope)
            try:
                yield disconnect
            finally:
                tg.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # Only the body can fail here: give its exception back unwrapped.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


async def complete(
    service: GenerationService,
    request: Request,
    params: TextGenerationTaskParams,
    card: ModelCard,
) -> tuple[CommandId, str, Finished] | None:
    """A whole answer, or None when the client went away first."""
    async with (
        cancel_on_disconnect(request.receive),
        service.generate(params, card) as generation,
    ):
        text, finished = await collect(generation)
        return generation.command_id, text, finished
    return None


def client_gone() -> Response:
    return Response(status_code=CLIENT_CLOSED_REQUEST)


class GenerationStream(Response):
    """A streamed generation; ``make_encoder`` renders it once it has started."""

    def __init__(
        self,
        service: GenerationService,
        params: TextGenerationTaskParams,
        card: ModelCard,
        make_encoder: Callable[[Generation], StreamEncoder],
        media_type: str,
    ) -> None:
        self._service = service
        self._params = params
        self._card = card
        self._make_encoder = make_encoder
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with cancel_on_disconnect(receive):
            await self._run(scope, receive, send)

    async def _run(self, scope: Scope, receive: Receive, send: Send) -> None:
        encoder: StreamEncoder | None = None
        try:
            async with self._service.generate(self._params, self._card) as generation:
                encoder = self._make_encoder(generation)
                headers = [
                    *self.raw_headers,
                    (COMMAND_ID_HEADER.encode(), generation.command_id.encode()),
                ]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await _write(send, encoder.begin())
                async for event in generation.events():
                    await _write(send, encoder.encode(event))
        except ApiError as error:
            if encoder is None:
                await send_error(scope, receive, send, error)
                return
            await _write(send, encoder.encode(Failed(error.message)))
        except Exception as e:
            logger.opt(exception=e).error("generation stream failed")
            if encoder is None:
                await send_error(scope, receive, send, ApiError(500, f"internal error: {e}"))
                return
            await _write(send, encoder.encode(Failed(f"internal error: {type(e).__name__}")))
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _write(send: Send, pieces: list[bytes]) -> None:
    if pieces:
        await send({"type": "http.response.body", "body": b"".join(pieces), "more_body": True})
