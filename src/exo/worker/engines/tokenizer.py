"""Tokenizer and chat template, from a GGUF file (cached) or a Hugging Face folder.

A GGUF file stores its vocabulary as metadata, not as a `tokenizer.json`. We build a
`tokenizers.Tokenizer` from it once and cache it (`tokenizer.json` + `tokenizer_meta.json`) in
the given cache directory; later loads read only the cache, with `tokenizers` and `jinja2`.
Byte-level BPE vocabularies (GPT-2, SmolLM, Llama 3, Qwen2) and SentencePiece ones (Llama 2,
Mistral, Gemma: `sentencepiece.py`) are built directly from the metadata; others go through
transformers' GGUF converter, when it is installed.
"""

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import SandboxedEnvironment
from loguru import logger
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from exo.shared.chat_formats import TURN_ENDS, native_format, template_variables
from exo.shared.models.chat_fallback import FALLBACK_TEMPLATE
from exo.worker.engines.gguf_reader import GGUFFile, eos_token_ids
from exo.worker.engines.sentencepiece import build_sentencepiece_bpe
from exo.worker.engines.text import REPLACEMENT

_CACHE_VERSION = 2  # 2: SentencePiece vocabularies built natively
_TOKEN_CONTROL, _TOKEN_USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's `tokenizer.ggml.pre` names -> how text is split before byte-level BPE.
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "codeshell", "exaone", "minerva")
_GPT2 = ("gpt2", "default", "gpt-2")
_LLAMA3 = ("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx")
_QWEN2 = ("qwen2", "deepseek-r1-qwen")


@dataclass(frozen=True)
class TokenizerMeta:
    """What a chat needs besides the vocabulary."""

    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    add_bos: bool = False


# Template variables a request's template_kwargs cannot replace.
_RESERVED = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "raise_exception",
     "strftime_now"}
)


class ChatTemplateError(ValueError):
    """The model's chat template refused the conversation (its `raise_exception`)."""


# Marks the end of a final assistant message that the prompt continues (a private-use
# character no template writes itself).
_OPEN_END = "\U0010fffd<exo:continue>"


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(
    value: object, ensure_ascii: bool = False, indent: int | None = None, sort_keys: bool = False
) -> str:
    # A filtered sequence (``tools | map(attribute='function')``) is a generator: a list.
    if isinstance(value, Iterator):
        value = list(cast(Iterator[object], value))
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _chat_environment() -> SandboxedEnvironment:
    # Sandboxed, but a template may fill lists of its own (Kimi K2's keeps its call ids in
    # one with ``append``); it only ever sees copies of the request's messages and tools.
    env = SandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    return env


