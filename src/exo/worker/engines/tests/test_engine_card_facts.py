"""The facts a model card carries match the model's file (the API never reads the file)."""

from pathlib import Path

from exo.modelgen.custom import Size, llama_gguf
from exo.modelgen.families.llama import CHAT
from exo.shared.models.embedded import embedded_model_card
from exo.worker.download.local import card_from_path
from exo.worker.engines.gguf_loader import load_gguf_config
from exo.worker.engines.tokenizer import load_tokenizer


def test_cards_carry_the_files_chat_template(gguf_path: Path) -> None:
    template = load_gguf_config(gguf_path).chat_template
    assert template is not None and "<|im_start|>" in template
    assert embedded_model_card(gguf_path).chat_template == template
    assert card_from_path(gguf_path).chat_template == template


def test_the_embedded_card_carries_the_files_sizes_and_shape(gguf_path: Path) -> None:
    """Placement's memory estimate reads these: weight bytes, their format, the kv shape."""
    embedded, read = embedded_model_card(gguf_path), card_from_path(gguf_path)
    facts = ("storage_size", "weight_format", "head_dim", "n_layers", "num_kv_heads",
             "num_heads", "hidden_size", "context_length", "embedding_bytes",
             "head_bytes")  # fmt: skip
    assert {f: getattr(embedded, f) for f in facts} == {f: getattr(read, f) for f in facts}
    assert read.weight_format == "Q4_1" and read.head_dim == 64
    assert read.embedding_bytes > 0 and read.head_bytes == 0  # a tied head


def test_a_generated_file_can_carry_a_real_tokenizer(gguf_path: Path, tmp_path: Path) -> None:
    """bench/engine.py --generate runs engines on such files: SmolLM2's vocabulary with the
    family's special tokens (Llama 3's) and chat template on random weights of another shape,
    read back as any GGUF."""
    size = Size(layers=1, hidden=64, ffn=128, heads=2, kv_heads=1)
    path = llama_gguf(tmp_path / "g.gguf", "Q8_0", size, tokenizer=gguf_path)
    source, generated = load_gguf_config(gguf_path), load_gguf_config(path)
    assert source.vocab == 49152 and generated.hidden == 64
    assert generated.vocab == source.vocab + len(CHAT.special_tokens)
    assert generated.chat_template == CHAT.template
    tokenizer = load_tokenizer(path, tmp_path / "cache")
    assert generated.eos_token_ids == (tokenizer.backend.token_to_id("<|eot_id|>"),)
    assert tokenizer.encode("Hello world") == load_tokenizer(gguf_path, tmp_path).encode(
        "Hello world"
    )
    assert len(tokenizer.encode("<|start_header_id|>user<|end_header_id|>")) == 3
