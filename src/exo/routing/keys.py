"""Cluster keys: what a shared secret turns into, and the key expressions built on it.

One secret yields two independent values: a key-expression prefix (sent in clear on the
wire, so clusters with different secrets never even subscribe to each other's keys) and
a MAC key (never sent). Both come from one slow derivation, so that the prefix seen on
the wire does not make guessing a weak secret cheap.

Key layout under the prefix::

    {prefix}/t/{topic}            broadcast topic
    {prefix}/d/{topic}/{node}     point-to-point topic, read only by {node}
    {prefix}/q/{endpoint}/{node}  request/reply endpoint served by {node}
    {prefix}/alive/{node}         liveliness token of {node}
"""

import hashlib
import hmac
import re
from dataclasses import dataclass
from functools import lru_cache

_SALT = b"exo/cluster/v1"
_ITERATIONS = 100_000
_CHUNK = re.compile(r"[A-Za-z0-9_.\-]+")


def check_node_id(node_id: str) -> str:
    """A node id is one key-expression chunk: letters, digits, ``_ . -``."""
    if not _CHUNK.fullmatch(node_id):
        raise ValueError(f"invalid node id {node_id!r}: use letters, digits, '_', '.', '-'")
    return node_id


def check_name(name: str) -> str:
    """A topic or endpoint name: one or more node-id-like chunks joined by ``/``."""
    if not all(_CHUNK.fullmatch(chunk) for chunk in name.split("/")):
        raise ValueError(f"invalid name {name!r}: '/'-separated chunks of letters, digits, '_.-'")
    return name


@dataclass(frozen=True)
class ClusterKeys:
    prefix: str
    mac_key: bytes

    @staticmethod
    def from_secret(secret: str) -> "ClusterKeys":
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        return _derive(secret)

    def topic(self, name: str) -> str:
        return f"{self.prefix}/t/{name}"

    def direct(self, name: str, node_id: str) -> str:
        return f"{self.prefix}/d/{name}/{node_id}"

    def endpoint(self, name: str, node_id: str | None) -> str:
        """The key of one node's endpoint, or of every node's (``node_id=None``)."""
        return f"{self.prefix}/q/{name}/{node_id or '*'}"

    def alive(self, node_id: str | None) -> str:
        """The liveliness key of one node, or of every node (``node_id=None``)."""
        return f"{self.prefix}/alive/{node_id or '*'}"

    def node_of_alive(self, key: str) -> str | None:
        """The node id in a liveliness key, or None if the key is not one of ours."""
        head, _, node_id = key.rpartition("/")
        if head != f"{self.prefix}/alive" or not _CHUNK.fullmatch(node_id):
            return None
        return node_id


@lru_cache(maxsize=16)
def _derive(secret: str) -> ClusterKeys:
    master = hashlib.pbkdf2_hmac("sha256", secret.encode(), _SALT, _ITERATIONS)
    prefix_hash = hmac.new(master, b"key-expression-prefix", hashlib.sha256).hexdigest()
    mac_key = hmac.new(master, b"envelope-mac", hashlib.sha256).digest()
    return ClusterKeys(prefix=f"exo/{prefix_hash[:32]}", mac_key=mac_key)
