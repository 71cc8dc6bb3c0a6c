"""Downloads and cards against the local stand-in hub (huggingface_hub, real HTTP)."""

import dataclasses
import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from exo.shared.models.model_cards import ModelCard
from exo.shared.types.worker.downloads import DownloadCompleted, DownloadOngoing, DownloadProgress
from exo.tests.node_process import free_port
from exo.worker.download.cards import card_from_hub
from exo.worker.download.hub import (
    PARTIAL_SUFFIX,
    DownloadCancelled,
    DownloadError,
    HubSettings,
    download_files,
    locate_hub_model,
    repo_folder,
    shard_files,
)
from exo.worker.download.shard_download import ShardDownload
from exo.worker.download.tests.conftest import GATED_REPO
from exo.worker.download.tests.hub_models import GGUF_REPO, SAFETENSORS_REPO, TINY_TEMPLATE
from exo.worker.download.tests.hub_server import FakeHub

FILE1 = "model-00001-of-00002.safetensors"
FILE2 = "model-00002-of-00002.safetensors"


def _download(card: ModelCard, settings: HubSettings, start: int = 0, end: int | None = None,
              cancelled: threading.Event | None = None) -> tuple[Path, int]:
    counted: list[int] = []
    files = shard_files(card, start, card.n_layers if end is None else end, settings)
    path = download_files(card, files, settings, counted.append, cancelled or threading.Event())
    return path, sum(counted)


def test_a_card_is_built_from_hub_metadata_without_fetching_weights(
    hub: FakeHub, settings: HubSettings
) -> None:
    card = card_from_hub(SAFETENSORS_REPO, settings)
    repo = hub.repos[SAFETENSORS_REPO]
    assert card.n_layers == 3 and card.num_heads == 6 and card.num_kv_heads == 3
    assert card.hub is not None and card.hub.revision == repo.commit
    weights = [n for n in repo.files if n.endswith(".safetensors")]
    assert card.storage_size.in_bytes == sum(len(repo.files[n]) for n in weights)
    lfs = {f.path: f.sha256 for f in card.hub.files}
    assert lfs[FILE1] == hashlib.sha256(repo.files[FILE1]).hexdigest()
    assert hub.weight_gets(SAFETENSORS_REPO) == []
    assert card.chat_template == TINY_TEMPLATE  # from tokenizer_config.json
    # What placement's memory estimate needs: the head size and the weights' format.
    assert (card.head_dim, card.weight_format) == (16, "F32")
    assert card.embedding_bytes == card.head_bytes == 160 * 96 * 4  # vocab x hidden, untied


def test_a_gguf_card_reads_only_the_head_of_the_chosen_quant(
    hub: FakeHub, settings: HubSettings
) -> None:
    card = card_from_hub(f"{GGUF_REPO}:Q8_0", settings)
    assert (card.n_layers, card.hidden_size, card.num_heads, card.num_kv_heads) == (3, 96, 6, 3)
    assert card.hub is not None and card.hub.gguf_quant == "Q8_0"
    assert [f.path for f in card.hub.files] == ["TinyLlama-Q8_0.gguf"]
    assert card.chat_template == TINY_TEMPLATE  # from the header
    assert (card.head_dim, card.weight_format) == (16, "Q8_0")
    gets = [r for r in hub.requests if r.method == "GET" and r.file is not None]
    assert gets and all(r.range_header == f"bytes=0-{(1 << 20) - 1}" for r in gets)
    with pytest.raises(DownloadError, match="Q2_K") as e:
        card_from_hub(f"{GGUF_REPO}:Q2_K", settings)
    assert e.value.status == 404


