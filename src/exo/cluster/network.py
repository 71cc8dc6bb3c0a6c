"""What the cluster link needs from the network: the part of ``exo.routing.Router`` it
uses. The real node passes nothing and gets a zenoh ``Router``; the simulator
(``exo.cluster.sim``) passes its own network, with a virtual clock."""

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol, TypeVar

from anyio.abc import TaskStatus

from exo.routing import Endpoint, Topic
from exo.routing.presence import PresenceEvent
from exo.routing.topics import Delivery

T = TypeVar("T")
Req = TypeVar("Req")
Rep = TypeVar("Rep")


class Inbox(Protocol[T]):
    """Messages of one topic: ``async for message in inbox``, or ``deliveries()`` with
    their senders."""

    def __aiter__(self) -> AsyncIterator[T]: ...

    def deliveries(self) -> AsyncIterator[Delivery[T]]: ...


class Presence(Protocol):
    def __aiter__(self) -> AsyncIterator[PresenceEvent]: ...


class ClusterNetwork(Protocol):
    @property
    def listen_endpoints(self) -> list[str]: ...

    async def publish(self, topic: Topic[T], message: T) -> None: ...

    async def send_to(self, topic: Topic[T], node_id: str, message: T) -> None: ...

    def subscribe(self, topic: Topic[T], *, include_self: bool = ...) -> Inbox[T]: ...

    def subscribe_direct(self, topic: Topic[T]) -> Inbox[T]: ...

    def presence(self) -> Presence: ...

    async def serve(
        self,
        endpoint: Endpoint[Req, Rep],
        handler: Callable[[Req], Awaitable[Rep]],
        *,
        task_status: TaskStatus[None] = ...,
    ) -> None: ...

    async def request(
        self, endpoint: Endpoint[Req, Rep], message: Req, *, target: str | None = ...,
        timeout: float | None = ...,
    ) -> Rep: ...


OpenNetwork = Callable[[], AbstractAsyncContextManager[ClusterNetwork]]
"""Opens this node's network (entered once, for as long as the link runs)."""
