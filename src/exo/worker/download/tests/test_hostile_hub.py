"""A hostile hub (or a card from the wire) naming paths outside the cache: nothing is
written or deleted outside it (stand-in hub, real HTTP, the real download path)."""

import hashlib
import os
import threading
from pathlib import Path

import anyio
import pytest

from exo.shared.models.model_cards import HubFile, ModelCard, ModelId
from exo.shared.tests.builders import INSTANCE_1, NODE_A, make_state
from exo.shared.types.commands import Command
from exo.shared.types.events import Event, NodeDownloadProgress
from exo.shared.types.state import State
from exo.shared.types.tasks import DownloadModel
from exo.shared.types.worker.downloads import DownloadFailed, DownloadProgress
from exo.shared.types.worker.shards import PipelineShardMetadata
from exo.utils.backoff import KeyedBackoff
from exo.worker.download.cards import UNSAFE_HUB_ANSWER, card_from_hub, parse_model_name
from exo.worker.download.coordinator import DownloadCoordinator
from exo.worker.download.hub import (
    DownloadError,
    HubSettings,
    delete_hub_model,
    download_files,
    snapshot_dir,
)
from exo.worker.download.hub_names import UnsafeName, file_name_problem
from exo.worker.download.tests.hub_models import GGUF_REPO, SAFETENSORS_REPO
from exo.worker.download.tests.hub_server import FakeHub
from exo.worker.runner.settings import RunnerSettings

ESCAPE = "../../../escape/pwned-Q8_0.gguf"
"""From ``snapshots/<commit>/`` three levels up is the cache's parent folder."""


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim-dir"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    return victim


def test_a_hub_claiming_a_path_as_its_commit_gets_no_card(
    hub: FakeHub, settings: HubSettings, tmp_path: Path
) -> None:
    _victim(tmp_path)
    hub.repos[SAFETENSORS_REPO].sha = "../../../victim-dir"
    with pytest.raises(DownloadError) as caught:
        card_from_hub(SAFETENSORS_REPO, settings)
    assert caught.value.status == UNSAFE_HUB_ANSWER
    assert "40-hex-digit commit" in caught.value.message
    assert (tmp_path / "victim-dir" / "precious.txt").read_text() == "keep me"


def test_a_hub_listing_a_file_outside_the_repo_gets_no_card(
    hub: FakeHub, settings: HubSettings, tmp_path: Path
) -> None:
    repo = hub.repos[GGUF_REPO]
    repo.files[ESCAPE] = b"attacker bytes" * 200
    with pytest.raises(DownloadError) as caught:
        card_from_hub(f"{GGUF_REPO}:Q8_0", settings)
    assert caught.value.status == UNSAFE_HUB_ANSWER and "unsafe file name" in caught.value.message
    assert not (tmp_path / "escape").exists()


def _hostile(card: ModelCard, **update: object) -> ModelCard:
    assert card.hub is not None
    return card.model_copy(update={"hub": card.hub.model_copy(update=update)})


def test_a_card_from_the_wire_naming_a_file_outside_the_cache_writes_nothing(
    hub: FakeHub, settings: HubSettings, tmp_path: Path
) -> None:
    card = card_from_hub(f"{GGUF_REPO}:Q8_0", settings)
    assert card.hub is not None
    data = b"attacker bytes" * 200
    hub.repos[GGUF_REPO].files[ESCAPE] = data
    (tmp_path / "escape").mkdir()
    target = tmp_path / "escape" / "pwned-Q8_0.gguf"
    target.write_text("the user's own file")
    bad = HubFile(path=ESCAPE, size=len(data), sha256=hashlib.sha256(data).hexdigest())
    hostile = _hostile(card, files=[bad])
    with pytest.raises(DownloadError) as caught:
        download_files(hostile, [bad], settings, lambda n: None, threading.Event())
    assert caught.value.status == 400 and "unsafe file name" in caught.value.message
    assert not target.is_symlink() and target.read_text() == "the user's own file"


