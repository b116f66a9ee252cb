"""The turn engine: every required reaction, event by event."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import statemachine as sm
from statemachine.core._codec import decode
from statemachine.core._engine import call_fingerprint

from .helpers import ManualClock, calling_turn, complete_turn, fail, new_session, tool_round

TRANSIENT = ["rate_limited", "overloaded"]


# -- the happy path -----------------------------------------------------------------


def test_happy_path_assembles_calls_and_completes() -> None:
    """start -> Assemble, Assembled -> CallModel(attempt 0), a reply without tool calls
    -> Finish(completed) carrying the host's reply."""
    session = new_session(model="primary")
    turn = session.new_turn()
    assert turn.state == "idle" and turn.status is None
    assert turn.start() == sm.Assemble(reduce=False, withhold_tools=False, instruction=None)
    call = turn.send(sm.Assembled({"messages": [1]}, 10))
    assert call == sm.CallModel({"messages": [1]}, attempt=0, model="primary", withhold_tools=False)
    finish = turn.send(sm.ModelReplied(reply="hello", cost=0.5))
    assert isinstance(finish, sm.Finish)
    assert finish.status is sm.TurnStatus.COMPLETED
    assert finish.reply == "hello" and finish.model == "primary"
    assert turn.state == "completed" and turn.status is sm.TurnStatus.COMPLETED
    assert turn.finish is finish and turn.done
    assert session.cost_usd == 0.5


# -- transient errors: backoff, caps, fallback -----------------------------------------


@pytest.mark.requirement("ER-1")
@pytest.mark.parametrize("category", TRANSIENT)
def test_transient_errors_wait_then_resend_the_same_request(category: str) -> None:
    """A rate limit or overload gives a Wait, then a CallModel with the same request and
    attempt + 1, waits growing exponentially."""
    session = new_session()
    turn = calling_turn(session, request="R")
    waits = []
    for attempt in range(5):
        wait = turn.send(fail(category))
        assert isinstance(wait, sm.Wait)
        assert wait.category == category and wait.attempt == attempt
        waits.append(wait.seconds)
        call = turn.send(sm.WaitDone())
        assert call == sm.CallModel("R", attempt=attempt + 1, model=None, withhold_tools=False)
    for n, seconds in enumerate(waits):
        nominal = 0.5 * 2**n
        assert 0.5 * nominal <= seconds < 1.5 * nominal


@pytest.mark.requirement("ER-5")
def test_per_call_cap_gives_retries_exhausted_after_one_plus_max_retries_attempts() -> None:
    """With max_retries=2 a call is attempted 3 times, then the turn ends retries_exhausted."""
    session = new_session(max_retries=2)
    turn = calling_turn(session)
    calls = 1
    action: sm.Action = turn.send(fail("rate_limited"))
    while isinstance(action, sm.Wait):
        action = turn.send(sm.WaitDone())
        assert isinstance(action, sm.CallModel)
        calls += 1
        action = turn.send(fail("rate_limited"))
    assert calls == 3
    assert isinstance(action, sm.Finish)
    assert action.status is sm.TurnStatus.RETRIES_EXHAUSTED
    assert action.error is not None and action.error.category is sm.ErrorCategory.RATE_LIMITED
    assert session.retries_used == 2


@pytest.mark.requirement("ER-5")
def test_session_ceiling_is_counted_separately_across_turns() -> None:
    """The session-wide ceiling spans turns and calls; it ends a turn with its own status
    even though the call still has per-call retries left."""
    session = new_session(max_retries=5, session_retry_ceiling=3)
    first = calling_turn(session)
    for _ in range(2):
        assert isinstance(first.send(fail("overloaded")), sm.Wait)
        first.send(sm.WaitDone())
    first.send(sm.ModelReplied())
    second = calling_turn(session)
    assert isinstance(second.send(fail("overloaded")), sm.Wait)
    second.send(sm.WaitDone())
    finish = second.send(fail("overloaded"))
    assert isinstance(finish, sm.Finish)
    assert finish.status is sm.TurnStatus.RETRY_CEILING_REACHED
    assert second.attempt == 1 < session.settings.max_retries
    assert session.retries_used == 3


@pytest.mark.requirement("ER-5")
def test_zero_retries_fail_at_once() -> None:
    """max_retries=0: the first transient error ends the turn."""
    turn = calling_turn(new_session(max_retries=0))
    finish = turn.send(fail("overloaded"))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.RETRIES_EXHAUSTED


@pytest.mark.requirement("ER-23")
def test_fallback_after_retries_are_exhausted_is_explicit_and_traced() -> None:
    """With fallbacks configured, a call that spent its retries moves to the next model at
    once, attempt 0, same request; the move counts a session retry and the Finish names
    the serving model and the error that caused each move."""
    session = new_session(max_retries=1, fallback_models=("b", "c"), model="a")
    turn = calling_turn(session, request="R")
    assert isinstance(turn.send(fail("overloaded")), sm.Wait)
    assert turn.send(sm.WaitDone()) == sm.CallModel("R", 1, "a", False)
    moved = turn.send(fail("overloaded", message="a is down"))
    assert moved == sm.CallModel("R", 0, "b", False)
    assert session.retries_used == 2
    assert turn.trace[-1].guard == "transient & fallback_left"
    assert turn.trace[-1].source == turn.trace[-1].dest == "calling"
    assert isinstance(turn.send(fail("rate_limited")), sm.Wait)
    turn.send(sm.WaitDone())
    assert turn.send(fail("rate_limited", message="b limited")) == sm.CallModel("R", 0, "c", False)
    finish = turn.send(sm.ModelReplied(reply="ok"))
    assert isinstance(finish, sm.Finish)
    assert finish.model == "c"
    assert [(f.from_model, f.to_model, f.error.message) for f in finish.fallbacks] == [
        ("a", "b", "a is down"),
        ("b", "c", "b limited"),
    ]
    assert session.retries_used == 4


