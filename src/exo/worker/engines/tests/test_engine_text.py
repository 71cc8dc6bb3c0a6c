"""Incremental detokenizer (never half a character) and stop-string matcher."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from exo.worker.engines.text import REPLACEMENT, IncrementalDetokenizer, StopMatcher
from exo.worker.engines.tokenizer import EngineTokenizer

TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8", exclude_categories=("Cs",)),
        st.sampled_from(list("aé日本🎉 \n€ßЖ")),
    ),
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(text=TEXT)
def test_detokenizer_streams_exactly_the_text_and_never_half_a_character(
    tokenizer: EngineTokenizer, text: str
) -> None:
    ids = tokenizer.encode(text)
    whole = tokenizer.decode(ids)  # == text, unless the vocabulary lacks one of its bytes
    detok = IncrementalDetokenizer(tokenizer.decode)
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == whole
    if REPLACEMENT not in whole:
        assert all(REPLACEMENT not in p for p in pieces)


@settings(max_examples=80, deadline=None)
@given(ids=st.lists(st.integers(0, 49151), max_size=30))
def test_detokenizer_on_arbitrary_token_sequences(
    tokenizer: EngineTokenizer, ids: list[int]
) -> None:
    detok = IncrementalDetokenizer(tokenizer.decode)
    pieces = [detok.push(i) for i in ids]
    assert "".join(pieces) + detok.flush() == tokenizer.decode(ids)


def test_detokenizer_holds_back_a_split_character(tokenizer: EngineTokenizer) -> None:
    ids = tokenizer.encode("🎉")
    assert len(ids) > 1  # byte-level: the emoji spans several tokens
    detok = IncrementalDetokenizer(tokenizer.decode)
    assert [detok.push(i) for i in ids] == [""] * (len(ids) - 1) + ["🎉"]


def _stream(stops: list[str], chunks: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    out = "".join(matcher.push(c) for c in chunks) + matcher.flush()
    return out, matcher.stopped


def test_stop_matcher_cuts_at_the_first_stop_across_chunks() -> None:
    assert _stream(["END"], ["hello E", "N", "D and more"]) == ("hello ", True)
    assert _stream(["END", "lo"], ["hel", "lo END"]) == ("hel", True)
    assert _stream(["END"], ["hello E", "NJOY"]) == ("hello ENJOY", False)
    assert _stream(["END"], ["trailing E"]) == ("trailing E", False)  # flushed at the end
    assert _stream([], ["a", "b"]) == ("ab", False)


def test_stop_matcher_holds_back_only_possible_prefixes() -> None:
    matcher = StopMatcher(["</s>"])
    assert matcher.push("abc<") == "abc"
    assert matcher.push("/x") == "</x"


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="ab<>/", max_size=30),
    stop=st.text(alphabet="ab<>/", min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 30), max_size=6),
)
def test_stop_matcher_equals_cutting_the_whole_text(text: str, stop: str, cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    i = text.find(stop)
    assert _stream([stop], chunks) == ((text[:i], True) if i >= 0 else (text, False))