class EngineTokenizer:
    """encode / decode / chat rendering over a `tokenizers.Tokenizer`."""

    def __init__(self, backend: Tokenizer, meta: TokenizerMeta) -> None:
        self.backend = backend
        self.meta = meta
        # A model without a template of its own gets the plain rendering.
        self.fallback = meta.chat_template is None
        template = FALLBACK_TEMPLATE if meta.chat_template is None else meta.chat_template
        self._template = _chat_environment().from_string(template)
        self._fallback_logged = False
        self._token_texts: dict[int, tuple[str, list[int] | None]] = {}

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The model's ends of sequence, and the tokens that end its turn in its chat format
        (harmony's ``<|call|>``...) when its vocabulary has them."""
        fmt = native_format(self.meta.chat_template)
        ends = [self.backend.token_to_id(t) for t in TURN_ENDS[fmt]] if fmt is not None else []
        extra = [i for i in ends if i is not None and i not in self.meta.eos_token_ids]
        return (*self.meta.eos_token_ids, *extra)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of text; special-token strings in it (e.g. <|im_start|>) map to their ids."""
        ids = list(self.backend.encode(text, add_special_tokens=False).ids)
        if add_special_tokens and self.meta.add_bos and self.meta.bos_token_id is not None:
            ids.insert(0, self.meta.bos_token_id)
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> tuple[str, list[int] | None]:
        """A token's text alone, and its own bytes where that text is not whole characters
        (a token holding part of a character's UTF-8 decodes alone to U+FFFD): what a
        log-probability entry shows, so that the bytes of an answer's tokens join into its
        text. None for the bytes where they are the text's UTF-8, or not known."""
        known = self._token_texts.get(token_id)
        if known is not None:
            return known
        text = self.decode([token_id])
        raw = _partial_bytes(self.backend.id_to_token(token_id)) if REPLACEMENT in text else None
        found = (text, raw)
        if len(self._token_texts) < _TOKEN_TEXTS_KEPT:
            self._token_texts[token_id] = found
        return found

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, object] | None = None,
        continue_final: bool = False,
    ) -> str:
        """The prompt text for a conversation, with the model's own template (or the plain
        fallback); ``tools`` (JSON schemas) and ``template_kwargs`` (``enable_thinking``...)
        are variables. ``continue_final``: the prompt ends inside the final (assistant)
        message, without its end of turn, so the answer continues it."""
        if self.fallback and not self._fallback_logged:
            self._fallback_logged = True
            logger.warning(
                "this model has no chat template: conversations are rendered plainly "
                "('User: ...', 'Assistant: ...')"
            )
        if not continue_final or not messages:
            return self._render(messages, add_generation_prompt, tools, template_kwargs)
        final = dict(messages[-1])
        content = str(final.get("content") or "")
        marked = [*messages[:-1], {**final, "content": content + _OPEN_END}]
        text = self._render(marked, False, tools, template_kwargs)
        at = text.rfind(_OPEN_END)
        if at >= 0:
            return text[:at]
        # The template rewrote the mark away: cut after the message's text itself.
        text = self._render(messages, False, tools, template_kwargs)
        at = text.rfind(content.strip()) if content.strip() else -1
        if at < 0:
            raise ChatTemplateError(
                "the chat template does not show the final assistant message, "
                "so the answer cannot continue it"
            )
        return text[: at + len(content.strip())]

    def _render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] | None,
        template_kwargs: Mapping[str, object] | None,
    ) -> str:
        variables = template_variables(self.meta.chat_template, template_kwargs)
        extra = {k: v for k, v in variables.items() if k not in _RESERVED}
        try:
            return self._template.render(
                **extra,
                messages=[dict(m) for m in messages],
                tools=[dict(t) for t in tools] if tools is not None else None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.meta.bos_token or "",
                eos_token=self.meta.eos_token or "",
                raise_exception=_raise_exception,
                strftime_now=_strftime_now,
            )
        except TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from e

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the rendered conversation (the template writes any BOS itself)."""
        return self.encode(self.render_chat(messages, add_generation_prompt))


# --- GGUF: build once, cache -------------------------------------------------------------------


_TOKEN_TEXTS_KEPT = 1 << 16  # token_text's answers kept (a vocabulary's most used tokens)
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in of each byte (GPT-2's table): the printable bytes
    stand for themselves, the others for 256, 257, ... in byte order."""
    keep = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    others = [b for b in range(256) if b not in keep]
    return {chr(b): b for b in keep} | {chr(256 + n): b for n, b in enumerate(others)}


_BYTE_LEVEL = _byte_level_alphabet()


def _partial_bytes(piece: str | None) -> list[int] | None:
    """The bytes a vocabulary piece stands for when they are not whole UTF-8 characters: a
    byte-fallback piece (<0xE2>) or a byte-level one (its characters each stand for a byte);
    None for a piece of neither kind, or whole characters after all."""
    if piece is None:
        return None
    match = _BYTE_PIECE.fullmatch(piece)
    if match is not None:
        raw = bytes([int(match[1], 16)])
    elif piece and all(c in _BYTE_LEVEL for c in piece):
        raw = bytes(_BYTE_LEVEL[c] for c in piece)
    else:
        return None
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)
    return None


def _file_key(path: Path) -> str:
    """Identity of a model file: its size and a hash of its first 16 MiB (the metadata)."""
    h = hashlib.sha256()
    h.update(f"{_CACHE_VERSION}:{path.stat().st_size}:".encode())
    with path.open("rb") as f:
        h.update(f.read(16 << 20))
    return h.hexdigest()[:20]


def gguf_tokenizer_cache_dir(path: Path, cache_dir: Path) -> Path:
    return cache_dir / f"tokenizer-{path.stem}-{_file_key(path)}"


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _GPT2:
        return byte_level
    if pre in _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    split = {**dict.fromkeys(_LLAMA3, _LLAMA3_SPLIT), **dict.fromkeys(_QWEN2, _QWEN2_SPLIT)}.get(
        pre
    )
    if split is None:
        raise ValueError(f"pre-tokenizer {pre!r} is not supported natively")
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _meta_str(meta: Mapping[str, object], key: str) -> str | None:
    value = meta.get(key)
    return value if isinstance(value, str) else None