@pytest.mark.requirement("ER-23")
def test_fallback_chain_ends_in_retries_exhausted() -> None:
    """When the last fallback model also spends its retries the turn ends."""
    turn = calling_turn(new_session(max_retries=0, fallback_models=("b",)))
    assert isinstance(turn.send(fail("overloaded")), sm.CallModel)
    finish = turn.send(fail("overloaded"))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.RETRIES_EXHAUSTED
    assert finish.model == "b"


@pytest.mark.requirement("ER-19")
def test_wait_that_would_cross_the_wall_clock_is_not_taken() -> None:
    """A wait beyond the remaining wall-clock budget ends the turn budget_exhausted, and
    the session takes the limit-reached path for the wall clock."""
    clock = ManualClock()
    session = new_session(clock=clock, max_wall_clock_s=30)
    turn = calling_turn(session)
    clock.advance(25)
    finish = turn.send(fail("rate_limited", retry_after_seconds=10))
    assert isinstance(finish, sm.Finish)
    assert finish.status is sm.TurnStatus.BUDGET_EXHAUSTED
    assert session.limit_reached is sm.SessionStatus.ERROR_MAX_WALL_CLOCK
    assert session.status is None
    final = session.new_turn()
    assert final.final_answer
    assert final.start().withhold_tools


@pytest.mark.requirement("ER-19")
@pytest.mark.requirement("ER-23")
def test_wait_that_cannot_be_taken_falls_back_when_a_model_is_left() -> None:
    """A wait that does not fit moves to the fallback model instead of ending the turn."""
    clock = ManualClock()
    session = new_session(clock=clock, max_wall_clock_s=30, fallback_models=("b",))
    turn = calling_turn(session)
    action = turn.send(fail("rate_limited", retry_after_seconds=45))
    assert action == sm.CallModel("req-1", 0, "b", False)


@pytest.mark.requirement("ER-20")
def test_long_server_wait_is_deferred_with_the_time_to_come_back() -> None:
    """A retry-after beyond max_server_wait_s is not slept on: retry_deferred, with
    retry_at on the session's clock; the session can go on later."""
    clock = ManualClock(start=500.0)
    session = new_session(clock=clock)
    turn = calling_turn(session)
    finish = turn.send(fail("overloaded", headers={"retry-after": "3600"}))
    assert isinstance(finish, sm.Finish)
    assert finish.status is sm.TurnStatus.RETRY_DEFERRED
    assert finish.retry_at == 500.0 + 3600
    assert session.status is None and session.limit_reached is None
    assert not session.new_turn().final_answer


# -- context overflow ----------------------------------------------------------------


@pytest.mark.requirement("ER-6")
@pytest.mark.requirement("ER-7")
def test_context_overflow_reduces_then_calls_with_the_smaller_request() -> None:
    """context_length_exceeded asks for a reduced assembly; the next call carries the
    new, smaller request, never the one that overflowed."""
    turn = calling_turn(new_session(), request="big", size=1000)
    action = turn.send(fail("context_length_exceeded"))
    assert action == sm.Assemble(reduce=True, withhold_tools=False, instruction=None)
    assert turn.state == "reducing_context"
    call = turn.send(sm.Assembled("small", 600))
    assert call == sm.CallModel("small", 0, None, False)
    assert turn.reductions == 1


@pytest.mark.requirement("ER-6")
@pytest.mark.requirement("ER-8")
@pytest.mark.parametrize(
    "event",
    [sm.CannotShrink(), sm.Assembled("big-again", 1000), sm.Assembled("bigger", 1200)],
    ids=["cannot-shrink", "same-size", "larger"],
)
def test_context_that_cannot_shrink_fails_cleanly(event: object) -> None:
    """A CannotShrink, or a size not strictly smaller, ends the turn context_exhausted."""
    turn = calling_turn(new_session(), request="big", size=1000)
    turn.send(fail("context_length_exceeded"))
    finish = turn.send(event)
    assert isinstance(finish, sm.Finish)
    assert finish.status is sm.TurnStatus.CONTEXT_EXHAUSTED
    assert turn.state == "failed"


@pytest.mark.requirement("ER-6")
def test_the_overflowed_request_is_never_resent_even_if_size_claims_to_shrink() -> None:
    """A reduced assembly that hands back the very request that overflowed is refused."""
    turn = calling_turn(new_session(), request={"m": [1, 2]}, size=1000)
    turn.send(fail("context_length_exceeded"))
    finish = turn.send(sm.Assembled({"m": [1, 2]}, 10))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.CONTEXT_EXHAUSTED


@pytest.mark.requirement("ER-8")
def test_too_many_reductions_end_the_turn() -> None:
    """After max_context_reductions reductions another overflow ends the turn."""
    turn = calling_turn(new_session(max_context_reductions=2), size=1000)
    for size in (800, 600):
        assert turn.send(fail("context_length_exceeded")).reduce  # type: ignore[union-attr]
        assert isinstance(turn.send(sm.Assembled(f"r{size}", size)), sm.CallModel)
    finish = turn.send(fail("context_length_exceeded"))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.CONTEXT_EXHAUSTED


# -- non-retryable errors ------------------------------------------------------------


@pytest.mark.requirement("ER-9")
@pytest.mark.requirement("ER-10")
@pytest.mark.parametrize("category", ["auth_error", "invalid_request"])
def test_auth_and_invalid_request_never_retry_nor_fall_back(category: str) -> None:
    """With fallbacks and retries configured, these end the turn at once with their own
    status; no Wait, no CallModel to any model."""
    session = new_session(fallback_models=("b", "c"), max_retries=5)
    turn = calling_turn(session)
    finish = turn.send(fail(category, message="bad key"))
    assert isinstance(finish, sm.Finish)
    assert finish.status.value == category
    assert finish.fallbacks == () and finish.model is None
    assert session.retries_used == 0
    assert [r.action for r in turn.trace if isinstance(r.action, sm.CallModel)] == [
        sm.CallModel("req-1", 0, None, False)
    ]


