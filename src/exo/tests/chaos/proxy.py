"""A small TCP proxy a test controls: one per directed cluster link (node i dials node j
through it), so the test can cut a link, delay it, or drop one direction only.

Threads, not asyncio: the test drives node processes synchronously, and a proxy must keep
forwarding while the test sleeps or waits. Every socket is on 127.0.0.1."""

import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class LinkState:
    cut: bool = False
    """No connection: existing ones are closed, new ones are refused (closed at once)."""
    delay_s: float = 0.0
    """Held this long before each forwarded chunk (both directions)."""
    drop_forward: bool = False
    """Bytes from the dialling node to the target are read and dropped (one-way loss)."""
    drop_backward: bool = False
    """Bytes from the target back to the dialling node are dropped."""


@dataclass(eq=False)
class Link:
    """Listens on ``port``; forwards each connection to ``target_port``."""

    name: str
    target_port: int
    state: LinkState = field(default_factory=LinkState)
    port: int = 0
    connections: int = 0
    _server: socket.socket | None = None
    _pairs: list[tuple[socket.socket, socket.socket]] = field(
        default_factory=list[tuple[socket.socket, socket.socket]]
    )
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False

    def start(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        self.port = server.getsockname()[1]
        self._server = server
        threading.Thread(target=self._accept, name=f"proxy-{self.name}", daemon=True).start()

    def set(self, **changes: float | bool) -> None:
        for key, value in changes.items():
            setattr(self.state, key, value)
        if self.state.cut:
            self._drop_all()

    def heal(self) -> None:
        self.state = LinkState()

    def close(self) -> None:
        self._closed = True
        if self._server is not None:
            self._server.close()
        self._drop_all()

    def _drop_all(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def _accept(self) -> None:
        assert self._server is not None
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self.state.cut:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=2)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._pairs.append((client, upstream))
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, forward: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                state = self.state
                if state.cut:
                    break
                if state.delay_s > 0:
                    time.sleep(state.delay_s)
                if state.drop_forward if forward else state.drop_backward:
                    continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@dataclass
class Mesh:
    """Proxies for every ordered pair of nodes: ``link(i, j)`` is how node i dials node j."""

    links: dict[tuple[int, int], Link] = field(default_factory=dict[tuple[int, int], Link])

    @classmethod
    def start(cls, cluster_ports: list[int]) -> "Mesh":
        mesh = cls()
        for i in range(len(cluster_ports)):
            for j, port in enumerate(cluster_ports):
                if i != j:
                    link = Link(name=f"{i}->{j}", target_port=port)
                    link.start()
                    mesh.links[(i, j)] = link
        return mesh

    def peers_of(self, i: int) -> list[str]:
        return [f"tcp/127.0.0.1:{link.port}" for (a, _), link in self.links.items() if a == i]

    def cut(self, i: int, j: int) -> None:
        """Both directions between i and j, whoever dialled."""
        self.links[(i, j)].set(cut=True)
        self.links[(j, i)].set(cut=True)

    def one_way(self, i: int, j: int) -> None:
        """What i sends to j is lost (on either connection between them)."""
        self.links[(i, j)].set(drop_forward=True)
        self.links[(j, i)].set(drop_backward=True)

    def delay(self, i: int, j: int, seconds: float) -> None:
        self.links[(i, j)].set(delay_s=seconds)
        self.links[(j, i)].set(delay_s=seconds)

    def isolate(self, i: int) -> None:
        for a, b in list(self.links):
            if i in (a, b):
                self.links[(a, b)].set(cut=True)

    def heal(self) -> None:
        for link in self.links.values():
            link.heal()

    def close(self) -> None:
        for link in self.links.values():
            link.close()
