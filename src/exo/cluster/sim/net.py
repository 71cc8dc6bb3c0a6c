"""A simulated network for the cluster link: every message is really encoded and decoded
(as on the wire) and delivered after a seeded delay, or lost, or twice; links can be cut
in one direction or both; a node that stops is seen gone by the others at once (a closed
connection), a node cut off only when its lease runs out, like zenoh liveliness."""

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from exo.cluster.network import ClusterNetwork, Inbox, Presence
from exo.cluster.sim.loop import Machine, current_machine, not_charged
from exo.routing import Endpoint, Topic
from exo.routing.errors import NoReply, RemoteError, RequestTimeout
from exo.routing.presence import Joined, Left, PresenceEvent
from exo.routing.topics import Delivery

T = TypeVar("T")
Req = TypeVar("Req")
Rep = TypeVar("Rep")

BUFFER = 100_000


@dataclass
class Faults:
    """The network's behaviour (seconds and probabilities per message)."""

    latency_s: float = 0.002
    jitter_s: float = 0.003
    """Extra delay, uniform in [0, jitter): messages overtake each other (reordering)."""
    loss: float = 0.0
    duplication: float = 0.0
    lease_s: float = 1.0
    """How long until a node that is cut off (not stopped) is seen gone."""


@dataclass
class Traffic:
    messages: int = 0
    bytes: int = 0
    by_kind: dict[str, list[int]] = field(default_factory=dict[str, list[int]])
    """Topic or endpoint name -> [messages, bytes]."""

    def count(self, kind: str, size: int) -> None:
        self.messages += 1
        self.bytes += size
        entry = self.by_kind.setdefault(kind, [0, 0])
        entry[0] += 1
        entry[1] += size


class _Stream(Generic[T]):
    def __init__(self) -> None:
        self.send: MemoryObjectSendStream[Delivery[T]]
        self.receive: MemoryObjectReceiveStream[Delivery[T]]
        self.send, self.receive = anyio.create_memory_object_stream[Delivery[T]](BUFFER)

    def offer(self, delivery: Delivery[T]) -> None:
        try:
            self.send.send_nowait(delivery)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    async def __aiter__(self) -> AsyncIterator[T]:
        async for delivery in self.receive:
            yield delivery.message

    async def deliveries(self) -> AsyncIterator[Delivery[T]]:
        async for delivery in self.receive:
            yield delivery


class _PresenceStream:
    def __init__(self) -> None:
        self.send, self.receive = anyio.create_memory_object_stream[PresenceEvent](BUFFER)
        self.members: set[str] = set()

    def change(self, node_id: str, alive: bool) -> None:
        if alive == (node_id in self.members):
            return
        if alive:
            self.members.add(node_id)
        else:
            self.members.discard(node_id)
        try:
            self.send.send_nowait(Joined(node_id) if alive else Left(node_id))
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    async def __aiter__(self) -> AsyncIterator[PresenceEvent]:
        async for event in self.receive:
            yield event


_Handler = Callable[[Any], Awaitable[Any]]


@dataclass
class _Port:
    """One run of one node on the network (a restart opens a new port)."""

    node_id: str
    topics: dict[str, list[tuple[_Stream[Any], bool]]] = field(default_factory=dict[str, list[tuple[_Stream[Any], bool]]])
    direct: dict[str, list[_Stream[Any]]] = field(default_factory=dict[str, list[_Stream[Any]]])
    services: dict[str, _Handler] = field(default_factory=dict[str, _Handler])
    presences: list[_PresenceStream] = field(default_factory=list[_PresenceStream])
    open: bool = True
    machine: Machine | None = None
    """The simulated machine the node runs on (its CPU is charged for what arrives)."""
    spawn: Callable[[Callable[[], Coroutine[Any, Any, None]]], None] | None = None


