"""Real zenoh sessions on loopback: every router listens on 127.0.0.1 and either connects
to explicit peers or scouts by multicast on ``lo`` only.

Declarations (subscribers, endpoints) reach other nodes a moment after they are made, so
a first message is sent again until it arrives (``until``), always under a deadline.
"""

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal, TypeVar

import anyio
import anyio.to_thread
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from pydantic import BaseModel, Field, TypeAdapter

from exo.routing import (
    Endpoint,
    Joined,
    Left,
    NoReply,
    RemoteError,
    RequestTimeout,
    Router,
    RouterClosed,
    Subscription,
    Topic,
    loopback_config,
    zenoh_config,
)
from exo.routing._zenoh import ZenohSession
from exo.routing.envelope import CounterSource, seal
from exo.routing.keys import ClusterKeys

pytestmark = pytest.mark.anyio

SECRET = "test-cluster-secret"
DEADLINE_S = 5.0
PROBE = -1

T = TypeVar("T")


class Ping(BaseModel, frozen=True, strict=True):
    n: int
    text: str = ""


class Started(BaseModel, frozen=True, strict=True):
    kind: Literal["started"] = "started"
    task: str


class Finished(BaseModel, frozen=True, strict=True):
    kind: Literal["finished"] = "finished"
    task: str
    tokens: int


Event = Annotated[Started | Finished, Field(discriminator="kind")]

PING = Topic("test/ping", Ping)
EVENTS = Topic("test/events", TypeAdapter[Event](Event))
ECHO = Endpoint("test/echo", Ping, Ping)


async def until(attempt: Callable[[], Awaitable[None]], outcome: Callable[[], Awaitable[T]]) -> T:
    """Repeat ``attempt`` until ``outcome`` gives a result (bounded by the caller's deadline)."""
    while True:
        await attempt()
        with anyio.move_on_after(0.05):
            return await outcome()


async def next_ping(subscription: Subscription[Ping]) -> Ping:
    """The next message that is not a leftover probe."""
    while (ping := await subscription.receive()).n == PROBE:
        pass
    return ping


async def link(sender: Router, topic: Topic[Ping], subscription: Subscription[Ping]) -> None:
    """Wait until ``subscription`` receives what ``sender`` publishes on ``topic``."""
    await until(lambda: sender.publish(topic, Ping(n=PROBE)), subscription.receive)


async def request_when_served(asker: Router, message: Ping, target: str | None) -> Ping:
    while True:
        try:
            return await asker.request(ECHO, message, target=target, timeout=1.0)
        except NoReply:
            await anyio.sleep(0.02)  # the endpoint's declaration is on its way


@asynccontextmanager
async def two_routers() -> AsyncGenerator[tuple[Router, Router]]:
    async with (
        Router(loopback_config("a", SECRET)) as a,
        Router(loopback_config("b", SECRET, peers=a.listen_endpoints)) as b,
    ):
        yield a, b


async def test_listen_endpoints_report_the_real_loopback_port() -> None:
    async with Router(loopback_config("a", SECRET)) as a:
        [endpoint] = a.listen_endpoints
        assert endpoint.startswith("tcp/127.0.0.1:")
        assert int(endpoint.rsplit(":", 1)[1]) > 0


async def test_two_routers_exchange_typed_messages_both_ways() -> None:
    with anyio.fail_after(DEADLINE_S):
        async with two_routers() as (a, b):
            at_a, at_b = a.subscribe(PING, include_self=False), b.subscribe(PING)
            events_at_a = a.subscribe(EVENTS)
            await link(a, PING, at_b)
            await link(b, PING, at_a)

            await a.publish(PING, Ping(n=1, text="from a"))
            await b.publish(PING, Ping(n=2, text="from b"))
            assert {await next_ping(at_b), await next_ping(at_b)} == {  # b hears itself too
                Ping(n=1, text="from a"),
                Ping(n=2, text="from b"),
            }
            assert await next_ping(at_a) == Ping(n=2, text="from b")  # a does not hear itself

            await b.publish(EVENTS, Finished(task="t1", tokens=7))
            delivery = await events_at_a.receive_delivery()
            assert delivery.sender == "b"
            assert delivery.message == Finished(task="t1", tokens=7)
            assert a.stats.rejected == b.stats.rejected == 0


