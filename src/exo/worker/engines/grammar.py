"""Constrained decoding with llguidance: the output follows a JSON schema or a tool call.

Why llguidance (pinned 1.9.1), from ``bench/grammar.py`` on SmolLM2's 49k vocabulary, one
thread, four schemas (nested object, enums, arrays, a long string), on a shared 2-core
machine (three runs): the next-token mask plus the advance cost 20-70 us per token with
llguidance, 6-19 us with xgrammar 0.2.9 and 30-90 us with outlines-core 0.2.14. xgrammar is
the fastest per token, but a decode step of that model is ~25,000 us, so every engine stays
under 0.3% of it. What separates them is the cost before the first token of each request
with a new schema or tool set: llguidance compiles in 0.2-0.5 ms (masks are built lazily),
xgrammar in 1-40 ms, outlines-core in 0.05-1.4 s (a regex index over the whole vocabulary).
llguidance also takes Lark grammars (a call's wrapper, ``<tool_call>[...]</tool_call>``,
around a schema) and needs no other package, where xgrammar declares torch and triton as
requirements (triton is of no use on CPU). Applying the mask to the logits is done here
with numpy, not llguidance.torch (see ``GrammarConstraint``).

``GrammarConstraint`` is a ``TokenConstraint`` for the sampler: one per request.
"""

import json
from collections.abc import Sequence
from typing import Any, cast

import llguidance
import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from exo.shared.chat_formats import as_native
from exo.shared.types.text_generation import ToolSpec
from exo.worker.engines.chat_prompt import ToolFormat, json_object
from exo.worker.engines.native_grammar import TokenId, native_call_lark, offered
from exo.worker.engines.tokenizer import EngineTokenizer

# Compact JSON the way models write it: ", " and ": ", no free whitespace.
_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """The schema or grammar cannot be compiled (the request's fault)."""


# An integer the schema leaves unbounded is held to the range RFC 8259 (section 6) calls
# interoperable, |n| <= 2**53 - 1 (at most 16 digits): what every JSON parser, JavaScript's
# included, reads exactly, and what llguidance's bounds (kept as doubles) hold exactly.
# Without a bound a sampled small model can write digits until it runs out of tokens (seen:
# an "age" of 50 digits, ended by "length", so the output did not parse).
SAFE_INTEGER = 2**53 - 1
# Keywords whose values are left as they are: data, not schemas, and "not" (a bound inside
# a negation would widen what the schema allows, not narrow it).
_LEFT_AS_IS = frozenset({"const", "enum", "default", "examples", "x-guidance", "not"})
# Keywords whose values map names to schemas (a property may be named "default").
_SCHEMA_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def _is_integer_schema(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    return "integer" in kinds and "number" not in kinds


def bounded_integers(value: Any) -> Any:
    """The schema ``value`` with every integer schema in it given the safe bound it lacks,
    on each side where it lacks one (a schema's own bounds are kept, even wider ones)."""
    if isinstance(value, list):  # the schemas of anyOf, allOf, prefixItems, ...
        return [bounded_integers(item) for item in cast(list[Any], value)]
    if not isinstance(value, dict):
        return value
    schema = cast(dict[str, Any], value)
    out: dict[str, Any] = {}
    for key, item in schema.items():
        if key in _LEFT_AS_IS:
            out[key] = item
        elif key in _SCHEMA_MAPS and isinstance(item, dict):
            named = cast(dict[str, Any], item)
            out[key] = {name: bounded_integers(sub) for name, sub in named.items()}
        else:
            out[key] = bounded_integers(item)
    if _is_integer_schema(schema):
        has_low = "minimum" in schema or "exclusiveMinimum" in schema
        has_high = "maximum" in schema or "exclusiveMaximum" in schema
        # A one-sided bound past the safe range gets no second side that would empty it.
        if not has_low and all(h >= -SAFE_INTEGER for h in _numbers(schema, "maximum")):
            out["minimum"] = -SAFE_INTEGER
        if not has_high and all(low <= SAFE_INTEGER for low in _numbers(schema, "minimum")):
            out["maximum"] = SAFE_INTEGER
    return out


def _numbers(schema: dict[str, Any], side: str) -> list[float]:
    """The numeric bounds on one side ("minimum" or "maximum"), exclusive or not (draft 4's
    boolean exclusiveMinimum/Maximum is a flag, not a bound)."""
    exclusive = "exclusive" + side[0].upper() + side[1:]
    values = [schema.get(side), schema.get(exclusive)]
    return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]


