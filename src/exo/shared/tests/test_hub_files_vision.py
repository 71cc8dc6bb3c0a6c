"""A vision-language checkpoint's files per pipeline stage: the tower and projector (whose
own numbered layers are not the model's) go with the first stage only."""

from exo.shared.models.hub_files import safetensors_files_for_layers

WEIGHT_MAP = {
    "language_model.model.embed_tokens.weight": "a.safetensors",
    "language_model.model.layers.0.mlp.up_proj.weight": "a.safetensors",
    "language_model.model.layers.1.mlp.up_proj.weight": "b.safetensors",
    "language_model.model.norm.weight": "b.safetensors",
    "language_model.lm_head.weight": "b.safetensors",
    "vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight": "v.safetensors",
    "vision_tower.vision_model.encoder.layers.1.mlp.fc1.weight": "w.safetensors",
    "multi_modal_projector.mm_input_projection_weight": "w.safetensors",
}


def test_the_tower_and_projector_go_with_the_first_stage() -> None:
    assert safetensors_files_for_layers(WEIGHT_MAP, 0, 1, 2) == {
        "a.safetensors", "v.safetensors", "w.safetensors"
    }
    # the last stage: its layer, the norm and the (untied) head; no tower file
    assert safetensors_files_for_layers(WEIGHT_MAP, 1, 2, 2) == {"b.safetensors"}
    qwen = {"visual.blocks.0.attn.qkv.weight": "v.safetensors",
            "model.layers.0.mlp.up_proj.weight": "a.safetensors"}  # fmt: skip
    assert safetensors_files_for_layers(qwen, 1, 2, 2) == set()
    assert safetensors_files_for_layers(qwen, 0, 1, 2) == {"a.safetensors", "v.safetensors"}
