"""Tokenizer: built once from GGUF metadata, then loaded from the cache without transformers."""

import json
import sys
from pathlib import Path

import pytest

from exo.worker.engines import tokenizer as tokenizer_module
from exo.worker.engines.tokenizer import (
    ChatTemplateError,
    EngineTokenizer,
    TokenizerMeta,
    gguf_tokenizer_cache_dir,
    load_hf_tokenizer,
    load_tokenizer,
)

CHAT = [{"role": "user", "content": "What is the capital of France?"}]
EXPECTED_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_chat_template_and_special_tokens(tokenizer: EngineTokenizer) -> None:
    assert tokenizer.render_chat(CHAT) == EXPECTED_PROMPT
    ids = tokenizer.encode_chat(CHAT)
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|>, <|im_end|>
    assert tokenizer.encode("The capital of France is") == [504, 3575, 282, 4649, 314]
    assert tokenizer.eos_token_ids == (2,)
    assert tokenizer.decode(tokenizer.encode("héllo wörld 🎉")) == "héllo wörld 🎉"


def test_second_load_uses_the_cache_without_transformers(
    gguf_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load_tokenizer(gguf_path, tmp_path)
    folder = gguf_tokenizer_cache_dir(gguf_path, tmp_path)
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_meta.json").is_file()

    def no_build(path: Path) -> None:
        raise AssertionError("the cached tokenizer should have been used")

    monkeypatch.setattr(tokenizer_module, "build_gguf_tokenizer", no_build)
    monkeypatch.setitem(sys.modules, "transformers", None)  # any import of it now fails
    cached = load_tokenizer(gguf_path, tmp_path)
    assert cached.render_chat(CHAT) == EXPECTED_PROMPT
    assert cached.encode("The capital of France is") == [504, 3575, 282, 4649, 314]


def test_template_errors_are_reported(tokenizer: EngineTokenizer) -> None:
    strict = EngineTokenizer(
        tokenizer.backend,
        TokenizerMeta(
            chat_template="{% if messages[0]['role'] != 'user' %}"
            "{{ raise_exception('first message must be from the user') }}{% endif %}ok",
            bos_token=None,
            eos_token=None,
            bos_token_id=None,
            eos_token_ids=(),
        ),
    )
    assert strict.render_chat(CHAT) == "ok"
    with pytest.raises(ChatTemplateError, match="must be from the user"):
        strict.render_chat([{"role": "assistant", "content": "hi"}])
    with pytest.raises(ChatTemplateError):  # the sandbox refuses attribute tricks
        EngineTokenizer(
            tokenizer.backend,
            TokenizerMeta("{{ messages.__class__.__mro__ }}", None, None, None, ()),
        ).render_chat(CHAT)


def test_hugging_face_folder_tokenizer(tokenizer: EngineTokenizer, tmp_path: Path) -> None:
    tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    template = tokenizer.meta.chat_template
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, "eos_token": "<|im_end|>", "bos_token": None})
    )
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "vocab_size": 49152,
                "eos_token_id": 2,
            }
        )
    )
    hf = load_hf_tokenizer(tmp_path)
    assert hf.render_chat(CHAT) == EXPECTED_PROMPT
    assert hf.encode_chat(CHAT) == tokenizer.encode_chat(CHAT)
    assert hf.eos_token_ids == (2,)


def test_tokens_holding_part_of_a_character_give_their_bytes(tokenizer: EngineTokenizer) -> None:
    """Byte-level BPE splits a character's UTF-8 over tokens: such a token's text alone is
    U+FFFD, and its bytes (what log-probability entries carry) join into the text."""
    text = "naïve 🎉 日本語 — ok 🤖"
    pieces = [tokenizer.token_text(t) for t in tokenizer.encode(text)]
    assert any(raw is not None for _, raw in pieces)  # this text does split characters
    for token, raw in pieces:
        assert (raw is not None) == ("\ufffd" in token)
    joined = b"".join(token.encode() if raw is None else bytes(raw) for token, raw in pieces)
    assert joined.decode() == text
    assert tokenizer.token_text(tokenizer.encode(" ok")[0]) == (" ok", None)
