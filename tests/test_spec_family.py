"""What the specification family's sibling pages ask of the engine (issue 11): sub-session
spend, terminal tools, the denial breaker and sliding windows, conflicts retried
serialized, the second-tier doom check, billed failures, session statuses, tool error
details, logging by shape, idle time."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

import statemachine as sm
from statemachine.io._drivers import tool_failure


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def session(clock: Clock | None = None, **settings: Any) -> sm.Session:
    return sm.Session(sm.Settings(**settings), seed=3, clock=clock or Clock())


def calling(s: sm.Session, request: Any = "request") -> sm.Turn:
    """A new turn of ``s``, started and assembled: its model call is in flight."""
    turn = s.new_turn()
    turn.start()
    turn.send(sm.Assembled(request, 100))
    return turn


def reply_turn(s: sm.Session, cost: float = 0.0, calls: tuple[sm.ToolCall, ...] = ()) -> sm.Action:
    return calling(s).send(sm.ModelReplied(calls, cost=cost))


def call(i: int, provider: str = "fs", name: str = "write", **kw: Any) -> sm.ToolCall:
    return sm.ToolCall(f"c{i}", provider, name, {"i": i}, **kw)


def ok(i: int) -> sm.ToolOutcome:
    return sm.ToolOutcome(f"c{i}", True, "done")


def failed(i: int, category: str) -> sm.ToolOutcome:
    return sm.ToolOutcome(f"c{i}", False, category, category)


def tool_turn(s: sm.Session, calls: list[sm.ToolCall]) -> sm.Turn:
    turn = calling(s)
    action = turn.send(sm.ModelReplied(tuple(calls)))
    assert isinstance(action, sm.InvokeTools)
    return turn


# -- sub-session spend (ER-80, ER-81, ER-82) -------------------------------------------


@pytest.mark.requirement("ER-80")
def test_a_childs_spend_is_charged_to_every_ancestor() -> None:
    """A grandchild's usage counts at the child, the parent and the root; the root whose
    budget it crosses takes its own limit-reached path at its next turn."""
    root = session(max_cost_usd=1.0)
    reply_turn(root, cost=0.1)
    child = root.spawn(sm.Settings())
    grandchild = child.spawn()
    reply_turn(grandchild, cost=0.5)
    reply_turn(child, cost=0.25)
    assert grandchild.cost_usd == 0.5
    assert child.cost_usd == pytest.approx(0.75)
    assert root.cost_usd == pytest.approx(0.85)
    assert root.own_cost_usd == pytest.approx(0.1)
    assert root.child_costs == {child.session_id: pytest.approx(0.75)}
    assert root.limit_reached is None
    reply_turn(grandchild, cost=0.2)
    assert root.cost_usd == pytest.approx(1.05)
    final = root.new_turn()
    assert final.final_answer and root.limit_reached is sm.SessionStatus.ERROR_MAX_BUDGET_USD
    assert "cost budget" in (final.instruction or "")


@pytest.mark.requirement("ER-81")
def test_a_child_cannot_outspend_its_ancestors_remaining_budget() -> None:
    """The child's remaining budget is min(its own, its ancestors'): it takes the
    limit-reached path when the parent's budget is spent, though it has none itself."""
    root = session(max_cost_usd=1.0)
    reply_turn(root, cost=0.4)
    child = root.spawn(sm.Settings(max_cost_usd=5.0))
    assert child.remaining_budget_usd == pytest.approx(0.6)
    sibling = root.spawn(sm.Settings())
    reply_turn(sibling, cost=0.5)  # a sibling's spend shrinks what is left to the child
    assert child.remaining_budget_usd == pytest.approx(0.1)
    reply_turn(child, cost=0.1)
    turn = child.new_turn()
    assert turn.final_answer
    assert child.limit_reached is sm.SessionStatus.ERROR_MAX_BUDGET_USD
    tight = root.spawn(sm.Settings(max_cost_usd=0.0))
    assert tight.remaining_budget_usd == pytest.approx(-0.0) or tight.remaining_budget_usd <= 0


