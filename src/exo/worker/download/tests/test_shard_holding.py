"""A node re-placed with another layer range of a model it partly holds fetches the files
of its new shard before it is seen as holding it (stand-in hub, real HTTP)."""

from pathlib import Path

import anyio
import pytest

from exo.shared.models.model_cards import ModelCard, ModelId
from exo.shared.tests.builders import INSTANCE_1, NODE_A, make_state, single_instance
from exo.shared.types.commands import Command, DeleteInstance
from exo.shared.types.events import Event, NodeDownloadProgress
from exo.shared.types.memory import Memory
from exo.shared.types.state import State
from exo.shared.types.tasks import DownloadModel
from exo.shared.types.worker.downloads import (
    DownloadCompleted,
    DownloadFailed,
    DownloadProgress,
)
from exo.shared.types.worker.shards import PipelineShardMetadata
from exo.utils.backoff import KeyedBackoff
from exo.worker.download.cards import card_from_hub
from exo.worker.download.coordinator import DownloadCoordinator
from exo.worker.download.hub import HubSettings, locate_hub_model
from exo.worker.download.local import locate_progress
from exo.worker.download.tests.hub_models import SAFETENSORS_REPO
from exo.worker.download.tests.hub_server import FakeHub
from exo.worker.runner.settings import RunnerSettings

FILE1 = "model-00001-of-00002.safetensors"
FILE2 = "model-00002-of-00002.safetensors"


def _task(card: ModelCard, start: int, end: int) -> DownloadModel:
    shard = PipelineShardMetadata(
        model_card=card, device_rank=0 if start == 0 else 1, world_size=2,
        start_layer=start, end_layer=end, n_layers=card.n_layers,
    )
    return DownloadModel(instance_id=INSTANCE_1, shard_metadata=shard)


async def _run(
    card: ModelCard, runner: RunnerSettings, held: list[DownloadProgress], task: DownloadModel
) -> DownloadProgress:
    """The worker's coordinator downloading ``task``; the final progress it reports."""
    events: list[Event] = []

    async def send_event(event: Event) -> None:
        events.append(event)
        if isinstance(event, NodeDownloadProgress):
            held.append(event.progress)

    async def send_command(command: Command) -> None:
        raise AssertionError(f"no command expected: {command}")

    def state() -> State:
        return make_state(downloads={NODE_A: {card.model_id: held[-1]}} if held else None)

    async with anyio.create_task_group() as tg:
        coordinator = DownloadCoordinator(
            node_id=NODE_A, settings=runner, send_event=send_event, send_command=send_command,
            backoff=KeyedBackoff[ModelId](), state=state, wakeup=lambda: None, task_group=tg,
        )
        with anyio.fail_after(60):
            await coordinator.download(task)
            while coordinator.running:
                await anyio.sleep(0.02)
    assert events
    return held[-1]


