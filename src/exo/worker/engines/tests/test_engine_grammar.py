"""The grammar constraint's mask on the embedded tokenizer: exactly llguidance's allowed
tokens, applied without torch.compile."""

import json
import subprocess
import sys
from pathlib import Path

import llguidance
import torch

from exo.worker.engines.grammar import GrammarCompiler, GrammarConstraint, schema_grammar
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
