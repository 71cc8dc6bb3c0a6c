"""Requests waiting for a model that cannot be obtained end at once, with the cause."""

import time

import anyio
import httpx
import httpx2
import openai

from exo.api.tests.conftest import ServeFn
from exo.api.tests.scripted_node import ScriptedNode
from exo.shared.types.worker.downloads import DownloadFailed
from exo.shared.types.worker.instances import InstanceId
from exo.shared.types.worker.runners import RunnerFailed

USER = [{"role": "user", "content": "hi"}]


class _DownloadFailsNode(ScriptedNode):
    """Instead of serving, the download on the instance's node fails with ``status``."""

    status: int | None = 403

    async def _become_ready(self, instance_id: InstanceId) -> None:
        await anyio.sleep(0.2)
        state = self._state
        instance = state.instances[instance_id]
        [node_id] = instance.shard_assignments.node_to_runner
        failed = DownloadFailed(error_message="org/model is gated: set HF_TOKEN",
                                status=self.status)
        downloads = {node_id: {instance.shard_assignments.model_id: failed}}
        self.set_state(state.model_copy(update={"downloads": downloads}))


class _RunnerFailsNode(ScriptedNode):
    """The runner fails to load, then the instance is given up."""

    async def _become_ready(self, instance_id: InstanceId) -> None:
        await anyio.sleep(0.1)
        state = self._state
        runners = state.instances[instance_id].shard_assignments.runner_to_shard
        failed = dict.fromkeys(runners, RunnerFailed(error_message="GGUF file is truncated"))
        self.set_state(state.model_copy(update={"runners": {**state.runners, **failed}}))
        await anyio.sleep(0.1)
        self._delete(instance_id)


def test_a_terminal_download_failure_answers_every_waiting_request_at_once(
    serve: ServeFn,
) -> None:
    server = serve(_DownloadFailsNode(), placement_timeout_s=60)
    calls: list[float] = []

    def on_request(request: httpx2.Request) -> None:
        calls.append(time.monotonic())

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x",
                           http_client=httpx2.Client(event_hooks={"request": [on_request]}))
    start = time.monotonic()
    try:
        client.chat.completions.create(model="m1", messages=USER)  # type: ignore[arg-type]
        raise AssertionError("expected a 403")
    except openai.PermissionDeniedError as e:
        assert "gated" in str(e) and "HF_TOKEN" in str(e)
        assert e.response.headers["x-should-retry"] == "false"
    assert time.monotonic() - start < 2.0
    assert len(calls) == 1
    # Streaming requests get the same HTTP error before any event.
    r = httpx.post(server.url + "/v1/chat/completions", timeout=10,
                   json={"model": "m1", "messages": USER, "stream": True})
    assert r.status_code == 403 and r.json()["error"]["code"] == "model_access_denied"


def test_no_disk_space_is_a_507_that_the_sdk_does_not_retry(serve: ServeFn) -> None:
    node = _DownloadFailsNode()
    node.status = 507
    server = serve(node, placement_timeout_s=60)
    calls: list[float] = []

    def on_request(request: httpx2.Request) -> None:
        calls.append(time.monotonic())

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=3,
                           http_client=httpx2.Client(event_hooks={"request": [on_request]}))
    try:
        client.chat.completions.create(model="m1", messages=USER)  # type: ignore[arg-type]
        raise AssertionError("expected a 507")
    except openai.APIStatusError as e:
        assert e.status_code == 507
    assert len(calls) == 1


def test_an_instance_given_up_tells_the_waiting_request_the_runner_error(serve: ServeFn) -> None:
    server = serve(_RunnerFailsNode(), placement_timeout_s=60)
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"model": "m1", "messages": USER})
    assert r.status_code == 503
    assert "GGUF file is truncated" in r.json()["error"]["message"]