@pytest.mark.requirement("ER-11")
def test_content_filtered_is_surfaced_distinctly() -> None:
    """content_filtered ends in its own terminal state and status, not a failure."""
    turn = calling_turn(new_session(fallback_models=("b",)))
    finish = turn.send(fail("content_filtered"))
    assert isinstance(finish, sm.Finish)
    assert finish.status is sm.TurnStatus.CONTENT_FILTERED
    assert turn.state == "filtered"
    assert turn.trace[-1].dest == "filtered"


@pytest.mark.requirement("ER-24")
def test_unknown_error_is_not_retried_and_keeps_the_raw_message() -> None:
    """An unknown error ends the turn unknown_error; its raw vendor data survives."""
    error = sm.ModelError("unknown", message="weird 418", code="teapot", status=418, body={"x": 1})
    finish = calling_turn(new_session()).send(sm.ModelFailed(error))
    assert isinstance(finish, sm.Finish)
    assert finish.status is sm.TurnStatus.UNKNOWN_ERROR
    assert finish.error is error
    assert (error.message, error.code, error.status, error.body) == (
        "weird 418",
        "teapot",
        418,
        {"x": 1},
    )
    assert not error.retryable


@pytest.mark.requirement("ER-31")
@pytest.mark.parametrize("category", [c.value for c in sm.ErrorCategory])
def test_partial_stream_failure_is_never_resent(category: str) -> None:
    """A failure after part of the reply streamed out ends stream_interrupted, even for a
    retryable category; a content filter that cut the stream is surfaced as
    content_filtered, distinctly (never resent either)."""
    finish = calling_turn(new_session()).send(fail_partial(category))
    assert isinstance(finish, sm.Finish)
    if category == "content_filtered":
        assert finish.status is sm.TurnStatus.CONTENT_FILTERED
    else:
        assert finish.status is sm.TurnStatus.STREAM_INTERRUPTED


def fail_partial(category: str) -> sm.ModelFailed:
    """A partial-stream failure of ``category``."""
    return sm.ModelFailed(sm.ModelError(category), partial=True)


def test_only_transient_categories_are_retryable() -> None:
    """``ModelError.retryable`` is true exactly for rate limits and overloads."""
    assert {c for c in sm.ErrorCategory if sm.ModelError(c).retryable} == {
        sm.ErrorCategory.RATE_LIMITED,
        sm.ErrorCategory.OVERLOADED,
    }


# -- tools and the breaker -----------------------------------------------------------


def _call(i: int, provider: str = "fs", name: str = "read", **arguments: object) -> sm.ToolCall:
    return sm.ToolCall(f"c{i}", provider, name, arguments or {"i": i})


@pytest.mark.requirement("ER-12")
def test_failed_tool_outcomes_become_error_results_and_the_turn_completes() -> None:
    """Each failed outcome is an error-flagged ToolResult in Finish(completed), in the
    order of the calls; successes are plain results."""
    session = new_session()
    calls = [_call(1), _call(2, provider="web"), _call(3)]
    finish = tool_round(
        session,
        calls,
        [
            sm.ToolOutcome("c3", ok=False, content="no such file", category="not_found"),
            sm.ToolOutcome("c1", ok=True, content="data"),
            sm.ToolOutcome("c2", ok=False, content="died"),
        ],
    )
    assert isinstance(finish, sm.Finish)
    assert finish.status is sm.TurnStatus.COMPLETED
    assert finish.tool_results == (
        sm.ToolResult("c1", "data"),
        sm.ToolResult("c2", "died", is_error=True, category=sm.ToolErrorCategory.UNKNOWN),
        sm.ToolResult("c3", "no such file", True, sm.ToolErrorCategory.NOT_FOUND),
    )


def _crash(call_id: str) -> sm.ToolOutcome:
    return sm.ToolOutcome(call_id, ok=False, content="exit 139", category="process_crashed")


@pytest.mark.requirement("ER-13")
@pytest.mark.requirement("ER-14")
@pytest.mark.requirement("ER-18")
def test_consecutive_crashes_trip_the_breaker_and_take_the_limit_path() -> None:
    """breaker_threshold consecutive process_crashed outcomes of one provider, across
    turns, trip its breaker: that turn ends breaker_open with its results, the next turn
    is the final-answer turn, never invoking tools, and the session ends
    error_circuit_breaker."""
    session = new_session(breaker_threshold=3)
    for i in range(2):
        finish = tool_round(session, [_call(i)], [_crash(f"c{i}")])
        assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.COMPLETED
    assert session.crash_counts == {"fs": 2}
    finish = tool_round(session, [_call(9)], [_crash("c9")])
    assert isinstance(finish, sm.Finish)
    assert finish.status is sm.TurnStatus.BREAKER_OPEN
    assert finish.tool_results[0].is_error
    assert session.tripped_providers == {"fs"}
    assert session.limit_reached is sm.SessionStatus.ERROR_CIRCUIT_BREAKER
    final = calling_turn(session)
    assert final.final_answer
    end = final.send(sm.ModelReplied(tool_calls=[_call(10)]))
    assert isinstance(end, sm.Finish) and end.status is sm.TurnStatus.COMPLETED
    assert session.status is sm.SessionStatus.ERROR_CIRCUIT_BREAKER
    with pytest.raises(sm.SessionEnded):
        session.new_turn()


@pytest.mark.requirement("ER-13")
def test_a_success_or_another_provider_resets_nothing_but_its_own_count() -> None:
    """Crashes count consecutively per provider: a success of that provider resets its
    count, another provider's crashes do not touch it."""
    session = new_session(breaker_threshold=2)
    tool_round(session, [_call(1)], [_crash("c1")])
    tool_round(session, [_call(2, provider="web")], [_crash("c2")])
    assert session.crash_counts == {"fs": 1, "web": 1}
    tool_round(session, [_call(3)], [sm.ToolOutcome("c3", ok=True)])
    assert session.crash_counts == {"web": 1}
    finish = tool_round(session, [_call(4)], [_crash("c4")])
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.COMPLETED
    assert session.tripped_providers == frozenset()