class SimNetwork:
    """The network all simulated nodes share."""

    def __init__(self, rng: random.Random, faults: Faults | None = None) -> None:
        self.rng = rng
        self.faults = faults or Faults()
        self.ports: dict[str, _Port] = {}
        self.cut: set[tuple[str, str]] = set()
        """Directed cuts: (a, b) means nothing from a reaches b."""
        self.traffic: dict[str, Traffic] = {}

    # -- faults ----------------------------------------------------------------------

    def reaches(self, src: str, dst: str) -> bool:
        return (src, dst) not in self.cut

    def linked(self, a: str, b: str) -> bool:
        """A connection lives while both directions carry its keep-alives."""
        return self.reaches(a, b) and self.reaches(b, a)

    def set_cut(self, cut: Iterable[tuple[str, str]]) -> None:
        """Cut (or heal) links; presence follows after a lease (a cut) or a round trip."""
        self.cut = set(cut)
        for observer in list(self.ports.values()):
            for subject in list(self.ports):
                if subject == observer.node_id:
                    continue
                alive = self.linked(observer.node_id, subject)
                delay = self.faults.latency_s if alive else self.faults.lease_s
                self._later(delay, self._presence_check, observer, subject)

    def _presence_check(self, observer: _Port, subject: str) -> None:
        if not observer.open:
            return
        alive = subject in self.ports and self.linked(observer.node_id, subject)
        for stream in observer.presences:
            stream.change(subject, alive)

    def _later(self, delay: float, fn: Callable[..., None], *args: Any,
               on: Machine | None = None) -> None:
        """Call ``fn`` after ``delay``; on the machine ``on`` (charged to it), if given."""
        context = on.context() if on is not None else None
        asyncio.get_running_loop().call_later(delay, fn, *args, context=context)

    def _delay(self) -> float:
        return self.faults.latency_s + self.rng.random() * self.faults.jitter_s

    def _transmit(
        self, src: str, dst: str, data: bytes, deliver: Callable[[bytes], None], kind: str
    ) -> None:
        with not_charged():  # the network's work, not the sender's (encoding is)
            self._schedule(src, dst, data, deliver, kind)

    def _schedule(
        self, src: str, dst: str, data: bytes, deliver: Callable[[bytes], None], kind: str
    ) -> None:
        self.traffic.setdefault(src, Traffic()).count(kind, len(data))
        if not self.reaches(src, dst) or self.rng.random() < self.faults.loss:
            return
        copies = 2 if self.rng.random() < self.faults.duplication else 1
        port = self.ports.get(dst)
        machine = port.machine if port is not None else None
        for _ in range(copies):  # decoding it is the receiver's work
            self._later(self._delay(), self._arrive, src, dst, data, deliver, on=machine)

    def _arrive(self, src: str, dst: str, data: bytes, deliver: Callable[[bytes], None]) -> None:
        if dst in self.ports and self.reaches(src, dst):
            deliver(data)

    # -- ports -----------------------------------------------------------------------

    def port(self, node_id: str) -> "SimPort":
        return SimPort(self, node_id)

    def _open(self, port: _Port) -> None:
        with not_charged():
            self._join(port)

    def _join(self, port: _Port) -> None:
        if port.node_id in self.ports:
            raise RuntimeError(f"{port.node_id} is on the network twice")
        self.ports[port.node_id] = port
        for other in self.ports.values():
            self._later(self.faults.latency_s, self._presence_check, other, port.node_id)
            if other is not port:
                self._later(self.faults.latency_s, self._presence_check, port, other.node_id)

    def _close(self, port: _Port) -> None:
        with not_charged():
            self._leave(port)

    def _leave(self, port: _Port) -> None:
        port.open = False
        if self.ports.get(port.node_id) is port:
            del self.ports[port.node_id]
        for other in self.ports.values():  # a closed connection is noticed at once
            self._later(self.faults.latency_s, self._presence_check, other, port.node_id)


