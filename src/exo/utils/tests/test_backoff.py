"""KeyedBackoff: exponential delays per key, capped, with the time passed in."""

import pytest

from exo.utils.backoff import KeyedBackoff

T0 = 100.0


def test_a_new_key_may_proceed_at_once() -> None:
    backoff = KeyedBackoff[str]()
    assert backoff.attempts("m") == 0
    assert backoff.should_proceed("m", T0)
    assert backoff.should_proceed("m", float("-inf"))
    assert backoff.next_at("m") == float("-inf")


def test_delays_double_from_the_base() -> None:
    backoff = KeyedBackoff[str](base_s=1.0, max_s=1000.0)
    assert [backoff.delay_after(n) for n in range(7)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]


def test_delays_are_capped() -> None:
    backoff = KeyedBackoff[str](base_s=1.0, max_s=30.0)
    assert [backoff.delay_after(n) for n in range(4, 9)] == [8.0, 16.0, 30.0, 30.0, 30.0]
    # A download retried every 30 s for hours passes 1024 attempts: 2.0 ** 1024 overflows.
    assert backoff.delay_after(1025) == 30.0
    assert backoff.delay_after(10_000) == 30.0


def test_many_attempts_keep_the_cap() -> None:
    backoff = KeyedBackoff[str](base_s=1.0, max_s=30.0)
    now = T0
    for _ in range(1100):
        backoff.record_attempt("m", now)
        now = backoff.next_at("m")
    assert backoff.attempts("m") == 1100
    assert not backoff.should_proceed("m", now - 29.0)
    assert backoff.should_proceed("m", now)


def test_base_and_factor_are_configurable() -> None:
    backoff = KeyedBackoff[str](base_s=0.5, factor=3.0, max_s=100.0)
    assert [backoff.delay_after(n) for n in range(1, 5)] == [0.5, 1.5, 4.5, 13.5]


def test_attempt_holds_the_key_back_for_its_delay() -> None:
    backoff = KeyedBackoff[str]()
    backoff.record_attempt("m", T0)
    assert backoff.attempts("m") == 1
    assert backoff.next_at("m") == T0 + 1.0
    assert not backoff.should_proceed("m", T0)
    assert not backoff.should_proceed("m", T0 + 0.999)
    assert backoff.should_proceed("m", T0 + 1.0)

    backoff.record_attempt("m", T0 + 1.0)
    assert backoff.attempts("m") == 2
    assert not backoff.should_proceed("m", T0 + 2.999)
    assert backoff.should_proceed("m", T0 + 3.0)


def test_delay_counts_from_the_latest_attempt() -> None:
    backoff = KeyedBackoff[str]()
    backoff.record_attempt("m", T0)
    backoff.record_attempt("m", T0 + 50.0)  # attempts may come late
    assert backoff.next_at("m") == T0 + 50.0 + 2.0


def test_keys_are_independent() -> None:
    backoff = KeyedBackoff[str]()
    for _ in range(5):
        backoff.record_attempt("a", T0)
    assert backoff.attempts("b") == 0
    assert backoff.should_proceed("b", T0)
    assert not backoff.should_proceed("a", T0 + 15.0)


def test_reset_forgets_attempts_and_delay() -> None:
    backoff = KeyedBackoff[str]()
    for _ in range(4):
        backoff.record_attempt("m", T0)
    backoff.record_attempt("other", T0)
    backoff.reset("m")
    assert backoff.attempts("m") == 0
    assert backoff.should_proceed("m", T0)
    backoff.record_attempt("m", T0)
    assert backoff.next_at("m") == T0 + 1.0  # starts over from the base
    # Others keep theirs; resetting an unknown key is fine.
    assert backoff.attempts("other") == 1
    backoff.reset("never-seen")


@pytest.mark.parametrize("n", [0, -1])
def test_no_delay_without_attempts(n: int) -> None:
    assert KeyedBackoff[str]().delay_after(n) == 0.0