@pytest.mark.requirement("ER-13")
@pytest.mark.requirement("ER-89")
def test_one_death_under_several_calls_is_one_crash() -> None:
    """A provider's process dying under three concurrent calls is one crash, not
    three; each call still gets its process_crashed result."""
    session = new_session(breaker_threshold=2)
    finish = tool_round(
        session, [_call(1), _call(2), _call(3)], [_crash("c2"), _crash("c1"), _crash("c3")]
    )
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.COMPLETED
    assert session.crash_counts == {"fs": 1}
    assert [r.category for r in finish.tool_results] == [sm.ToolErrorCategory.PROCESS_CRASHED] * 3
    assert all(r.is_error for r in finish.tool_results)
    finish = tool_round(session, [_call(4), _call(5)], [_crash("c4"), _crash("c5")])
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.BREAKER_OPEN
    assert session.tripped_providers == frozenset({"fs"})


# -- the doom loop -------------------------------------------------------------------


@pytest.mark.requirement("ER-17")
def test_identical_consecutive_tool_calls_take_the_doom_loop_path() -> None:
    """doom_loop_threshold identical calls in a row (same name, same arguments as
    canonical JSON; the provider does not matter) fire the doom-loop limit."""
    session = new_session(doom_loop_threshold=3)
    for i, (provider, args) in enumerate(
        [("a", {"x": 1, "y": [1, 2]}), ("b", {"y": [1, 2], "x": 1}), ("a", {"x": 1, "y": [1, 2]})]
    ):
        assert session.limit_reached is None
        ok = sm.ToolOutcome(f"c{i}", ok=True)
        tool_round(session, [sm.ToolCall(f"c{i}", provider, "search", args)], [ok])
    assert session.limit_reached is sm.SessionStatus.ERROR_DOOM_LOOP
    final = session.new_turn()
    assert final.final_answer
    assert final.start().withhold_tools
    final.send(sm.Assembled("r", 1))
    final.send(sm.ModelReplied())
    assert session.status is sm.SessionStatus.ERROR_DOOM_LOOP


@pytest.mark.requirement("ER-17")
def test_different_arguments_break_the_run() -> None:
    """A call with other arguments in between starts the count again."""
    session = new_session(doom_loop_threshold=3)
    for i, q in enumerate(["a", "a", "b", "a", "a"]):
        ok = sm.ToolOutcome(f"c{i}", ok=True)
        tool_round(session, [sm.ToolCall(f"c{i}", "p", "search", {"q": q})], [ok])
    assert session.limit_reached is None


@pytest.mark.requirement("ER-87")
def test_the_host_check_judges_the_last_window_of_calls_in_order() -> None:
    """With doom_check_window=3, the host's check sees the last three calls in the
    order the model made them, once every three calls; between checks the session
    holds the calls seen since the last one and how many they are."""
    seen: list[list[str]] = []

    def check(window: tuple[sm.ToolCall, ...]) -> bool:
        seen.append([call.id for call in window])
        return False

    session = sm.Session(
        sm.Settings(doom_check_window=3, doom_loop_threshold=50),
        seed=1,
        clock=ManualClock(),
        doom_check=check,
    )
    for i in range(5):
        ok = sm.ToolOutcome(f"c{i}", ok=True)
        tool_round(session, [sm.ToolCall(f"c{i}", "p", "search", {"q": i})], [ok])
    assert seen == [["c0", "c1", "c2"]]
    held = session.snapshot()
    assert held["doom_since"] == 2
    assert [call["id"] for call in held["doom_window"]] == ["c2", "c3", "c4"]
    tool_round(session, [sm.ToolCall("c5", "p", "search", {"q": 5})], [sm.ToolOutcome("c5", True)])
    assert seen == [["c0", "c1", "c2"], ["c3", "c4", "c5"]]
    assert session.limit_reached is None


# -- bounds and the limit-reached path --------------------------------------------------


@pytest.mark.requirement("ER-15")
@pytest.mark.requirement("ER-16")
def test_max_turns_runs_n_turns_then_one_final_answer_turn() -> None:
    """With max_turns=2: two ordinary turns, then a final-answer turn whose Assemble and
    CallModel withhold tools and carry the instruction; then the session has ended."""
    session = new_session(max_turns=2)
    complete_turn(session)
    complete_turn(session)
    assert session.limit_reached is sm.SessionStatus.ERROR_MAX_TURNS
    assert session.status is None
    final = session.new_turn()
    assemble = final.start()
    assert isinstance(assemble, sm.Assemble)
    assert assemble.withhold_tools and assemble.instruction
    assert "error_max_turns" in assemble.instruction
    call = final.send(sm.Assembled("r", 1))
    assert isinstance(call, sm.CallModel) and call.withhold_tools
    end = final.send(sm.ModelReplied(tool_calls=[_call(1)]))
    assert isinstance(end, sm.Finish) and end.tool_results == ()
    assert session.status is sm.SessionStatus.ERROR_MAX_TURNS
    assert session.turns == 3
    with pytest.raises(sm.SessionEnded) as info:
        session.new_turn()
    assert info.value.status is sm.SessionStatus.ERROR_MAX_TURNS


@pytest.mark.requirement("ER-15")
def test_max_turns_zero_makes_the_first_turn_the_final_answer() -> None:
    """max_turns=0 allows no ordinary turn at all."""
    session = new_session(max_turns=0)
    assert session.new_turn().final_answer


@pytest.mark.requirement("ER-15")
def test_cost_bound_fires_after_the_turn_that_crossed_it() -> None:
    """The sum of ModelReplied.cost reaching max_cost_usd fires error_max_budget_usd."""
    session = new_session(max_cost_usd=1.0)
    complete_turn(session, cost=0.6)
    assert session.limit_reached is None
    complete_turn(session, cost=0.5)
    assert session.limit_reached is sm.SessionStatus.ERROR_MAX_BUDGET_USD
    final = calling_turn(session)
    final.send(sm.ModelReplied(cost=0.1))
    assert session.status is sm.SessionStatus.ERROR_MAX_BUDGET_USD


