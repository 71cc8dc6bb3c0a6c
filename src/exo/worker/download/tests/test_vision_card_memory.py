"""Hub cards of vision models carry the tower's memory (from the stand-in hub): a Gemma 3 or
Qwen VL safetensors repo's from its config, a GGUF repo with an mmproj file the Gemma 3 tower's."""

import json
import shutil
from pathlib import Path

from exo.shared.models.qwen_vision_memory import (
    QwenTowerShape,
    qwen_activation_bytes,
    qwen_tower_params,
)
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


def test_hub_qwen_vl_card_reads_the_preprocessors_limit(
    hub_folders: dict[str, Path], tmp_path: Path
) -> None:
    """A Qwen2.5-VL repo: the tower from config.json, the largest image from the listed
    preprocessor_config.json (fetched with the card's metadata)."""
    folder = shutil.copytree(hub_folders[SAFETENSORS_REPO], tmp_path / "qvl")
    text = json.loads((folder / "config.json").read_text())
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2,
              "out_hidden_size": text["hidden_size"], "patch_size": 14}  # fmt: skip
    config = {**text, "model_type": "qwen2_5_vl", "vision_config": vision}
    (folder / "config.json").write_text(json.dumps(config))
    pre = {"min_pixels": 3136, "max_pixels": 28 * 28 * 16}
    (folder / "preprocessor_config.json").write_text(json.dumps(pre))
    fake = FakeHub()
    fake.add_folder("vis-org/tiny-qwen-vl", folder)
    with serve_hub(fake):
        card = card_from_hub("vis-org/tiny-qwen-vl", HubSettings(cache_dir=tmp_path / "c",
                                                                 endpoint=fake.url))  # fmt: skip
    shape = QwenTowerShape.from_config(config, pre)
    assert shape is not None and shape.max_pixels == 28 * 28 * 16
    assert card.vision and card.vision_bytes == qwen_tower_params(shape) * 4 > 0
    assert card.vision_activation_bytes == qwen_activation_bytes(shape) > 0