def test_a_full_download_is_verified_pinned_and_found_again_offline(
    hub: FakeHub, settings: HubSettings
) -> None:
    card = card_from_hub(SAFETENSORS_REPO, settings)
    path, counted = _download(card, settings)
    repo = hub.repos[SAFETENSORS_REPO]
    assert path.parts[-1] == repo.commit and path.parts[-2] == "snapshots"
    for name in (FILE1, FILE2, "config.json", "tokenizer_config.json"):
        assert (path / name).read_bytes() == repo.files[name]
    assert not (path / "README.md").exists()
    assert counted == sum(len(d) for n, d in repo.files.items() if n != "README.md")
    assert locate_hub_model(card, settings.cache_dir) == path
    # Found in the cache: no network needed (hub down, or offline).
    hub.down = True
    before = len(hub.requests)
    assert _download(card, settings)[0] == path
    assert _download(card, dataclasses.replace(settings, offline=True))[0] == path
    assert len(hub.requests) == before


def test_each_pipeline_shard_fetches_only_its_files(hub: FakeHub, settings: HubSettings) -> None:
    card = card_from_hub(SAFETENSORS_REPO, settings)
    _download(card, settings, 0, 1)
    assert hub.weight_gets(SAFETENSORS_REPO) == [FILE1]
    other = dataclasses.replace(settings, cache_dir=settings.cache_dir.parent / "other-node")
    hub.requests.clear()
    _download(card, other, 2, 3)
    assert hub.weight_gets(SAFETENSORS_REPO) == [FILE2]


def test_a_cut_download_resumes_from_where_it_stopped(hub: FakeHub, settings: HubSettings) -> None:
    card = card_from_hub(SAFETENSORS_REPO, settings)
    hub.cut_once.add(FILE1)
    path, counted = _download(card, settings, 0, 1)
    data = hub.repos[SAFETENSORS_REPO].files[FILE1]
    assert (path / FILE1).read_bytes() == data
    starts = [r.range_start for r in hub.requests if r.method == "GET" and r.file == FILE1]
    assert len(starts) == 2 and starts[0] == 0 and 0 < starts[1] <= len(data) // 2
    assert counted == sum(f.size for f in shard_files(card, 0, 1, settings))


def test_a_download_interrupted_by_a_restart_continues_its_partial_file(
    hub: FakeHub, settings: HubSettings
) -> None:
    card = card_from_hub(SAFETENSORS_REPO, settings)
    data = hub.repos[SAFETENSORS_REPO].files[FILE1]
    assert card.hub is not None
    [f1] = [f for f in card.hub.files if f.path == FILE1]
    blobs = repo_folder(settings.cache_dir, SAFETENSORS_REPO) / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / f"{f1.sha256}{PARTIAL_SUFFIX}").write_bytes(data[:100_000])  # left by a crash
    path, counted = _download(card, settings, 0, 1)
    assert (path / FILE1).read_bytes() == data
    starts = [r.range_start for r in hub.requests if r.method == "GET" and r.file == FILE1]
    assert starts == [100_000]
    assert (path / FILE1).is_symlink() and not list(blobs.glob(f"*{PARTIAL_SUFFIX}"))
    assert counted == sum(f.size for f in shard_files(card, 0, 1, settings))


def test_a_corrupted_file_is_detected_and_fetched_again(
    hub: FakeHub, settings: HubSettings
) -> None:
    card = card_from_hub(SAFETENSORS_REPO, settings)
    hub.corrupt_once.add(FILE2)
    path, _ = _download(card, settings, 2, 3)
    assert (path / FILE2).read_bytes() == hub.repos[SAFETENSORS_REPO].files[FILE2]
    assert hub.weight_gets(SAFETENSORS_REPO) == [FILE2, FILE2]


def test_a_gguf_download_fetches_the_one_quant(hub: FakeHub, settings: HubSettings) -> None:
    card = card_from_hub(f"{GGUF_REPO}:Q4_K_M", settings)
    path, _ = _download(card, settings)
    assert path.name == "TinyLlama-Q4_K_M.gguf"
    assert path.read_bytes() == hub.repos[GGUF_REPO].files["TinyLlama-Q4_K_M.gguf"]
    assert hub.weight_gets(GGUF_REPO)[-1] == "TinyLlama-Q4_K_M.gguf"
    assert all(r.range_header is not None for r in hub.requests
               if r.method == "GET" and r.file == "TinyLlama-Q8_0.gguf")


