"""Engine behaviour the mutation runner found untested (``specs/mutation.md``).

A sampled run over ``statemachine/core/_engine.py`` left alive: the doom-loop count
after a tool-free reply reset to ``-1`` instead of ``0`` (an unreachable state a
snapshot refuses), a spend exactly at ``max_cost_usd`` not firing the budget, a cancel reason dropped
from the cancelled calls' results, and wrong ``IllegalEvent`` messages.
"""

from __future__ import annotations

import math

import pytest

import statemachine as sm

from .helpers import ManualClock, calling_turn, complete_turn, fail, new_session, tool_round


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


# -- the engine's full run (second session) --------------------------------------------


def _provider_call(i: int, provider: str = "web") -> sm.ToolCall:
    return sm.ToolCall(f"c{i}", provider, "fetch", {"n": i})


def _outcome(i: int, category: str | None = None) -> sm.ToolOutcome:
    if category is None:
        return sm.ToolOutcome(f"c{i}", ok=True)
    return sm.ToolOutcome(f"c{i}", ok=False, category=sm.ToolErrorCategory(category))


@pytest.mark.requirement("ER-19")
def test_a_wait_that_ends_exactly_at_the_wall_clock_bound_is_taken() -> None:
    """A retry-after that ends exactly at ``max_wall_clock_s`` fits the bound (only one
    that would cross it takes the limit-reached path)."""
    for retry_after, fits in ((10.0, True), (10.5, False)):
        session = new_session(max_wall_clock_s=10.0)
        turn = calling_turn(session)
        action = turn.send(fail("rate_limited", retry_after_seconds=retry_after))
        assert isinstance(action, sm.Wait) is fits, retry_after
        if isinstance(action, sm.Wait):
            assert action.seconds == 10.0


@pytest.mark.requirement("ER-20")
def test_a_server_wait_exactly_at_max_server_wait_s_is_honoured() -> None:
    """``max_server_wait_s`` is the longest wait honoured: a server asking for exactly
    that long is waited on; a second more and the turn finishes ``retry_deferred``."""
    for retry_after, honoured in ((300.0, True), (301.0, False)):
        session = new_session()
        turn = calling_turn(session)
        action = turn.send(fail("rate_limited", retry_after_seconds=retry_after))
        assert isinstance(action, sm.Wait) is honoured, retry_after
        if isinstance(action, sm.Wait):
            assert action.seconds == 300.0
        else:
            assert isinstance(action, sm.Finish)
            assert action.status is sm.TurnStatus.RETRY_DEFERRED


@pytest.mark.requirement("ER-39")
def test_the_waited_total_saturates_at_the_largest_float() -> None:
    """Waits add up in ``waited_s``, a JSON number: two waits of 1e308 s saturate it at
    the largest float instead of overflowing to infinity, and the session still
    snapshots."""
    import sys

    session = new_session(max_server_wait_s=1e308)
    turn = calling_turn(session)
    for _ in range(2):
        action = turn.send(fail("rate_limited", retry_after_seconds=1e308))
        assert isinstance(action, sm.Wait) and action.seconds == 1e308
        turn.send(sm.WaitDone())
    assert session.state.waited_s == sys.float_info.max
    assert session.snapshot()["waited_s"] == sys.float_info.max


@pytest.mark.requirement("ER-85")
def test_a_provider_whose_window_holds_no_crash_is_forgotten() -> None:
    """Once a provider's last ``breaker_window`` rounds hold no crash, its window is
    dropped from the state (it cannot trip from there): the snapshot keeps only the
    windows that still hold a crash."""
    session = new_session(breaker_threshold=5, breaker_window=2, breaker_window_threshold=2)
    tool_round(session, [_provider_call(0)], [_outcome(0, "process_crashed")])
    assert session.snapshot()["crash_logs"] == {"web": "1"}
    tool_round(session, [_provider_call(1)], [_outcome(1)])
    assert session.snapshot()["crash_logs"] == {"web": "10"}
    tool_round(session, [_provider_call(2)], [_outcome(2)])
    assert session.snapshot()["crash_logs"] in ({}, None)


