"""A Gemma 3 vision card's memory: the tower's bytes in the card are the bytes the loaded tower
holds (from the safetensors folder and from the mmproj beside a GGUF), the first pipeline
stage's estimate adds them and one image's encoding, later stages do not."""

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import Tensor

from exo.master.placement_memory import card_estimate, pipeline_memory
from exo.modelgen.mmproj_out import write_gemma3_mmproj
from exo.shared.models.model_cards import HubFile, ModelCard, ModelId
from exo.shared.models.vision_memory import (
    VisionFields,
    VisionShape,
    gemma3_tower,
    vision_params,
)
from exo.shared.types.memory import Memory
from exo.worker.download.vision_card import hub_gguf_vision_fields, local_vision_fields
from exo.worker.engines.models.gemma3_mmproj import load_gemma3_vision
from exo.worker.engines.models.gemma3_vision import Gemma3Vision
from exo.worker.engines.tests.gemma3_models import text_gguf, tiny_gemma3_folder

transformers = pytest.importorskip("transformers")


def _held_bytes(vision: Gemma3Vision) -> int:
    """Every tensor the loaded tower and projector keep."""
    t = vision.tower
    held: list[Tensor] = [*t.patch, t.positions, *t.post_norm, vision.projection, vision.norm]
    for layer in t.layers:
        for field in dataclasses.fields(layer):
            held.extend(getattr(layer, field.name))
    return sum(x.numel() * x.element_size() for x in held)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_gemma3_folder(tmp_path_factory.mktemp("gemma3-memory"))


def test_card_counts_the_towers_actual_bytes(folder: Path, tmp_path: Path) -> None:
    actual = _held_bytes(Gemma3Vision.load(folder))
    fields = local_vision_fields(folder)
    assert fields["vision_bytes"] == actual
    write_gemma3_mmproj(folder, tmp_path / "mmproj-tiny-F16.gguf", matrices="F16")
    model = text_gguf(tmp_path / "tiny-Q8_0.gguf")
    from_gguf = local_vision_fields(model)
    assert from_gguf == fields  # loaded float32 whatever the mmproj's matrices are
    assert _held_bytes(load_gemma3_vision(model)) == actual
    assert fields["vision_activation_bytes"] > 0
    (tmp_path / "alone").mkdir()  # a GGUF with no mmproj beside it: no tower
    alone = local_vision_fields(text_gguf(tmp_path / "alone" / "m.gguf"))
    assert alone == {"vision_bytes": 0, "vision_activation_bytes": 0}


def test_gemma3_4b_tower_shape_is_the_real_ones() -> None:
    """The hub GGUF cards' Gemma 3 tower: the parameter count of transformers' own 4B model
    (built on the meta device: no memory)."""
    config = transformers.Gemma3Config(
        text_config={"hidden_size": 2560, "num_hidden_layers": 1, "vocab_size": 8},
        vision_config={"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27,
                       "num_attention_heads": 16, "image_size": 896, "patch_size": 14,
                       "vision_use_head": False},  # as the hub config: no pooling head
        mm_tokens_per_image=256,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.Gemma3ForConditionalGeneration(config)
    theirs = sum(p.numel() for p in model.model.vision_tower.parameters())
    theirs += sum(p.numel() for p in model.model.multi_modal_projector.parameters())
    assert vision_params(gemma3_tower(2560)) == theirs
    assert VisionShape.from_config(config.to_dict()) == gemma3_tower(2560)


def _card(vision: VisionFields | None = None) -> ModelCard:
    fields = vision or {"vision_bytes": 0, "vision_activation_bytes": 0}
    return ModelCard(
        model_id=ModelId("gemma3-vision"), n_layers=8, hidden_size=2560, num_heads=8,
        num_kv_heads=4, storage_size=Memory(in_bytes=800 * 2**20), context_length=4096,
        architecture="gemma3", vision=True, **fields,
    )  # fmt: skip


def test_first_stage_holds_the_tower() -> None:
    fields = hub_gguf_vision_fields(
        [HubFile(path="gemma-3-4b-it-Q4_K_M.gguf", size=1), HubFile(path="mmproj-F16.gguf", size=1)],
        "gemma3", 2560,
    )  # fmt: skip
    assert fields["vision_bytes"] == vision_params(gemma3_tower(2560)) * 4
    card, text_only = _card(fields), _card()
    extra = fields["vision_bytes"] + fields["vision_activation_bytes"]
    assert pipeline_memory(card, 0, 4) - pipeline_memory(text_only, 0, 4) == extra
    assert card_estimate(card, 0, 4).vision == extra
    assert pipeline_memory(card, 4, 8) == pipeline_memory(text_only, 4, 8)
    assert hub_gguf_vision_fields([HubFile(path="m-Q4_K_M.gguf", size=1)], "gemma3", 2560) == {
        "vision_bytes": 0, "vision_activation_bytes": 0,
    }  # fmt: skip
