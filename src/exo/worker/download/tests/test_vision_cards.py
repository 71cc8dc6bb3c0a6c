"""Cards say which models take images: a config with a vision tower, or an mmproj file
beside the GGUF (from the local stand-in hub, and from files a node holds)."""

import json
import shutil
from pathlib import Path

from exo.worker.download.cards import card_from_hub
from exo.worker.download.hub import HubSettings
from exo.worker.download.local import card_from_path, takes_images
from exo.worker.download.tests.hub_models import GGUF_REPO, SAFETENSORS_REPO, write_tiny_gguf
from exo.worker.download.tests.hub_server import FakeHub, serve_hub

VISION = {"model_type": "siglip_vision_model", "hidden_size": 32, "image_size": 64}


def _vision_folder(source: Path, folder: Path) -> Path:
    """The safetensors repo with its config nested as a vision-language model's."""
    shutil.copytree(source, folder)
    text = json.loads((folder / "config.json").read_text())
    config = {"model_type": "gemma3", "text_config": text, "vision_config": VISION}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_hub_cards_flag_vision(hub_folders: dict[str, Path], tmp_path: Path) -> None:
    fake = FakeHub()
    fake.add_folder(SAFETENSORS_REPO, hub_folders[SAFETENSORS_REPO])
    fake.add_folder(
        "vis-org/tiny-vl", _vision_folder(hub_folders[SAFETENSORS_REPO], tmp_path / "vl")
    )
    gguf = shutil.copytree(hub_folders[GGUF_REPO], tmp_path / "gguf")
    fake.add_folder(GGUF_REPO, hub_folders[GGUF_REPO])
    write_tiny_gguf(gguf / "mmproj-TinyLlama-F16.gguf", "F16")
    fake.add_folder("vis-org/tiny-vl-GGUF", gguf)
    with serve_hub(fake):
        settings = HubSettings(cache_dir=tmp_path / "cache", endpoint=fake.url)
        assert not card_from_hub(SAFETENSORS_REPO, settings).vision
        vl = card_from_hub("vis-org/tiny-vl", settings)
        assert vl.vision and vl.n_layers == 3  # the text model's shape, from text_config
        assert not card_from_hub(f"{GGUF_REPO}:Q8_0", settings).vision
        card = card_from_hub("vis-org/tiny-vl-GGUF:Q8_0", settings)
        assert card.vision and card.hub is not None
        # the quant's file, and the projector the first stage downloads with it (issue 25)
        assert [f.path for f in card.hub.files] == ["TinyLlama-Q8_0.gguf",
                                                    "mmproj-TinyLlama-F16.gguf"]  # fmt: skip


def test_local_files_flag_vision(hub_folders: dict[str, Path], tmp_path: Path) -> None:
    folder = _vision_folder(hub_folders[SAFETENSORS_REPO], tmp_path / "vl")
    assert takes_images(folder)
    assert not takes_images(hub_folders[SAFETENSORS_REPO])
    model = write_tiny_gguf(tmp_path / "g" / "Tiny-Q8_0.gguf")
    assert not card_from_path(model).vision
    write_tiny_gguf(tmp_path / "g" / "mmproj-Tiny-F16.gguf", "F16")
    assert card_from_path(model).vision