@pytest.mark.requirement("ER-82")
def test_a_childs_spend_survives_snapshots_and_is_never_counted_twice() -> None:
    """A restored child keeps its ancestors' budget as recorded; reports of its total are
    a max-merge: repeated, late or out-of-order reports do not count twice."""
    clock = Clock()
    root = session(clock, max_cost_usd=1.0)
    child = root.spawn(sm.Settings())
    restored_child = sm.Session.restore(json.loads(json.dumps(child.snapshot())), clock=clock)
    assert restored_child.parent_id == root.session_id
    assert restored_child.remaining_budget_usd == pytest.approx(1.0)
    reply_turn(restored_child, cost=0.3)  # advanced elsewhere: no live parent
    assert root.cost_usd == 0.0
    restored_root = sm.Session.restore(json.loads(json.dumps(root.snapshot())), clock=clock)
    for total in (0.3, 0.3, 0.1, 0.3):  # repeated and late reports
        restored_root.record_child_spend(restored_child.session_id or "", total)
    assert restored_root.cost_usd == pytest.approx(0.3)
    reply_turn(restored_child, cost=0.8)  # now past the recorded ancestors' budget
    assert restored_child.new_turn().final_answer
    assert restored_child.limit_reached is sm.SessionStatus.ERROR_MAX_BUDGET_USD
    restored_root.record_child_spend(restored_child.session_id or "", restored_child.cost_usd)
    again = sm.Session.restore(json.loads(json.dumps(restored_root.snapshot())), clock=clock)
    assert again.cost_usd == pytest.approx(1.1)
    assert again.new_turn().final_answer
    with pytest.raises(sm.ConfigError, match=r"^total_usd"):
        again.record_child_spend("x", float("nan"))
    with pytest.raises(sm.ConfigError, match=r"^child_id"):
        again.record_child_spend("", 1.0)


# -- terminal tools (ER-83) -------------------------------------------------------------


@pytest.mark.requirement("ER-83")
def test_a_terminal_tool_that_succeeds_marks_the_loop_done() -> None:
    """A call marked terminates_turn that succeeds ends the loop after its round, whatever
    other calls the reply held; a failed one does not."""
    s = session()
    turn = tool_turn(s, [call(1, name="report", terminates_turn=True), call(2)])
    finish = turn.send(sm.ToolsDone((ok(1), failed(2, "execution_failed"))))
    assert (
        isinstance(finish, sm.Finish) and finish.done and finish.status is sm.TurnStatus.COMPLETED
    )
    assert turn.trace[-1].guard == "terminal_tool"
    turn = tool_turn(s, [call(3, name="report", terminates_turn=True)])
    finish = turn.send(sm.ToolsDone((failed(3, "execution_failed"),)))
    assert isinstance(finish, sm.Finish) and not finish.done
    turn = tool_turn(s, [call(4)])
    finish = turn.send(sm.ToolsDone((ok(4),)))
    assert isinstance(finish, sm.Finish) and not finish.done
    done = reply_turn(s)
    assert isinstance(done, sm.Finish) and done.done  # implicit done: no tool call


# -- the denial breaker and the windows (ER-84, ER-85) -----------------------------------


@pytest.mark.requirement("ER-84")
def test_consecutive_denials_trip_the_denial_breaker() -> None:
    """denial_threshold permission_denied outcomes in a row take the limit-reached path
    with error_denial_breaker; an allowed call in between resets the run."""
    s = session(denial_threshold=3)
    turn = tool_turn(s, [call(1), call(2)])
    turn.send(sm.ToolsDone((failed(1, "permission_denied"), failed(2, "permission_denied"))))
    assert s.denials == 2 and s.limit_reached is None
    turn = tool_turn(s, [call(3)])
    turn.send(sm.ToolsDone((ok(3),)))
    assert s.denials == 0
    turn = tool_turn(s, [call(4), call(5), call(6)])
    finish = turn.send(sm.ToolsDone(tuple(failed(i, "permission_denied") for i in (4, 5, 6))))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.BREAKER_OPEN
    assert len(finish.tool_results) == 3 and all(r.is_error for r in finish.tool_results)
    final = calling(s)
    assert final.final_answer and "denial breaker" in (final.instruction or "")
    final.send(sm.ModelReplied())
    assert s.status is sm.SessionStatus.ERROR_DENIAL_BREAKER