@pytest.mark.requirement("ER-15")
def test_wall_clock_bound_counts_time_between_and_within_turns() -> None:
    """Time on the injected clock, waits included, fires error_max_wall_clock."""
    clock = ManualClock()
    session = new_session(clock=clock, max_wall_clock_s=60)
    turn = calling_turn(session)
    wait = turn.send(fail("rate_limited"))
    assert isinstance(wait, sm.Wait)
    clock.advance(wait.seconds)
    turn.send(sm.WaitDone())
    turn.send(sm.ModelReplied())
    assert session.limit_reached is None
    clock.advance(61)
    final = session.new_turn()
    assert final.final_answer
    assert session.limit_reached is sm.SessionStatus.ERROR_MAX_WALL_CLOCK


@pytest.mark.requirement("ER-15")
def test_bounds_are_independent() -> None:
    """Each bound fires on its own, whatever the others are set to."""
    clock = ManualClock()
    session = new_session(clock=clock, max_turns=100, max_cost_usd=100.0, max_wall_clock_s=5)
    complete_turn(session, cost=1.0)
    clock.advance(5)
    complete_turn(session)
    assert session.limit_reached is sm.SessionStatus.ERROR_MAX_WALL_CLOCK


@pytest.mark.requirement("ER-16")
@pytest.mark.parametrize(
    ("event", "status"),
    [
        (fail("rate_limited"), sm.TurnStatus.RETRIES_EXHAUSTED),
        (fail("overloaded", retry_after_seconds=1), sm.TurnStatus.RETRIES_EXHAUSTED),
        (fail("context_length_exceeded"), sm.TurnStatus.CONTEXT_EXHAUSTED),
        (fail("auth_error"), sm.TurnStatus.AUTH_ERROR),
    ],
)
def test_final_answer_turn_makes_one_attempt(event: sm.ModelFailed, status: sm.TurnStatus) -> None:
    """The final-answer turn neither retries, reduces nor falls back, and the session
    ends after it whatever its status."""
    session = new_session(max_turns=0, fallback_models=("b",))
    turn = calling_turn(session)
    finish = turn.send(event)
    assert isinstance(finish, sm.Finish) and finish.status is status
    assert session.status is sm.SessionStatus.ERROR_MAX_TURNS


@pytest.mark.requirement("ER-15")
def test_first_limit_to_fire_names_the_session_status() -> None:
    """When several limits fire, the first one to fire is the one reported."""
    session = new_session(max_turns=1, breaker_threshold=1)
    tool_round(session, [_call(1)], [_crash("c1")])
    assert session.limit_reached is sm.SessionStatus.ERROR_CIRCUIT_BREAKER


# -- protocol misuse --------------------------------------------------------------------


@pytest.mark.requirement("ER-27")
def test_illegal_event_raises_names_event_and_state_and_changes_nothing() -> None:
    """An event the state does not take raises IllegalEvent naming both; the turn goes
    on with a legal event as if nothing happened."""
    session = new_session()
    turn = calling_turn(session)
    before = (turn.state, len(turn.trace), session.retries_used, turn.action)
    with pytest.raises(sm.IllegalEvent) as info:
        turn.send(sm.WaitDone())
    assert info.value.event == "WaitDone" and info.value.state == "calling"
    assert "WaitDone" in str(info.value) and "calling" in str(info.value)
    assert (turn.state, len(turn.trace), session.retries_used, turn.action) == before
    assert isinstance(turn.send(sm.ModelReplied()), sm.Finish)


@pytest.mark.requirement("ER-27")
@pytest.mark.parametrize(
    "outcomes",
    [
        [sm.ToolOutcome("c1", ok=True)],
        [
            sm.ToolOutcome("c1", ok=True),
            sm.ToolOutcome("c2", ok=True),
            sm.ToolOutcome("c3", ok=True),
        ],
        [sm.ToolOutcome("c1", ok=True), sm.ToolOutcome("c1", ok=True)],
        [sm.ToolOutcome("c1", ok=True), sm.ToolOutcome("zz", ok=True)],
    ],
    ids=["missing", "unknown", "duplicate", "foreign"],
)
def test_tools_done_must_match_the_calls_exactly(outcomes: list[sm.ToolOutcome]) -> None:
    """Outcomes for unknown calls, two for one call, or none for a call are refused and
    change nothing: nothing is lost."""
    turn = calling_turn(new_session())
    turn.send(sm.ModelReplied(tool_calls=[_call(1), _call(2)]))
    with pytest.raises(sm.IllegalEvent, match="ToolsDone in state 'invoking_tools'"):
        turn.send(sm.ToolsDone(outcomes))
    assert turn.state == "invoking_tools"
    done = turn.send(sm.ToolsDone([sm.ToolOutcome("c1", ok=True), sm.ToolOutcome("c2", ok=True)]))
    assert isinstance(done, sm.Finish)


@pytest.mark.requirement("ER-27")
def test_duplicate_tool_call_ids_in_a_reply_are_refused() -> None:
    """A reply with two calls of one id is bad data: refused, state unchanged."""
    turn = calling_turn(new_session())
    with pytest.raises(sm.IllegalEvent, match="appears twice"):
        turn.send(sm.ModelReplied(tool_calls=[_call(1), _call(1)]))
    assert turn.state == "calling"


@pytest.mark.requirement("ER-27")
def test_protocol_misuse_outside_running_states() -> None:
    """Sending before start, after the finish, a non-event, or starting twice raises."""
    session = new_session()
    turn = session.new_turn()
    with pytest.raises(sm.IllegalEvent, match="start"):
        turn.send(sm.Assembled("r", 1))
    turn.start()
    with pytest.raises(sm.IllegalEvent):
        turn.start()
    with pytest.raises(sm.IllegalEvent, match="not an event"):
        turn.send("Assembled")
    turn.send(sm.Assembled("r", 1))
    turn.send(sm.ModelReplied())
    with pytest.raises(sm.IllegalEvent, match="finished"):
        turn.send(sm.ModelReplied())


