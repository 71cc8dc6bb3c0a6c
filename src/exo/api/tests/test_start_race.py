"""A request that comes right after the node started, before the node reported its own
memory, waits for that report instead of failing with "no nodes are available" (found by
sending a chat request the moment /health answered)."""

from collections.abc import Callable

import anyio
import httpx

from exo.api.tests.conftest import ServeFn
from exo.api.tests.scripted_node import TEXT, ScriptedNode
from exo.shared.types.state import State


class _JustStarted(ScriptedNode):
    """A node whose own info reaches its state 0.3 s after the first look for it."""

    def __init__(self) -> None:
        super().__init__()
        self._info = self._state.nodes
        self._state = State()
        self._reporting = False

    async def wait_for_state(self, predicate: Callable[[State], bool], timeout: float) -> State:
        if not self._reporting:
            self._reporting = True
            self._spawn(self._report)
        return await super().wait_for_state(predicate, timeout)

    async def _report(self) -> None:
        await anyio.sleep(0.3)
        self.set_state(self._state.model_copy(update={"nodes": self._info}))


def test_a_request_at_start_waits_for_the_nodes_own_report(serve: ServeFn) -> None:
    server = serve(_JustStarted(), placement_timeout_s=10.0)
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "m1", "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == TEXT