def test_missing_and_gated_repos_are_clear_terminal_errors(
    hub: FakeHub, settings: HubSettings
) -> None:
    with pytest.raises(DownloadError, match="not found on the hub") as e:
        card_from_hub("nobody/no-such-model", settings)
    assert e.value.status == 404
    with pytest.raises(DownloadError, match=r"gated.*set HF_TOKEN") as e:
        card_from_hub(GATED_REPO, settings)
    assert e.value.status == 403
    wrong = dataclasses.replace(settings, token="hf_wrong")
    with pytest.raises(DownloadError, match="no access") as e:
        card_from_hub(GATED_REPO, wrong)
    assert e.value.status == 403
    good = dataclasses.replace(settings, token=hub.repos[GATED_REPO].token)
    card = card_from_hub(GATED_REPO, good)
    # The card was built with a token; a node without one cannot download it.
    with pytest.raises(DownloadError, match="gated") as e:
        _download(card, settings)
    assert e.value.status == 403
    assert _download(card, good)[0].exists()


def test_offline_without_the_files_is_a_clear_error(hub: FakeHub, settings: HubSettings) -> None:
    card = card_from_hub(SAFETENSORS_REPO, settings)
    offline = dataclasses.replace(settings, offline=True)
    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE") as e:
        _download(card, offline)
    assert e.value.status == 404
    with pytest.raises(DownloadError, match="HF_HUB_OFFLINE") as e:
        card_from_hub(GGUF_REPO, offline)
    assert e.value.status == 404
    assert hub.weight_gets(SAFETENSORS_REPO) == []


def test_no_disk_space_fails_before_any_byte(hub: FakeHub, settings: HubSettings) -> None:
    card = card_from_hub(SAFETENSORS_REPO, settings)
    files = shard_files(card, 0, 3, settings)
    with pytest.raises(DownloadError, match="free disk") as e:
        download_files(card, files, settings, lambda n: None, threading.Event(), free=lambda p: 1000)
    assert e.value.status == 507
    assert hub.weight_gets(SAFETENSORS_REPO) == []


@pytest.mark.slow  # the retries with backoff take about 25 s
def test_an_unreachable_hub_is_a_transient_error(hub: FakeHub, settings: HubSettings) -> None:
    card = card_from_hub(SAFETENSORS_REPO, settings)
    unreachable = dataclasses.replace(settings, endpoint=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(DownloadError, match="retrying") as e:
        _download(card, unreachable)
    assert e.value.status is None


def test_a_cancelled_download_stops(hub: FakeHub, settings: HubSettings) -> None:
    card = card_from_hub(SAFETENSORS_REPO, settings)
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(DownloadCancelled):
        _download(card, settings, cancelled=cancelled)
    assert locate_hub_model(card, settings.cache_dir) is None


@pytest.mark.anyio
async def test_progress_is_reported_at_most_twice_a_second_with_speed_and_eta(
    hub: FakeHub, settings: HubSettings
) -> None:
    # huggingface_hub hands over 10 MB chunks: 25 MB at 10 MB/s, about 2.5 s.
    repo = hub.repos[SAFETENSORS_REPO]
    hub.repos["tiny-org/big"] = dataclasses.replace(
        repo, files={**repo.files, FILE1: os.urandom(25 << 20)})
    card = card_from_hub("tiny-org/big", settings)
    hub.bytes_per_s = 10e6
    events: list[DownloadProgress] = []

    async def report(progress: DownloadProgress) -> None:
        events.append(progress)

    started = time.monotonic()
    outcome = await ShardDownload(card, 0, 1, settings).run(report)
    elapsed = time.monotonic() - started
    assert isinstance(outcome, DownloadCompleted)
    ongoing = [e for e in events if isinstance(e, DownloadOngoing)]
    assert 2 <= len(ongoing) <= 2 * elapsed + 1
    done = [e.downloaded_bytes for e in ongoing]
    assert done == sorted(done) and done[-1] >= 20 << 20
    assert ongoing[-1].total_bytes == sum(f.size for f in shard_files(card, 0, 1, settings))
    assert all(e.bytes_per_s > 0 and e.eta_s is not None for e in ongoing)