@pytest.mark.requirement("ER-85")
def test_sliding_windows_trip_the_breakers() -> None:
    """M denials among the last W outcomes trip the denial breaker, and M crashes of one
    provider among its last W rounds trip its crash breaker, with no run in a row."""
    s = session(denial_threshold=None, denial_window=4, denial_window_threshold=2)
    turn = tool_turn(s, [call(1), call(2)])
    turn.send(sm.ToolsDone((failed(1, "permission_denied"), ok(2))))
    assert s.limit_reached is None
    turn = tool_turn(s, [call(3), call(4)])
    finish = turn.send(sm.ToolsDone((ok(3), failed(4, "permission_denied"))))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.BREAKER_OPEN
    assert s.limit_reached is sm.SessionStatus.ERROR_DENIAL_BREAKER

    s = session(breaker_threshold=5, breaker_window=3, breaker_window_threshold=2)
    for i, crashed in enumerate((True, False, True)):
        turn = tool_turn(s, [call(i, provider="web")])
        outcome = failed(i, "process_crashed") if crashed else ok(i)
        finish = turn.send(sm.ToolsDone((outcome,)))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.BREAKER_OPEN
    assert s.tripped_providers == frozenset({"web"})
    assert s.limit_reached is sm.SessionStatus.ERROR_CIRCUIT_BREAKER

    s = session(breaker_threshold=5, breaker_window=2, breaker_window_threshold=2)
    for i, crashed in enumerate((True, False, True)):  # the first crash left the window
        turn = tool_turn(s, [call(i, provider="web")])
        outcome = failed(i, "process_crashed") if crashed else ok(i)
        finish = turn.send(sm.ToolsDone((outcome,)))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.COMPLETED
    with pytest.raises(sm.ConfigError, match=r"^denial_window_threshold: must be set together"):
        sm.Settings(denial_window=3)


# -- conflicts (ER-86) ------------------------------------------------------------------


@pytest.mark.requirement("ER-86")
def test_conflicts_are_reinvoked_one_at_a_time_after_a_backoff() -> None:
    """Two conflicting calls are re-invoked alone, in order, each after a Wait, counted;
    the results merge every call's latest outcome; a conflict that outlives the cap goes
    to the model as an error result."""
    s = session(max_conflict_retries=2)
    turn = tool_turn(s, [call(1), call(2), call(3)])
    action = turn.send(
        sm.ToolsDone((failed(1, "concurrency_conflict"), ok(2), failed(3, "concurrency_conflict")))
    )
    assert isinstance(action, sm.Wait)
    assert action.category is sm.ToolErrorCategory.CONCURRENCY_CONFLICT and action.attempt == 0
    assert 0 <= action.seconds <= 0.75
    action = turn.send(sm.WaitDone())
    assert action == sm.InvokeTools((call(1),))
    action = turn.send(sm.ToolsDone((failed(1, "concurrency_conflict"),)))
    assert isinstance(action, sm.Wait) and action.attempt == 1
    assert turn.send(sm.WaitDone()) == sm.InvokeTools((call(1),))
    action = turn.send(sm.ToolsDone((failed(1, "concurrency_conflict"),)))  # cap spent
    assert isinstance(action, sm.Wait) and action.attempt == 0  # now the next call
    assert turn.send(sm.WaitDone()) == sm.InvokeTools((call(3),))
    with pytest.raises(sm.IllegalEvent, match="c1"):
        turn.send(sm.ToolsDone((ok(1),)))  # only the call in flight answers
    finish = turn.send(sm.ToolsDone((ok(3),)))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.COMPLETED
    assert [(r.call_id, r.is_error) for r in finish.tool_results] == [
        ("c1", True),
        ("c2", False),
        ("c3", False),
    ]
    assert finish.tool_results[0].category is sm.ToolErrorCategory.CONCURRENCY_CONFLICT
    assert finish.tool_results[0].retryable
    assert s.tool_retries == 3


