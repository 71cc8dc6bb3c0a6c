"""How a node joins a cluster: the network side (endpoints, discovery, secret) and the
timing of heartbeats and elections, all derived from one node timeout."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from exo.cluster.election import Timing
from exo.routing import RoutingConfig

DEFAULT_DISCOVERY_PORT = 7446
DEFAULT_NODE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ClusterConfig:
    secret: str
    listen: Sequence[str]
    """Zenoh endpoints to listen on, e.g. ``tcp/0.0.0.0:7447``."""
    peers: Sequence[str] = ()
    """Endpoints of other nodes to connect to (retried until reached)."""
    multicast: bool = False
    """Find other nodes by multicast scouting."""
    multicast_interface: str | None = None
    """The interface to scout on (``lo`` in tests); None lets zenoh choose."""
    multicast_port: int = DEFAULT_DISCOVERY_PORT
    force_master: bool = False
    node_timeout_s: float = DEFAULT_NODE_TIMEOUT_S
    """A node silent for this long is gone (a dead process is noticed at once)."""
    command_timeout_s: float = 30.0
    """How long a command may wait for a master before its requester gets an error."""
    gossip: bool = True
    """Peers tell each other where to connect. Off only where every link must go
    through the given endpoints (the chaos tests' proxies)."""
    router: bool = False
    """Also route for the nodes that ``connect`` to this one (they may share no subnet
    or multicast domain with each other)."""
    connect: Sequence[str] = ()
    """Routers to join through (zenoh client mode): then every packet of this node goes
    through one of them, and ``listen``, ``peers`` and multicast are not used."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "listen", tuple(self.listen))
        object.__setattr__(self, "peers", tuple(self.peers))
        object.__setattr__(self, "connect", tuple(self.connect))
        if self.connect and (self.router or self.peers):
            raise ValueError("a node that connects to a router is neither a router nor a peer")
        if self.node_timeout_s <= 0:
            raise ValueError("the node timeout must be positive")
        if not self.secret:
            raise ValueError("the cluster secret must not be empty")

    @property
    def heartbeat_interval_s(self) -> float:
        return max(self.node_timeout_s / 5, 0.02)

    @property
    def request_timeout_s(self) -> float:
        return max(min(self.node_timeout_s, 5.0), 1.0)

    @property
    def timing(self) -> Timing:
        beat = self.heartbeat_interval_s
        return Timing(
            node_timeout_s=self.node_timeout_s,
            settle_s=min(2 * beat, 0.5),
            join_grace_s=min(self.node_timeout_s, 3 * beat),
        )

    def routing(self, node_id: str, replay_path: Path | None = None) -> RoutingConfig:
        """``replay_path``: where the replay guard remembers what it admitted."""
        lease_ms = max(int(min(self.node_timeout_s, 10.0) * 1000), 500)
        return RoutingConfig(
            node_id=node_id,
            secret=self.secret,
            listen=() if self.connect else self.listen,
            peers=self.connect or self.peers,
            multicast=self.multicast and not self.connect,
            multicast_interface=self.multicast_interface,
            multicast_address=f"224.0.0.224:{self.multicast_port}",
            lease_ms=lease_ms,
            scouting_delay_ms=min(500, lease_ms // 4),
            reconnect_max_ms=min(4_000, lease_ms),
            request_timeout_s=self.request_timeout_s,
            gossip=self.gossip,
            mode="client" if self.connect else "router" if self.router else "peer",
            replay_path=replay_path,
        )
