"""The driver loop's edges (``io/_loop.py``), found by issue 38's mutation sample:
what a cancel charges, the reason it keeps, and what it refuses."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import statemachine as sm
from statemachine.io._loop import MAX_REASON, CallCancelled, cancel, report_usage, text_of

from .helpers import ManualClock

RATE_LIMITED = sm.ModelFailed(sm.ModelError(sm.ErrorCategory.RATE_LIMITED, "slow down"))


class _Context:
    def assemble(self, action: sm.Assemble) -> sm.Assembled:
        return sm.Assembled("req", 10)


class _Tools:
    def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        return sm.ToolOutcome(call.id, ok=True)


def _session() -> sm.Session:
    return sm.Session(seed=1, clock=ManualClock())


class _Reporting:
    """A model whose first call reports a usage and then (``then``) returns an event or
    raises; later calls raise ``KeyboardInterrupt`` without reporting."""

    def __init__(self, then: Any) -> None:
        self.then, self.calls = then, 0

    def complete(self, action: sm.CallModel) -> Any:
        self.calls += 1
        if self.calls == 1:
            report_usage(sm.Usage(input_tokens=7, cost_usd=0.25))
            if isinstance(self.then, BaseException):
                raise self.then
            return self.then
        raise KeyboardInterrupt


@pytest.mark.requirement("ER-245")
def test_the_sync_drive_charges_what_an_interrupted_call_reported() -> None:
    session = _session()
    turn = session.new_turn()
    with pytest.raises(KeyboardInterrupt):
        sm.run_turn(turn, model=_Reporting(KeyboardInterrupt()), tools=_Tools(), context=_Context())
    assert turn.status is sm.TurnStatus.CANCELLED and session.cost_usd == 0.25


@pytest.mark.requirement("ER-245")
def test_a_usage_reported_by_an_earlier_call_is_not_charged_to_a_later_cancel() -> None:
    """The first call reported a usage and failed (its event charging nothing); the
    retry is interrupted before it reports: the cancel charges nothing (sync and async)."""
    session = _session()
    turn = session.new_turn()
    with pytest.raises(KeyboardInterrupt):
        sm.run_turn(
            turn,
            model=_Reporting(RATE_LIMITED),
            tools=_Tools(),
            context=_Context(),
            sleep=lambda _s: None,
        )
    assert turn.status is sm.TurnStatus.CANCELLED and session.cost_usd == 0.0

    class Async(_Reporting):
        async def complete(self, action: sm.CallModel) -> Any:  # type: ignore[override]
            return _Reporting.complete(self, action)

    class AsyncContext(_Context):
        async def assemble(self, action: sm.Assemble) -> sm.Assembled:  # type: ignore[override]
            return _Context.assemble(self, action)

    async def no_wait(_seconds: float) -> None:
        return None

    session = _session()
    turn = session.new_turn()
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(
            sm.arun_turn(
                turn,
                model=Async(RATE_LIMITED),
                tools=_Tools(),
                context=AsyncContext(),
                sleep=no_wait,
            )
        )
    assert turn.status is sm.TurnStatus.CANCELLED and session.cost_usd == 0.0


def test_a_usage_said_outside_a_drive_goes_nowhere() -> None:
    report_usage(sm.Usage(input_tokens=1))  # no drive runs: nothing to charge, no error


def test_a_call_cancelled_without_a_cost_charges_nothing() -> None:
    session = _session()
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("req", 10))
    cancel(turn, CallCancelled("stop"))
    assert turn.status is sm.TurnStatus.CANCELLED and session.cost_usd == 0.0


def test_cancelling_a_finished_turn_changes_nothing() -> None:
    session = _session()
    turn = session.new_turn()
    finish = sm.run_turn(
        turn, model=lambda_model(sm.ModelReplied(reply="hi")), tools=_Tools(), context=_Context()
    )
    cancel(turn, KeyboardInterrupt())
    assert turn.finish is finish and finish.status is sm.TurnStatus.COMPLETED


def lambda_model(event: Any) -> Any:
    class Model:
        def complete(self, action: sm.CallModel) -> Any:
            return event

    return Model()


def test_a_driver_given_no_turn_names_it() -> None:
    with pytest.raises(TypeError, match=r"^turn: expected a statemachine\.Turn, got 'x'"):
        sm.run_turn("x", model=lambda_model(None), tools=_Tools(), context=_Context())  # type: ignore[arg-type]


def test_an_error_text_is_bounded_and_never_raises() -> None:
    """``text_of`` keeps a text of exactly the limit, cuts a longer one to the limit
    ending in ``...``, reads a broken ``__str__`` as unprintable; the cancel reason's
    limit is 2,000 characters."""
    assert MAX_REASON == 2000
    assert text_of(RuntimeError("x" * 2000)) == "x" * 2000
    assert text_of(RuntimeError("x" * 2001)) == "x" * 1997 + "..."
    assert text_of(RuntimeError("abcdef"), 5) == "ab..."

    class Broken(Exception):
        def __str__(self) -> str:
            raise ValueError("no")

    assert text_of(Broken()) == "<unprintable Broken>"
    session = _session()
    turn = session.new_turn()
    turn.start()
    cancel(turn, RuntimeError("y" * 5000))
    (cancelled,) = [r.caused_by for r in turn.trace if isinstance(r.caused_by, sm.Cancelled)]
    assert cancelled.reason == "RuntimeError: " + "y" * 1997 + "..."