@pytest.mark.requirement("ER-27")
def test_bad_event_data_is_refused_at_construction() -> None:
    """Events validate their own fields with errors naming the field."""
    with pytest.raises(TypeError, match="size"):
        sm.Assembled("r", -1)
    with pytest.raises(ValueError, match="cost"):
        sm.ModelReplied(cost=float("nan"))
    with pytest.raises(TypeError, match="tool_calls"):
        sm.ModelReplied(tool_calls=["c1"])
    with pytest.raises(ValueError, match="category"):
        sm.ModelError("rate_limit")
    with pytest.raises(ValueError, match="category"):
        sm.ToolOutcome("c1", ok=True, category="timeout")
    with pytest.raises(TypeError, match=r"ToolCall\.provider"):
        sm.ToolCall("c1", "", "x")


def test_new_turn_while_one_runs_is_refused() -> None:
    """A session runs one turn at a time."""
    session = new_session()
    calling_turn(session)
    with pytest.raises(sm.TurnInProgress):
        session.new_turn()


# -- cancellation ----------------------------------------------------------------------


@pytest.mark.requirement("ER-32")
def test_cancel_in_every_running_state() -> None:
    """Cancelled finishes the turn cancelled from every running state; the session can
    start a new turn afterwards."""
    for steps in range(5):
        session = new_session()
        turn = session.new_turn()
        script: list[object] = [
            sm.Assembled("r", 100),
            fail("context_length_exceeded"),
            sm.Assembled("r2", 50),
            fail("rate_limited"),
        ]
        turn.start()
        for event in script[:steps]:
            turn.send(event)
        finish = turn.send(sm.Cancelled("user hit ctrl-c"))
        assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.CANCELLED
        assert session.new_turn().index == 2


@pytest.mark.requirement("ER-32")
def test_cancel_while_invoking_tools_returns_cancelled_results() -> None:
    """In-flight calls come back as cancelled error results, so no tool call is left
    without a result."""
    turn = calling_turn(new_session())
    turn.send(sm.ModelReplied(tool_calls=[_call(1), _call(2)]))
    finish = turn.send(sm.Cancelled("timeout"))
    assert isinstance(finish, sm.Finish)
    assert [(r.call_id, r.is_error, r.category) for r in finish.tool_results] == [
        ("c1", True, sm.ToolErrorCategory.CANCELLED),
        ("c2", True, sm.ToolErrorCategory.CANCELLED),
    ]


@pytest.mark.requirement("ER-245")
def test_a_cancelled_call_that_was_billed_is_counted_as_a_reply_would_be() -> None:
    """Cancelled while the model call is in flight, with what the vendor reported:
    its cost counts toward max_cost_usd (the next turn is the final-answer turn) and
    its usage is kept in the trace and the snapshot, as a reply's would be; a
    snapshot restores to the same spend."""
    session = new_session(max_cost_usd=1.0)
    turn = calling_turn(session)
    usage = sm.Usage(input_tokens=900, output_tokens=40, model="m-1")
    finish = turn.send(sm.Cancelled("user left", cost=1.25, usage=usage))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.CANCELLED
    assert session.cost_usd == 1.25
    last = turn.trace[-1]
    assert last.event == "Cancelled" and last.cost_usd == 1.25
    assert last.usage == sm.Usage(input_tokens=900, output_tokens=40, cost_usd=1.25, model="m-1")
    restored = sm.Session.restore(json.loads(json.dumps(session.snapshot())))
    assert restored.cost_usd == 1.25
    assert restored.current_turn is not None
    assert restored.current_turn.trace[-1].usage == last.usage
    final = session.new_turn()
    assert final.start() == sm.Assemble(
        reduce=False, withhold_tools=True, instruction=final.instruction
    )
    assert "[limit: error_max_budget_usd]" in (final.instruction or "")


@pytest.mark.requirement("ER-245")
def test_a_cancel_gives_its_cost_once_in_either_field() -> None:
    """The cost may come as ``cost`` or as ``usage.cost_usd`` (each fills the other);
    ``Cancelled()`` charges nothing and prints as it always did; a record written
    before the fields reads as charging nothing."""
    old = decode({"$type": "Cancelled", "reason": "stop"}, "journal")
    assert old == sm.Cancelled("stop") and old.cost == 0.0 and old.usage is None
    assert sm.Cancelled(usage=sm.Usage(cost_usd=0.5)).cost == 0.5
    assert sm.Cancelled(cost=0.5, usage=sm.Usage()).usage == sm.Usage(cost_usd=0.5)
    assert repr(sm.Cancelled("stop")) == "Cancelled(reason='stop')"
    assert "cost=0.5" in repr(sm.Cancelled("stop", cost=0.5))
    session = new_session(max_cost_usd=1.0)
    turn = calling_turn(session)
    turn.send(sm.Cancelled("stop"))
    assert session.cost_usd == 0.0 and turn.trace[-1].usage is None


@pytest.mark.requirement("ER-245")
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cost": -0.1}, "cost: must be a finite number >= 0"),
        ({"cost": float("nan")}, "cost: must be a finite number >= 0"),
        ({"cost": True}, "cost: must be a finite number >= 0"),
        ({"usage": {"input_tokens": 3}}, "usage: must be a Usage or None"),
        ({"cost": 1.0, "usage": sm.Usage(cost_usd=2.0)}, "Cancelled.cost: 1.0 and usage"),
    ],
)
def test_a_cancels_bad_cost_or_usage_is_refused_as_a_replys_is(
    kwargs: dict[str, Any], message: str
) -> None:
    """The same clear errors as on ModelReplied."""
    with pytest.raises(sm.InvalidValue, match=message.replace("(", r"\(")):
        sm.Cancelled("stop", **kwargs)


@pytest.mark.requirement("ER-245")
def test_a_cancel_charges_only_while_a_model_call_is_in_flight() -> None:
    """Outside ``calling`` no model call is in flight: a cost or a usage is refused
    (IllegalEvent, nothing changes); a cost past the largest float is refused too."""
    session = new_session()
    turn = session.new_turn()
    turn.start()
    for event in (sm.Cancelled(cost=0.1), sm.Cancelled(usage=sm.Usage(input_tokens=1))):
        with pytest.raises(sm.IllegalEvent, match="only in state 'calling'"):
            turn.send(event)
        assert turn.state == "assembling" and session.cost_usd == 0.0
    turn.send(sm.Assembled("r", 10))
    turn.send(sm.ModelReplied(cost=1e308))
    turn = calling_turn(session)
    with pytest.raises(sm.IllegalEvent, match="past the largest float"):
        turn.send(sm.Cancelled(cost=1e308))
    assert turn.state == "calling" and session.cost_usd == 1e308


