"""Serving a generation over HTTP: streamed or whole, stopped when the client leaves.

``GenerationStream`` is an ASGI response that starts the generation itself, so an error
before the first byte (unknown instance, timeout, queue full) is still a proper HTTP
error, and a client that disconnects at any point -- queued, waiting for placement or
mid-stream -- cancels the generation.
"""

import json
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from loguru import logger
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from exo.api.errors import ApiError, send_error
from exo.api.generation_events import Failed, Finished, GenerationEvent
from exo.api.generation_service import GenerationService, collect, failure_error
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

    def begin(self, prompt_tokens: int) -> list[bytes]:
        """The opening events, once the prompt's length is known."""
        ...

    def encode(self, event: GenerationEvent, index: int = 0) -> list[bytes]:
        """An event of choice ``index`` (only OpenAI chat has several, with ``n``)."""
        ...


# An SSE comment line: clients ignore it, proxies and idle timeouts see traffic.
KEEP_ALIVE = b": keep-alive\n\n"


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


class _Output:
    """The response's bytes: headers sent once, on the first write or keep-alive."""

    def __init__(self, send: Send, headers: list[tuple[bytes, bytes]]) -> None:
        self._send = send
        self._headers = headers
        self._lock = anyio.Lock(fast_acquire=True)  # no loop turn a token when free
        self.started = False
        self.last_write = anyio.current_time()

    async def write(self, pieces: list[bytes]) -> None:
        async with self._lock:
            await self._start()
            if pieces:
                await _write(self._send, pieces)
            self.last_write = anyio.current_time()

    async def _start(self) -> None:
        if not self.started:
            self.started = True
            await self._send(
                {"type": "http.response.start", "status": 200, "headers": self._headers}
            )

    async def keep_alive(self, interval_s: float) -> None:
        """While nothing else is written: a comment every ``interval_s`` seconds."""
        while True:
            await anyio.sleep(max(self.last_write + interval_s - anyio.current_time(), 0.0))
            if anyio.current_time() - self.last_write >= interval_s:
                await self.write([KEEP_ALIVE])


class GenerationStream(Response):
    """A streamed generation; ``make_encoder`` renders it.

    The status line waits for the generation's first event, so a request the runner
    refuses (a prompt over the context) is still a plain HTTP error; with ``keep_alive``
    (SSE), a wait longer than the keep-alive interval (a queue, a model load) starts the
    stream with comments instead.
    """

    def __init__(
        self,
        service: GenerationService,
        params: TextGenerationTaskParams | Sequence[TextGenerationTaskParams],
        card: ModelCard,
        make_encoder: Callable[[CommandId], StreamEncoder],
        media_type: str,
        keep_alive: bool = True,
    ) -> None:
        self._service = service
        self._params = [params] if isinstance(params, TextGenerationTaskParams) else list(params)
        self._card = card
        self._make_encoder = make_encoder
        self._keep_alive = keep_alive
        self.status_code = 200
        self.media_type = media_type
        self.background = None
        self.init_headers({"cache-control": "no-cache", "x-accel-buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with cancel_on_disconnect(receive):
            await self._run(scope, receive, send)

    async def _run(self, scope: Scope, receive: Receive, send: Send) -> None:
        command_id = CommandId()
        encoder = self._make_encoder(command_id)
        headers = [*self.raw_headers, (COMMAND_ID_HEADER.encode(), command_id.encode())]
        out = _Output(send, headers)
        begun = False
        async with anyio.create_task_group() as tg:
            if self._keep_alive:
                tg.start_soon(out.keep_alive, self._service.keep_alive_interval_s)
            failure: Failed | None = None
            try:
                for index, params in enumerate(self._params):
                    # Choices run one after another: n of them never wait for n slots.
                    cid = command_id if index == 0 else CommandId()
                    last: GenerationEvent | None = None
                    async with self._service.generate(params, self._card, cid) as generation:
                        async for event in generation.events():
                            last = event
                            if isinstance(event, Failed) and not out.started:
                                failure = event
                                break
                            pieces: list[bytes] = []
                            if not begun:
                                begun = True
                                pieces.extend(encoder.begin(generation.prompt_tokens or 0))
                            await out.write([*pieces, *encoder.encode(event, index)])
                    if failure is not None or not isinstance(last, Finished):
                        break
            except ApiError as error:
                failure = Failed(error.message)
                if not out.started:
                    tg.cancel_scope.cancel()
                    await send_error(scope, receive, send, error)
                    return
            except Exception as e:
                logger.opt(exception=e).error("generation stream failed")
                failure = Failed(f"internal error: {type(e).__name__}")
                if not out.started:
                    tg.cancel_scope.cancel()
                    await send_error(scope, receive, send, ApiError(500, failure.message))
                    return
            tg.cancel_scope.cancel()
            if failure is not None:
                if not out.started:
                    await send_error(scope, receive, send, failure_error(failure))
                    return
                opening = [] if begun else encoder.begin(0)
                await out.write([*opening, *encoder.encode(failure, 0)])
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _write(send: Send, pieces: list[bytes]) -> None:
    if pieces:
        await send({"type": "http.response.body", "body": b"".join(pieces), "more_body": True})
