"""What OpenAI's legacy completions add over one generation: several prompts (strings or
token ids), ``n`` choices of each, ``best_of`` ranking, and the legacy ``logprobs`` object
(tokens, token_logprobs, top_logprobs, text_offset), echo of the prompt included."""

import codecs
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from exo.api.generation_events import Finished
from exo.shared.types.chunks import EchoedPrompt, TokenLogprob, token_raw

# One prompt: its text, or its token ids.
Prompt = str | list[int]

MAX_PROMPTS = 64
"""Prompts of one request; choices run one after another, so a list is bounded."""


def _ints(items: list[object]) -> list[int] | None:
    """The items as token ids, if they all are (JSON integers, not booleans)."""
    if all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        return [i for i in items if isinstance(i, int)]
    return None


def parse_prompts(value: object) -> list[Prompt]:
    """OpenAI's ``prompt``: a string, a list of strings, a list of token ids, or a list of
    lists of token ids. A ValueError names what is wrong."""
    if isinstance(value, str):
        return [_text(value, None)]
    if not isinstance(value, list) or not value:
        raise ValueError("must be a string, a list of strings or a list of token ids")
    items: list[object] = list(value)  # pyright: ignore[reportUnknownArgumentType]
    ids = _ints(items)
    if ids is not None:
        return [ids]
    if len(items) > MAX_PROMPTS:
        raise ValueError(f"at most {MAX_PROMPTS} prompts are accepted, got {len(items)}")
    prompts: list[Prompt] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            prompts.append(_text(item, i))
            continue
        inner = _ints(list(item)) if isinstance(item, list) else None  # pyright: ignore[reportUnknownArgumentType]
        if not inner:
            raise ValueError(
                f"item {i} must be a string or a non-empty list of token ids (integers)"
            )
        prompts.append(inner)
    return prompts


def _text(value: str, index: int | None) -> str:
    if not value:
        where = "" if index is None else f"item {index}: "
        raise ValueError(f"{where}a prompt must not be empty")
    return value


@dataclass(frozen=True)
class Answer:
    """One generation of one prompt: its text and how it ended."""

    prompt: Prompt
    text: str
    finished: Finished

    @property
    def score(self) -> float:
        """The generated tokens' cumulative log-probability (``best_of`` keeps the highest)."""
        return sum(e.logprob for e in self.finished.logprobs)


def best(answers: Sequence[Answer], n: int) -> list[Answer]:
    """The ``n`` answers of highest cumulative log-probability, best first (all of them,
    in order, when there are only ``n``)."""
    if len(answers) <= n:
        return list(answers)
    return sorted(answers, key=lambda a: a.score, reverse=True)[:n]


def prompt_text(answer: Answer) -> str:
    """The prompt as text: the client's string, or the runner's decoding of its ids."""
    if isinstance(answer.prompt, str):
        return answer.prompt
    return answer.finished.echo.text if answer.finished.echo is not None else ""


def _shown(token: str, token_bytes: list[int] | None) -> str:
    """A token as the legacy logprobs show it: its text, or, where that alone is part of a
    character (a character's UTF-8 split over tokens), ``bytes:`` and its bytes escaped, as
    OpenAI shows such tokens."""
    if token_bytes is None:
        return token
    return "bytes:" + "".join(f"\\x{b:02x}" for b in token_bytes)


def _top(entry: TokenLogprob) -> dict[str, float]:
    return {_shown(t.token, t.token_bytes): t.logprob for t in entry.top}


def logprobs_object(
    entries: Sequence[TokenLogprob], start: int, echo: EchoedPrompt | None = None
) -> dict[str, Any]:
    """OpenAI's legacy logprobs object of ``entries`` (generated tokens), whose text starts
    at character ``start`` of the answer; with ``echo``, the prompt's tokens come first (the
    first one has no log-probability: nothing precedes it). A token's ``text_offset`` is the
    character of the text its first byte belongs to: the tokens' bytes, not their texts
    alone (U+FFFD for part of a character), join into the text."""
    pieces: list[tuple[str, list[int] | None]] = []  # each token's text and split bytes
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    if echo is not None:
        scored = echo.logprobs or []
        pieces.extend(zip(echo.tokens, echo.token_bytes or [None] * len(echo.tokens), strict=True))
        token_logprobs.extend([None, *(e.logprob for e in scored)][: len(echo.tokens)])
        top_logprobs.extend([None, *(_top(e) for e in scored)][: len(echo.tokens)])
    pieces.extend((e.token, e.token_bytes) for e in entries)
    token_logprobs.extend(e.logprob for e in entries)
    top_logprobs.extend(_top(e) for e in entries)
    offsets: list[int] = []
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    at = start
    for token, token_bytes in pieces:
        offsets.append(at)
        at += len(text.decode(token_raw(token, token_bytes)))
    return {
        "tokens": [_shown(*p) for p in pieces],
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


def choice_json(
    answer: Answer, index: int, *, echo: bool, logprobs: bool, finish: str
) -> dict[str, Any]:
    """One choice of a whole completion."""
    prompt = prompt_text(answer)
    lp: dict[str, Any] | None = None
    if logprobs:
        shown = answer.finished.echo if echo else None
        lp = logprobs_object(answer.finished.logprobs, 0 if echo else len(prompt), shown)
    return {
        "text": (prompt if echo else "") + answer.text,
        "index": index,
        "logprobs": lp,
        "finish_reason": finish,
    }
