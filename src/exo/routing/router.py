"""The router: one node's door to the cluster network.

    async with anyio.create_task_group() as tg, Router(config) as router:
        events = router.subscribe(EVENTS)
        await router.publish(EVENTS, event)
        await router.send_to(CHUNKS, node_id, chunk)
        await tg.start(router.serve, LOG, answer_log_request)
        page = await router.request(LOG, LogRequest(since=10), target=master_id)

Needs anyio's asyncio backend. Messages from this node reach its own subscribers too
(unless ``include_self=False``). Closing the router ends its subscriptions, presence
watches and ``serve`` calls (so open the task group that runs ``serve`` outside it).
"""

import weakref
from contextlib import AsyncExitStack
from functools import partial
from types import TracebackType
from typing import Protocol, Self, TypeVar

import anyio
import anyio.to_thread
from anyio.abc import TaskStatus

from exo.routing._zenoh import ZenohSession
from exo.routing.config import RoutingConfig, zenoh_config
from exo.routing.errors import RouterClosed
from exo.routing.keys import ClusterKeys, check_node_id
from exo.routing.outbox import Outbox
from exo.routing.presence import PresenceWatch
from exo.routing.replay_book import ReplayBook
from exo.routing.rpc import Handler, Service, request
from exo.routing.subscription import Subscription
from exo.routing.topics import Endpoint, Topic
from exo.routing.transport import LoopBridge, RouterStats, Transport

T = TypeVar("T")
Req = TypeVar("Req")
Rep = TypeVar("Rep")

_LOCATORS_TIMEOUT_S = 2.0


class _Ends(Protocol):
    def end(self) -> None: ...


E = TypeVar("E", bound=_Ends)


class Router:
    def __init__(self, config: RoutingConfig) -> None:
        self.config = config
        self._keys = ClusterKeys.from_secret(config.secret)
        self._stats = RouterStats()
        self._transport: Transport | None = None
        self._stack = AsyncExitStack()
        self._listen: list[str] = []
        self._open_streams: weakref.WeakSet[_Ends] = weakref.WeakSet()

    @property
    def node_id(self) -> str:
        return self.config.node_id

    @property
    def stats(self) -> RouterStats:
        return self._stats

    @property
    def listen_endpoints(self) -> list[str]:
        """Where this node really listens (``:0`` resolved): give these as another's peers."""
        return list(self._listen)

    async def __aenter__(self) -> Self:
        if self._transport is not None:
            raise RuntimeError("the router is open already")
        async with AsyncExitStack() as stack:
            bridge = LoopBridge()
            stack.callback(bridge.close)
            session = await anyio.to_thread.run_sync(ZenohSession, zenoh_config(self.config))
            stack.push_async_callback(partial(anyio.to_thread.run_sync, session.close))
            self._listen = await anyio.to_thread.run_sync(session.locators, _LOCATORS_TIMEOUT_S)
            stack.callback(session.declare_token(self._keys.alive(self.node_id)))
            outbox = Outbox(f"exo-router-{self.node_id}", self.config.send_buffer)
            stack.push_async_callback(outbox.close)
            stack.callback(self._end_streams)
            book = ReplayBook(self.config.replay_path)
            stack.callback(book.close)
            self._transport = Transport(
                self.node_id, self._keys, session, bridge, outbox, self._stats, book
            )
            stack.callback(self._forget_transport)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._stack.__aexit__(exc_type, exc, tb)

    async def publish(self, topic: Topic[T], message: T) -> None:
        """Send to every subscriber of ``topic`` in the cluster."""
        await self._open().put(self._keys.topic(topic.name), topic.encode(message))

    async def send_to(self, topic: Topic[T], node_id: str, message: T) -> None:
        """Send to ``node_id`` only (its ``subscribe_direct(topic)``)."""
        key = self._keys.direct(topic.name, check_node_id(node_id))
        await self._open().put(key, topic.encode(message))

    def subscribe(
        self, topic: Topic[T], *, include_self: bool = True, buffer: int | None = None
    ) -> Subscription[T]:
        """Receive what anyone publishes on ``topic`` from now on."""
        return self._track(
            self._subscribe(topic, self._keys.topic(topic.name), include_self, buffer)
        )

    def subscribe_direct(self, topic: Topic[T], *, buffer: int | None = None) -> Subscription[T]:
        """Receive what is sent to this node with ``send_to(topic, this node, ...)``."""
        key = self._keys.direct(topic.name, self.node_id)
        return self._track(self._subscribe(topic, key, True, buffer))

    async def serve(
        self,
        endpoint: Endpoint[Req, Rep],
        handler: Handler[Req, Rep],
        *,
        max_concurrent: int = 32,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Answer ``endpoint`` requests with ``handler`` until cancelled or the router closes.
        ``await task_group.start(router.serve, endpoint, handler)`` returns once it serves."""
        service = Service(self._open(), endpoint, handler, max_concurrent=max_concurrent)
        self._track(service)
        await service.run(task_status)

    async def request(
        self,
        endpoint: Endpoint[Req, Rep],
        message: Req,
        *,
        target: str | None = None,
        timeout: float | None = None,
    ) -> Rep:
        """Ask ``target`` (or any node serving ``endpoint``). Raises RequestTimeout, NoReply
        (nobody serves it) or RemoteError (the handler failed)."""
        timeout_s = self.config.request_timeout_s if timeout is None else timeout
        node = None if target is None else check_node_id(target)
        return await request(self._open(), endpoint, message, target=node, timeout_s=timeout_s)

    def presence(self, *, buffer: int = 1024) -> PresenceWatch:
        """Joined for every node alive now (this one included), then Joined/Left as they change."""
        return self._track(PresenceWatch(self._open(), buffer=buffer))

    def _subscribe(
        self, topic: Topic[T], key: str, include_self: bool, buffer: int | None
    ) -> Subscription[T]:
        size = self.config.subscription_buffer if buffer is None else buffer
        return Subscription(self._open(), topic, key, buffer=size, include_self=include_self)

    def _track(self, stream: E) -> E:
        self._open_streams.add(stream)
        return stream

    def _open(self) -> Transport:
        if self._transport is None:
            raise RouterClosed("the router is not open")
        return self._transport

    def _end_streams(self) -> None:
        for stream in list(self._open_streams):
            stream.end()

    def _forget_transport(self) -> None:
        self._transport = None
