"""Chunks to events, and stop sequences, with plain values."""

from exo.api.generation_events import (
    ChunkTranslator,
    Failed,
    Finished,
    GenerationEvent,
    StopScanner,
    TextDelta,
)
from exo.shared.models.model_cards import ModelId
from exo.shared.types.chunks import ErrorChunk, FinishReason, TokenChunk, Usage

MODEL = ModelId("test/model")


def token(text: str, idx: int = 0, reason: FinishReason | None = None) -> TokenChunk:
    usage = Usage(prompt_tokens=5, completion_tokens=idx + 1) if reason else None
    return TokenChunk(
        model=MODEL, text=text, token_id=idx, idx=idx, finish_reason=reason, usage=usage
    )


def text_of(events: list[GenerationEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def test_scanner_without_stops_passes_text_through() -> None:
    scanner = StopScanner([])
    assert scanner.feed("abc") == ("abc", None)


def test_scanner_finds_a_stop_inside_one_piece() -> None:
    scanner = StopScanner(["STOP"])
    assert scanner.feed("helloSTOPworld") == ("hello", "STOP")


def test_scanner_holds_back_a_possible_start_across_pieces() -> None:
    scanner = StopScanner(["<end>"])
    assert scanner.feed("hi <e") == ("hi ", None)
    assert scanner.feed("nd> more") == ("", "<end>")


def test_scanner_releases_held_text_that_was_not_a_stop() -> None:
    scanner = StopScanner(["<end>"])
    assert scanner.feed("a <e") == ("a ", None)
    assert scanner.feed("x") == ("<ex", None)
    assert scanner.flush() == ""
    assert scanner.feed("tail <") == ("tail ", None)
    assert scanner.flush() == "<"


def test_scanner_takes_the_earliest_stop() -> None:
    scanner = StopScanner(["world", "lo"])
    assert scanner.feed("hello world") == ("hel", "lo")


def test_scanner_ignores_empty_stops() -> None:
    assert StopScanner(["", "x"]).feed("abc") == ("abc", None)


def test_finishes_with_the_runners_usage() -> None:
    t = ChunkTranslator([], accepted_ns=0, sent_ns=10)
    assert t.feed(token("a", 0), now_ns=20) == [TextDelta("a")]
    events = t.feed(token("b", 1, "stop"), now_ns=30)
    assert events[0] == TextDelta("b")
    finished = events[1]
    assert isinstance(finished, Finished)
    assert finished.reason == "stop"
    assert finished.usage == Usage(prompt_tokens=5, completion_tokens=2)
    assert (finished.timings.sent_ns, finished.timings.first_token_ns) == (10, 20)
    assert finished.timings.finished_ns == 30
    assert t.done and t.command_done


def test_error_chunk_fails_the_generation() -> None:
    t = ChunkTranslator([], 0, 0)
    t.feed(token("a"), 1)
    assert t.feed(ErrorChunk(model=MODEL, error_message="runner died"), 2) == [
        Failed("runner died")
    ]
    assert t.done and t.command_done


def test_token_with_error_reason_fails_the_generation() -> None:
    t = ChunkTranslator([], 0, 0)
    events = t.feed(token("x", 0, "error"), 1)
    assert len(events) == 1 and isinstance(events[0], Failed)


def test_stop_sequence_mid_stream_ends_the_answer_before_the_runner() -> None:
    t = ChunkTranslator(["STOP"], 0, 0)
    events = t.feed(token("okST"), 1) + t.feed(token("OP and more", 1), 2)
    assert text_of(events) == "ok"
    finished = events[-1]
    assert isinstance(finished, Finished)
    assert finished.reason == "stop_sequence" and finished.stop_sequence == "STOP"
    assert finished.usage.completion_tokens == 2
    assert t.done and not t.command_done  # the runner still runs: the API cancels it
    assert t.feed(token("late", 2, "stop"), 3) == []
    assert t.command_done


def test_held_text_is_flushed_at_the_end() -> None:
    t = ChunkTranslator(["STOP"], 0, 0)
    events = t.feed(token("abS"), 1) + t.feed(token("T", 1, "length"), 2)
    assert text_of(events) == "abST"
    assert isinstance(events[-1], Finished) and events[-1].reason == "length"


def test_a_stream_that_ends_early_fails() -> None:
    t = ChunkTranslator([], 0, 0)
    t.feed(token("a"), 1)
    events = t.end_of_stream()
    assert len(events) == 1 and isinstance(events[0], Failed)
    assert t.end_of_stream() == []


def test_missing_usage_is_counted() -> None:
    t = ChunkTranslator([], 0, 0)
    t.feed(token("a"), 1)
    last = TokenChunk(model=MODEL, text="b", token_id=1, idx=1, finish_reason="stop")
    finished = t.feed(last, 2)[-1]
    assert isinstance(finished, Finished)
    assert finished.usage == Usage(prompt_tokens=0, completion_tokens=2)