@pytest.mark.requirement("ER-85")
def test_only_denials_count_in_the_denial_window() -> None:
    """``denial_window_threshold`` denials among the last ``denial_window`` outcomes trip
    the breaker; outcomes that were not denials count as none, so a denial whose
    predecessor left the window does not trip it."""
    session = new_session(denial_threshold=None, denial_window=4, denial_window_threshold=2)
    outcomes = ["permission_denied", None, None, None, None, "permission_denied"]
    for i, category in enumerate(outcomes):
        tool_round(session, [_provider_call(i)], [_outcome(i, category)])
        assert session.limit_reached is None, i
    assert session.snapshot()["denial_log"] == "0001"


@pytest.mark.requirement("ER-86")
def test_a_reinvoked_conflict_answers_for_itself_only() -> None:
    """Two conflicting calls, re-invoked one at a time: each re-invocation's outcome is
    that call's result, never the other pending call's."""
    session = new_session(max_conflict_retries=2)
    turn = calling_turn(session)
    calls = [_provider_call(i) for i in (1, 2, 3)]
    turn.send(sm.ModelReplied(tool_calls=calls))
    conflict = "concurrency_conflict"
    action = turn.send(sm.ToolsDone([_outcome(1, conflict), _outcome(2), _outcome(3, conflict)]))
    assert isinstance(action, sm.Wait)
    assert turn.send(sm.WaitDone()) == sm.InvokeTools((calls[0],))
    assert isinstance(turn.send(sm.ToolsDone([_outcome(1)])), sm.Wait)
    # what the turn holds meanwhile: c1's new outcome, c3's conflict still
    held = [(o["call_id"], o["ok"]) for o in session.snapshot()["turn"]["outcomes"]]
    assert held == [("c1", True), ("c2", True), ("c3", False)]
    assert turn.send(sm.WaitDone()) == sm.InvokeTools((calls[2],))
    finish = turn.send(sm.ToolsDone([_outcome(3)]))
    assert isinstance(finish, sm.Finish)
    assert [(r.call_id, r.is_error) for r in finish.tool_results] == [
        ("c1", False),
        ("c2", False),
        ("c3", False),
    ]


# the facts each guard and effect reads, as specs/table.md describes them: written out,
# so a mutated FACTS_OF_GUARD / FACTS_OF_EFFECT entry cannot move the expectation
_FACTS_OF_GUARD = [
    ("wait_fits", "_wait_facts"),
    ("server_wait_too_long", "_wait_facts"),
    ("wait_crosses_wall_clock", "_wait_facts"),
    ("trips_breaker", "_tool_facts"),
    ("trips_denial_breaker", "_tool_facts"),
    ("conflict_retry", "_tool_facts"),
    ("terminal_tool", "_tool_facts"),
]
_FACTS_OF_EFFECT = [
    ("wait", "_wait_facts"),
    ("finish_tools", "_tool_facts"),
    ("tool_wait", "_tool_facts"),
    ("invoke_tools", "_doom_facts"),
]


@pytest.mark.requirement("ER-35")
@pytest.mark.parametrize(("name", "facts"), _FACTS_OF_GUARD)
def test_each_guard_that_reads_facts_gets_them_on_a_row_of_its_own(name: str, facts: str) -> None:
    """In the shipped table several guards of one group read the same facts, so a
    guard that lost its facts would go unnoticed there; the model check's mutated
    tables put a guard on a row alone, where it must still get them."""
    from statemachine.core import _engine
    from statemachine.core._table import Row

    row = Row("calling", "ModelFailed", (name,), "failed", "finish", "unknown_error")
    group = _engine.Dispatch([row]).groups[("calling", "ModelFailed", None)]
    assert group.facts is getattr(_engine, facts)
    plain = _engine.Dispatch(
        [Row("calling", "ModelFailed", (), "failed", "finish", "unknown_error")]
    )
    assert plain.groups[("calling", "ModelFailed", None)].facts is None