async def test_point_to_point_reaches_only_its_target() -> None:
    with anyio.fail_after(DEADLINE_S):
        async with Router(loopback_config("a", SECRET)) as a:
            peers = a.listen_endpoints
            async with (
                Router(loopback_config("b", SECRET, peers=peers)) as b,
                Router(loopback_config("c", SECRET, peers=peers)) as c,
            ):
                inbox_b, inbox_c = b.subscribe_direct(PING), c.subscribe_direct(PING)
                inbox_a = a.subscribe_direct(PING)
                await until(lambda: a.send_to(PING, "b", Ping(n=PROBE)), inbox_b.receive)
                await until(lambda: a.send_to(PING, "c", Ping(n=PROBE)), inbox_c.receive)

                await a.send_to(PING, "b", Ping(n=1))
                await a.send_to(PING, "c", Ping(n=2))
                await a.send_to(PING, "b", Ping(n=3))
                await a.send_to(PING, "c", Ping(n=4))
                await a.send_to(PING, "a", Ping(n=5))
                # One link from a to each node, in order: anything of b's that reached c
                # would have come before 4.
                assert [await next_ping(inbox_b), await next_ping(inbox_b)] == [
                    Ping(n=1),
                    Ping(n=3),
                ]
                assert [await next_ping(inbox_c), await next_ping(inbox_c)] == [
                    Ping(n=2),
                    Ping(n=4),
                ]
                assert await next_ping(inbox_a) == Ping(n=5)


async def test_request_reply_with_errors_and_timeouts() -> None:
    async def echo(ping: Ping) -> Ping:
        if ping.text == "fail":
            raise ValueError("asked to fail")
        if ping.text == "slow":
            await anyio.sleep(30)
        return Ping(n=ping.n * 2, text="echo")

    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as serving, two_routers() as (a, b):
            await serving.start(a.serve, ECHO, echo)  # ends when a closes
            assert await request_when_served(b, Ping(n=21), target="a") == Ping(n=42, text="echo")
            assert await b.request(ECHO, Ping(n=1), target=None) == Ping(n=2, text="echo")

            with pytest.raises(RemoteError, match="ValueError: asked to fail"):
                await b.request(ECHO, Ping(n=1, text="fail"), target="a")

            started = time.monotonic()
            with pytest.raises(RequestTimeout):
                await b.request(ECHO, Ping(n=1, text="slow"), target="a", timeout=0.3)
            assert time.monotonic() - started < 1.5

            with pytest.raises((NoReply, RequestTimeout)):
                await b.request(ECHO, Ping(n=1), target="nobody", timeout=0.5)
    # a closed with the slow handler still running: serving ended at once, not after 30 s.


async def test_presence_sees_nodes_join_and_leave() -> None:
    with anyio.fail_after(DEADLINE_S):
        async with Router(loopback_config("a", SECRET)) as a:
            watch = a.presence()
            assert await watch.receive() == Joined("a")
            async with Router(loopback_config("b", SECRET, peers=a.listen_endpoints)) as b:
                assert await watch.receive() == Joined("b")
                at_b = b.presence()
                assert {await at_b.receive(), await at_b.receive()} == {
                    Joined("a"),
                    Joined("b"),
                }
            left_at = time.monotonic()
            assert await watch.receive() == Left("b")
            assert time.monotonic() - left_at < 1.0
            assert watch.members == {"a"}