def test_deleting_a_card_whose_commit_is_a_path_deletes_nothing_outside(
    hub: FakeHub, settings: HubSettings, tmp_path: Path
) -> None:
    victim = _victim(tmp_path)
    card = card_from_hub(SAFETENSORS_REPO, settings)
    hostile = _hostile(card, revision="../../../victim-dir")
    with pytest.raises(UnsafeName):
        delete_hub_model(hostile, settings.cache_dir)
    assert (victim / "precious.txt").read_text() == "keep me"


def test_a_link_in_the_snapshot_never_takes_a_deletion_outside(
    hub: FakeHub, settings: HubSettings, tmp_path: Path
) -> None:
    victim = _victim(tmp_path)
    card = card_from_hub(SAFETENSORS_REPO, settings)
    assert card.hub is not None
    folder = snapshot_dir(settings.cache_dir, card.hub)
    assert folder.is_dir()  # the card fetched config.json into it
    os.symlink(victim / "precious.txt", folder / "planted.json")
    assert delete_hub_model(card, settings.cache_dir)
    assert not folder.exists()
    assert (victim / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    "name", ["../x", "a/../b", "/etc/passwd", "a\\b", "", "./a", "a//b", "C:x"]
)
def test_unsafe_file_names_are_named(name: str) -> None:
    assert file_name_problem(name) is not None


@pytest.mark.parametrize("name", ["../x", "a/..", "./x", "a/b/c", "-a/b", "a--b/c", "a/."])
def test_malformed_repo_ids_are_not_model_names(name: str) -> None:
    assert parse_model_name(name) is None


async def _coordinate(card: ModelCard, tmp_path: Path, hub_cache: Path) -> list[DownloadProgress]:
    reported: list[DownloadProgress] = []

    async def send_event(event: Event) -> None:
        if isinstance(event, NodeDownloadProgress):
            reported.append(event.progress)

    async def send_command(command: Command) -> None:
        pass

    def state() -> State:
        return make_state()

    runner = RunnerSettings(cache_dir=tmp_path / "c", models_dir=tmp_path / "m",
                            hub_cache_dir=hub_cache)
    shard = PipelineShardMetadata(model_card=card, device_rank=0, world_size=1, start_layer=0,
                                  end_layer=card.n_layers, n_layers=card.n_layers)
    async with anyio.create_task_group() as tg:
        coordinator = DownloadCoordinator(
            node_id=NODE_A, settings=runner, send_event=send_event, send_command=send_command,
            backoff=KeyedBackoff[ModelId](), state=state, wakeup=lambda: None, task_group=tg,
        )
        coordinator.action("delete", card)
        with anyio.fail_after(30):
            await coordinator.download(DownloadModel(instance_id=INSTANCE_1, shard_metadata=shard))
            while coordinator.running:
                await anyio.sleep(0.02)
    return reported


@pytest.mark.anyio
async def test_the_worker_refuses_a_hostile_card_from_a_command(
    hub: FakeHub, settings: HubSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    victim = _victim(tmp_path)
    card = card_from_hub(SAFETENSORS_REPO, settings)
    hostile = _hostile(card, revision="../../../victim-dir")
    reported = await _coordinate(hostile, tmp_path, settings.cache_dir)
    assert (victim / "precious.txt").read_text() == "keep me"
    [failed] = reported
    assert isinstance(failed, DownloadFailed) and failed.status == 400
    assert "40-hex-digit commit" in failed.error_message


def test_a_download_never_follows_a_link_out_of_the_cache(
    hub: FakeHub, settings: HubSettings, tmp_path: Path
) -> None:
    card = card_from_hub(f"{GGUF_REPO}:Q8_0", settings)
    assert card.hub is not None
    data = b"weights" * 300
    hub.repos[GGUF_REPO].files["sub/model-Q8_0.gguf"] = data
    hub.repos[GGUF_REPO].sha = card.hub.revision  # still the commit the card pinned
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = snapshot_dir(settings.cache_dir, card.hub)
    folder.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, folder / "sub")  # planted: a folder link out of the cache
    f = HubFile(path="sub/model-Q8_0.gguf", size=len(data),
                sha256=hashlib.sha256(data).hexdigest())
    planted = _hostile(card, files=[f])
    with pytest.raises(DownloadError) as caught:
        download_files(planted, [f], settings, lambda n: None, threading.Event())
    assert caught.value.status == 400 and "outside" in caught.value.message
    assert list(outside.iterdir()) == []