def _meta_int(meta: Mapping[str, object], key: str) -> int | None:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def build_byte_level_bpe(meta: Mapping[str, object]) -> Tokenizer:
    """A byte-level BPE tokenizer from GGUF metadata (tokenizer.ggml.model == "gpt2")."""
    tokens = cast(list[str], meta["tokenizer.ggml.tokens"])
    merges = [cast(str, m).split(" ", 1) for m in cast(list[object], meta["tokenizer.ggml.merges"])]
    types = cast(list[int], meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[(a, b) for a, b in merges], fuse_unk=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = _pre_tokenizer(_meta_str(meta, "tokenizer.ggml.pre") or "default")
    tok.decoder = decoders.ByteLevel()
    special = [
        AddedToken(tokens[i], special=t == _TOKEN_CONTROL, normalized=False)
        for i, t in enumerate(types)
        if t in (_TOKEN_CONTROL, _TOKEN_USER_DEFINED)
    ]
    tok.add_special_tokens([a for a in special if a.special])
    tok.add_tokens([a for a in special if not a.special])
    return tok


def _build_with_transformers(path: Path) -> Tokenizer:
    try:
        from transformers import AutoTokenizer  # slow, optional
    except ImportError as e:
        raise ValueError(
            f"{path.name}: this tokenizer type needs transformers to be converted once"
        ) from e
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return cast(Tokenizer, hf.backend_tokenizer)


def _gguf_meta(meta: Mapping[str, object]) -> TokenizerMeta:
    tokens = cast(list[str], meta.get("tokenizer.ggml.tokens", []))

    def token(i: int | None) -> str | None:
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    bos = _meta_int(meta, "tokenizer.ggml.bos_token_id")
    eos = _meta_int(meta, "tokenizer.ggml.eos_token_id")
    return TokenizerMeta(
        chat_template=_meta_str(meta, "tokenizer.chat_template"),
        bos_token=token(bos),
        eos_token=token(eos),
        bos_token_id=bos,
        eos_token_ids=eos_token_ids(meta),
        # llama.cpp adds BOS to SentencePiece vocabularies that do not say otherwise
        add_bos=meta.get(
            "tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.model") == "llama"
        )
        is True,
    )


def build_gguf_tokenizer(path: Path) -> tuple[Tokenizer, TokenizerMeta]:
    """Build (slow path) the tokenizer of a GGUF file from its metadata."""
    f = GGUFFile(path)
    try:
        meta = f.metadata
        if meta.get("tokenizer.ggml.model") == "gpt2":
            try:
                backend = build_byte_level_bpe(meta)
            except ValueError:  # a pre-tokenizer we do not know: let transformers convert it
                backend = _build_with_transformers(path)
        elif meta.get("tokenizer.ggml.model") == "llama":
            backend = build_sentencepiece_bpe(meta, str(meta.get("general.architecture", "")))
        else:
            backend = _build_with_transformers(path)
        return backend, _gguf_meta(meta)
    finally:
        f.close()


def load_gguf_tokenizer(path: Path, cache_dir: Path) -> EngineTokenizer:
    """The tokenizer of a GGUF file, built on the first call and read from cache_dir after."""
    folder = gguf_tokenizer_cache_dir(path, cache_dir)
    tok_file, meta_file = folder / "tokenizer.json", folder / "tokenizer_meta.json"
    if tok_file.exists() and meta_file.exists():
        raw = cast(dict[str, Any], json.loads(meta_file.read_text(encoding="utf-8")))
        raw["eos_token_ids"] = tuple(raw["eos_token_ids"])
        return EngineTokenizer(Tokenizer.from_file(str(tok_file)), TokenizerMeta(**raw))
    backend, meta = build_gguf_tokenizer(path)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "tokenizer.json.tmp"
    backend.save(str(tmp))
    tmp.replace(tok_file)
    tmp_meta = folder / "tokenizer_meta.json.tmp"
    tmp_meta.write_text(json.dumps(asdict(meta)), encoding="utf-8")
    tmp_meta.replace(meta_file)
    return EngineTokenizer(backend, meta)


# --- Hugging Face folders ----------------------------------------------------------------------


def _token_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        content = cast(dict[str, object], value).get("content")
        return content if isinstance(content, str) else None
    return None


def load_hf_tokenizer(folder: Path) -> EngineTokenizer:
    """tokenizer.json + tokenizer_config.json (+ chat_template.jinja) of a Hugging Face folder."""
    from exo.worker.engines.safetensors_loader import hf_config

    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok_config: dict[str, object] = {}
    if (folder / "tokenizer_config.json").exists():
        text = (folder / "tokenizer_config.json").read_text(encoding="utf-8")
        tok_config = cast(dict[str, object], json.loads(text))
    config = hf_config(folder)
    bos, eos = _token_text(tok_config.get("bos_token")), _token_text(tok_config.get("eos_token"))
    eos_ids = list(config.eos_token_ids)
    eos_id = backend.token_to_id(eos) if eos is not None else None
    if eos_id is not None and eos_id not in eos_ids:
        eos_ids.append(eos_id)
    meta = TokenizerMeta(
        chat_template=config.chat_template,
        bos_token=bos,
        eos_token=eos,
        bos_token_id=backend.token_to_id(bos) if bos is not None else config.bos_token_id,
        eos_token_ids=tuple(eos_ids),
        add_bos=bool(tok_config.get("add_bos_token", False)),
    )
    return EngineTokenizer(backend, meta)


def load_tokenizer(model_path: Path, cache_dir: Path) -> EngineTokenizer:
    """The tokenizer of a GGUF file or a Hugging Face folder."""
    if model_path.is_dir():
        return load_hf_tokenizer(model_path)
    return load_gguf_tokenizer(model_path, cache_dir)
