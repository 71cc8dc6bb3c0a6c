"""How a node joins the cluster network, and the zenoh configuration it becomes.

Every field that decides where packets go (listen, peers, multicast, multicast_interface)
has no default: each caller states it. Tests use ``loopback_config``, which keeps every
packet on ``lo``.

Multicast scouting: zenoh sends scouts to ``multicast_address`` (zenoh's default is
224.0.0.224:7446) on ``multicast_interface`` (zenoh's "auto" picks a real interface when
it is None). On Linux ``lo`` carries multicast sent with ``interface: "lo"`` even without
the MULTICAST link flag.

Liveliness timing: a node that closes, or whose process dies, is seen as gone at once
(its TCP link closes: a few ms on loopback). A node that hangs or is cut off is seen as
gone when the ``lease_ms`` it announced expires (measured: 0.75 s with a 1 s lease, 9.5 s
with zenoh's default 10 s).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from exo.routing.keys import check_node_id

ZENOH_MULTICAST_ADDRESS = "224.0.0.224:7446"

JsonValue = str | int | float | bool | None | list["JsonValue"] | dict[str, "JsonValue"]


@dataclass(frozen=True)
class RoutingConfig:
    node_id: str
    secret: str
    listen: Sequence[str]
    """Zenoh endpoints to listen on, e.g. ``tcp/0.0.0.0:0`` or ``tcp/127.0.0.1:0``."""
    peers: Sequence[str]
    """Explicit endpoints to connect to, e.g. ``tcp/10.0.0.2:7447``; retried until reached."""
    multicast: bool
    multicast_interface: str | None
    """Interface for multicast scouting: "lo" in tests; None lets zenoh pick ("auto")."""
    multicast_address: str = ZENOH_MULTICAST_ADDRESS
    gossip: bool = True
    """Tell connected peers about each other's locators (zenoh warns when this is off)."""
    mode: Literal["peer", "router", "client"] = "peer"
    """``peer``: a mesh of direct links. ``router``: also route for the clients connected
    to this node. ``client``: every packet goes through the router in ``peers`` (for
    nodes that reach each other only through it: other subnets, no shared multicast
    domain); a client listens on nothing."""
    lease_ms: int = 10_000
    keep_alive: int = 4
    scouting_delay_ms: int = 500
    """How long opening a session waits for scouting replies (only with multicast)."""
    reconnect_max_ms: int = 4_000
    request_timeout_s: float = 5.0
    subscription_buffer: int = 4096
    """Messages a subscription holds for a slow reader before it drops (and counts) more."""
    send_buffer: int = 1024
    """Messages queued for sending before ``publish`` waits."""
    replay_path: Path | None = None
    """Where this node remembers the envelopes it admitted, so that a recorded message
    is refused after a restart too (None: only while it runs); see ``replay_book``."""

    def __post_init__(self) -> None:
        check_node_id(self.node_id)
        object.__setattr__(self, "listen", tuple(self.listen))
        object.__setattr__(self, "peers", tuple(self.peers))
        if min(self.lease_ms, self.keep_alive, self.subscription_buffer, self.send_buffer) <= 0:
            raise ValueError("lease_ms, keep_alive and the buffer sizes must be positive")


def loopback_config(
    node_id: str,
    secret: str,
    *,
    peers: Sequence[str] = (),
    multicast_port: int | None = None,
    lease_ms: int = 1_000,
    request_timeout_s: float = 2.0,
) -> RoutingConfig:
    """A config whose every packet stays on loopback: listens on 127.0.0.1 (a free port)
    and, when ``multicast_port`` is given, scouts by multicast on ``lo`` only."""
    return RoutingConfig(
        node_id=node_id,
        secret=secret,
        listen=("tcp/127.0.0.1:0",),
        peers=peers,
        multicast=multicast_port is not None,
        multicast_interface="lo",
        multicast_address=f"224.0.0.224:{multicast_port or 7446}",
        lease_ms=lease_ms,
        scouting_delay_ms=100,
        reconnect_max_ms=500,
        request_timeout_s=request_timeout_s,
    )


def zenoh_config(config: RoutingConfig) -> dict[str, JsonValue]:
    """The zenoh configuration for a RoutingConfig, as JSON values."""
    return {
        "mode": config.mode,
        "listen": {"endpoints": [] if config.mode == "client" else list(config.listen)},
        "connect": {
            "endpoints": list(config.peers),
            "retry": {
                "period_init_ms": min(250, config.reconnect_max_ms),
                "period_max_ms": config.reconnect_max_ms,
                "period_increase_factor": 2.0,
            },
        },
        "scouting": {
            "delay": config.scouting_delay_ms,
            "multicast": {
                "enabled": config.multicast,
                "listen": config.multicast,
                "address": config.multicast_address,
                "interface": config.multicast_interface or "auto",
                "ttl": 1,
            },
            "gossip": {"enabled": config.gossip},
        },
        "transport": {"link": {"tx": {"lease": config.lease_ms, "keep_alive": config.keep_alive}}},
        # Read-only admin space: the only way to learn the real port of a ":0" listener.
        "adminspace": {"enabled": True, "permissions": {"read": True, "write": False}},
    }