@pytest.mark.requirement("ER-86")
def test_a_conflict_wait_never_crosses_the_wall_clock_and_cancel_keeps_results() -> None:
    """A conflict whose wait would cross max_wall_clock_s goes to the model at once; a
    cancel mid-backoff keeps the settled results and cancels the rest."""
    clock = Clock()
    s = session(clock, max_wall_clock_s=10.0, base_delay_ms=20_000, max_delay_ms=20_000)
    turn = tool_turn(s, [call(1)])
    finish = turn.send(sm.ToolsDone((failed(1, "concurrency_conflict"),)))
    assert isinstance(finish, sm.Finish) and finish.tool_results[0].is_error
    s = session(clock)
    turn = tool_turn(s, [call(1), call(2)])
    assert isinstance(turn.send(sm.ToolsDone((ok(1), failed(2, "concurrency_conflict")))), sm.Wait)
    finish = turn.send(sm.Cancelled("user left"))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.CANCELLED
    assert [(r.call_id, r.is_error, r.category) for r in finish.tool_results] == [
        ("c1", False, None),
        ("c2", True, sm.ToolErrorCategory.CANCELLED),
    ]
    restored = sm.Session.restore(json.loads(json.dumps(s.snapshot())), clock=clock)
    assert restored.tool_retries == 1


# -- the second-tier doom check (ER-87) --------------------------------------------------


@pytest.mark.requirement("ER-87")
def test_a_second_tier_check_sees_the_window_and_can_fire_the_doom_loop() -> None:
    """The hook is consulted when the first tier is one identical call short and after
    every doom_check_window calls; True fires error_doom_loop; its exception changes
    nothing."""
    seen: list[tuple[str, ...]] = []

    def near_duplicates(calls: tuple[sm.ToolCall, ...]) -> bool:
        seen.append(tuple(c.id for c in calls))
        return len({c.name for c in calls}) == 1 and len(calls) >= 4

    s = sm.Session(
        sm.Settings(doom_check_window=4), seed=1, clock=Clock(), doom_check=near_duplicates
    )
    for i in range(3):  # same tool, different arguments: the first tier never counts
        turn = tool_turn(s, [sm.ToolCall(f"c{i}", "fs", "grep", {"q": i})])
        turn.send(sm.ToolsDone((ok(i),)))
    assert seen == [] and s.limit_reached is None
    turn = tool_turn(s, [sm.ToolCall("c3", "fs", "grep", {"q": 3})])
    assert seen == [("c0", "c1", "c2", "c3")]
    assert s.limit_reached is sm.SessionStatus.ERROR_DOOM_LOOP

    def broken(_calls: tuple[sm.ToolCall, ...]) -> bool:
        raise RuntimeError("judge unavailable")

    s = sm.Session(sm.Settings(doom_loop_threshold=3), seed=1, clock=Clock(), doom_check=broken)
    turn = tool_turn(s, [sm.ToolCall("a", "fs", "ls", {})])
    turn.send(sm.ToolsDone((sm.ToolOutcome("a", True),)))
    turn = calling(s)
    before = s.snapshot()
    with pytest.raises(RuntimeError, match="judge"):
        turn.send(sm.ModelReplied((sm.ToolCall("b", "fs", "ls", {}),)))  # one short: consulted
    assert s.snapshot() == before and turn.state == "calling"


@pytest.mark.requirement("ER-87")
def test_the_second_tier_verdict_is_a_field_of_the_reply_and_a_replay_asks_no_check() -> None:
    """The turn asks the check before the reply's step and sends its verdict in the reply:
    the trace keeps it (``False`` where none was due), and the recorded replies sent to
    a fresh session whose check must not be asked end in the same state."""
    asked: list[int] = []

    def judge(calls: tuple[sm.ToolCall, ...]) -> bool:
        asked.append(len(calls))
        return len(calls) >= 4

    def refuse(_calls: tuple[sm.ToolCall, ...]) -> bool:
        raise AssertionError("a replayed reply holds its verdict: no check is asked")

    def run(check: Any, replies: list[sm.ModelReplied] | None = None) -> list[Any]:
        s = sm.Session(sm.Settings(doom_check_window=4), seed=1, clock=Clock(), doom_check=check)
        sent = []
        for i in range(4):
            turn = calling(s)
            reply = (
                replies[i]
                if replies
                else sm.ModelReplied((sm.ToolCall(f"c{i}", "fs", "grep", {"q": i}),))
            )
            turn.send(reply)
            sent.append(turn.trace[-1].caused_by)
            if s.limit_reached is None:
                turn.send(sm.ToolsDone((ok(i),)))
        return [s.snapshot(), sent]

    snapshot, sent = run(judge)
    assert asked == [4]
    assert [r.doom_verdict for r in sent] == [False, False, False, True]
    assert snapshot["limit"] == "error_doom_loop"
    assert run(refuse, sent)[0] == snapshot
    assert run(None, sent)[0] == snapshot  # a host with no check replays the verdicts too
    assert "doom_verdict" not in repr(sent[-1])  # a reply prints as it always did


