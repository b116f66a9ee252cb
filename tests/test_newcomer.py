"""The mistakes a newcomer makes first get an error that says what to write instead,
and change nothing."""

from __future__ import annotations

import pytest

import statemachine as sm


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("rate_limited", "write sm.ModelFailed(sm.ModelError('rate_limited', ...))"),
        (ValueError("429"), "write sm.ModelFailed(sm.classify(exc))"),
        (None, 'write sm.ModelFailed(sm.ModelError("rate_limited", ...))'),
    ],
    ids=["category-name", "exception", "none"],
)
def test_model_failed_without_a_model_error_says_how_to_build_one(value: object, hint: str) -> None:
    """``sm.ModelFailed("rate_limited")`` is refused with an InvalidValue (a TypeError)
    naming the field, what it got and the line to write, not attrs' bare message."""
    with pytest.raises(
        sm.InvalidValue, match=r"ModelFailed\.error: must be a ModelError"
    ) as raised:
        sm.ModelFailed(value)  # type: ignore[arg-type]
    assert hint in str(raised.value)
    assert isinstance(raised.value, TypeError)


def test_sending_a_bare_model_error_suggests_wrapping_it_and_changes_nothing() -> None:
    """``turn.send(sm.ModelError(...))`` is refused with the line to write
    (``sm.ModelFailed(error)``); the turn is where it was and takes the right event."""
    turn = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0).new_turn()
    turn.start()
    turn.send(sm.Assembled({"messages": []}, size=10))
    before = (turn.state, turn.steps, turn.attempt)
    error = sm.ModelError("rate_limited", retry_after_seconds=2)
    with pytest.raises(sm.IllegalEvent, match=r"turn\.send\(sm\.ModelFailed\(error\)\)"):
        turn.send(error)
    assert (turn.state, turn.steps, turn.attempt) == before
    assert isinstance(turn.send(sm.ModelFailed(error)), sm.Wait)


def test_other_non_events_get_no_wrapping_hint() -> None:
    """The hint is for a model error only: another object is just not an event."""
    turn = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0).new_turn()
    turn.start()
    with pytest.raises(sm.IllegalEvent) as raised:
        turn.send("Assembled")
    assert "is not an event" in str(raised.value)
    assert "ModelFailed(error)" not in str(raised.value)


def test_an_error_prints_as_one_line_for_a_log() -> None:
    """``print(failed.status, failed.error)`` as the docs write it: ``str`` of a
    ``ModelError`` is one line (category, HTTP status, code, the message cut at 200
    characters), without the headers or the body; ``repr`` keeps every field."""
    error = sm.ModelError(
        "rate_limited",
        "Too many\nrequests. " + "x" * 500,
        status=429,
        code="rate_limit_exceeded",
        headers={"retry-after": "2", "x-request-id": "r" * 300},
        body={"error": {"message": "y" * 300}},
    )
    line = str(error)
    assert line.startswith("rate_limited (HTTP 429) [rate_limit_exceeded]: Too many requests. x")
    assert "\n" not in line
    assert line.endswith("\u2026")
    assert len(line) == len("rate_limited (HTTP 429) [rate_limit_exceeded]: ") + 200
    assert "retry-after" not in line and "r" * 50 not in line
    assert "x-request-id" in repr(error)
    assert str(sm.ModelError("auth_error")) == "auth_error"
    assert str(sm.ModelError("unknown", "short")) == "unknown: short"