class SimPort(ClusterNetwork, AbstractAsyncContextManager["SimPort"]):
    """One node's view of the network, in the shape of the zenoh ``Router``."""

    def __init__(self, net: SimNetwork, node_id: str) -> None:
        self._net = net
        self._port = _Port(node_id)

    @property
    def listen_endpoints(self) -> list[str]:
        return [f"sim/{self._port.node_id}"]

    async def __aenter__(self) -> Self:
        self._port.machine = current_machine()
        self._net._open(self._port)  # pyright: ignore[reportPrivateUsage]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._net._close(self._port)  # pyright: ignore[reportPrivateUsage]

    def _deliverer(self, dst: _Port, topic: Topic[T], direct: bool) -> Callable[[bytes], None]:
        sender = self._port.node_id

        def deliver(data: bytes) -> None:
            if not dst.open:
                return
            message = topic.decode(data)
            if direct:
                for stream in dst.direct.get(topic.name, []):
                    stream.offer(Delivery(sender, message))
                return
            for stream, include_self in dst.topics.get(topic.name, []):
                if include_self or dst.node_id != sender:
                    stream.offer(Delivery(sender, message))

        return deliver

    async def publish(self, topic: Topic[T], message: T) -> None:
        data = topic.encode(message)
        with not_charged():  # one message to the network; reaching every node is its work
            self._fan_out(topic, data)

    def _fan_out(self, topic: Topic[T], data: bytes) -> None:
        for dst in list(self._net.ports.values()):
            if dst is self._port:
                self._deliverer(dst, topic, False)(data)
            else:
                self._net._transmit(self._port.node_id, dst.node_id, data, self._deliverer(dst, topic, False), topic.name)  # pyright: ignore[reportPrivateUsage]

    async def send_to(self, topic: Topic[T], node_id: str, message: T) -> None:
        dst = self._net.ports.get(node_id)
        if dst is None:
            return
        data = topic.encode(message)
        self._net._transmit(self._port.node_id, node_id, data, self._deliverer(dst, topic, True), topic.name)  # pyright: ignore[reportPrivateUsage]

    def subscribe(self, topic: Topic[T], *, include_self: bool = False) -> Inbox[T]:
        stream = _Stream[T]()
        self._port.topics.setdefault(topic.name, []).append((stream, include_self))
        return stream

    def subscribe_direct(self, topic: Topic[T]) -> Inbox[T]:
        stream = _Stream[T]()
        self._port.direct.setdefault(topic.name, []).append(stream)
        return stream

    def presence(self) -> Presence:
        stream = _PresenceStream()
        self._port.presences.append(stream)
        for node_id, other in self._net.ports.items():
            if other is self._port or self._net.linked(self._port.node_id, node_id):
                stream.change(node_id, True)
        return stream

    async def serve(
        self,
        endpoint: Endpoint[Req, Rep],
        handler: Callable[[Req], Awaitable[Rep]],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with anyio.create_task_group() as tg:
            def spawn(job: Callable[[], Coroutine[Any, Any, None]]) -> None:
                tg.start_soon(job)

            self._port.services[endpoint.name] = handler
            self._port.spawn = spawn
            task_status.started()
            await anyio.sleep_forever()

    async def request(
        self, endpoint: Endpoint[Req, Rep], message: Req, *, target: str | None = None,
        timeout: float | None = None,
    ) -> Rep:
        net, me = self._net, self._port.node_id
        dst = net.ports.get(target) if target is not None else None
        if dst is None:
            await anyio.sleep(net.faults.latency_s)
            raise NoReply(f"nobody serves {endpoint}")
        reply_kind = f"{endpoint.name} (reply)"
        box: list[tuple[bool, bytes]] = []
        done = anyio.Event()

        def reply(ok: bool) -> Callable[[bytes], None]:
            def arrive(data: bytes) -> None:
                if not box:
                    box.append((ok, data))
                    done.set()
            return arrive

        def at_server(data: bytes) -> None:
            handler = dst.services.get(endpoint.name)
            if handler is None or dst.spawn is None:
                net._transmit(dst.node_id, me, b"no such service", reply(False), reply_kind)  # pyright: ignore[reportPrivateUsage]
                return
            request = endpoint.request.decode(data)

            async def answer() -> None:
                try:
                    result = await handler(request)
                except Exception as e:  # the remote handler's failure, as text
                    net._transmit(dst.node_id, me, str(e).encode(), reply(False), reply_kind)  # pyright: ignore[reportPrivateUsage]
                    return
                net._transmit(dst.node_id, me, endpoint.reply.encode(result), reply(True), reply_kind)  # pyright: ignore[reportPrivateUsage]

            dst.spawn(answer)

        net._transmit(me, dst.node_id, endpoint.request.encode(message), at_server, endpoint.name)  # pyright: ignore[reportPrivateUsage]
        with anyio.move_on_after(timeout if timeout is not None else 5.0):
            await done.wait()
        if not box:
            raise RequestTimeout(f"{endpoint} to {target}: no reply")
        ok, data = box[0]
        if not ok:
            raise RemoteError(data.decode(errors="replace"))
        return endpoint.reply.decode(data)
