"""Constrained decoding with llguidance: the output follows a JSON schema or a tool call.

Why llguidance (pinned 1.9.1): it takes JSON schemas and Lark grammars (a call's wrapper,
``<tool_call>[...]</tool_call>``, around a schema), builds the token masks lazily from
the tokenizer's own vocabulary (no per-schema index to precompute), and measured here on
SmolLM2's 49k vocabulary its mask cost about 0.03 ms per token on average against ~30 ms
for a decode step. outlines-core needs a regex per schema and a vocabulary rebuilt from
byte-level token strings, and has no grammar wrapper for calls.

``GrammarConstraint`` is a ``TokenConstraint`` for the sampler: one per request.
"""

import json
from collections.abc import Sequence
from typing import Any

import llguidance
import torch
from torch import Tensor

from exo.shared.types.text_generation import ToolSpec
from exo.worker.engines.chat_prompt import ToolFormat, json_object
from exo.worker.engines.tokenizer import EngineTokenizer

# Compact JSON the way models write it: ", " and ": ", no free whitespace.
_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """The schema or grammar cannot be compiled (the request's fault)."""


def _styled(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "x-guidance": {**_STYLE, **schema.get("x-guidance", {})}}


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments without properties the schema does not name, unless it allows them (a
    small model otherwise invents properties until it runs out of tokens)."""
    if schema.get("type") == "object" and "additionalProperties" not in schema:
        return {**schema, "additionalProperties": False}
    return schema


def call_schema(tools: Sequence[ToolSpec], forced: str | None, key: str) -> dict[str, Any]:
    """One call object of any of ``tools`` (or of ``forced``)."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, key: _closed(json_object(t.parameters))},
            "required": ["name", key],
            "additionalProperties": False,
        }
        for t in tools
        if forced is None or t.name == forced
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def tool_call_grammar(fmt: ToolFormat, tools: Sequence[ToolSpec], forced: str | None) -> str:
    """A Lark grammar: one call in the model's own format."""
    key = "parameters" if fmt == "llama3" else "arguments"
    call = json.dumps(_styled(call_schema(tools, forced, key)))
    start = {
        "hermes": 'start: "<tool_call>\\n" call "\\n</tool_call>"',
        "smollm": 'start: "<tool_call>[" call "]</tool_call>"',
        # Special-token markers are left out: the parser reads a bare call object.
        "llama3": "start: call",
        "mistral": "start: call",
    }[fmt]
    return llguidance.LLMatcher.grammar_from_lark(f"{start}\ncall: %json {call}")


def schema_grammar(schema: dict[str, Any]) -> str:
    return llguidance.LLMatcher.grammar_from_json_schema(_styled(schema))


class GrammarCompiler:
    """Builds constraints for one tokenizer (its llguidance view is built once, ~1 s)."""

    def __init__(self, tokenizer: EngineTokenizer, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._llg: llguidance.LLTokenizer | None = None

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        if self._llg is None:
            self._llg = llguidance.LLTokenizer(
                self._tokenizer.backend.to_str(),
                n_vocab=self._vocab_size,
                eos_token=list(self._tokenizer.eos_token_ids),
            )
        return self._llg

    def constraint(self, grammar: str) -> "GrammarConstraint":
        tokenizer = self._llg_tokenizer()
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise GrammarError(f"the output schema cannot be compiled: {error}")
        return GrammarConstraint(llguidance.LLMatcher(tokenizer, grammar, log_level=0), tokenizer)


class GrammarConstraint:
    def __init__(self, matcher: llguidance.LLMatcher, tokenizer: llguidance.LLTokenizer) -> None:
        # llguidance.torch pulls in torch._dynamo (~2 s, ~120 MB): only runners that get a
        # constrained request pay for it, not every runner at start.
        import llguidance.torch as llg_torch

        self._llg_torch = llg_torch
        self._matcher = matcher
        self._bitmask = llg_torch.allocate_token_bitmask(1, tokenizer.vocab_size)

    def mask(self, logits: Tensor) -> Tensor:
        llg_torch = self._llg_torch
        llg_torch.fill_next_token_bitmask(self._matcher, self._bitmask, 0)
        z = logits.float().clone().unsqueeze(0)
        width = min(z.shape[-1], self._bitmask.shape[-1] * 32)
        view = z[:, :width]
        llg_torch.apply_token_bitmask_inplace(view, self._bitmask)
        if width < z.shape[-1]:
            z[:, width:] = -torch.inf
        return z[0]

    def accept(self, token: int) -> None:
        # A token the mask allowed is always consumed; an error state only allows EOS.
        self._matcher.consume_token(token)
