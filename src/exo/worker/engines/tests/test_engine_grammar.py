"""The grammar constraint's mask on the embedded tokenizer: exactly llguidance's allowed
tokens, applied without torch.compile."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import llguidance
import pytest
import torch

from exo.worker.engines.grammar import (
    GrammarCompiler,
    GrammarConstraint,
    bounded_integers,
    schema_grammar,
)
from exo.worker.engines.tokenizer import EngineTokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}},
        "n": {"type": "integer"},
    },
    "required": ["name", "tags", "n"],
    "additionalProperties": False,
}
DOCUMENT = {"name": "Ada, the first", "tags": ["bb", "a"], "n": -42}


def _constraint(tokenizer: EngineTokenizer) -> GrammarConstraint:
    return GrammarCompiler(tokenizer, tokenizer.vocab_size).constraint(schema_grammar(SCHEMA))


def test_mask_allows_exactly_what_llguidance_allows(tokenizer: EngineTokenizer) -> None:
    grammar = schema_grammar(SCHEMA)
    constraint = _constraint(tokenizer)
    llg = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=tokenizer.vocab_size,
                                 eos_token=list(tokenizer.eos_token_ids))
    reference = llguidance.LLMatcher(llg, grammar, log_level=0)
    # A vocabulary row wider than the grammar's (a padded embedding): the extra ids are never
    # allowed.
    logits = torch.randn(tokenizer.vocab_size + 64, dtype=torch.bfloat16)
    text = json.dumps(DOCUMENT, separators=(", ", ": "))
    for token in [*tokenizer.encode(text), tokenizer.eos_token_ids[0]]:
        expected = torch.frombuffer(bytearray(reference.compute_logit_bias()), dtype=torch.uint8)
        masked = constraint.mask(logits)
        assert masked.dtype == torch.float32 and masked.shape == logits.shape
        allowed = torch.isfinite(masked)
        assert torch.equal(allowed[: tokenizer.vocab_size], expected.bool())
        assert not allowed[tokenizer.vocab_size :].any()
        assert torch.equal(masked[allowed], logits.float()[allowed])
        assert bool(allowed[token]), f"the document's token {token} is not allowed"
        constraint.accept(token)
        assert reference.consume_token(token)
    assert reference.is_stopped()


def test_constraining_does_not_load_torch_compile(gguf_path: Path, tmp_path: Path) -> None:
    """llguidance.torch's kernel imports torch._dynamo (~2 s, ~120 MB in a runner)."""
    script = f"""
import sys, torch
from pathlib import Path
from exo.worker.engines.grammar import GrammarCompiler, schema_grammar
from exo.worker.engines.tokenizer import load_tokenizer
tok = load_tokenizer(Path({str(gguf_path)!r}), Path({str(tmp_path)!r}))
c = GrammarCompiler(tok, tok.vocab_size).constraint(schema_grammar({{"type": "integer"}}))
c.accept(int(torch.argmax(c.mask(torch.randn(tok.vocab_size)))))
print(sorted(m for m in sys.modules if m.startswith("torch._dynamo")))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=240, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.fixture(scope="module")
def compiler(tokenizer: EngineTokenizer) -> GrammarCompiler:
    """One compiler for the module: its llguidance view of the tokenizer takes ~0.3 s."""
    return GrammarCompiler(tokenizer, tokenizer.vocab_size)


def _accepts(
    compiler: GrammarCompiler, tokenizer: EngineTokenizer, schema: dict[str, Any], text: str
) -> bool:
    """Whether the constraint lets the tokens of ``text``, then the end, through."""
    constraint = compiler.constraint(schema_grammar(schema))
    for token in [*tokenizer.encode(text), tokenizer.eos_token_ids[0]]:
        if not constraint.allowed()[token]:
            return False
        constraint.accept(token)
    return True


SAFE = 2**53 - 1


def test_an_unbounded_integer_has_at_most_the_safe_digits(
    tokenizer: EngineTokenizer, compiler: GrammarCompiler
) -> None:
    schema: dict[str, Any] = {"type": "integer"}
    for n in (0, -7, 42, SAFE, -SAFE):
        assert _accepts(compiler, tokenizer, schema, str(n)), n
    for n in (SAFE + 1, -SAFE - 1, 10**40):
        assert not _accepts(compiler, tokenizer, schema, str(n)), n
    # Numbers are not integers: they keep their exponents and their range.
    assert _accepts(compiler, tokenizer, {"type": "number"}, "1e300")
    assert _accepts(compiler, tokenizer, {"type": ["integer", "number"]}, str(10**20))


def test_an_integer_keeps_its_own_bounds(
    tokenizer: EngineTokenizer, compiler: GrammarCompiler
) -> None:
    natural: dict[str, Any] = {"type": "integer", "minimum": 0}
    assert not _accepts(compiler, tokenizer, natural, "-1")
    assert _accepts(compiler, tokenizer, natural, str(SAFE))
    assert not _accepts(compiler, tokenizer, natural, str(SAFE + 1))
    # A bound past the safe range is the schema's choice, and gets no side that empties it.
    huge: dict[str, Any] = {"type": "integer", "minimum": 10**17}
    assert _accepts(compiler, tokenizer, huge, str(10**17))
    assert not _accepts(compiler, tokenizer, huge, str(10**17 - 1))
    assert _accepts(compiler, tokenizer, {"type": "integer", "maximum": -(10**17)}, str(-(10**17)))


def test_integers_are_bounded_wherever_the_schema_nests_them() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "default": {"type": "integer"},  # a property named like a data keyword
            "ids": {"type": "array", "items": {"type": ["integer", "null"]}},
            "pick": {"anyOf": [{"type": "integer", "maximum": 5}, {"type": "string"}]},
        },
        "$defs": {"n": {"type": "integer", "exclusiveMinimum": 0}},
        "default": {"type": "integer"},  # data, not a schema
        "enum": [{"type": "integer"}],
        "not": {"type": "integer"},  # bounded, it would let big integers through
    }
    out = bounded_integers(schema)
    full = {"minimum": -SAFE, "maximum": SAFE}
    assert out["properties"]["default"] == {"type": "integer", **full}
    assert out["properties"]["ids"]["items"] == {"type": ["integer", "null"], **full}
    assert out["properties"]["pick"]["anyOf"][0] == {
        "type": "integer", "maximum": 5, "minimum": -SAFE
    }
    assert out["$defs"]["n"] == {"type": "integer", "exclusiveMinimum": 0, "maximum": SAFE}
    assert out["default"] == {"type": "integer"} and out["enum"] == [{"type": "integer"}]
    assert out["not"] == {"type": "integer"}
    assert schema["properties"]["default"] == {"type": "integer"}  # the caller's is untouched


def test_a_model_that_favours_digits_still_ends_its_object(
    tokenizer: EngineTokenizer, compiler: GrammarCompiler
) -> None:
    """The fault this bound fixes: sampled freely, SmolLM2 once wrote an "age" of 50 digits
    and hit its token limit. Here the logits favour digits above all; the object must still
    close within the longest document the schema admits."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {"age": {"type": "integer"}},
        "required": ["age"],
        "additionalProperties": False,
    }
    constraint = compiler.constraint(schema_grammar(schema))
    logits = torch.zeros(tokenizer.vocab_size)
    for digit in "0123456789":  # "1" first: a leading "0" would end the number at once
        logits[tokenizer.encode(digit)[0]] = 10.0 if digit == "1" else 9.0
    text: list[int] = []
    for _ in range(40):  # '{"age": ' + 17 characters + '}' + the end, at most
        token = int(torch.argmax(constraint.mask(logits)))
        if token in tokenizer.eos_token_ids:
            break
        constraint.accept(token)
        text.append(token)
    else:
        raise AssertionError(f"no end after {tokenizer.decode(text)!r}")
    value = json.loads(tokenizer.decode(text))
    assert value == {"age": int("1" * 16)}


OPEN: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}},
    },
    "required": ["name", "pet"],
}


def test_an_ollama_schema_forbids_keys_it_does_not_list(
    compiler: GrammarCompiler, tokenizer: EngineTokenizer
) -> None:
    from exo.api.tool_models import ollama_format

    closed = json.loads(ollama_format(OPEN) or "")
    good = '{"name": "Ada", "pet": {"kind": "cat"}}'
    extra_top = '{"name": "Ada", "pet": {"kind": "cat"}, "age": 3}'
    extra_nested = '{"name": "Ada", "pet": {"kind": "cat", "age": 3}}'
    # As written (JSON Schema's default), other keys are allowed ...
    assert _accepts(compiler, tokenizer, OPEN, extra_top)
    assert _accepts(compiler, tokenizer, OPEN, extra_nested)
    # ... Ollama's format forbids them, at every level.
    assert _accepts(compiler, tokenizer, closed, good)
    assert not _accepts(compiler, tokenizer, closed, extra_top)
    assert not _accepts(compiler, tokenizer, closed, extra_nested)
