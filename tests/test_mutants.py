"""The checks check: seeded mutants of the transition table must each be caught.

Each mutant is a small edit of ``statemachine.core._table.ROWS`` (a new, dropped or
changed row) that breaks one promise. The model check runs the real engine on the
mutated table (a ``Dispatch`` built from it, which the sessions run) and must report the
requirement it breaks; the planted unbounded loop must also be caught by the
stateful suite's per-step ranking check, quickly.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hypothesis_settings
from hypothesis.stateful import run_state_machine_as_test

from statemachine import Settings
from statemachine.core._engine import Dispatch
from statemachine.core._table import BACKING_OFF, CALLING, ROWS, Row
from statemachine.dev.check import check

SMALL = Settings(
    max_retries=2,
    session_retry_ceiling=3,
    max_context_reductions=1,
    breaker_threshold=1,
    fallback_models=("fb",),
    max_wall_clock_s=60,
    max_server_wait_s=5,
)


def _at(source: str, event: str, guards: tuple[str, ...]) -> int:
    return next(
        i for i, r in enumerate(ROWS) if (r.source, r.event, r.guards) == (source, event, guards)
    )


def _insert(before: int, row: Row) -> tuple[Row, ...]:
    return (*ROWS[:before], row, *ROWS[before:])


def _replace(at: int, row: Row) -> tuple[Row, ...]:
    return (*ROWS[:at], row, *ROWS[at + 1 :])


def _drop(at: int) -> tuple[Row, ...]:
    return (*ROWS[:at], *ROWS[at + 1 :])


def _wait_again(_core: Any, turn: Any, _event: Any, _facts: Any, _status: Any) -> Any:
    """A planted effect: answer WaitDone with the same Wait, consuming nothing."""
    return turn.actions[-1]


MUTANTS: dict[str, tuple[tuple[Row, ...], set[str]]] = {
    # auth_error retried like a rate limit
    "retry_auth_error": (
        _insert(
            _at(CALLING, "ModelFailed", ("auth_error",)),
            Row(CALLING, "ModelFailed", ("auth_error", "retries_left"), BACKING_OFF, "wait"),
        ),
        {"ER-9", "ER-10"},
    ),
    # invalid_request falls back to the next model
    "fall_back_on_invalid_request": (
        _insert(
            _at(CALLING, "ModelFailed", ("invalid_request",)),
            Row(CALLING, "ModelFailed", ("invalid_request", "fallback_left"), CALLING, "fall_back"),
        ),
        {"ER-9", "ER-10"},
    ),
    # the overflowed request is sent again after a backoff
    "resend_after_overflow": (
        _replace(
            _at(CALLING, "ModelFailed", ("context_length_exceeded", "reductions_left")),
            Row(
                CALLING,
                "ModelFailed",
                ("context_length_exceeded", "retries_left"),
                BACKING_OFF,
                "wait",
            ),
        ),
        {"ER-6"},
    ),
    # the session ceiling row is gone: per-call retries go on past it
    "drop_session_ceiling": (
        _drop(_at(CALLING, "ModelFailed", ("transient", "ceiling_reached"))),
        {"ER-5"},
    ),
    # the final-answer turn invokes tools: an open breaker's provider is called again
    "invoke_open_breaker": (
        _drop(_at(CALLING, "ModelReplied", ("final_answer",))),
        {"ER-16", "ER-18"},
    ),
    # a partial stream resent: the partial row is gone
    "resend_partial_stream": (
        _drop(_at(CALLING, "ModelFailed", ("partial",))),
        {"ER-31"},
    ),
    # content_filtered reported as a generic failure
    "filtered_as_failure": (
        _replace(
            _at(CALLING, "ModelFailed", ("content_filtered",)),
            Row(CALLING, "ModelFailed", ("content_filtered",), "failed", "finish", "unknown_error"),
        ),
        {"ER-11"},
    ),
    # the wait is taken whatever the server asked for and whatever the clock says
    "wait_ignores_server_and_clock": (
        _replace(
            _at(CALLING, "ModelFailed", ("transient", "retries_left", "wait_fits")),
            Row(CALLING, "ModelFailed", ("transient", "retries_left"), BACKING_OFF, "wait"),
        ),
        {"ER-19", "ER-20"},
    ),
    # reductions without a cap
    "unbounded_reductions": (
        _replace(
            _at(CALLING, "ModelFailed", ("context_length_exceeded", "reductions_left")),
            Row(CALLING, "ModelFailed", ("context_length_exceeded",), "reducing_context", "reduce"),
        ),
        {"ER-8"},
    ),
    # a planted unbounded loop: WaitDone -> backing_off, Wait again, nothing consumed
    "planted_loop": (
        _replace(
            _at(BACKING_OFF, "WaitDone", ()),
            Row(BACKING_OFF, "WaitDone", (), BACKING_OFF, "wait_again"),
        ),
        {"ER-29"},
    ),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
@pytest.mark.requirement("ER-35")
def test_model_check_catches_mutant(name: str) -> None:
    """The model check of the mutated table fails, naming the broken requirement,
    with a shortest path to the violation."""
    rows, broken = MUTANTS[name]
    report = check(SMALL, rows=rows, effects={"wait_again": _wait_again})
    assert not report.ok
    found = {v.requirement for v in report.violations}
    assert found & broken, report.render()
    assert all(v.path for v in report.violations if v.requirement in broken)


@pytest.mark.requirement("ER-35")
def test_unmutated_table_passes_the_same_check() -> None:
    """The same settings on the real table find nothing: the mutants are the cause."""
    report = check(SMALL)
    assert report.ok, report.render()


@pytest.mark.requirement("ER-35", "ER-29")
def test_planted_loop_is_unbounded_in_the_model_check() -> None:
    """The planted loop is reported as a loop, as a recovery edge that consumes
    nothing, and as a state with no way to a terminal state."""
    rows, _ = MUTANTS["planted_loop"]
    report = check(SMALL, rows=rows, effects={"wait_again": _wait_again})
    messages = " ".join(v.message for v in report.violations)
    assert "consumed nothing" in messages
    assert "loop" in messages
    assert "no way to a terminal state" in messages


@pytest.mark.requirement("ER-35", "ER-29")
def test_stateful_suite_catches_planted_loop_quickly() -> None:
    """The stateful suite's per-step ranking check finds the planted loop within a
    few seconds (a global step bound alone is known to miss it)."""
    from tests.test_stateful import TurnMachine

    rows, _ = MUTANTS["planted_loop"]
    started = time.perf_counter()
    planted = type(
        "PlantedLoop", (TurnMachine,), {"DISPATCH": Dispatch(rows, {"wait_again": _wait_again})}
    )
    with pytest.raises(AssertionError, match="ranking"):
        run_state_machine_as_test(
            planted,
            settings=hypothesis_settings(
                max_examples=200,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
                report_multiple_bugs=False,
            ),
        )
    assert time.perf_counter() - started < 20


@pytest.mark.requirement("ER-35", "ER-6")
def test_stateful_suite_catches_resend_after_overflow() -> None:
    """The stateful suite's reference model also catches the overflow resend (by the
    reaction check, the resent request, or the wait it should never have taken)."""
    from tests.test_stateful import TurnMachine

    rows, _ = MUTANTS["resend_after_overflow"]
    planted = type("ResendAfterOverflow", (TurnMachine,), {"DISPATCH": Dispatch(rows)})
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            planted,
            settings=hypothesis_settings(
                max_examples=300,
                derandomize=True,
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
                report_multiple_bugs=False,
            ),
        )
