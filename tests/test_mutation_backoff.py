"""Backoff edge cases the mutation runner found untested (``specs/mutation.md``).

``wait_seconds`` has two guards the envelope properties of ``tests/test_backoff.py``
never reach: the re-ordered division for a delay so large that jittering it would
overflow to infinity, and the ``+ 0.0`` that writes a signed zero as ``0.0``.
"""

from __future__ import annotations

import math

import pytest

import statemachine as sm
from statemachine.core._backoff import wait_seconds

from .helpers import calling_turn, fail, new_session

HUGE = 1.7e308
"""A delay (ms) whose jittered value overflows a float when ``0.5 + u`` > ~1.06."""


@pytest.mark.requirement("ER-22")
@pytest.mark.parametrize("u", [0.6, 0.75, 0.9, 0.999])
def test_a_delay_near_the_largest_float_is_divided_before_it_is_jittered(u: float) -> None:
    """When ``delay * (0.5 + u)`` would overflow, the wait is ``delay / 1000 * (0.5 + u)``:
    finite, and exactly the formula's value, not infinity and not a clamped value."""
    assert math.isinf(HUGE * (0.5 + u))  # the case under test
    seconds = wait_seconds(0, u, None, HUGE, 1.0, HUGE)
    assert math.isfinite(seconds)
    assert seconds == HUGE / 1000.0 * (0.5 + u)
    assert 0.5 * HUGE / 1000 <= seconds < 1.5 * HUGE / 1000


@pytest.mark.requirement("ER-22")
def test_a_delay_that_does_not_overflow_keeps_the_plain_formula() -> None:
    """Below the overflow the wait is ``delay * (0.5 + u) / 1000``, to the last bit."""
    for delay, u in ((HUGE, 0.0), (HUGE, 0.5), (1.0e300, 0.99), (500.0, 0.25)):
        assert wait_seconds(0, u, None, delay, 1.0, HUGE) == delay * (0.5 + u) / 1000.0


@pytest.mark.requirement("ER-22")
def test_a_negative_zero_base_delay_waits_positive_zero() -> None:
    """A base delay of ``-0.0`` (allowed: it is not below zero) gives a wait of ``+0.0``,
    never a signed zero, whether or not the server sent a retry-after of ``-0``."""
    for retry_after in (None, -0.0, 0.0):
        seconds = wait_seconds(0, 0.5, retry_after, -0.0, 2.0, 30_000.0)
        assert seconds == 0.0
        assert math.copysign(1.0, seconds) == 1.0, retry_after


@pytest.mark.requirement("ER-3")
def test_a_tied_retry_after_of_negative_zero_is_not_returned() -> None:
    """A retry-after that only ties the jittered wait (``-0`` against a zero delay) does
    not replace it: the wait stays ``+0.0``. Through the engine too: the Wait's seconds
    are a plain zero with a zero base delay and a ``retry-after: -0`` header."""
    assert math.copysign(1.0, wait_seconds(0, 0.1, -0.0, 0.0, 2.0, 0.0)) == 1.0
    session = new_session(base_delay_ms=0.0, max_delay_ms=0.0)
    turn = calling_turn(session)
    action = turn.send(fail("rate_limited", headers={"retry-after": "-0"}))
    assert isinstance(action, sm.Wait)
    assert action.seconds == 0.0
    assert math.copysign(1.0, action.seconds) == 1.0


@pytest.mark.requirement("ER-22")
def test_a_factor_whose_power_overflows_waits_the_cap() -> None:
    """``factor ** n`` beyond a float (attempt 5,000 at factor 2) is the cap, jittered:
    the retry waits ``max_delay_ms``, not a crash on an unset delay."""
    with pytest.raises(OverflowError):
        _ = 2.0**5000
    assert wait_seconds(5000, 0.5, None, 500.0, 2.0, 30_000.0) == 30.0
    assert wait_seconds(5000, 0.0, None, 500.0, 2.0, 30_000.0) == 15.0
