"""Hub cards of Gemma 3 vision models carry the tower's memory (from the stand-in hub): a
safetensors repo's from its config, a GGUF repo with an mmproj file the Gemma 3 tower's."""

import json
import shutil
from pathlib import Path

from exo.shared.models.vision_memory import (
    VisionShape,
    vision_activation_bytes,
    vision_weight_bytes,
)
from exo.worker.download.cards import card_from_hub
from exo.worker.download.hub import HubSettings
from exo.worker.download.tests.hub_models import SAFETENSORS_REPO
from exo.worker.download.tests.hub_server import FakeHub, serve_hub

VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "image_size": 64, "patch_size": 16}  # fmt: skip


def test_hub_safetensors_card_counts_the_tower(hub_folders: dict[str, Path], tmp_path: Path) -> None:
    folder = shutil.copytree(hub_folders[SAFETENSORS_REPO], tmp_path / "vl")
    text = json.loads((folder / "config.json").read_text())
    config = {"model_type": "gemma3", "text_config": text, "vision_config": VISION,
              "mm_tokens_per_image": 4}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    fake = FakeHub()
    fake.add_folder(SAFETENSORS_REPO, hub_folders[SAFETENSORS_REPO])
    fake.add_folder("vis-org/tiny-gemma3", folder)
    with serve_hub(fake):
        settings = HubSettings(cache_dir=tmp_path / "cache", endpoint=fake.url)
        card = card_from_hub("vis-org/tiny-gemma3", settings)
        plain = card_from_hub(SAFETENSORS_REPO, settings)
    shape = VisionShape.from_config(config)
    assert shape is not None and shape.text_hidden == text["hidden_size"]
    assert card.vision_bytes == vision_weight_bytes(shape) > 0
    assert card.vision_activation_bytes == vision_activation_bytes(shape) > 0
    assert plain.vision_bytes == plain.vision_activation_bytes == 0