def _hub_card(
    hub: FakeHub, settings: HubSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[ModelCard, RunnerSettings]:
    """The stand-in hub's safetensors model, and a runner's settings sharing the hub cache."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    runner = RunnerSettings(
        cache_dir=tmp_path / "cache", models_dir=tmp_path / "models",
        hub_cache_dir=settings.cache_dir,
    )
    return card_from_hub(SAFETENSORS_REPO, settings), runner


@pytest.mark.anyio
async def test_a_node_re_placed_on_other_layers_fetches_that_shards_files(
    hub: FakeHub, settings: HubSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    card, runner = _hub_card(hub, settings, tmp_path, monkeypatch)
    held: list[DownloadProgress] = []
    first = await _run(card, runner, held, _task(card, 0, 1))
    assert isinstance(first, DownloadCompleted)
    assert (first.start_layer, first.end_layer) == (0, 1) and not first.covers(1, 3)
    assert hub.weight_gets(SAFETENSORS_REPO) == [FILE1]

    # The runner of the new shard would refuse to load rather than miss tensors.
    assert locate_hub_model(card, settings.cache_dir, (1, 3)) is None
    refused = locate_progress(card, runner.models_dir, settings.cache_dir, (), (1, 3))
    assert isinstance(refused, DownloadFailed)

    hub.requests.clear()
    second = await _run(card, runner, held, _task(card, 1, 3))
    assert isinstance(second, DownloadCompleted) and second.covers(1, 3)
    assert hub.weight_gets(SAFETENSORS_REPO) == [FILE2]  # only what was missing
    # Both shards' files are now here: the node holds the whole model.
    assert (second.start_layer, second.end_layer) == (0, card.n_layers)
    assert locate_hub_model(card, settings.cache_dir, (1, 3)) is not None


@pytest.mark.anyio
async def test_a_shard_found_whole_in_a_read_only_cache_is_not_fetched(
    hub: FakeHub, settings: HubSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    card = card_from_hub(SAFETENSORS_REPO, settings)
    own = RunnerSettings(cache_dir=tmp_path / "c", models_dir=tmp_path / "m",
                         hub_cache_dir=settings.cache_dir)
    await _run(card, own, [], _task(card, 0, 1))  # another tool's cache, holding layer 0
    other = RunnerSettings(cache_dir=tmp_path / "c", models_dir=tmp_path / "m",
                           hub_cache_dir=tmp_path / "own-cache",
                           extra_model_dirs=(settings.cache_dir,))
    hub.requests.clear()
    found = await _run(card, other, [], _task(card, 0, 1))
    assert isinstance(found, DownloadCompleted) and found.covers(0, 1)
    assert hub.weight_gets(SAFETENSORS_REPO) == []
    # Layers it lacks there are fetched into this node's own cache.
    fetched = await _run(card, other, [], _task(card, 1, 3))
    assert isinstance(fetched, DownloadCompleted) and fetched.covers(1, 3)
    assert FILE2 in hub.weight_gets(SAFETENSORS_REPO)
    assert locate_hub_model(card, tmp_path / "own-cache", (1, 3)) is not None


@pytest.mark.anyio
async def test_an_instance_is_deleted_only_once_its_download_failure_is_in_the_state(
    tmp_path: Path,
) -> None:
    """The failure (an event) and the deletion (a command) travel apart; a request that saw
    the instance go before the failure arrived answered "removed before it became ready"
    without the cause (chaos seed 2). The deletion now waits for the failure in the state."""
    card = ModelCard(
        model_id=ModelId("gone-model"), n_layers=2, hidden_size=64, num_heads=2,
        num_kv_heads=2, storage_size=Memory.from_mb(1), context_length=128,
        architecture="llama", source=str(tmp_path / "gone-model.gguf"),  # no such file
    )
    instance = single_instance(model_id=card.model_id)
    applied: list[DownloadProgress] = []
    deleted_with: list[DownloadProgress | None] = []

    def state() -> State:
        downloads = {NODE_A: {card.model_id: applied[-1]}} if applied else None
        return make_state([instance], downloads=downloads)

    async def send_event(event: Event) -> None:
        if isinstance(event, NodeDownloadProgress):
            progress = event.progress

            async def applied_later() -> None:  # the master's round trip
                await anyio.sleep(0.3)
                applied.append(progress)

            tg.start_soon(applied_later)

    async def send_command(command: Command) -> None:
        assert isinstance(command, DeleteInstance)
        deleted_with.append(state().downloads.get(NODE_A, {}).get(card.model_id))

    runner = RunnerSettings(cache_dir=tmp_path / "cache", models_dir=tmp_path / "models")
    async with anyio.create_task_group() as tg:
        coordinator = DownloadCoordinator(
            node_id=NODE_A, settings=runner, send_event=send_event, send_command=send_command,
            backoff=KeyedBackoff[ModelId](), state=state, wakeup=lambda: None, task_group=tg,
        )
        with anyio.fail_after(30):
            await coordinator.download(_task(card, 0, 2))
    assert len(deleted_with) == 1
    failure = deleted_with[0]
    assert isinstance(failure, DownloadFailed) and failure.terminal, failure


@pytest.mark.anyio
async def test_a_finished_download_is_not_started_over_while_its_completion_travels(
    hub: FakeHub, settings: HubSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker wakes as a download ends and plans on a state its completion has not
    reached yet (the event goes through the master's log): it asks for the shard again.
    The coordinator started it over, its first report (Ongoing, no layers) following the
    completion into the state, and so on at each end: the state flickered between the two
    until the runner moved on (test_shard_gguf_nodes read a node's Ongoing right after
    both nodes had completed)."""
    card, runner = _hub_card(hub, settings, tmp_path, monkeypatch)
    sent: list[DownloadProgress] = []
    ended = [anyio.Event()]  # set as each download ends (the worker's wake-up)

    async def send_event(event: Event) -> None:
        if isinstance(event, NodeDownloadProgress):
            sent.append(event.progress)

    async def send_command(command: Command) -> None:
        raise AssertionError(f"no command expected: {command}")

    async def download(task: DownloadModel) -> DownloadProgress:
        ended.append(anyio.Event())
        await coordinator.download(task)
        with anyio.fail_after(60):
            await ended[-1].wait()
        return sent[-1]

    task = _task(card, 0, 1)
    async with anyio.create_task_group() as tg:
        coordinator = DownloadCoordinator(
            node_id=NODE_A, settings=runner, send_event=send_event, send_command=send_command,
            backoff=KeyedBackoff[ModelId](), state=make_state, wakeup=lambda: ended[-1].set(),
            task_group=tg,
        )  # the state: none of its reports applied yet
        done = await download(task)
        assert isinstance(done, DownloadCompleted) and done.covers(0, 1)
        reports = len(sent)
        await coordinator.download(task)  # the planner asks again
        assert card.model_id not in coordinator.running
        assert len(sent) == reports and coordinator.reported[card.model_id] == done
        # another shard of the model is still fetched
        hub.requests.clear()
        other = await download(_task(card, 1, 3))
        assert isinstance(other, DownloadCompleted) and other.covers(1, 3)
        assert hub.weight_gets(SAFETENSORS_REPO) == [FILE2]