@pytest.mark.requirement("ER-87")
def test_a_hosts_own_verdict_is_taken_where_due_and_refused_elsewhere() -> None:
    """A session with no check takes a verdict the host puts in the reply (a check's
    window kept from then on): ``True`` where none is due is refused and changes
    nothing; ``turn.judged(reply, check)`` asks ``check`` where a verdict is due and
    gives the reply the turn would send, and its ``True`` fires the doom loop. Anything
    but a bool or ``None`` is refused when the reply is made."""
    s = sm.Session(sm.Settings(doom_check_window=2), seed=1, clock=Clock())
    turn = calling(s)
    before = s.snapshot()
    first = sm.ModelReplied((sm.ToolCall("c1", "fs", "ls", {"d": 1}),), doom_verdict=True)
    with pytest.raises(sm.IllegalEvent, match="doom_verdict is True, but no second-tier"):
        turn.send(first)  # the first call of a window of two: no verdict is due
    assert s.snapshot() == before and turn.state == "calling"
    unasked: list[int] = []
    first = turn.judged(sm.ModelReplied(first.tool_calls), lambda calls: bool(unasked.append(1)))
    assert first.doom_verdict is False and unasked == []
    turn.send(first)
    turn.send(sm.ToolsDone((sm.ToolOutcome("c1", True, "ok"),)))
    assert s.snapshot()["doom_since"] == 1  # the window kept: the reply said a check was there
    turn = calling(s)
    reply = sm.ModelReplied((sm.ToolCall("c2", "fs", "ls", {"d": 2}),))
    assert turn.judged(first, lambda calls: True) is first  # holds a verdict: kept as it is
    windows: list[tuple[str, ...]] = []
    judged = turn.judged(
        reply, lambda calls: bool(windows.append(tuple(c.id for c in calls))) or True
    )
    assert windows == [("c1", "c2")] and judged.doom_verdict is True
    assert reply.doom_verdict is None  # the host's reply is left as it was
    turn.send(judged)
    assert s.limit_reached is sm.SessionStatus.ERROR_DOOM_LOOP
    turn.send(sm.ToolsDone((sm.ToolOutcome("c2", True, "ok"),)))
    s.new_turn()
    with pytest.raises(sm.IllegalEvent, match="replaced by turn 3"):
        turn.judged(reply)  # as send: only the current turn takes a reply
    with pytest.raises(sm.InvalidValue, match="doom_verdict: must be True, False or None"):
        sm.ModelReplied(doom_verdict=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="judged: takes a ModelReplied"):
        turn.judged(sm.WaitDone())  # type: ignore[arg-type]


# -- billed failures (ER-88) -------------------------------------------------------------


@pytest.mark.requirement("ER-88")
def test_a_billed_failure_counts_toward_the_budget_and_every_cost_is_traced() -> None:
    """ModelFailed(cost=...) is charged like a reply; each event's cost is in the trace
    and survives a snapshot."""
    clock = Clock()
    s = session(clock, max_cost_usd=0.5)
    turn = calling(s)
    wait = turn.send(sm.ModelFailed(sm.ModelError("overloaded"), cost=0.25))
    assert isinstance(wait, sm.Wait)
    turn.send(sm.WaitDone())
    turn.send(sm.ModelFailed(sm.ModelError("unknown", "stream broke"), partial=True, cost=0.3))
    assert s.cost_usd == pytest.approx(0.55)
    assert [r.cost_usd for r in turn.trace] == [0.0, 0.0, 0.25, 0.0, 0.3]
    restored = sm.Session.restore(json.loads(json.dumps(s.snapshot())), clock=clock)
    assert [r.cost_usd for r in restored.current_turn.trace] == [0.0, 0.0, 0.25, 0.0, 0.3]  # type: ignore[union-attr]
    assert restored.new_turn().final_answer
    with pytest.raises(ValueError, match=r"^cost"):
        sm.ModelFailed(sm.ModelError("overloaded"), cost=-1.0)