@pytest.mark.requirement("ER-35")
@pytest.mark.parametrize(("name", "facts"), _FACTS_OF_EFFECT)
def test_each_effect_that_reads_facts_gets_them_whatever_its_guards(name: str, facts: str) -> None:
    from statemachine.core import _engine
    from statemachine.core._table import Row

    row = Row("calling", "ToolsDone", (), "calling", name)
    group = _engine.Dispatch([row]).groups[("calling", "ToolsDone", None)]
    assert group.facts is getattr(_engine, facts)


def _doom_session(
    seen: list[int], verdict: object = False, clock: ManualClock | None = None, **settings: object
) -> sm.Session:
    def check(window: object) -> object:
        seen.append(len(window))  # type: ignore[arg-type]
        return verdict

    return sm.Session(
        sm.Settings(**settings),  # type: ignore[arg-type]
        seed=7,
        clock=clock or ManualClock(),
        doom_check=check,  # type: ignore[arg-type]
    )


@pytest.mark.requirement("ER-87")
def test_the_second_tier_check_runs_once_every_doom_check_window_calls() -> None:
    """With distinct calls (the first tier never close to firing), the host's check is
    consulted after every ``doom_check_window`` calls: at the 3rd, 6th and 9th."""
    seen: list[int] = []
    session = _doom_session(seen, doom_check_window=3, doom_loop_threshold=50)
    consulted = []
    for i in range(9):
        tool_round(session, [_provider_call(i)], [_outcome(i)])
        consulted.append(len(seen))
    assert consulted == [0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert seen == [3, 3, 3]


@pytest.mark.requirement("ER-87")
def test_a_doom_check_that_returns_no_bool_is_refused_and_nothing_changes() -> None:
    seen: list[int] = []
    session = _doom_session(seen, verdict="yes", doom_check_window=2, doom_loop_threshold=50)
    tool_round(session, [_provider_call(0)], [_outcome(0)])
    before = session.snapshot()
    turn = calling_turn(session)
    with pytest.raises(TypeError, match=r"^doom_check: must return a bool, got str"):
        turn.send(sm.ModelReplied(tool_calls=[_provider_call(1)]))
    assert turn.state == "calling"
    assert session.snapshot()["doom_since"] == before["doom_since"]


@pytest.mark.requirement("ER-87")
def test_a_final_answer_reply_with_tool_calls_leaves_the_doom_detector_alone() -> None:
    """The final-answer turn withholds tools; a model that calls one anyway completes
    the turn, and neither tier looks at that call: the run of identical calls and the
    host's check stay as they were."""
    seen: list[int] = []
    session = _doom_session(seen, max_turns=1, doom_loop_threshold=2, doom_check_window=5)
    tool_round(session, [_provider_call(0)], [_outcome(0)])
    assert session.limit_reached is sm.SessionStatus.ERROR_MAX_TURNS
    doom = {k: v for k, v in session.snapshot().items() if k.startswith("doom")}
    turn = calling_turn(session)
    finish = turn.send(sm.ModelReplied(tool_calls=[_provider_call(1)]))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.COMPLETED
    assert {k: v for k, v in session.snapshot().items() if k.startswith("doom")} == doom
    assert seen == [1]  # consulted on the first turn only (one call short of firing)


@pytest.mark.requirement("ER-86")
def test_a_conflict_that_goes_to_the_model_leaves_nothing_pending() -> None:
    """A conflict whose backoff would cross the wall clock is answered at once; the
    finished turn holds no pending re-invocation."""
    clock = ManualClock()
    session = new_session(
        clock=clock, max_wall_clock_s=10.0, base_delay_ms=20_000, max_delay_ms=20_000
    )
    turn = calling_turn(session)
    turn.send(sm.ModelReplied(tool_calls=[_provider_call(1)]))
    finish = turn.send(sm.ToolsDone([_outcome(1, "concurrency_conflict")]))
    assert isinstance(finish, sm.Finish) and finish.tool_results[0].is_error
    snapshot = session.snapshot()
    assert snapshot["turn"]["pending"] == []


@pytest.mark.parametrize(
    ("value", "shape"),
    [
        (None, "null"),
        (True, "bool"),
        (3, "int"),
        (2.5, "float"),
        ("secret text", "str[11]"),
        ([], "list[0]"),
        (("a", "b"), "list[2] of str[1]"),
        ({"model": "m", "max_tokens": 5}, "{model: str[1], max_tokens: int}"),
        ({"two words": 1, 7: 2, "k" * 40: 3, "k" * 41: 4}, "{?: int, ?: int, " + "k" * 40 + ": int, ?: int}"),
        ({"a": {"b": {"c": {"d": {"e": 1}}}}}, "{a: {b: {c: {d: dict}}}}"),
        ([[[[["deep"]]]]], "list[1] of list[1] of list[1] of list[1] of list"),
        ({f"k{i}": i for i in range(21)}, "{" + ", ".join(f"k{i}: int" for i in range(20)) + ", ...+1}"),
        ({f"k{i}": i for i in range(20)}, "{" + ", ".join(f"k{i}: int" for i in range(20)) + "}"),
        (b"raw", "bytes"),
    ],
)  # fmt: skip
@pytest.mark.requirement("ER-92")
def test_a_request_shape_shows_types_keys_and_sizes_never_content(
    value: object, shape: str
) -> None:
    """What a log may show of a request: strings by length, identifier-like keys (at
    most 40 characters) by name and others as ``?``, 20 keys then a count, four levels."""
    from statemachine.core._engine import request_shape

    assert request_shape(value) == shape


@pytest.mark.requirement("ER-92")
def test_an_invalid_request_is_logged_with_the_request_shape_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failure a human must look at (invalid_request, unknown) is logged as a warning
    naming the status, code and the request's shape, never the request's content."""
    session = new_session()
    turn = calling_turn(session, request={"messages": [{"content": "my password is hunter2"}]})
    with caplog.at_level("WARNING", logger="statemachine"):
        turn.send(fail("invalid_request", code="bad_field", status=400))
    [record] = [r for r in caplog.records if r.name == "statemachine"]
    text = record.getMessage()
    assert "invalid_request (code=bad_field, status=400" in text
    assert "request shape: {messages: list[1] of {content: str[22]}}" in text
    assert "hunter2" not in text
    caplog.clear()
    with caplog.at_level("WARNING", logger="statemachine"):
        calling_turn(new_session()).send(fail("auth_error"))
    assert not [r for r in caplog.records if r.name == "statemachine"]


@pytest.mark.requirement("ER-27")
@pytest.mark.parametrize(
    ("calls", "answered", "problem"),
    [
        (1, [], "no outcome for call id(s) 'c0'"),
        (1, [0, 0], "two outcomes for call id 'c0'"),
        (2, [0], "no outcome for call id(s) 'c1'"),
        (2, [0, 0], "two outcomes for call id 'c0'"),
        (2, [0, 1, 2], "outcome for unknown call id 'c2'"),
    ],
)
def test_tools_done_must_answer_each_call_in_flight_once(
    calls: int, answered: list[int], problem: str
) -> None:
    """However many calls are in flight (the one-call round has a fast path), a
    ToolsDone with a missing, duplicate or unknown outcome is refused, naming it, and
    the turn still waits for a proper one."""
    session = new_session()
    turn = calling_turn(session)
    turn.send(sm.ModelReplied(tool_calls=[_provider_call(i) for i in range(calls)]))
    with pytest.raises(sm.IllegalEvent) as refused:
        turn.send(sm.ToolsDone([_outcome(i) for i in answered]))
    assert str(refused.value) == f"ToolsDone in state 'invoking_tools': {problem}"
    assert turn.state == "invoking_tools"
    assert isinstance(turn.send(sm.ToolsDone([_outcome(i) for i in range(calls)])), sm.Finish)


@pytest.mark.requirement("ER-39")
def test_a_failed_call_whose_cost_would_overflow_the_spend_is_refused() -> None:
    """A ModelFailed reports the failed attempt's cost like a reply does: one that would
    take the session's spend past the largest float is refused before anything
    changes."""
    session = new_session()
    turn = calling_turn(session)
    turn.send(sm.ModelFailed(sm.ModelError("rate_limited"), cost=1.7e308))
    turn.send(sm.WaitDone())
    with pytest.raises(sm.IllegalEvent, match="past the largest float"):
        turn.send(sm.ModelFailed(sm.ModelError("rate_limited"), cost=1.7e308))
    assert turn.state == "calling"
    assert session.cost_usd == 1.7e308


_TAIL = (
    "Tools are no longer available. Do not call any tool: reply now with your final "
    "answer, based on what you have so far."
)


@pytest.mark.requirement("ER-16")
@pytest.mark.parametrize(
    ("limit", "what"),
    [
        ("error_max_turns", "the maximum number of turns (3)"),
        ("error_max_budget_usd", "the cost budget ($2.5)"),
        ("error_max_wall_clock", "the wall-clock budget (90 s)"),
        ("error_circuit_breaker", "a tool provider's circuit breaker (repeated crashes)"),
        ("error_doom_loop", "the repeated-tool-call guard (the same call over and over)"),
        ("error_denial_breaker", "the denial breaker (tool calls denied over and over)"),
    ],
)
def test_the_final_answer_instruction_names_the_limit_that_fired(limit: str, what: str) -> None:
    from statemachine.core._engine import final_answer_instruction

    settings = sm.Settings(max_turns=3, max_cost_usd=2.5, max_wall_clock_s=90)
    text = final_answer_instruction(sm.SessionStatus(limit), settings)
    assert text == f"This session has reached {what}. {_TAIL} [limit: {limit}]"


@pytest.mark.requirement("ER-97")
def test_each_transition_is_timed_on_the_session_clock_for_trace_and_observers() -> None:
    """A transition's time is the session clock when it was taken: ``Turn.trace`` and
    an observer's record carry the same absolute reading (``TraceRecord.at``), the
    snapshot the offset from the session's start."""
    clock = ManualClock(1000.0)
    seen: list[sm.TraceRecord] = []
    session = sm.Session(sm.Settings(), seed=7, clock=clock, observers=[seen.append])
    clock.advance(5.0)
    turn = session.new_turn()
    turn.start()
    clock.advance(2.0)
    turn.send(sm.Assembled("req", 10))
    clock.advance(3.0)
    turn.send(sm.ModelReplied())
    assert [r.at for r in turn.trace] == [1005.0, 1007.0, 1010.0]
    assert [r.at for r in seen] == [1005.0, 1007.0, 1010.0]
    assert session.snapshot()["turn"]["times"] == [5.0, 7.0, 10.0]


@pytest.mark.requirement("ER-15")
def test_the_first_limit_to_fire_is_the_one_kept() -> None:
    """One tool round that trips the crash breaker and the denial breaker at once: the
    crash breaker fired first, and it is what the session reports."""
    session = new_session(breaker_threshold=1, denial_threshold=1)
    calls = [_provider_call(1, "web"), _provider_call(2, "fs")]
    finish = tool_round(
        session, calls, [_outcome(1, "process_crashed"), _outcome(2, "permission_denied")]
    )
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.BREAKER_OPEN
    assert session.limit_reached is sm.SessionStatus.ERROR_CIRCUIT_BREAKER


@pytest.mark.requirement("ER-80")
def test_a_completed_parent_leaves_its_live_children_running() -> None:
    """Ending a session ``completed`` ends it alone (its children may finish their own
    work); ending it ``cancelled`` or ``failed`` ends every live child, cancelled."""
    parent = new_session()
    child = parent.spawn()
    parent.end("completed")
    assert child.status is None
    other = new_session()
    kid = other.spawn()
    other.end("failed", reason="gave up")
    assert kid.status is sm.SessionStatus.CANCELLED


@pytest.mark.requirement("ER-39")
def test_a_parents_spend_saturates_when_its_children_add_up_past_the_largest_float() -> None:
    """Each session refuses a cost that would overflow its own spend, but a parent adds
    its children's: two children of 1e308 each leave the parent at the largest float,
    still a number a snapshot can hold."""
    import sys

    parent = new_session()
    for _ in range(2):
        child = parent.spawn()
        turn = calling_turn(child)
        turn.send(sm.ModelReplied(cost=1e308))
    assert parent.cost_usd == sys.float_info.max
    assert parent.snapshot()["cost_usd"] == sys.float_info.max


@pytest.mark.requirement("ER-80")
def test_child_spend_reports_count_once_each_and_never_backwards() -> None:
    """Reports carry a child's total: what is new is charged, a repeated or a lower
    (late) total changes nothing, and each child's total is kept apart from its
    siblings'."""
    parent = sm.Session(sm.Settings(), seed=1, clock=ManualClock(), session_id="root")
    a, b = parent.spawn(), parent.spawn()
    assert (a.session_id, b.session_id) == ("root.1", "root.2")
    parent.record_child_spend("root.1", 0.5)
    parent.record_child_spend("root.2", 0.25)
    parent.record_child_spend("root.1", 0.5)  # repeated
    parent.record_child_spend("root.1", 0.375)  # late
    assert parent.cost_usd == 0.75
    assert parent.snapshot()["child_costs"] == {"root.1": 0.5, "root.2": 0.25}
    parent.record_child_spend("root.2", 1.0)
    assert parent.cost_usd == 1.5


@pytest.mark.requirement("ER-80")
def test_ending_a_parent_cancels_only_live_children_with_the_reason() -> None:
    """A child that already ended is left as it is; a running child's turn is
    cancelled with the parent's reason (``parent ended`` when none was given)."""
    for reason, content in (
        ("budget cut", "cancelled: budget cut"),
        ("", "cancelled: parent ended"),
    ):
        parent = new_session()
        done = parent.spawn()
        done.end("completed")
        running = parent.spawn()
        turn = calling_turn(running)
        turn.send(sm.ModelReplied(tool_calls=[_provider_call(1)]))
        parent.end("failed", reason=reason)
        assert done.status is sm.SessionStatus.COMPLETED
        assert running.status is sm.SessionStatus.CANCELLED
        finish = turn.finish
        assert finish is not None and finish.status is sm.TurnStatus.CANCELLED
        assert finish.tool_results[0].content == content


@pytest.mark.requirement("ER-93")
def test_idle_time_is_what_passed_between_finish_and_start_never_less_than_zero() -> None:
    clock = ManualClock()
    session = new_session(clock=clock)
    complete_turn(session)
    clock.advance(0.25)
    session.new_turn().start()
    assert session.snapshot()["idle_s"] == 0.25
    session.current_turn.send(sm.Assembled("r", 1))  # type: ignore[union-attr]
    session.current_turn.send(sm.ModelReplied())  # type: ignore[union-attr]
    clock.advance(-2.0)  # a clock that went backwards counts no idle time
    session.new_turn().start()
    assert session.snapshot()["idle_s"] == 0.25


@pytest.mark.requirement("ER-32")
def test_a_conflicts_waits_add_up_in_waited_s() -> None:
    """A conflicting tool call's backoff is a wait like a model retry's: each one's
    seconds are added to ``waited_s`` (not the saturated maximum), one jitter draw each."""
    session = new_session()
    turn = calling_turn(session)
    turn.send(sm.ModelReplied(tool_calls=[_search(1)]))
    conflict = sm.ToolErrorCategory.CONCURRENCY_CONFLICT
    waits = []
    for _ in range(2):
        wait = turn.send(sm.ToolsDone((sm.ToolOutcome("c1", False, "busy", category=conflict),)))
        assert isinstance(wait, sm.Wait) and 0 < wait.seconds < 60
        waits.append(wait.seconds)
        assert isinstance(turn.send(sm.WaitDone()), sm.InvokeTools)
    assert session.waited_s == pytest.approx(sum(waits))
    assert session.state.draws == 2


@pytest.mark.requirement("ER-92")
def test_a_logged_failure_names_its_turn_and_attempt_each_in_its_place(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The warning of an unknown error on the third turn's second attempt says
    ``turn=3, attempt=1`` (and the model), not the two numbers the other way round."""
    session = new_session(model="m")
    for _ in range(2):
        complete_turn(session)
    turn = calling_turn(session)
    turn.send(fail("overloaded"))
    turn.send(sm.WaitDone())
    with caplog.at_level("WARNING", logger="statemachine"):
        turn.send(fail("unknown", code="weird"))
    [record] = [r for r in caplog.records if r.name == "statemachine"]
    assert "unknown_error (code=weird, status=None, model=m, turn=3, attempt=1)" in (
        record.getMessage()
    )


@pytest.mark.requirement("ER-32")
def test_an_http_date_retry_after_is_read_against_the_steps_wall_time() -> None:
    """``send(..., wall=...)``: the Unix time a step gives is what an HTTP-date
    ``retry-after`` is measured from (7 s before the date: a wait of 7 s)."""
    from datetime import UTC, datetime
    from email.utils import format_datetime

    date = datetime(2026, 12, 2, 6, 0, 10, tzinfo=UTC)
    turn = calling_turn(new_session())
    headers = {"retry-after": format_datetime(date, usegmt=True)}
    wait = turn.send(fail("rate_limited", headers=headers), wall=date.timestamp() - 7)
    assert isinstance(wait, sm.Wait)
    assert (wait.seconds, wait.retry_after) == (7.0, 7.0)


@pytest.mark.requirement("ER-144")
def test_a_finish_hands_back_the_hosts_own_reply_object() -> None:
    """A reply given as an SDK object (here one with ``model_dump``) comes back in the
    turn's ``Finish`` as that very object, its JSON form beside it in ``reply_data``
    (``test_boundary.py`` proves it per vendor; that file is not among the engine's
    mutation tests)."""

    class Reply:
        def model_dump(self, mode: str = "json") -> dict[str, str]:
            return {"text": "hi"}

    reply = Reply()
    finish = calling_turn(new_session()).send(sm.ModelReplied(reply=reply))
    assert isinstance(finish, sm.Finish)
    assert finish.reply is reply
    assert finish.reply_data == {"text": "hi"}
    # a tool round's Finish finds the reply that asked for the tools, kept (once the
    # reply's step was taken) beside the wall time it was given
    turn = calling_turn(new_session())
    event = sm.ModelReplied(reply=reply, tool_calls=[_search(1)])
    assert isinstance(turn.send(event, wall=1_764_633_600.0), sm.InvokeTools)
    finish = turn.send(sm.ToolsDone((sm.ToolOutcome("c1", ok=True),)))
    assert isinstance(finish, sm.Finish)
    assert finish.reply is reply


@pytest.mark.requirement("ER-38")
def test_a_restored_turn_takes_no_step_before_its_last_one() -> None:
    """A snapshot whose turn's last step came 5 s after the start: restored, that step is
    the session's last reading, and a step given an earlier moment is taken at it (the
    times never run backwards, so the next snapshot restores too)."""
    clock = ManualClock(0.0)
    session = sm.Session(sm.Settings(), seed=1, clock=clock)
    turn = session.new_turn()
    turn.start()
    clock.advance(5)
    turn.send(sm.Assembled({"m": 1}, 5))
    restored = sm.Session.restore(session.snapshot(), clock=ManualClock(100.0))
    assert (restored.started, restored.last_at) == (95.0, 100.0)
    current = restored.current_turn
    assert current is not None
    assert isinstance(current.send(sm.ModelReplied(), at=97.0), sm.Finish)
    assert [record.at for record in current.trace] == [95.0, 100.0, 100.0]
    assert restored.snapshot()["turn"]["times"] == [0.0, 5.0, 5.0]
    sm.Session.restore(restored.snapshot(), clock=ManualClock(200.0))


@pytest.mark.requirement("ER-70")
def test_only_a_failure_with_headers_needs_the_steps_wall_time() -> None:
    """What the store's worker journals a wall time for: a failure whose headers may hold
    an HTTP-date ``retry-after``; not one without headers, nor any other event."""
    from statemachine.core._engine import needs_wall

    assert needs_wall(fail("rate_limited", headers={"retry-after": "5"}))
    assert not needs_wall(fail("rate_limited"))
    assert not needs_wall(sm.ModelReplied())
    assert not needs_wall(sm.WaitDone())


@pytest.mark.requirement("ER-23")
def test_a_retry_after_the_first_fallback_calls_that_fallback() -> None:
    """After moving to the first fallback model (index 0), a rate limit's retry calls
    that model again, not the primary (a sampled run left ``index < 0`` -> ``<= 0``
    alive in the retry)."""
    turn = calling_turn(new_session(max_retries=0, fallback_models=("b",), model="a"))
    assert turn.send(fail("overloaded")) == sm.CallModel("req-1", 0, "b", False)
    session = new_session(max_retries=1, fallback_models=("b", "c"), model="a")
    turn = calling_turn(session)
    turn.send(fail("overloaded"))
    turn.send(sm.WaitDone())
    assert turn.send(fail("overloaded")) == sm.CallModel("req-1", 0, "b", False)
    assert isinstance(turn.send(fail("rate_limited")), sm.Wait)
    assert turn.send(sm.WaitDone()) == sm.CallModel("req-1", 1, "b", False)


@pytest.mark.requirement("ER-140")
@pytest.mark.parametrize("wall", [math.nan, math.inf, -math.inf])
def test_a_steps_wall_time_that_is_not_finite_is_refused(wall: float) -> None:
    """A step given a wall time that is not a finite number is refused naming ``wall``,
    and the turn is where it was (a sampled run left the refusal's ``raise`` deletable
    under the engine's own tests)."""
    turn = calling_turn(new_session())
    with pytest.raises(ValueError, match="wall: must be a finite number of seconds"):
        turn.send(fail("rate_limited", headers={"retry-after": "1"}), wall=wall)
    assert turn.state == "calling" and turn.attempt == 0


@pytest.mark.requirement("ER-35")
def test_a_moment_given_as_an_int_is_read_and_a_non_number_is_refused_naming_at() -> None:
    """``at`` may be any real number of seconds (an int read as its float); a bool or a
    numeric string is no moment: ``TypeError`` naming ``at``, and the turn is as it was."""
    session = sm.Session(seed=1, clock=ManualClock(0.0))
    turn = session.new_turn()
    turn.start(at=5)
    assert turn.trace[0].at == 5.0 and type(turn.trace[0].at) is float
    for bad in (True, "6"):
        with pytest.raises(TypeError, match=rf"^at: must be a number of seconds, got {bad!r}"):
            turn.send(sm.Assembled("r", 1), at=bad)  # type: ignore[arg-type]
        assert turn.state == "assembling" and len(turn.trace) == 1
    turn.send(sm.Assembled("r", 1), at=7)
    assert turn.trace[-1].at == 7.0
