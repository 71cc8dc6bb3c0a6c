"""Our GGUF tokenizers (built without transformers) against transformers' on the same file.

One fixed text with emoji, CJK, Cyrillic, accents, code, tabs and runs of spaces and newlines.
Vocabularies: Llama 3 and Qwen2 byte-level BPE and a Llama-style SentencePiece vocabulary,
trained here with `tokenizers` and written as GGUF metadata. Gemma 3's SentencePiece vocabulary,
from the real Gemma 3 270M file, is checked in `exo/tests/test_gemma3_270m.py` (transformers
takes about a minute to convert it, and that test needs its tokenizer anyway).
transformers builds its tokenizer from the GGUF on its own (`AutoTokenizer(gguf_file=...)`).
"""

import sys
from pathlib import Path
from typing import Any

import gguf
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from exo.worker.engines.tokenizer import EngineTokenizer, load_gguf_tokenizer

transformers = pytest.importorskip("transformers")

TEXT = (
    "Hello, world! It's 2026: naïve café, déjà-vu, Straße, ÅÄÖ.\n"
    "你好，世界。日本語のテキスト。한국어 문장. Привет, мир! Γειά σου.\n"  # noqa: RUF001
    "Emoji: 🤖🎉👍🏽 👨‍👩‍👧 ❤️ — “quotes” … ½ ∑ ∞\n\n"
    "def cube(x: int) -> int:\n    return x ** 3  # comment\n\n"
    "\t\ttabs   and    spaces     here\n\n\n   \n"
    "numbers 1234567 3.14159 0x1F  trailing  "
)

CORPUS = [
    TEXT,
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def main():\n    print('hello world')\n    return 0\n",
    "Machine learning models read tokens; tokenizers write them. Every token counts.",
    "中文分词与日本語の形態素解析は難しい。",
    "Ein kleiner Text auf Deutsch über Wörter und Sätze.",
]


def _write_gguf(path: Path, arch: str, fields: dict[str, Any]) -> Path:
    """A GGUF holding only tokenizer metadata (the tokenizer needs no tensors)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    for key, value in fields.items():
        if isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, str(value))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _byte_level_gguf(tmp: Path, arch: str, pre: str) -> Path:
    """A byte-level BPE vocabulary trained on CORPUS, as llama.cpp's `gpt2` tokenizer model."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS, trainer)
    state: dict[str, Any] = __import__("json").loads(bpe.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    tokens = sorted(vocab, key=lambda t: vocab[t])
    merges = [" ".join(m) if isinstance(m, list) else m for m in state["model"]["merges"]]
    return _write_gguf(
        tmp / f"{pre}.gguf",
        arch,
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3 if t in specials else 1 for t in tokens],
            "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": vocab["<|begin_of_text|>"],
            "tokenizer.ggml.eos_token_id": vocab["<|end_of_text|>"],
        },
    )


def _sentencepiece_gguf(tmp: Path, arch: str = "llama") -> Path:
    """A Llama-style SentencePiece BPE vocabulary: control tokens, 256 byte pieces, then pieces
    learnt on CORPUS (spaces as ▁, scored by merge order), as llama.cpp's `llama` model."""
    spm = Tokenizer(models.BPE())
    spm.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False)
    spm.train_from_iterator(CORPUS[1:], trainer)  # not TEXT: its rarer characters need bytes
    vocab = spm.get_vocab()
    learnt = sorted(vocab, key=lambda t: vocab[t])
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + learnt
    types = [2, 3, 3] + [6] * 256 + [1] * len(learnt)
    scores = [0.0] * 259 + [-float(i) for i in range(len(learnt))]
    return _write_gguf(
        tmp / "spm.gguf",
        arch,
        {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": scores,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0,
        },
    )


def assert_parity(
    path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, reference: Any = None
) -> EngineTokenizer:
    """Our tokenizer of `path` encodes and decodes TEXT (and a few openings) as transformers'."""
    if reference is None:
        reference = transformers.AutoTokenizer.from_pretrained(
            str(path.parent), gguf_file=path.name
        )
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "transformers", None)  # ours must not need it
        ours = load_gguf_tokenizer(path, cache)
    for text in ("  two leading spaces", " one", "\n newline first"):
        assert ours.encode(text) == reference(text, add_special_tokens=False).input_ids, text
    expected = reference(TEXT, add_special_tokens=False).input_ids
    got = ours.encode(TEXT)
    assert got == expected
    assert ours.decode(got) == reference.decode(expected, skip_special_tokens=True)
    assert ours.encode(TEXT, add_special_tokens=True) == reference(TEXT).input_ids
    return ours


@pytest.mark.parametrize(
    ("arch", "pre"), [("llama", "llama-bpe"), ("qwen2", "qwen2")], ids=["llama3", "qwen2"]
)
def test_byte_level_bpe_matches_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str, pre: str
) -> None:
    ours = assert_parity(_byte_level_gguf(tmp_path, arch, pre), tmp_path / "cache", monkeypatch)
    assert ours.decode(ours.encode(TEXT)) == TEXT  # byte level: lossless


@pytest.mark.parametrize("arch", ["llama", "phi3"])
def test_sentencepiece_matches_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str
) -> None:
    ours = assert_parity(_sentencepiece_gguf(tmp_path, arch), tmp_path / "cache", monkeypatch)
    ids = ours.encode(TEXT, add_special_tokens=True)
    assert ids[0] == 1  # llama.cpp's default for SentencePiece: a BOS
    assert any(t >= 259 for t in ids) and any(3 <= t < 259 for t in ids)  # pieces and bytes


@pytest.mark.parametrize(("ab", "bc"), [(-1.0, -2.0), (-2.0, -1.0)], ids=["ab-first", "bc-first"])
def test_sentencepiece_merges_follow_the_scores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ab: float, bc: float
) -> None:
    """ "abc" is "ab" + "c" or "a" + "bc", whichever join scores higher."""
    pieces = ["\u2581", "a", "b", "c", "ab", "bc", "\u2581ab", "\u2581a"]
    path = _write_gguf(
        tmp_path / "tiny-spm.gguf",
        "llama",
        {
            "tokenizer.ggml.model": "llama",
            "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", *pieces],
            "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -5.0, -5.0, -5.0, -5.0, ab, bc, -9.0, -8.0],
            "tokenizer.ggml.token_type": [2, 3, 3] + [1] * len(pieces),
            "tokenizer.ggml.unknown_token_id": 0,
        },
    )
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    ours = load_gguf_tokenizer(path, tmp_path / "cache")
    text = "abc cab abcabc"
    assert ours.encode(text) == reference(text, add_special_tokens=False).input_ids
    first = ours.encode("abc")
    assert first == ([9, 6] if ab > bc else [10, 8])  # ▁ab c  /  ▁a bc


def test_sentencepiece_byte_pieces_give_their_bytes(tmp_path: Path) -> None:
    """A character outside the vocabulary goes as byte pieces (<0xF0> ...): each one's text
    alone is U+FFFD and its byte is what a log-probability entry carries."""
    ours = load_gguf_tokenizer(_sentencepiece_gguf(tmp_path), tmp_path / "cache")
    ids = ours.encode("🤖 ok")
    raws = [ours.token_text(t)[1] for t in ids]
    split = [raw for raw in raws if raw is not None]
    assert [t for t, raw in zip(ids, raws, strict=True) if raw is not None] == [
        t for t in ids if 3 <= t < 259
    ]  # exactly the byte pieces
    assert bytes(b for raw in split for b in raw) == "🤖".encode()
