"""Messages a node refuses, sent to a real node process on 127.0.0.1: garbage is counted
in /metrics and logged at most once per peer per minute; a node of another protocol
version is refused with a clear line naming both versions."""

import re
from pathlib import Path

import anyio
import httpx
import pytest

from exo.cluster.election import Heartbeat
from exo.cluster.messages import HEARTBEATS
from exo.cluster.tests.nodes import SECRET, NodeProc, node_group, wait_until
from exo.routing import Router, envelope, loopback_config
from exo.shared.types.common import NodeId

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

_REJECTED = re.compile(r'^exo_cluster_messages_rejected_total\{reason="(\w+)"\} (\S+)$', re.M)


async def _rejected(proc: NodeProc) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(proc.url + "/metrics")).text
    return {reason: float(n) for reason, n in _REJECTED.findall(text)}


async def test_garbage_is_counted_and_logged_once_per_peer_per_minute(tmp_path: Path) -> None:
    async with node_group(tmp_path) as group:
        a = group.start("a")
        await group.up(a)
        config = loopback_config("prober", SECRET, peers=[a.endpoint])
        async with Router(config) as router:
            await anyio.sleep(1.0)  # let the link come up
            transport = router._open()  # pyright: ignore[reportPrivateUsage]
            key = transport.keys.topic(HEARTBEATS.name)
            sent = 2000
            for i in range(sent):
                transport.session.put(key, b"garbage %d" % i)

            async def counted() -> bool:
                return (await _rejected(a)).get("malformed", 0) >= sent

            await wait_until(counted, 30, f"{sent} rejections in /metrics")
        lines = [line for line in a.log().splitlines() if "rejected a message" in line]
        assert 1 <= len(lines) <= 2, lines[:5]


async def test_a_node_of_another_protocol_version_is_refused_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with node_group(tmp_path) as group:
        a = group.start("a")
        await group.up(a)
        old = envelope.PROTOCOL_VERSION - 1
        monkeypatch.setattr(envelope, "_MAGIC", b"EXO" + str(old).encode())
        config = loopback_config("old-node", SECRET, peers=[a.endpoint])
        async with Router(config) as router:
            await anyio.sleep(1.0)
            beat = Heartbeat(node_id=NodeId("old-node"), term=99, master=NodeId("old-node"),
                             last_idx=10**6)
            for _ in range(50):
                await router.publish(HEARTBEATS, beat)

            async def refused() -> bool:
                return (await _rejected(a)).get("version", 0) >= 50

            await wait_until(refused, 30, "the old node's messages to be refused")
        log = a.log()
        expected = (f"node old-node speaks cluster protocol v{old}, this node "
                    f"v{envelope.PROTOCOL_VERSION}")
        assert log.count(expected) == 1, log[-2000:]
        state = await a.state()
        assert "old-node" not in state["nodes"]
        assert "following master old-node" not in log