def _styled(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as it is compiled: compact JSON, bounded integers."""
    return {**bounded_integers(schema), "x-guidance": {**_STYLE, **schema.get("x-guidance", {})}}


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


def tool_call_grammar(
    fmt: ToolFormat,
    tools: Sequence[ToolSpec],
    forced: str | None,
    token_id: TokenId | None = None,
) -> str:
    """A Lark grammar: one call in the model's own format (``token_id``: a marker's id in
    the model's vocabulary, so the MoE formats' markers are written as their tokens)."""
    native = as_native(fmt)
    if native is not None:
        calls = offered(tools, forced, lambda t: _closed(json_object(t.parameters)))
        lark = native_call_lark(native, calls, _styled, token_id)
        return llguidance.LLMatcher.grammar_from_lark(lark)
    key = "parameters" if fmt == "llama3" else "arguments"
    call = json.dumps(_styled(call_schema(tools, forced, key)))
    # <tool_call> as its token where the vocabulary has it whole (Qwen's added tokens)
    opened, closed = _marker("<tool_call>", token_id), _marker("</tool_call>", token_id)
    start = {
        "hermes": f'start: {opened} "\\n" call "\\n" {closed}',
        "smollm": f'start: {opened} "[" call "]" {closed}',
        # Special-token markers are left out: the parser reads a bare call object.
        "llama3": "start: call",
        "mistral": "start: call",
    }.get(fmt, "start: call")
    return llguidance.LLMatcher.grammar_from_lark(f"{start}\ncall: %json {call}")


def _marker(text: str, token_id: TokenId | None) -> str:
    token = token_id(text) if token_id is not None else None
    return f"<[{token}]>" if token is not None else json.dumps(text)


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
    """The mask is unpacked and applied with numpy: llguidance.torch's kernel goes through
    torch.compile (importing torch._dynamo: ~2 s and ~120 MB per runner) and was slower
    (median 100 against 65 us per token, mean 315 against 121, in one A/B run)."""

    def __init__(self, matcher: llguidance.LLMatcher, tokenizer: llguidance.LLTokenizer) -> None:
        self._matcher = matcher
        # One bit per token id: bit i of word w is token 32 * w + i.
        self._words = np.zeros((tokenizer.vocab_size + 31) // 32, dtype=np.uint32)

    def allowed(self) -> NDArray[np.bool_]:
        """The next tokens the grammar allows: a bool per token id of llguidance's vocabulary."""
        words = self._words
        self._matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        # Little-endian bytes, least significant bit first: token order.
        as_bytes = words.astype("<u4", copy=False).view(np.uint8)
        return np.unpackbits(as_bytes, bitorder="little").view(np.bool_)

    def mask(self, logits: Tensor) -> Tensor:
        """``logits`` (one row, [vocab]) as float32, with the tokens the grammar forbids at
        -inf (ids beyond the grammar's vocabulary too)."""
        allowed = self.allowed()
        z = logits.to(torch.float32, copy=True)
        width = min(z.shape[-1], allowed.shape[0])
        if z.is_cpu:
            np.copyto(z.numpy()[:width], -np.inf, where=~allowed[:width])
        else:
            forbidden = torch.from_numpy(~allowed[:width]).to(z.device)
            z[:width].masked_fill_(forbidden, -torch.inf)
        z[width:] = -torch.inf
        return z

    def accept(self, token: int) -> None:
        # A token the mask allowed is always consumed; an error state only allows EOS.
        self._matcher.consume_token(token)
