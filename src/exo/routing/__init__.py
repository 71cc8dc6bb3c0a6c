"""Cluster networking over zenoh: typed topics, point-to-point messages, request/reply and
presence, all authenticated with the cluster secret. Generic over pydantic-encodable types;
it imports nothing else from exo."""

from exo.routing.config import RoutingConfig, loopback_config, zenoh_config
from exo.routing.errors import (
    NoReply,
    RemoteError,
    RequestError,
    RequestTimeout,
    RouterClosed,
    RoutingError,
)
from exo.routing.presence import Joined, Left, PresenceEvent, PresenceWatch
from exo.routing.router import Router
from exo.routing.subscription import Subscription
from exo.routing.topics import Delivery, Endpoint, Topic
from exo.routing.transport import RouterStats

__all__ = [
    "Delivery",
    "Endpoint",
    "Joined",
    "Left",
    "NoReply",
    "PresenceEvent",
    "PresenceWatch",
    "RemoteError",
    "RequestError",
    "RequestTimeout",
    "Router",
    "RouterClosed",
    "RouterStats",
    "RoutingConfig",
    "RoutingError",
    "Subscription",
    "Topic",
    "loopback_config",
    "zenoh_config",
]
