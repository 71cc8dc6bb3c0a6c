"""A safetensors folder in a models dir that is not whole (a shard deleted or cut, a
garbled header) is not offered as a model, and is not reported downloaded."""

import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from exo.shared.types.worker.downloads import DownloadCompleted, DownloadFailed
from exo.worker.download.local import INVALID_FILE_STATUS, locate_progress
from exo.worker.download.model_dirs import scan_models_dir
from exo.worker.download.tests.hub_models import SAFETENSORS_REPO

SHARD2 = "model-00002-of-00002.safetensors"


@pytest.fixture
def warnings() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING", format="{message}")
    yield lines
    logger.remove(sink)


@pytest.fixture
def models(tmp_path: Path, hub_folders: dict[str, Path]) -> Path:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copytree(hub_folders[SAFETENSORS_REPO], models / "tiny-llama")
    return models


def test_a_folder_missing_a_shard_is_skipped_naming_the_file(
    models: Path, warnings: list[str]
) -> None:
    [card] = scan_models_dir(models)  # whole: offered, and found whole
    assert isinstance(locate_progress(card, models), DownloadCompleted)
    (models / "tiny-llama" / SHARD2).unlink()
    assert scan_models_dir(models) == []
    assert any("tiny-llama" in w and f"missing {SHARD2}" in w for w in warnings), warnings
    failed = locate_progress(card, models)
    assert isinstance(failed, DownloadFailed) and failed.status == INVALID_FILE_STATUS
    assert f"missing {SHARD2}" in failed.error_message


def test_a_cut_shard_is_skipped_with_its_sizes(models: Path, warnings: list[str]) -> None:
    shard = models / "tiny-llama" / SHARD2
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    assert scan_models_dir(models) == []
    assert any(f"{SHARD2} is truncated: it has {len(data) - 100} bytes, its tensors need "
               f"{len(data)}" in w for w in warnings), warnings


def test_a_huge_header_length_is_skipped_with_a_reason(models: Path, warnings: list[str]) -> None:
    shard = models / "tiny-llama" / SHARD2
    data = shard.read_bytes()
    shard.write_bytes(struct.pack("<Q", 10**12) + data[8:])
    assert [c.model_id for c in scan_models_dir(models)] == []
    assert any(f"{SHARD2}: its header length says 1000000000000 bytes" in w
               for w in warnings), warnings
    # A single-file folder with no index is checked the same way.
    (models / "tiny-llama" / "model.safetensors.index.json").unlink()
    (models / "tiny-llama" / "model-00001-of-00002.safetensors").unlink()
    assert [c.model_id for c in scan_models_dir(models)] == []
