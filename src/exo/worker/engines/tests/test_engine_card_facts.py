"""The facts a model card carries match the model's file (the API never reads the file)."""

from pathlib import Path

from exo.shared.models.embedded import embedded_model_card
from exo.worker.download.local import card_from_path
from exo.worker.engines.gguf_loader import load_gguf_config


def test_cards_carry_the_files_chat_template(gguf_path: Path) -> None:
    template = load_gguf_config(gguf_path).chat_template
    assert template is not None and "<|im_start|>" in template
    assert embedded_model_card(gguf_path).chat_template == template
    assert card_from_path(gguf_path).chat_template == template