# -- ending a session (ER-90) ------------------------------------------------------------


@pytest.mark.requirement("ER-90")
def test_a_host_ends_a_session_on_purpose_and_cancelling_cascades() -> None:
    """end() sets completed / cancelled / failed; cancelled cancels the running turn and
    every live child; completed refuses a running turn; an ended session takes no turn."""
    s = session()
    reply_turn(s)
    s.end()
    assert s.status is sm.SessionStatus.COMPLETED
    with pytest.raises(sm.SessionEnded):
        s.new_turn()
    with pytest.raises(sm.SessionEnded):
        s.end(sm.SessionStatus.FAILED)

    parent = session()
    child = parent.spawn()
    child_turn = tool_turn(child, [call(1)])
    turn = parent.new_turn()
    turn.start()
    with pytest.raises(sm.TurnInProgress):
        parent.end("completed")
    finish = parent.end("cancelled", reason="user pressed ctrl-c")
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.CANCELLED
    assert parent.status is sm.SessionStatus.CANCELLED
    assert child.status is sm.SessionStatus.CANCELLED
    assert child_turn.status is sm.TurnStatus.CANCELLED
    assert child_turn.finish is not None and child_turn.finish.tool_results[0].is_error
    restored = sm.Session.restore(json.loads(json.dumps(parent.snapshot())))
    assert restored.status is sm.SessionStatus.CANCELLED
    with pytest.raises(ValueError, match=r"^status"):
        session().end(sm.SessionStatus.ERROR_MAX_TURNS)


# -- tool error details (ER-91) and logging by shape (ER-92) -------------------------------


@pytest.mark.requirement("ER-91")
def test_tool_errors_carry_retryable_and_details() -> None:
    """retryable defaults from the category; details keep the raw error, through the
    engine to the ToolResult, and a driver's exception becomes its type and message."""
    assert sm.ToolOutcome("a", False, category="timeout").retryable
    assert not sm.ToolOutcome("a", False, category="permission_denied").retryable
    assert sm.ToolOutcome("a", False, category="unknown", retryable=True).retryable
    with pytest.raises(ValueError, match=r"^retryable"):
        sm.ToolOutcome("a", True, retryable=True)
    outcome = tool_failure(call(1), KeyError("token"))
    assert outcome.category is sm.ToolErrorCategory.UNKNOWN
    assert outcome.details == {"type": "builtins.KeyError", "message": "'token'"}
    s = session()
    turn = tool_turn(s, [call(1)])
    finish = turn.send(sm.ToolsDone((outcome,)))
    assert isinstance(finish, sm.Finish)
    assert finish.tool_results[0].details == outcome.details
    assert not finish.tool_results[0].retryable


@pytest.mark.requirement("ER-92")
def test_invalid_and_unknown_failures_are_logged_by_shape_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The log names the status, code and the request's shape, never its content."""
    private = "sk-live-SECRET and the user's private text"
    request = {"model": "m", "messages": [{"role": "user", "content": private}], "n": 1}
    for category, status in (("invalid_request", "invalid_request"), ("unknown", "unknown_error")):
        caplog.clear()
        turn = calling(session(), request)
        with caplog.at_level(logging.WARNING, logger="statemachine"):
            turn.send(sm.ModelFailed(sm.ModelError(category, f"echo: {private}", code="E42")))
        text = caplog.text
        assert status in text and "E42" in text
        assert "messages: list[1] of {role: str[4], content: str[" in text
        assert "SECRET" not in text and "private" not in text
    caplog.clear()
    turn = calling(session(), request)
    with caplog.at_level(logging.WARNING, logger="statemachine"):
        turn.send(sm.ModelFailed(sm.ModelError("auth_error", "bad key")))
    assert caplog.text == ""


