"""A flood into a slow reader: every drop is counted, the log gets a line a second."""

import time

import anyio
import pytest
from loguru import logger

from exo.routing import Router, loopback_config
from exo.routing.tests.test_router import PING, SECRET, Ping

pytestmark = pytest.mark.anyio

FLOOD = 3000


async def test_a_flood_into_a_full_subscription_logs_once_a_second() -> None:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING", format="{message}")
    try:
        with anyio.fail_after(30):
            async with Router(loopback_config("a", SECRET)) as a:
                slow = a.subscribe(PING, buffer=1)
                started = time.monotonic()
                for n in range(FLOOD):
                    await a.publish(PING, Ping(n=n))
                while a.stats.dropped < FLOOD - 1:
                    await anyio.sleep(0.01)
                elapsed = time.monotonic() - started
                assert (await slow.receive()).n == 0
    finally:
        logger.remove(sink)
    dropped = [line for line in lines if "message dropped" in line]
    assert a.stats.dropped == FLOOD - 1
    assert 1 <= len(dropped) <= elapsed + 1, (len(dropped), elapsed)
    if len(dropped) > 1:
        assert "more dropped since the last report" in dropped[-1]
