"""Retry-after edge cases the mutation runner found untested (``specs/mutation.md``).

The truth table of ``specs/retry-after.md`` (``tests/test_backoff.py``) fixes the
precedence; these pin the boundaries between its rows: a date with no usable zone, a
date that is exactly now, a wall clock a fraction of a second past the date.
"""

from __future__ import annotations

import pytest

import statemachine as sm
from statemachine.core._retry_after import header_retry_after, retry_after

WALL = 1_000_000_000.0
"""Sun, 09 Sep 2001 01:46:40 GMT."""

IN_TEN_SECONDS = "Sun, 09 Sep 2001 01:46:50 GMT"


def _wait(headers: dict[str, str], wall: float = WALL) -> float | None:
    return retry_after(sm.ModelError("rate_limited", headers=headers), wall)


@pytest.mark.requirement("ER-21")
def test_a_date_without_a_known_zone_is_ignored() -> None:
    """An HTTP-date in ``-0000`` (zone unknown, RFC 5322) cannot be placed on the clock:
    it is not waited on, and as a ``date`` header it gives way to the wall clock."""
    assert _wait({"retry-after": "Sun, 09 Sep 2001 01:46:50 -0000"}) is None
    got = _wait({"retry-after": IN_TEN_SECONDS, "date": "Sun, 09 Sep 2001 01:46:45 -0000"})
    assert got == 10.0


@pytest.mark.requirement("ER-21")
def test_a_date_that_is_now_or_just_past_is_not_a_wait() -> None:
    """A date equal to the reference time, or a fraction of a second behind the wall
    clock, is not in the future: no retry-after (never zero, never negative)."""
    assert _wait({"retry-after": IN_TEN_SECONDS, "date": IN_TEN_SECONDS}) is None
    assert _wait({"retry-after": IN_TEN_SECONDS}, wall=WALL + 10) is None
    assert _wait({"retry-after": IN_TEN_SECONDS}, wall=WALL + 10.5) is None


@pytest.mark.requirement("ER-4")
def test_a_date_one_second_ahead_and_a_fractional_clock_are_honoured() -> None:
    """The smallest future HTTP-date (one second ahead) is a one-second wait, and a
    fractional wall clock gives a fractional wait."""
    one_ahead = "Sun, 09 Sep 2001 01:46:41 GMT"
    assert _wait({"retry-after": one_ahead, "date": "Sun, 09 Sep 2001 01:46:40 GMT"}) == 1.0
    assert _wait({"retry-after": one_ahead}) == 1.0
    assert _wait({"retry-after": IN_TEN_SECONDS}, wall=WALL + 9.75) == 0.25


@pytest.mark.requirement("ER-4")
def test_zero_and_small_values_are_usable_in_every_source() -> None:
    """Zero is a usable wait in the field and in both headers; ``-0.5`` is not."""
    assert retry_after(sm.ModelError("rate_limited", retry_after_seconds=0), WALL) == 0.0
    assert _wait({"retry-after-ms": "0"}) == 0.0
    assert _wait({"retry-after": "0"}) == 0.0
    assert _wait({"retry-after": "0.5"}) == 0.5
    assert _wait({"retry-after": "-0.5"}) is None
    assert _wait({"retry-after-ms": "-0.5", "retry-after": "3"}) == 3.0
    field = sm.ModelError("rate_limited", retry_after_seconds=-0.5, headers={"retry-after": "4"})
    assert retry_after(field, WALL) == 4.0


@pytest.mark.requirement("ER-21")
def test_no_headers_and_no_field_is_no_wait() -> None:
    """An error with neither a field nor headers has no retry-after; headers with
    neither retry-after header have none either, whatever else they hold."""
    assert retry_after(sm.ModelError("rate_limited"), WALL) is None
    assert header_retry_after(sm.Headers({"date": IN_TEN_SECONDS}), WALL) is None
    assert _wait({"x-other": "5"}) is None
