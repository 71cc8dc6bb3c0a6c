"""Half-open connections against the API's uvicorn server (the node's own config):
real sockets on 127.0.0.1, a request head that never ends, more than the cap at once."""

import socket
import threading
import time
from collections.abc import Generator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from exo.api.connection_guard import HeadGuard, server_config
from exo.tests.node_process import free_port

HEAD_S = 0.5
CAP = 20


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def server() -> Generator[tuple[int, HeadGuard]]:
    guard = HeadGuard(head_timeout_s=HEAD_S, max_pending=CAP)
    port = free_port()
    config = server_config(_app, guard, host="127.0.0.1", port=port, log_level="warning",
                           lifespan="off")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    yield port, guard
    srv.should_exit = True
    thread.join(10)


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before closing, or None when it is still open after ``seconds``."""
    sock.settimeout(seconds)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return received


def _get(port: int) -> bytes:
    with _connect(port) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return _closed_within(sock, 10) or b""


def test_a_request_head_that_never_ends_is_closed_with_408(server: tuple[int, HeadGuard]) -> None:
    port, guard = server
    with _connect(port) as silent, _connect(port) as slow:
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        started = time.monotonic()
        for sock in (silent, slow):
            reply = _closed_within(sock, HEAD_S + 5)
            assert reply is not None, "a half-open connection is held open"
            assert reply.startswith(b"HTTP/1.1 408")
        assert time.monotonic() - started < HEAD_S + 5
    assert guard.timed_out == 2 and guard.pending == 0
    assert _get(port).endswith(b"ok")  # and the server still serves


def test_a_keep_alive_connection_gets_a_deadline_for_each_head(
    server: tuple[int, HeadGuard],
) -> None:
    port, guard = server
    with _connect(port) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(10)
        first = b""
        while not first.endswith(b"ok"):
            chunk = sock.recv(4096)
            assert chunk, first
            first += chunk
        sock.sendall(b"GET / HTTP/1.1\r\n")  # the second head never ends
        reply = _closed_within(sock, HEAD_S + 5)
        assert reply is not None and reply.startswith(b"HTTP/1.1 408")
    assert guard.pending == 0


def test_connections_beyond_the_cap_are_closed_at_once(server: tuple[int, HeadGuard]) -> None:
    port, guard = server
    socks = [_connect(port) for _ in range(CAP)]
    try:
        deadline = time.monotonic() + 10
        while guard.pending < CAP:
            assert time.monotonic() < deadline, guard
            time.sleep(0.01)
        extra = [_connect(port) for _ in range(5)]
        for sock in extra:
            assert _closed_within(sock, 5) == b""  # closed before the head deadline
            sock.close()
        assert guard.refused == 5
    finally:
        for sock in socks:
            sock.close()
    deadline = time.monotonic() + 10
    while guard.pending:
        assert time.monotonic() < deadline, guard
        time.sleep(0.01)
    assert _get(port).endswith(b"ok")
