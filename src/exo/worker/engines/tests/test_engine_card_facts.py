"""The facts a model card carries match the model's file (the API never reads the file)."""

from pathlib import Path

from exo.shared.models.embedded import embedded_model_card
from exo.shared.models.local import card_from_path
from exo.worker.engines.gguf_loader import load_gguf_config


def test_cards_carry_the_files_chat_template(gguf_path: Path) -> None:
    template = load_gguf_config(gguf_path).chat_template
    assert template is not None and "<|im_start|>" in template
    assert embedded_model_card(gguf_path).chat_template == template
    assert card_from_path(gguf_path).chat_template == template


def test_the_embedded_card_carries_the_files_sizes_and_shape(gguf_path: Path) -> None:
    """Placement's memory estimate reads these: weight bytes, their format, the kv shape."""
    embedded, read = embedded_model_card(gguf_path), card_from_path(gguf_path)
    facts = ("storage_size", "weight_format", "head_dim", "n_layers", "num_kv_heads",
             "num_heads", "hidden_size", "context_length")  # fmt: skip
    assert {f: getattr(embedded, f) for f in facts} == {f: getattr(read, f) for f in facts}
    assert read.weight_format == "Q4_1" and read.head_dim == 64
