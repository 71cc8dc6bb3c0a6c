"""Request/reply over zenoh queries, with authenticated requests and replies.

A reply body is one status byte then the content: ``0`` + the reply as JSON, or ``1`` +
the handler's error as UTF-8 text. A reply's MAC covers the request it answers (see
``reply_context``), so a reply cannot be replayed as the answer to another request.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectSendStream
from loguru import logger
from pydantic import ValidationError

from exo.routing._zenoh import IncomingQuery
from exo.routing.envelope import Opened, Rejection
from exo.routing.errors import NoReply, RemoteError, RequestTimeout
from exo.routing.topics import Endpoint
from exo.routing.transport import Transport, reply_context

Req = TypeVar("Req")
Rep = TypeVar("Rep")

_OK = b"\x00"
_ERROR = b"\x01"
_REPLY_BUFFER = 16
_QUERY_MARGIN_S = 0.5  # see `request`

_INBOX_BUFFER = 256

Handler = Callable[[Req], Awaitable[Rep]]


@dataclass(frozen=True)
class _Accepted(Generic[Req]):
    query: IncomingQuery
    opened: Opened
    request: Req


class Service(Generic[Req, Rep]):
    """Answers requests to ``endpoint`` addressed to this node (or to every node), while
    ``run`` runs.

    Each request runs ``handler`` in its own task; past ``max_concurrent`` running ones, a
    request gets a "busy" error at once. An exception in the handler becomes a RemoteError
    for the asker (and is logged here)."""

    def __init__(
        self,
        transport: Transport,
        endpoint: Endpoint[Req, Rep],
        handler: Handler[Req, Rep],
        *,
        max_concurrent: int,
    ) -> None:
        self._transport = transport
        self._endpoint = endpoint
        self._handler = handler
        self._max_concurrent = max_concurrent
        self._running = 0
        self._guard = transport.guard()
        self._key = transport.keys.endpoint(endpoint.name, transport.node_id)
        self._inbox, self._accepted = anyio.create_memory_object_stream[_Accepted[Req]](
            _INBOX_BUFFER
        )
        self._undeclare: Callable[[], None] = lambda: None
        self._cancel = anyio.CancelScope()

    async def run(self, task_status: TaskStatus[None]) -> None:
        """Serve until cancelled or ended; ``task_status.started()`` once declared."""
        with self._cancel:
            async with anyio.create_task_group() as task_group, self._accepted:
                self._undeclare = self._transport.session.serve(self._key, self._on_query_thread)
                try:
                    task_status.started()
                    async for accepted in self._accepted:
                        self._running += 1
                        task_group.start_soon(self._answer, accepted)
                finally:
                    self._undeclare()

    def end(self) -> None:
        """Stop serving at once; requests being handled get no reply."""
        self._undeclare()
        self._inbox.close()
        self._cancel.cancel()

    def _on_query_thread(self, query: IncomingQuery) -> None:
        self._transport.bridge.post(partial(self._on_query, query))

    def _on_query(self, query: IncomingQuery) -> None:
        opened = self._transport.open(query.key, query.payload, self._guard)
        if opened is None:
            query.finish()
            return
        try:
            request = self._endpoint.request.decode(opened.payload)
        except ValidationError as e:
            logger.debug(f"{self._endpoint} from {opened.sender}: invalid request: {e}")
            self._transport.reject(Rejection.UNDECODABLE, query.key, opened.sender)
            query.finish()
            return
        try:
            self._inbox.send_nowait(_Accepted(query, opened, request))
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._transport.stats.dropped += 1
            logger.warning(f"{self._endpoint}: not serving or too many queued requests: dropped")
            query.finish()

    async def _answer(self, accepted: _Accepted[Req]) -> None:
        query, opened = accepted.query, accepted.opened
        replied = False
        try:
            if self._running > self._max_concurrent:
                body = _ERROR + f"{self._endpoint} on {self._transport.node_id} is busy".encode()
            else:
                body = await self._run_handler(opened.sender, accepted.request)
            await self._transport.reply(query, opened, self._key, body)
            replied = True  # the outbox finishes the query once the reply is out
        finally:
            self._running -= 1
            if not replied:
                query.finish()

    async def _run_handler(self, sender: str, request: Req) -> bytes:
        try:
            reply = await self._handler(request)
        except Exception as e:
            logger.exception(f"{self._endpoint}: handler failed on a request from {sender}")
            return _ERROR + f"{type(e).__name__}: {e}".encode()
        return _OK + self._endpoint.reply.encode(reply)


async def request(
    transport: Transport,
    endpoint: Endpoint[Req, Rep],
    message: Req,
    *,
    target: str | None,
    timeout_s: float,
) -> Rep:
    """Ask ``target`` (or every node serving ``endpoint``); the first valid reply wins."""
    key = transport.keys.endpoint(endpoint.name, target)
    send, receive = anyio.create_memory_object_stream[bytes](_REPLY_BUFFER)
    with send, receive, anyio.move_on_after(timeout_s) as deadline:
        counter = await transport.query(
            key,
            endpoint.request.encode(message),
            # zenoh's own timeout a little later than ours: a query still unanswered at the
            # deadline ends as a timeout here, not (when zenoh's fired first) as "nobody replied"
            timeout_s=timeout_s + _QUERY_MARGIN_S,
            on_reply=partial(_post_reply, transport, send),
            on_done=partial(transport.bridge.post, send.close),
        )
        context = reply_context(key, transport.node_id, transport.envelope_session, counter)
        async for data in receive:
            opened = transport.open(context, data, None)
            if opened is not None:
                return _parse_reply(transport, endpoint, opened, context)
    if deadline.cancelled_caught:
        raise RequestTimeout(f"{endpoint} to {target or 'any node'}: no reply in {timeout_s} s")
    raise NoReply(f"{endpoint} to {target or 'any node'}: nobody replied")


def _post_reply(transport: Transport, send: MemoryObjectSendStream[bytes], data: bytes) -> None:
    transport.bridge.post(partial(transport.offer, send, data, "reply"))


def _parse_reply(
    transport: Transport, endpoint: Endpoint[Req, Rep], opened: Opened, context: str
) -> Rep:
    status, content = opened.payload[:1], opened.payload[1:]
    if status == _ERROR:
        raise RemoteError(f"{endpoint} on {opened.sender}: {content.decode(errors='replace')}")
    if status != _OK:
        transport.reject(Rejection.MALFORMED, context, opened.sender)
        raise RemoteError(f"{endpoint} on {opened.sender}: malformed reply")
    try:
        return endpoint.reply.decode(content)
    except ValidationError as e:
        transport.reject(Rejection.UNDECODABLE, context, opened.sender)
        raise RemoteError(f"{endpoint} on {opened.sender}: invalid reply: {e}") from e
