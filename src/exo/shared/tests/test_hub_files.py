"""Which hub files a shard needs and which quant a GGUF repo gives (pure)."""

from exo.shared.models.hub_files import (
    choose_gguf,
    quant_of,
    safetensors_files_for_layers,
    split_parts_complete,
    support_files,
)
from exo.shared.models.model_cards import HubFile

WEIGHT_MAP = {
    "model.embed_tokens.weight": "a.safetensors",
    "model.layers.0.mlp.up_proj.weight": "a.safetensors",
    "model.layers.1.mlp.up_proj.weight": "a.safetensors",
    "model.layers.1.mlp.down_proj.weight": "b.safetensors",
    "model.layers.2.mlp.up_proj.weight": "b.safetensors",
    "model.layers.3.mlp.up_proj.weight": "c.safetensors",
    "model.norm.weight": "c.safetensors",
    "lm_head.weight": "c.safetensors",
}


def test_each_layer_range_needs_only_the_files_holding_it() -> None:
    assert safetensors_files_for_layers(WEIGHT_MAP, 0, 1, 4) == {"a.safetensors"}
    assert safetensors_files_for_layers(WEIGHT_MAP, 1, 2, 4) == {"a.safetensors", "b.safetensors"}
    assert safetensors_files_for_layers(WEIGHT_MAP, 2, 3, 4) == {"b.safetensors"}
    assert safetensors_files_for_layers(WEIGHT_MAP, 3, 4, 4) == {"c.safetensors"}


def test_a_tied_head_makes_the_last_shard_fetch_the_embeddings() -> None:
    tied = {k: v for k, v in WEIGHT_MAP.items() if not k.startswith("lm_head")}
    assert safetensors_files_for_layers(tied, 3, 4, 4) == {"a.safetensors", "c.safetensors"}


def _files(*names: str) -> list[HubFile]:
    return [HubFile(path=n, size=1) for n in names]


def test_support_files_are_configs_and_tokenizers_at_the_repo_root() -> None:
    files = _files("config.json", "tokenizer.json", "chat_template.jinja", "tokenizer.model",
                   "README.md", "model.safetensors", "onnx/config.json", ".gitattributes")
    assert [f.path for f in support_files(files)] == [
        "config.json", "tokenizer.json", "chat_template.jinja", "tokenizer.model"]


def test_gguf_quants_are_named_chosen_and_split_parts_kept_together() -> None:
    assert quant_of("Qwen3-8B-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("x/Llama-3.1-70B-Instruct-Q8_0-00001-of-00002.gguf") == "Q8_0"
    assert quant_of("model.IQ3_XS.gguf") == "IQ3_XS"
    assert quant_of("gemma-3-1b-it-bf16.gguf") == "BF16"
    files = _files("M-Q4_K_M.gguf", "M-Q8_0-00002-of-00002.gguf", "M-Q8_0-00001-of-00002.gguf",
                   "mmproj-M-F16.gguf", "README.md")
    assert [f.path for f in choose_gguf(files, None)] == ["M-Q4_K_M.gguf"]  # type: ignore[union-attr]
    q8 = choose_gguf(files, "q8_0")
    assert isinstance(q8, list) and [f.path for f in q8] == [
        "M-Q8_0-00001-of-00002.gguf", "M-Q8_0-00002-of-00002.gguf"]
    assert split_parts_complete(q8) and not split_parts_complete(q8[:1])
    missing = choose_gguf(files, "Q2_K")
    assert isinstance(missing, str) and "Q4_K_M" in missing
    assert isinstance(choose_gguf(_files("A-Q3_K_S.gguf", "A-Q5_0.gguf"), None), str)


def test_a_deleted_download_is_forgotten_and_other_actions_leave_the_state() -> None:
    from exo.shared.tests.builders import DONE, MODEL_1, NODE_A, fold, make_state, model_card
    from exo.shared.types.events import DownloadActionRequested

    state = make_state(downloads={NODE_A: {MODEL_1: DONE}})
    card = model_card()
    for action in ("start", "cancel"):
        after = fold(state, [DownloadActionRequested(node_id=NODE_A, action=action, model_card=card)])
        assert after.downloads == state.downloads
    after = fold(state, [DownloadActionRequested(node_id=NODE_A, action="delete", model_card=card)])
    assert MODEL_1 not in after.downloads[NODE_A]


def test_catalogue_names_map_to_hub_repos_and_quants() -> None:
    from exo.shared.models.catalogue import CATALOGUE, estimate_bytes, hub_name, listing

    assert hub_name("qwen3-8b") == "Qwen/Qwen3-8B"
    assert hub_name("Qwen3-8B:q4_k_m") == "Qwen/Qwen3-8B-GGUF:Q4_K_M"
    assert hub_name("qwen/qwen3-8b") == "Qwen/Qwen3-8B"
    assert hub_name("no-such-model") is None
    families = {e.name.split("-")[0] for e in CATALOGUE}
    assert {"llama", "qwen2.5", "qwen3", "mistral", "gemma"} <= families
    assert len({e.name for e in CATALOGUE}) == len(CATALOGUE)
    assert estimate_bytes(8.0, "BF16") == 16_000_000_000
    assert all(entry.size_estimated for entry in listing())
