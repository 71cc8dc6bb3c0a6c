"""A subscription: authentic, decoded messages of one topic as an anyio receive stream."""

from collections.abc import AsyncIterator
from functools import partial
from typing import Generic, TypeVar

import anyio
from anyio.abc import ObjectReceiveStream
from loguru import logger
from pydantic import ValidationError

from exo.routing.envelope import Rejection
from exo.routing.topics import Delivery, Topic
from exo.routing.transport import Transport

T = TypeVar("T")


class Subscription(ObjectReceiveStream[T], Generic[T]):
    """``async for message in subscription`` (or ``receive()``); ``deliveries()`` also gives
    the sender. Ends (EndOfStream) when the router closes; ``aclose()`` unsubscribes."""

    def __init__(
        self, transport: Transport, topic: Topic[T], key: str, *, buffer: int, include_self: bool
    ) -> None:
        self._transport = transport
        self._topic = topic
        self._guard = transport.guard()
        self._send, self._receive = anyio.create_memory_object_stream[Delivery[T]](buffer)
        self._undeclare = transport.session.subscribe(
            key, self._on_sample_thread, include_local=include_self
        )

    def _on_sample_thread(self, key: str, data: bytes) -> None:
        self._transport.bridge.post(partial(self._on_sample, key, data))

    def _on_sample(self, key: str, data: bytes) -> None:
        opened = self._transport.open(key, data, self._guard)
        if opened is None:
            return
        try:
            message = self._topic.decode(opened.payload)
        except ValidationError as e:
            logger.debug(f"{self._topic} from {opened.sender}: invalid message: {e}")
            self._transport.reject(Rejection.UNDECODABLE, key, opened.sender)
            return
        self._transport.offer(self._send, Delivery(opened.sender, message), repr(self._topic))

    async def receive(self) -> T:
        return (await self._receive.receive()).message

    async def receive_delivery(self) -> Delivery[T]:
        return await self._receive.receive()

    async def deliveries(self) -> AsyncIterator[Delivery[T]]:
        async for delivery in self._receive:
            yield delivery

    def end(self) -> None:
        """Stop receiving; the reader still gets what is buffered, then EndOfStream."""
        self._undeclare()
        self._send.close()

    async def aclose(self) -> None:
        self.end()
        self._receive.close()