@asynccontextmanager
async def node_process(node_id: str, peers: list[str]) -> AsyncGenerator[Process]:
    src = Path(__file__).resolve().parents[3]
    command = [sys.executable, "-m", "exo.routing.tests.node_process", node_id, SECRET, *peers]
    async with await anyio.open_process(
        command,
        env={**os.environ, "PYTHONPATH": str(src)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as process:
        try:
            assert process.stdout is not None
            line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 4096)
            assert json.loads(line)[0].startswith("tcp/127.0.0.1:")
            yield process
        finally:
            if process.returncode is None:
                process.kill()


async def test_presence_sees_a_killed_node_at_once_and_a_hung_one_within_its_lease() -> None:
    with anyio.fail_after(10):
        async with Router(loopback_config("a", SECRET)) as a:
            watch = a.presence()
            assert await watch.receive() == Joined("a")
            async with (
                node_process("crashing", a.listen_endpoints) as crashing,
                node_process("hanging", a.listen_endpoints) as hanging,
            ):
                assert {await watch.receive(), await watch.receive()} == {
                    Joined("crashing"),
                    Joined("hanging"),
                }
                started = time.monotonic()
                crashing.send_signal(signal.SIGKILL)
                assert await watch.receive() == Left("crashing")
                assert time.monotonic() - started < 1.0

                started = time.monotonic()
                hanging.send_signal(signal.SIGSTOP)  # its lease is 1 s
                assert await watch.receive() == Left("hanging")
                assert 0.3 < time.monotonic() - started < 3.0


async def same(ping: Ping) -> Ping:
    return ping


async def test_routers_with_different_secrets_never_deliver_to_each_other() -> None:
    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as serving, Router(loopback_config("a", SECRET)) as a:
            peers = a.listen_endpoints
            async with (
                Router(loopback_config("stranger", "another-secret", peers=peers)) as stranger,
                Router(loopback_config("c", SECRET, peers=peers)) as c,
            ):
                await serving.start(a.serve, ECHO, same)
                at_stranger, at_c = stranger.subscribe(PING), c.subscribe(PING)
                seen_by_stranger = stranger.presence()
                await stranger.publish(PING, Ping(n=99))
                await link(a, PING, at_c)  # c, same secret, is reached: the network is up
                await a.publish(PING, Ping(n=1))
                assert await next_ping(at_c) == Ping(n=1)
                assert await request_when_served(c, Ping(n=3), target="a") == Ping(n=3)

                with pytest.raises((NoReply, RequestTimeout)):
                    await stranger.request(ECHO, Ping(n=1), target="a", timeout=0.3)
                assert await seen_by_stranger.receive() == Joined("stranger")
                assert await next_ping(at_stranger) == Ping(n=99)  # it hears only itself
                assert seen_by_stranger.members == {"stranger"}
                assert stranger.stats.delivered == 2  # its own presence and ping, nothing else
                assert stranger.stats.rejected == a.stats.rejected == c.stats.rejected == 0


async def test_forged_and_replayed_envelopes_are_rejected_and_counted() -> None:
    keys = ClusterKeys.from_secret(SECRET)
    key = keys.topic(PING.name)
    counter = CounterSource()

    def sealed(payload: bytes, *, mac_key: bytes = keys.mac_key, context: str = key) -> bytes:
        return seal(mac_key, context, "mallory", counter.session, counter.next(), payload)

    with anyio.fail_after(DEADLINE_S):
        async with Router(loopback_config("a", SECRET)) as a:
            subscription = a.subscribe(PING)
            config = zenoh_config(loopback_config("mallory", SECRET, peers=a.listen_endpoints))
            raw = await anyio.to_thread.run_sync(ZenohSession, config)
            try:

                async def put(data: bytes) -> None:
                    await anyio.to_thread.run_sync(raw.put, key, data)

                await until(lambda: put(sealed(PING.encode(Ping(n=PROBE)))), subscription.receive)
                recorded = sealed(PING.encode(Ping(n=1)))
                await put(recorded)
                assert await next_ping(subscription) == Ping(n=1)

                for forgery in (
                    b"not an envelope",
                    sealed(PING.encode(Ping(n=2)), mac_key=b"\x00" * 32),
                    sealed(PING.encode(Ping(n=3)), context=keys.topic("test/other")),
                    recorded,
                    sealed(b'{"n": "not a number"}'),
                ):
                    await put(forgery)
                await put(sealed(PING.encode(Ping(n=4))))
                # Same link, same key, in order: every forgery was judged before 4 arrived.
                assert await next_ping(subscription) == Ping(n=4)
                assert a.stats.rejected == 5
                assert a.stats.rejections == {
                    "malformed": 1,
                    "bad_mac": 2,
                    "replay": 1,
                    "undecodable": 1,
                }
            finally:
                await anyio.to_thread.run_sync(raw.close)


async def test_a_recorded_envelope_is_refused_after_the_receiver_restarts(
    tmp_path: Path,
) -> None:
    """#20.8: a message recorded before the receiver restarted is refused after it (its
    data directory remembers what it admitted); the sender's new messages still pass."""
    keys = ClusterKeys.from_secret(SECRET)
    key = keys.topic(PING.name)
    counter = CounterSource()
    config = replace(loopback_config("a", SECRET), replay_path=tmp_path / "replay.log")

    def sealed(n: int, sender: str = "b") -> bytes:
        return seal(keys.mac_key, key, sender, counter.session, counter.next(),
                    PING.encode(Ping(n=n)))

    recorded: list[bytes] = []

    def record() -> bytes:
        if not recorded:
            recorded.append(sealed(1))
        return recorded[0]

    async def run_receiver() -> tuple[Ping, dict[str, int]]:
        """Start a, send it the recorded message then a fresh one: a's first message
        after the probes, and what it refused."""
        async with Router(config) as a:
            subscription = a.subscribe(PING)
            raw_config = zenoh_config(loopback_config("b", SECRET, peers=a.listen_endpoints))
            raw = await anyio.to_thread.run_sync(ZenohSession, raw_config)
            try:

                async def put(data: bytes) -> None:
                    await anyio.to_thread.run_sync(raw.put, key, data)

                # Probes from another sender: nothing newer from b before the recording.
                await until(lambda: put(sealed(PROBE, "probe")), subscription.receive)
                await put(record())
                await put(sealed(100))
                return await next_ping(subscription), dict(a.stats.rejections)
            finally:
                await anyio.to_thread.run_sync(raw.close)

    with anyio.fail_after(3 * DEADLINE_S):
        assert await run_receiver() == (Ping(n=1), {})
        # The receiver restarted: the recording is refused, the next message is not.
        assert await run_receiver() == (Ping(n=100), {"replay": 1})


def lo_carries_multicast(port: int) -> bool:
    """Send one datagram to the zenoh scouting group on lo and see whether it comes back."""
    group = "224.0.0.224"
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender,
    ):
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        receiver.bind((group, port))
        membership = struct.pack("4s4s", socket.inet_aton(group), socket.inet_aton("127.0.0.1"))
        receiver.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, membership)
        receiver.settimeout(1.0)
        sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
        sender.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
        sender.sendto(b"exo-probe", (group, port))
        try:
            return receiver.recv(64) == b"exo-probe"
        except TimeoutError:
            return False


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_multicast_discovery_on_lo_without_explicit_peers() -> None:
    port = free_udp_port()
    if not lo_carries_multicast(port):
        pytest.skip("lo does not carry multicast here (as root: ip link set lo multicast on)")
    with anyio.fail_after(DEADLINE_S):
        async with (
            Router(loopback_config("a", SECRET, multicast_port=port)) as a,
            Router(loopback_config("b", SECRET, multicast_port=port)) as b,
        ):
            at_b = b.subscribe(PING)
            await link(a, PING, at_b)
            await a.publish(PING, Ping(n=1))
            assert await next_ping(at_b) == Ping(n=1)


async def test_closing_ends_subscriptions_and_refuses_new_messages() -> None:
    with anyio.fail_after(DEADLINE_S):
        async with Router(loopback_config("a", SECRET)) as a:
            subscription = a.subscribe(PING)
            await link(a, PING, subscription)
            await a.publish(PING, Ping(n=1))
            assert await next_ping(subscription) == Ping(n=1)
        assert all([ping.n == PROBE async for ping in subscription])
        with pytest.raises(RouterClosed):
            await a.publish(PING, Ping(n=2))


async def test_a_full_subscription_drops_and_counts_instead_of_blocking() -> None:
    with anyio.fail_after(DEADLINE_S):
        async with Router(loopback_config("a", SECRET)) as a:
            slow, fast = a.subscribe(PING, buffer=2), a.subscribe(PING)
            for n in range(10):  # local subscribers need no declaration to travel: no probe
                await a.publish(PING, Ping(n=n))
            assert [(await fast.receive()).n for _ in range(10)] == list(range(10))
            while a.stats.dropped < 8:
                await anyio.sleep(0.01)
            assert a.stats.dropped == 8
            assert [await slow.receive(), await slow.receive()] == [Ping(n=0), Ping(n=1)]