@pytest.mark.requirement("ER-32")
def test_cancel_while_a_conflict_waits_keeps_the_settled_calls_results() -> None:
    """Cancelled while a conflicting call waits to be re-invoked: the calls that already
    have an outcome keep the result it makes (a failure stays that failure), the waiting
    call comes back cancelled."""
    turn = calling_turn(new_session())
    turn.send(sm.ModelReplied(tool_calls=[_call(1), _call(2), _call(3)]))
    conflict = sm.ToolErrorCategory.CONCURRENCY_CONFLICT
    wait = turn.send(
        sm.ToolsDone(
            [
                sm.ToolOutcome("c1", True, "one"),
                sm.ToolOutcome("c2", False, "busy", category=conflict),
                sm.ToolOutcome("c3", False, "no such file", sm.ToolErrorCategory.NOT_FOUND),
            ]
        )
    )
    assert isinstance(wait, sm.Wait) and turn.state == "backing_off_tools"
    finish = turn.send(sm.Cancelled("stop"))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.CANCELLED
    assert [(r.call_id, r.content, r.is_error, r.category) for r in finish.tool_results] == [
        ("c1", "one", False, None),
        ("c2", "cancelled: stop", True, sm.ToolErrorCategory.CANCELLED),
        ("c3", "no such file", True, sm.ToolErrorCategory.NOT_FOUND),
    ]


@pytest.mark.requirement("ER-32")
def test_a_conflict_waits_as_a_conflict_numbering_its_reinvocations() -> None:
    """The wait before a conflicting call goes again says it is for a
    ``concurrency_conflict`` and which re-invocation it precedes (0 for the first), and
    asks for no server wait."""
    turn = calling_turn(new_session())
    turn.send(sm.ModelReplied(tool_calls=[_call(1)]))
    conflict = sm.ToolErrorCategory.CONCURRENCY_CONFLICT
    busy = sm.ToolsDone([sm.ToolOutcome("c1", False, "busy", category=conflict)])
    for attempt in range(2):
        wait = turn.send(busy)
        assert isinstance(wait, sm.Wait)
        assert (wait.category, wait.attempt, wait.retry_after) == (conflict, attempt, None)
        assert turn.send(sm.WaitDone()) == sm.InvokeTools((_call(1),))


# -- trace, observers, determinism ---------------------------------------------------


@pytest.mark.requirement("ER-30")
def test_every_transition_is_a_frozen_record_and_observers_see_them() -> None:
    """The turn's trace has one record per transition, with counters; observers receive
    the same records as they happen; a content-filter finish is a distinct record."""
    seen: list[sm.TraceRecord] = []
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock(), observers=[seen.append])
    turn = calling_turn(session)
    turn.send(fail("rate_limited"))
    turn.send(sm.WaitDone())
    turn.send(fail("content_filtered"))
    trace = turn.trace
    assert list(trace) == seen
    assert [(r.source, r.event, r.dest) for r in trace] == [
        ("idle", "start", "assembling"),
        ("assembling", "Assembled", "calling"),
        ("calling", "ModelFailed", "backing_off"),
        ("backing_off", "WaitDone", "calling"),
        ("calling", "ModelFailed", "filtered"),
    ]
    assert [r.step for r in trace] == list(range(5))
    assert trace[2].session_retries == 1 and trace[3].attempt == 1
    last = trace[-1]
    assert isinstance(last.action, sm.Finish)
    assert last.action.status is sm.TurnStatus.CONTENT_FILTERED
    with pytest.raises(AttributeError):
        last.dest = "completed"  # type: ignore[misc]


@pytest.mark.requirement("ER-30")
def test_breaker_opening_is_a_distinct_record() -> None:
    """An observer can tell a breaker opening from any other finish."""
    seen: list[sm.TraceRecord] = []
    session = sm.Session(
        sm.Settings(breaker_threshold=1), clock=ManualClock(), observers=[seen.append]
    )
    tool_round(session, [_call(1)], [_crash("c1")])
    assert seen[-1].dest == "breaker_open"
    assert seen[-1].guard == "trips_breaker"


def _script() -> list[object]:
    return [
        sm.Assembled("r", 1000),
        fail("rate_limited"),
        sm.WaitDone(),
        fail("overloaded", headers={"retry-after-ms": "100"}),
        sm.WaitDone(),
        fail("context_length_exceeded"),
        sm.Assembled("r2", 500),
        fail("rate_limited"),
        sm.WaitDone(),
        sm.ModelReplied(tool_calls=[_call(1)]),
        sm.ToolsDone([_crash("c1")]),
    ]


@pytest.mark.requirement("ER-25")
def test_same_seed_and_events_give_the_same_actions_bit_for_bit() -> None:
    """Two sessions with one seed produce identical actions; another seed differs only in
    the waits."""

    def run(seed: int) -> list[sm.Action]:
        turn = new_session(seed=seed).new_turn()
        return [turn.start()] + [turn.send(e) for e in _script()]

    first, second, other = run(11), run(11), run(12)
    assert first == second
    assert [repr(a) for a in first] == [repr(a) for a in second]
    assert first != other
    assert [type(a) for a in first] == [type(a) for a in other]


@pytest.mark.requirement("ER-29")
def test_a_failure_storm_ends_within_the_derived_step_bound() -> None:
    """Whatever transient failures come, a turn ends within
    2 + (1 + reductions) * (2 * (retries + 1) * (fallbacks + 1)) + 1 steps."""
    settings: dict[str, Any] = {
        "max_retries": 3,
        "fallback_models": ("b",),
        "max_context_reductions": 2,
    }
    session = new_session(**settings)
    turn = calling_turn(session)
    steps = 2
    action: sm.Action | None = None
    while not turn.done:
        action = turn.action
        event = sm.WaitDone() if isinstance(action, sm.Wait) else fail("overloaded")
        turn.send(event)
        steps += 1
    bound = 2 + 3 * (2 * 4 * 2) + 1
    assert steps <= bound
    assert turn.status is sm.TurnStatus.RETRIES_EXHAUSTED


