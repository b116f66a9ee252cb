"""Engine behaviour the mutation runner found untested (``specs/mutation.md``).

A sampled run over ``statemachine/core/_engine.py`` left alive: the doom-loop count
after a tool-free reply reset to ``-1`` instead of ``0`` (an unreachable state a
snapshot refuses), a spend exactly at ``max_cost_usd`` not firing the budget, a cancel reason dropped
from the cancelled calls' results, and wrong ``IllegalEvent`` messages.
"""

from __future__ import annotations

import pytest

import statemachine as sm

from .helpers import ManualClock, calling_turn, complete_turn, new_session, tool_round


def _search(i: int) -> sm.ToolCall:
    return sm.ToolCall(f"c{i}", "p", "search", {"q": "same"})


@pytest.mark.requirement("ER-17")
def test_a_tool_free_reply_restarts_the_doom_count_from_zero() -> None:
    """After a reply with no tool call, the run of identical calls starts again: the
    session is in a state a snapshot restores (no fingerprint, a count of zero), and
    the ``doom_loop_threshold``-th identical call after it fires the limit."""
    session = new_session(doom_loop_threshold=3)
    for i in range(2):
        tool_round(session, [_search(i)], [sm.ToolOutcome(f"c{i}", ok=True)])
    complete_turn(session)  # no tool call: the run is over
    restored = sm.Session.restore(session.snapshot(), clock=ManualClock())
    assert restored.snapshot() == session.snapshot()  # a reachable state: count 0, no call
    for i in range(2, 4):
        tool_round(session, [_search(i)], [sm.ToolOutcome(f"c{i}", ok=True)])
        assert session.limit_reached is None
    tool_round(session, [_search(4)], [sm.ToolOutcome("c4", ok=True)])
    assert session.limit_reached is sm.SessionStatus.ERROR_DOOM_LOOP


@pytest.mark.requirement("ER-32")
def test_a_cancel_reason_is_written_into_the_cancelled_calls_results() -> None:
    """Cancelling while tools run gives each call an error result that carries the
    host's reason; without a reason the result just says ``cancelled``."""
    for reason, content in (
        ("user pressed stop", "cancelled: user pressed stop"),
        ("", "cancelled"),
    ):
        session = new_session()
        turn = calling_turn(session)
        turn.send(sm.ModelReplied(tool_calls=[_search(1), _search(2)]))
        finish = turn.send(sm.Cancelled(reason))
        assert isinstance(finish, sm.Finish)
        assert finish.status is sm.TurnStatus.CANCELLED
        assert [(r.call_id, r.content, r.is_error) for r in finish.tool_results] == [
            ("c1", content, True),
            ("c2", content, True),
        ]


def test_illegal_event_messages_name_the_state_and_what_is_legal() -> None:
    """An illegal event in a running state lists the events legal there (``start`` is
    never one of them); in a finished turn it says the turn has finished."""
    session = new_session()
    turn = calling_turn(session)
    with pytest.raises(sm.IllegalEvent) as running:
        turn.send(sm.WaitDone())
    message = str(running.value)
    assert "'calling'" in message
    assert "legal there: Cancelled, ModelFailed, ModelReplied" in message
    assert "finished" not in message
    assert "start" not in message.split("legal there:")[1]
    turn.send(sm.ModelReplied())
    with pytest.raises(sm.IllegalEvent) as finished:
        turn.send(sm.WaitDone())
    assert "the turn has finished" in str(finished.value)


@pytest.mark.requirement("ER-15")
def test_a_spend_exactly_at_max_cost_usd_fires_the_budget_limit() -> None:
    """``max_cost_usd`` is reached when the spend *equals* it, not only when it passes it;
    a spend just below leaves the session running."""
    below = new_session(max_cost_usd=1.0)
    complete_turn(below, cost=0.75)
    assert below.limit_reached is None
    complete_turn(below, cost=0.25)
    assert below.limit_reached is sm.SessionStatus.ERROR_MAX_BUDGET_USD