# -- idle time (ER-93) ------------------------------------------------------------------


@pytest.mark.requirement("ER-93")
def test_idle_time_counts_toward_the_wall_clock_unless_the_setting_says_not() -> None:
    """By default the time between turns spends max_wall_clock_s; with
    wall_clock_counts_idle = false only the time inside turns does."""
    for counts_idle, fired in ((True, True), (False, False)):
        clock = Clock()
        s = session(clock, max_wall_clock_s=60.0, wall_clock_counts_idle=counts_idle)
        reply_turn(s)
        clock.now += 3600  # the user thinks for an hour
        turn = s.new_turn()
        assert turn.final_answer is fired
        assert s.idle_s == pytest.approx(3600)
    clock = Clock()
    s = session(clock, max_wall_clock_s=60.0, wall_clock_counts_idle=False)
    reply_turn(s)
    clock.now += 3600
    turn = s.new_turn()
    turn.start()
    clock.now += 61  # inside a turn, the clock counts
    turn.send(sm.Assembled("r", 1))
    turn.send(sm.ModelReplied())
    restored = sm.Session.restore(json.loads(json.dumps(s.snapshot())), clock=clock)
    assert restored.idle_s == pytest.approx(3600)
    assert restored.new_turn().final_answer


@pytest.mark.requirement("ER-86")
def test_the_drivers_wait_and_reinvoke_a_conflicting_call() -> None:
    """run_turn and arun_turn sleep through a conflict's Wait and re-invoke the call,
    without glue: the model sees only the final outcome."""
    import asyncio

    def script() -> Any:
        outcomes = iter(["conflict", "conflict", "ok"])

        def invoke(tool_call: sm.ToolCall) -> sm.ToolOutcome:
            if next(outcomes) == "conflict":
                return sm.ToolOutcome(tool_call.id, False, "locked", "concurrency_conflict")
            return sm.ToolOutcome(tool_call.id, True, "committed")

        return invoke

    class Model:
        def complete(self, _action: sm.CallModel) -> sm.ModelReplied:
            return sm.ModelReplied((sm.ToolCall("c1", "git", "commit"),))

    class Context:
        def assemble(self, _action: sm.Assemble) -> sm.Assembled:
            return sm.Assembled("request", 10)

    class Tools:
        def __init__(self) -> None:
            self.invoke = script()

    slept: list[float] = []
    finish = sm.run_turn(
        session().new_turn(), model=Model(), tools=Tools(), context=Context(), sleep=slept.append
    )
    assert finish.status is sm.TurnStatus.COMPLETED and not finish.tool_results[0].is_error
    assert len(slept) == 2

    class AsyncModel:
        async def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            return Model().complete(action)

    class AsyncContext:
        async def assemble(self, action: sm.Assemble) -> sm.Assembled:
            return Context().assemble(action)

    class AsyncTools:
        def __init__(self) -> None:
            self.sync = script()

        async def invoke(self, tool_call: sm.ToolCall) -> sm.ToolOutcome:
            return self.sync(tool_call)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    finish = asyncio.run(
        sm.arun_turn(
            session().new_turn(),
            model=AsyncModel(),
            tools=AsyncTools(),
            context=AsyncContext(),
            sleep=sleep,
        )
    )
    assert (
        finish.status is sm.TurnStatus.COMPLETED and finish.tool_results[0].content == "committed"
    )
    assert len(slept) == 4


# -- what a hostile review found (each a state the engine reached but could not restore,
#    or one it accepted but could never write) ---------------------------------------------


def roundtrip(s: sm.Session) -> sm.Session:
    return sm.Session.restore(json.loads(json.dumps(s.snapshot())))


