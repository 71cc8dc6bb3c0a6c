"""A peer holding the secret floods the master with local events: beyond its budget they
are refused and counted, and the master logs it once a second (real routers, loopback)."""

import time
from pathlib import Path

import anyio
import pytest
from loguru import logger

from exo.cluster.config import ClusterConfig
from exo.cluster.messages import LOCAL_EVENTS, LocalEventsMsg
from exo.cluster.tests.test_link import M2, SECRET, download, running_link
from exo.routing import NoReply, RequestTimeout, Router
from exo.shared.types.common import NodeId
from exo.shared.types.events import NodeDownloadProgress
from exo.utils.flood_gate import FloodGate

pytestmark = pytest.mark.anyio

FLOODER = NodeId("flooder")
RATE, BURST, BATCH, BATCHES = 50.0, 300.0, 100, 30


async def test_a_flood_of_local_events_is_refused_beyond_the_budget(tmp_path: Path) -> None:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING", format="{message}")
    accepted = 0
    try:
        with anyio.fail_after(60):
            async with running_link(M2, tmp_path / "m2", force_master=True) as m2:
                await m2.link.ready.wait()
                m2.link.sequencer.event_gate = FloodGate(RATE, BURST)
                config = ClusterConfig(secret=SECRET, listen=["tcp/127.0.0.1:0"],
                                       peers=m2.link.listen_endpoints)
                async with Router(config.routing(FLOODER)) as router:
                    started = time.monotonic()
                    for b in range(BATCHES):
                        events = [download(FLOODER, "flood", b * BATCH + i) for i in range(BATCH)]
                        msg = LocalEventsMsg(node_id=FLOODER, events=events)
                        while True:
                            try:
                                ack = await router.request(LOCAL_EVENTS, msg, target=M2,
                                                           timeout=5)
                                break
                            except (NoReply, RequestTimeout):
                                await anyio.sleep(0.05)  # the endpoint's declaration travels
                        accepted += BATCH if ack.accepted else 0
                    elapsed = time.monotonic() - started
                logged = [e for e in m2.log.read_from(0, 100_000)
                          if isinstance(e.event, NodeDownloadProgress)
                          and e.event.node_id == FLOODER]
    finally:
        logger.remove(sink)
    assert accepted <= BURST + RATE * elapsed + BATCH, (accepted, elapsed)
    assert len(logged) == accepted
    assert m2.link.sequencer.event_gate.dropped[FLOODER] == BATCHES * BATCH - accepted > 0
    flood_lines = [line for line in lines if "sends local events faster" in line]
    assert 1 <= len(flood_lines) <= elapsed + 1, (flood_lines, elapsed)
