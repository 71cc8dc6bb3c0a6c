"""The links between a pipeline's stages: one TCP stream from each rank to the next, the last
rank's to rank 0 (a ring), opened once the group exists.

A step's header, its images and its activations go down the ring on these streams, and the
logits come back on the last one. A stream delivers in order and the kernel buffers what the
receiver has not read yet, so a message is one write on one side and one read on the other:
the receiver wakes once, when the bytes arrive. gloo's point-to-point send and receive (what
the stages used before) pair each message up between background threads on both sides, and on
a busy machine every one of those hand-offs waits for a core: a 3-stage trip (header and
activations down, logits back) measured 0.6-6.3 ms over gloo against 0.1-0.6 ms over these
streams on a loaded 2-core machine, and a 1B-shaped model split over 3 loopback nodes lost
~15 ms a token in its hops.

Rank 0 reads the logits in a thread of its own (``LogitsReader``), whatever it is doing: so the
last stage never blocks on a full stream, and no cycle of full streams can form around the
ring. A connection is taken only from the expected rank, proving the group's nonce (which
travels over the group's own rendezvous); keep-alive probes notice a peer host that vanished.
A closed or broken stream ends the pipeline with "lost the group" (a peer loss, as gloo's
errors were). The streams live as long as the runner process (a runner serves one instance),
as its gloo group does.
"""

import secrets
import socket
import threading
from collections import deque
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
from torch import Tensor

_HELLO = 16 + 8  # nonce, the connecting rank (int64)
# keep-alive: first probe after 10 s of silence, then every 5 s, 3 unanswered probes: gone
_KEEPALIVE = (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))


_WAITALL = getattr(socket, "MSG_WAITALL", 0)


class LinkClosed(RuntimeError):
    """The stream to or from another stage ended."""


def local_address_towards(host: str) -> str | None:
    """The address of this machine's interface towards ``host`` (a UDP socket's route lookup:
    nothing is sent); None when there is no route."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return str(probe.getsockname()[0]).split("%", 1)[0]
    except OSError:
        return None


def _bytes(t: Tensor) -> memoryview:
    """The bytes of ``t`` (a contiguous tensor: its own memory, writable)."""
    return t.view(-1).view(torch.uint8).numpy().data


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _KEEPALIVE:
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _read_into(sock: socket.socket, view: memoryview, what: str) -> None:
    """All of ``view`` from ``sock``: one call that waits for every byte (MSG_WAITALL), so a
    big message costs one wake-up and one take of the GIL, not one per arriving segment."""
    got = 0
    while got < len(view):
        try:
            n = sock.recv_into(view[got:], len(view) - got, _WAITALL)
        except OSError as e:
            raise LinkClosed(f"lost the group: {what}: {e}") from e
        if n == 0:
            raise LinkClosed(f"lost the group: {what} closed the link")
        got += n


@dataclass
class StageLink:
    """This rank's two streams: ``out`` to the next rank, ``inp`` from the previous one."""

    rank: int
    world_size: int
    out: socket.socket
    inp: socket.socket

    def send(self, *tensors: Tensor) -> None:
        """The tensors' bytes, in order, to the next rank (blocks while its buffer is full)."""
        views = [_bytes(t.detach().cpu().contiguous()) for t in tensors if t.numel()]
        try:
            if sum(len(v) for v in views) <= 1 << 16:  # one segment for a decode step
                self.out.sendall(b"".join(views))
            else:
                for v in views:
                    self.out.sendall(v)
        except OSError as e:
            raise LinkClosed(f"lost the group: rank {(self.rank + 1) % self.world_size}: {e}") from e

    def recv_into(self, t: Tensor) -> Tensor:
        """Fill ``t`` (contiguous) with the next bytes from the previous rank."""
        assert t.is_contiguous()
        if t.numel():
            host = t if t.device.type == "cpu" else torch.empty_like(t, device="cpu")
            _read_into(self.inp, _bytes(host), f"rank {(self.rank - 1) % self.world_size}")
            if host is not t:
                t.copy_(host)
        return t


def open_link(rank: int, world_size: int, group_host: str, timeout_s: float) -> StageLink:
    """Open this rank's streams: listen, tell every rank where (a collective over the group:
    every rank calls this together, after joining it), connect to the next rank and take the
    previous one's connection."""
    address = local_address_towards(group_host) or ("::1" if ":" in group_host else "127.0.0.1")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.bind((address, 0))
        listener.listen(4)
        listener.settimeout(timeout_s)
        mine = (address, int(listener.getsockname()[1]), secrets.token_bytes(16))
        every: list[tuple[str, int, bytes] | None] = [None] * world_size
        dist.all_gather_object(every, mine)
        nonce = cast(tuple[str, int, bytes], every[0])[2]  # rank 0's, for every link
        host, port, _ = cast(tuple[str, int, bytes], every[(rank + 1) % world_size])
        out = socket.create_connection((host, port), timeout=timeout_s)
        _tune(out)
        out.sendall(nonce + rank.to_bytes(8, "little"))
        inp = _accept(listener, nonce, (rank - 1) % world_size)
    finally:
        listener.close()
    out.settimeout(None)
    inp.settimeout(None)
    return StageLink(rank, world_size, out, inp)


def _accept(listener: socket.socket, nonce: bytes, expected: int) -> socket.socket:
    """The previous rank's connection; any other is closed (until the listener's timeout)."""
    while True:
        try:
            sock, _ = listener.accept()
        except TimeoutError as e:
            raise LinkClosed(f"lost the group: rank {expected} did not connect") from e
        sock.settimeout(listener.gettimeout())
        hello = bytearray(_HELLO)
        try:
            _read_into(sock, memoryview(hello), "a connecting peer")
        except LinkClosed:
            sock.close()
            continue
        if bytes(hello[:16]) == nonce and int.from_bytes(hello[16:], "little") == expected:
            _tune(sock)
            return sock
        sock.close()


class LogitsReader:
    """Rank 0's reader of the last stage's stream: every step's logits, in the order the steps
    were sent, kept until the step that asked for them takes them."""

    def __init__(self, link: StageLink) -> None:
        self.link = link
        self._unread: deque[tuple[int, ...]] = deque()  # shapes of steps sent, not yet read
        self._frames: deque[Tensor] = deque()  # read, not yet taken
        self._sent = self._taken = 0
        self._error: BaseException | None = None
        self._closed = False
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="exo-logits", daemon=True)
        self._thread.start()

    def expect(self, shape: tuple[int, ...]) -> int:
        """Note a step sent down the ring (the shape of its logits); the step's number."""
        with self._ready:
            self._unread.append(shape)
            self._sent += 1
            self._ready.notify_all()
            return self._sent - 1

    def take(self, step: int) -> Tensor:
        """Step ``step``'s logits, once they are here (steps are taken in the order sent)."""
        with self._ready:
            if step != self._taken:
                raise RuntimeError(f"the logits of step {step} taken before step {self._taken}'s")
            while not self._frames and self._error is None:
                self._ready.wait()
            if not self._frames:
                assert self._error is not None
                raise self._error
            self._taken += 1
            return self._frames.popleft()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def _run(self) -> None:
        try:
            while True:
                with self._ready:
                    while not self._unread and not self._closed:
                        self._ready.wait()
                    if self._closed:
                        return
                    shape = self._unread[0]
                logits = self.link.recv_into(torch.empty(*shape, dtype=torch.float32))
                with self._ready:
                    self._unread.popleft()
                    self._frames.append(logits)
                    self._ready.notify_all()
        except BaseException as e:  # every step still waiting hears it
            with self._ready:
                self._error = e
                self._ready.notify_all()