@pytest.mark.requirement("ER-17")
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)  # JSON data: no infinity
        | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8,
    )
)
def test_fingerprint_is_the_hash_of_canonical_json(arguments: object) -> None:
    """The fast encoder gives exactly ``json.dumps(sort_keys=True)``'s canonical form, so
    the same arguments in any key order are the same call."""
    canonical = json.dumps(
        ["t", arguments], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    expected = hashlib.blake2b(canonical.encode(), digest_size=12).hexdigest()
    assert call_fingerprint(sm.ToolCall("c", "p", "t", arguments)) == expected


def test_fingerprint_of_odd_arguments_does_not_raise() -> None:
    """Cyclic or non-JSON arguments still fingerprint (by repr), never raise. A
    ``ToolCall`` refuses them at the door (``ValueError`` naming the field), so these are
    forced into a built call, as a defence in depth."""
    cyclic: dict[str, object] = {}
    cyclic["self"] = cyclic
    for arguments in (cyclic, {"o": object()}, {1: 2}, {1: "x", "a": 2}, {(1, 2): 3}):
        call = sm.ToolCall("c", "p", "t")
        object.__setattr__(call, "arguments", arguments)
        assert len(call_fingerprint(call)) == 24
    for arguments in (cyclic, {"o": object()}, {(1, 2): 3}):
        with pytest.raises(ValueError, match=r"^ToolCall\.arguments: must be JSON data"):
            sm.ToolCall("c", "p", "t", arguments)


@pytest.mark.requirement("ER-30")
def test_replayed_trace_counters_equal_what_observers_saw_live() -> None:
    """``Turn.trace`` replays its counters from the rows' effects; on a turn with waits,
    a fallback, a reduction and tools they equal the live records, field by field."""
    seen: list[sm.TraceRecord] = []
    session = sm.Session(
        sm.Settings(max_retries=1, fallback_models=("b",)),
        seed=4,
        clock=ManualClock(),
        observers=[seen.append],
    )
    complete_turn(session)
    turn = session.new_turn()
    turn.start()
    for event in [
        sm.Assembled("r", 100),
        fail("overloaded"),
        sm.WaitDone(),
        fail("overloaded"),
        fail("context_length_exceeded"),
        sm.Assembled("r2", 50),
        fail("rate_limited"),
        sm.WaitDone(),
        sm.ModelReplied(tool_calls=[_call(1)]),
        sm.ToolsDone([_crash("c1")]),
    ]:
        turn.send(event)
    live = [r for r in seen if r.turn == 2]
    assert list(turn.trace) == live
    assert [r.session_retries for r in live][-1] == session.retries_used == 3
    assert max(r.reductions for r in live) == 1


@pytest.mark.requirement("ER-19")
@pytest.mark.requirement("ER-20")
def test_a_wait_past_the_wall_clock_is_budget_exhausted_even_when_also_too_long() -> None:
    """When the server asks for more than max_server_wait_s *and* the wait would cross
    the wall clock, the wall clock names the status and fires the session limit."""
    session = new_session(max_wall_clock_s=30, max_server_wait_s=60)
    finish = calling_turn(session).send(fail("rate_limited", retry_after_seconds=100))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.BUDGET_EXHAUSTED
    assert session.limit_reached is sm.SessionStatus.ERROR_MAX_WALL_CLOCK


@pytest.mark.requirement("ER-27")
def test_a_reply_whose_arguments_json_cannot_hold_is_taken_once() -> None:
    """Tool arguments with keys JSON cannot sort are still a legal reply: the cost is
    counted once and the calls are invoked."""
    session = new_session()
    turn = calling_turn(session)
    call = sm.ToolCall("c1", "p", "x", {1: "x", "a": 2})
    action = turn.send(sm.ModelReplied(tool_calls=[call], cost=1.0))
    assert isinstance(action, sm.InvokeTools)
    assert session.cost_usd == 1.0


def test_results_and_finishes_compare_on_the_contract_fields() -> None:
    """A ToolResult equals ``ToolResult(call_id, content, is_error=True)`` whatever its
    category; a Finish compares on status, results and error, not on provenance."""
    finish = tool_round(
        new_session(),
        [_call(1)],
        [sm.ToolOutcome("c1", ok=False, content="boom", category="execution_failed")],
    )
    assert isinstance(finish, sm.Finish)
    assert finish.tool_results == (sm.ToolResult("c1", "boom", is_error=True),)
    assert finish.tool_results[0].category is sm.ToolErrorCategory.EXECUTION_FAILED
    replied = calling_turn(new_session(model="m")).send(sm.ModelReplied(reply="hi"))
    assert replied == sm.Finish(sm.TurnStatus.COMPLETED)


def test_an_idle_turn_is_replaced_not_counted() -> None:
    """A turn created but never started (its host failed before ``start``) does not
    block the session, nor count toward max_turns."""
    session = new_session(max_turns=1)
    session.new_turn()
    turn = session.new_turn()
    assert turn.index == 1 and not turn.final_answer
    assert session.turns == 1


@pytest.mark.requirement("ER-17")
def test_a_reply_without_tool_calls_ends_a_run_of_identical_calls() -> None:
    """The loop finished between two identical calls: they are not consecutive."""
    session = new_session(doom_loop_threshold=2)
    same = {"q": "status"}
    tool_round(session, [sm.ToolCall("c1", "p", "check", same)], [sm.ToolOutcome("c1", ok=True)])
    complete_turn(session)
    tool_round(session, [sm.ToolCall("c2", "p", "check", same)], [sm.ToolOutcome("c2", ok=True)])
    assert session.limit_reached is None
    tool_round(session, [sm.ToolCall("c3", "p", "check", same)], [sm.ToolOutcome("c3", ok=True)])
    assert session.limit_reached is sm.SessionStatus.ERROR_DOOM_LOOP
