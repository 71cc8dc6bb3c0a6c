"""Where the runners of an instance meet (rank 0's node, at an address the others
reach). Pure."""

import ipaddress
from collections.abc import Mapping, Sequence

from exo.shared.types.common import NodeId
from exo.shared.types.profiling import NodeInfo
from exo.shared.types.worker.instances import Instance


def group_host(instance: Instance, nodes: Mapping[NodeId, NodeInfo]) -> str:
    """Where the runners of ``instance`` meet: rank 0's node, at an address every other
    node of the instance can be expected to reach."""
    assignments = instance.shard_assignments
    ranks = {
        node_id: shard.device_rank
        for node_id, runner_id in assignments.node_to_runner.items()
        if (shard := assignments.runner_to_shard.get(runner_id)) is not None
    }
    if len(ranks) < 2:
        return _LOOPBACK
    leader = min(ranks, key=lambda node_id: (ranks[node_id], node_id))
    infos = [nodes.get(node_id) for node_id in sorted(ranks)]
    known = [info for info in infos if info is not None]
    if len(known) == len(infos) and len({info.hostname for info in known}) == 1:
        return _LOOPBACK
    leader_info = nodes.get(leader)
    if leader_info is None:
        return _LOOPBACK
    own = [a for a in _interfaces(leader_info.addresses) if not a.ip.is_loopback]
    others = [
        _interfaces(info.addresses)
        for node_id, info in nodes.items()
        if node_id in ranks and node_id != leader
    ]
    for candidate in own:
        if all(any(a.ip in candidate.network for a in theirs) for theirs in others):
            return str(candidate.ip)
    return str(own[0].ip) if own else _LOOPBACK


_LOOPBACK = "127.0.0.1"


def _interfaces(
    addresses: Sequence[str],
) -> list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]:
    found: list[ipaddress.IPv4Interface | ipaddress.IPv6Interface] = []
    for text in addresses:
        try:
            found.append(ipaddress.ip_interface(text))
        except ValueError:
            continue
    return found