@pytest.mark.requirement("ER-84")
@pytest.mark.requirement("ER-38")
def test_a_tripped_denial_breaker_restores_whatever_follows_in_its_round() -> None:
    """The counts stay where they tripped the breaker, so the snapshot restores."""
    s = session(denial_threshold=2)
    turn = tool_turn(s, [call(1), call(2), call(3)])
    turn.send(sm.ToolsDone((failed(1, "permission_denied"), failed(2, "permission_denied"), ok(3))))
    assert roundtrip(s).limit_reached is sm.SessionStatus.ERROR_DENIAL_BREAKER
    s = session(denial_threshold=None, denial_window=3, denial_window_threshold=2)
    turn = tool_turn(s, [call(1), call(2), call(3), call(4)])
    turn.send(
        sm.ToolsDone((failed(1, "permission_denied"), failed(2, "permission_denied"), ok(3), ok(4)))
    )
    assert roundtrip(s).limit_reached is sm.SessionStatus.ERROR_DENIAL_BREAKER


@pytest.mark.requirement("ER-90")
def test_an_ended_session_starts_no_turn_and_ids_are_checked() -> None:
    """An idle turn of an ended session refuses start(); a child id is registered at
    spawn (an unknown one is refused); default child ids skip a taken one."""
    s = session()
    turn = s.new_turn()
    s.end("completed")
    with pytest.raises(sm.SessionEnded):
        turn.start()
    assert roundtrip(s).status is sm.SessionStatus.COMPLETED
    parent = sm.Session(sm.Settings(), session_id="r")
    with pytest.raises(sm.ConfigError, match=r"^child_id: 'r\.1' is not a child"):
        parent.record_child_spend("r.1", 1.0)
    named = parent.spawn(session_id="r.2")
    unnamed = parent.spawn()
    assert (named.session_id, unnamed.session_id) == ("r.2", "r.3")
    assert parent.spawn().session_id == "r.4"
    assert roundtrip(parent).child_costs == {"r.2": 0.0, "r.3": 0.0, "r.4": 0.0}


@pytest.mark.requirement("ER-81")
def test_a_live_childs_snapshot_holds_its_ancestors_budget_as_it_is() -> None:
    """The snapshot of a live child records the ancestors' remaining budget at that
    moment, not the one at spawn."""
    parent = sm.Session(sm.Settings(max_cost_usd=1.0), session_id="r")
    child = parent.spawn()
    reply_turn(parent, cost=0.3)
    assert roundtrip(child).remaining_budget_usd == pytest.approx(0.7)


@pytest.mark.requirement("ER-83")
def test_a_terminal_tool_in_a_round_that_trips_a_breaker_is_not_done() -> None:
    """The breaker's final-answer turn must still run: the loop is not done."""
    s = session(breaker_threshold=1)
    turn = tool_turn(s, [call(1, name="report", terminates_turn=True), call(2, provider="web")])
    finish = turn.send(sm.ToolsDone((ok(1), failed(2, "process_crashed"))))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.BREAKER_OPEN
    assert not finish.done


def _reinvoking() -> dict[str, Any]:
    """A snapshot of a turn re-invoking c1 alone, c3 still pending."""
    s = session()
    turn = tool_turn(s, [call(1), call(2), call(3)])
    turn.send(
        sm.ToolsDone((failed(1, "concurrency_conflict"), ok(2), failed(3, "concurrency_conflict")))
    )
    turn.send(sm.WaitDone())
    return json.loads(json.dumps(s.snapshot()))  # type: ignore[no-any-return]


def _first_round() -> dict[str, Any]:
    s = session()
    tool_turn(s, [call(1), call(2)])
    return json.loads(json.dumps(s.snapshot()))  # type: ignore[no-any-return]


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize(
    ("make", "forge", "problem"),
    [
        (_reinvoking, lambda t: t.update(pending=["c3", "c1"]), "turn.in_flight"),
        (_first_round, lambda t: t.update(in_flight=t["in_flight"][:1]), "turn.in_flight"),
        (_reinvoking, lambda t: t.update(costs=[[2, 0.0]]), "turn.costs"),
    ],
)
def test_forged_tool_rounds_are_refused(make: Any, forge: Any, problem: str) -> None:
    """A re-invocation that is not the first pending call alone, a first round without
    all its calls in flight, a kept cost of nothing: refused, naming the key (they once
    restored, then raised KeyError on the next event)."""
    data = make()
    forge(data["turn"])
    with pytest.raises(sm.SnapshotError, match=rf"^{re.escape(problem)}"):
        sm.Session.restore(data)
