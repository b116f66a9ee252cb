"""What restore decides about a forged snapshot (``core/_reachable.py``), rule by rule.

An outside mutation sample (issue 28) found rules of the reachable-state check that no
test reached: each is here, a real snapshot with one field forged, refused with the
rule's own message, and its boundary (the largest value the engine can reach) still
restored, so a check made strict or loose, or deleted, fails a test."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

import statemachine as sm

from .helpers import ManualClock, fail

SETTINGS = sm.Settings(
    breaker_window=5,
    breaker_window_threshold=3,
    max_retries=2,
    fallback_models=("b",),
    max_cost_usd=10,
)


def _snapshot() -> dict[str, Any]:
    """A finished turn that retried once, replied with a cost and a tool call, and saw
    the tool's provider crash once (a crash window kept)."""
    session = sm.Session(SETTINGS, seed=1, clock=ManualClock(), session_id="s")
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    turn.send(fail("rate_limited"))
    turn.send(sm.WaitDone())
    turn.send(sm.ModelReplied(cost=0.5, tool_calls=[sm.ToolCall("c1", "fs", "read", {})]))
    crashed = sm.ToolOutcome("c1", False, "x", category=sm.ToolErrorCategory.PROCESS_CRASHED)
    turn.send(sm.ToolsDone((crashed,)))
    data: dict[str, Any] = json.loads(json.dumps(session.snapshot()))
    return data


def _restores(data: dict[str, Any]) -> bool:
    sm.Session.restore(data, clock=ManualClock())
    return True


Forgery = Callable[[dict[str, Any]], None]

_ASSEMBLE = {"$type": "Assemble", "reduce": False, "withhold_tools": False, "instruction": None}

FORGED: dict[str, tuple[Forgery, str]] = {
    "a crash log with no crash": (
        lambda d: d.__setitem__("crash_logs", {"fs": "00"}),
        r"^crash_logs\.fs: not a window of recent crashes",
    ),
    "a crash log longer than the window": (
        lambda d: d.__setitem__("crash_logs", {"fs": "100001"}),
        r"^crash_logs\.fs: not a window of recent crashes",
    ),
    "a crash log at the window's count, not tripped": (
        lambda d: d.__setitem__("crash_logs", {"fs": "10101"}),
        r"^crash_logs\.fs: its crashes reach the window's count, not tripped",
    ),
    "an attempt over max_retries": (
        lambda d: d["turn"].__setitem__("attempt", 3),
        r"^turn\.attempt: 3 is over max_retries",
    ),
    "a turn that spent more than the session": (
        lambda d: d["turn"].__setitem__("costs", [[4, 0.9]]),
        r"^turn\.costs: the turn spent more than the session's spend",
    ),
    "counters that do not follow the path": (
        lambda d: d["turn"]["path"][3].__setitem__(4, 0),
        r"^turn\.path\[3\]: counters \(0, 0, 1\) after retry, where the effect leaves \(1, 0, 1\)",
    ),
    "an action of the wrong type": (
        lambda d: d["turn"]["actions"].__setitem__(2, dict(_ASSEMBLE)),
        r"^turn\.actions\[2\]: a Assemble for effect wait",
    ),
    "a CallModel withholding tools in a plain turn": (
        lambda d: d["turn"]["actions"][1].__setitem__("withhold_tools", True),
        r"^turn\.actions\[1\]: CallModel withhold_tools does not fit the turn",
    ),
    "an Assemble withholding tools in a plain turn": (
        lambda d: d["turn"]["actions"][0].__setitem__("withhold_tools", True),
        r"^turn\.actions\[0\]: the final-answer flags do not fit the turn",
    ),
    "an Assemble with an instruction in a plain turn": (
        lambda d: d["turn"]["actions"][0].__setitem__("instruction", "answer now"),
        r"^turn\.actions\[0\]: the final-answer flags do not fit the turn",
    ),
    "a final-answer flag without the instruction": (
        lambda d: d["turn"].__setitem__("final_answer", True),
        r"^turn\.instruction: a final-answer turn has an instruction, and only it",
    ),
    "a final-answer turn with no limit fired": (
        lambda d: d["turn"].update(final_answer=True, instruction="answer now"),
        r"^turn\.final_answer: a final-answer turn, but no limit has fired",
    ),
    "a CallModel to a model the settings do not name": (
        lambda d: d["turn"]["actions"][1].__setitem__("model", "zzz"),
        r"^turn\.actions\[1\]: CallModel to a model the settings do not name",
    ),
    "a CallModel whose attempt is not the step's": (
        lambda d: d["turn"]["actions"][3].__setitem__("attempt", 0),
        r"^turn\.actions\[3\]: CallModel attempt 0, the step says 1",
    ),
    "a Wait whose attempt is not the step's": (
        lambda d: d["turn"]["actions"][2].__setitem__("attempt", 1),
        r"^turn\.actions\[2\]: Wait attempt 1, not the step's",
    ),
    "a wait the settings cannot ask for": (
        lambda d: d["turn"]["actions"][2].__setitem__("seconds", 1e308),
        r"^turn\.actions\[2\]: a wait of 1e\+308 s the settings cannot ask for",
    ),
    "a wait shorter than the retry-after it honours": (
        lambda d: d["turn"]["actions"][2].__setitem__("retry_after", 100.0),
        r"^turn\.actions\[2\]: a wait shorter than the retry-after it honours",
    ),
    "a cost kept for a step that is no model call's outcome": (
        lambda d: d["turn"].__setitem__("costs", [[3, 0.5]]),
        r"^turn\.costs\[0\]: step 3 is no model call's outcome",
    ),
    "a cost of nothing kept": (
        lambda d: d["turn"].__setitem__("costs", [[4, 0.0]]),
        r"^turn\.costs\[0\]: an event that cost nothing is not kept",
    ),
    "a breaker count at the threshold, not tripped": (
        lambda d: d.__setitem__("breakers", {"fs": 3}),
        r"^breakers\.fs: 3 crashes reach the threshold but it is not tripped",
    ),
    "more jitter draws than retries": (
        lambda d: d.__setitem__("draws", 2),
        r"^draws: 2 jitter draws for 1 retries and 0 tool re-invocations",
    ),
    "a turn index that is not the latest": (
        lambda d: d.__setitem__("turns", 2),
        r"^turn\.index: 1 is not the session's latest turn \(2\)",
    ),
}


@pytest.mark.requirement("ER-38")
def test_the_snapshot_the_forgeries_start_from_restores() -> None:
    """The unforged snapshot is one the engine reached: it restores."""
    assert _restores(_snapshot())


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize("name", sorted(FORGED))
def test_a_forged_snapshot_is_refused_by_the_rule_it_breaks(name: str) -> None:
    """Each forgery is a SnapshotError whose message is the broken rule's, naming the
    key; the snapshot it was forged from is left as it was."""
    forge, message = FORGED[name]
    data = _snapshot()
    forge(data)
    before = copy.deepcopy(data)
    with pytest.raises(sm.SnapshotError, match=message):
        sm.Session.restore(data, clock=ManualClock())
    assert data == before


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize(
    ("name", "forge"),
    [
        (
            "a crash log as long as the window",
            lambda d: d.__setitem__("crash_logs", {"fs": "00001"}),
        ),
        (
            "a crash log one crash under the count",
            lambda d: d.__setitem__("crash_logs", {"fs": "10001"}),
        ),
        ("a breaker one crash under the threshold", lambda d: d.__setitem__("breakers", {"fs": 2})),
        ("as many draws as retries", lambda d: d.__setitem__("draws", 1)),
        ("a turn that spent all of the session's spend", lambda d: d.__setitem__("cost_usd", 0.5)),
    ],
)
def test_the_boundary_of_each_rule_is_a_state_the_engine_reaches(name: str, forge: Forgery) -> None:
    """At a rule's boundary the state is still one the engine can be in: restored."""
    data = _snapshot()
    forge(data)
    assert _restores(data), name


@pytest.mark.requirement("ER-38")
def test_the_final_answer_turn_of_a_limit_restores_and_its_flags_are_checked() -> None:
    """A final-answer turn (a limit fired) carries its instruction, withholds tools and
    makes one attempt: restored as the engine wrote it; a second attempt, a tool call
    or an Assemble without its instruction is refused."""
    session = sm.Session(sm.Settings(max_turns=1), seed=1, clock=ManualClock())
    first = session.new_turn()
    first.start()
    first.send(sm.Assembled({"m": 1}, 5))
    first.send(sm.ModelReplied())
    final = session.new_turn()
    final.start()
    final.send(sm.Assembled({"m": 2}, 5))
    data: dict[str, Any] = json.loads(json.dumps(session.snapshot()))
    assert data["turn"]["final_answer"] and data["turn"]["actions"][1]["withhold_tools"]
    assert _restores(copy.deepcopy(data))
    plain = copy.deepcopy(data)
    plain["turn"]["actions"][0]["instruction"] = None
    with pytest.raises(sm.SnapshotError, match=r"^turn\.actions\[0\]: the final-answer flags"):
        sm.Session.restore(plain, clock=ManualClock())
    open_tools = copy.deepcopy(data)
    open_tools["turn"]["actions"][1]["withhold_tools"] = False
    with pytest.raises(sm.SnapshotError, match=r"^turn\.actions\[1\]: CallModel withhold_tools"):
        sm.Session.restore(open_tools, clock=ManualClock())
    retried = copy.deepcopy(data)
    retried["turn"]["attempt"] = 1
    with pytest.raises(sm.SnapshotError):
        sm.Session.restore(retried, clock=ManualClock())


def _snap(session: sm.Session) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(session.snapshot()))
    return data


def _fresh() -> dict[str, Any]:
    """A session with no turn yet."""
    return _snap(sm.Session(sm.Settings(), seed=1, clock=ManualClock()))


def _running() -> dict[str, Any]:
    """A turn waiting for the model's reply."""
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    return _snap(session)


def _ended_by_max_turns() -> dict[str, Any]:
    """``max_turns=1``: a turn, then the final-answer turn, finished: the session's
    status is the limit."""
    session = sm.Session(sm.Settings(max_turns=1), seed=1, clock=ManualClock())
    for request in ({"m": 1}, {"m": 2}):
        turn = session.new_turn()
        turn.start()
        turn.send(sm.Assembled(request, 5))
        turn.send(sm.ModelReplied())
    assert session.status is sm.SessionStatus.ERROR_MAX_TURNS
    return _snap(session)


def _doomed() -> dict[str, Any]:
    """Three turns asking for the same tool call: the doom loop fired (threshold 3),
    the final-answer turn not started yet."""
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock(), session_id="d")
    for i in range(3):
        turn = session.new_turn()
        turn.start()
        turn.send(sm.Assembled({"m": i}, 5))
        turn.send(sm.ModelReplied(tool_calls=[sm.ToolCall(f"c{i}", "fs", "read", {"p": 1})]))
        turn.send(sm.ToolsDone((sm.ToolOutcome(f"c{i}", True, "ok"),)))
    assert session.limit_reached is sm.SessionStatus.ERROR_DOOM_LOOP
    return _snap(session)


def _two_doomed_calls() -> dict[str, Any]:
    """Two turns asking for the same tool call: a doom run of 2, under the threshold."""
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock(), session_id="d")
    for i in range(2):
        turn = session.new_turn()
        turn.start()
        turn.send(sm.Assembled({"m": i}, 5))
        turn.send(sm.ModelReplied(tool_calls=[sm.ToolCall(f"c{i}", "fs", "read", {"p": 1})]))
        turn.send(sm.ToolsDone((sm.ToolOutcome(f"c{i}", True, "ok"),)))
    return _snap(session)


def _child() -> dict[str, Any]:
    """A child of a parent with ``max_cost_usd=10``: it spent 1.0, and read its
    ancestors' budget (9.0 left) at that spend."""
    parent = sm.Session(sm.Settings(max_cost_usd=10), seed=1, clock=ManualClock(), session_id="p")
    child = parent.spawn()
    turn = child.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    turn.send(sm.ModelReplied(cost=1.0))
    return _snap(child)


def _doom_checked() -> dict[str, Any]:
    """A host's doom check over windows of 3 calls (never fired): one turn asked for
    two different calls, so the window holds 2 and the check is 1 call away."""
    session = sm.Session(
        sm.Settings(doom_check_window=3, doom_loop_threshold=50),
        seed=1,
        clock=ManualClock(),
        doom_check=lambda window: False,
    )
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    calls = [sm.ToolCall("c1", "fs", "read", {"p": 1}), sm.ToolCall("c2", "fs", "read", {"p": 2})]
    turn.send(sm.ModelReplied(tool_calls=calls))
    turn.send(sm.ToolsDone(tuple(sm.ToolOutcome(c.id, True, "ok") for c in calls)))
    data = _snap(session)
    assert (len(data["doom_window"]), data["doom_since"]) == (2, 2)
    return data


def _idle() -> dict[str, Any]:
    """A turn made but not started."""
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock())
    session.new_turn()
    return _snap(session)


def _conflicted(reinvoked: bool = False) -> dict[str, Any]:
    """A tool round where ``c1`` conflicted and ``c2`` succeeded: backing off before
    re-invoking ``c1`` (or, ``reinvoked``, invoking it again alone)."""
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    calls = [sm.ToolCall("c1", "fs", "write", {"p": 1}), sm.ToolCall("c2", "fs", "read", {"p": 2})]
    turn.send(sm.ModelReplied(tool_calls=calls))
    conflict = sm.ToolErrorCategory.CONCURRENCY_CONFLICT
    turn.send(
        sm.ToolsDone(
            (
                sm.ToolOutcome("c1", False, "busy", category=conflict),
                sm.ToolOutcome("c2", True, "ok"),
            )
        )
    )
    if reinvoked:
        turn.send(sm.WaitDone())
    data = _snap(session)
    assert data["turn"]["pending"] == ["c1"]
    assert data["turn"]["state"] == ("invoking_tools" if reinvoked else "backing_off_tools")
    return data


def _reinvoked() -> dict[str, Any]:
    return _conflicted(reinvoked=True)


def _invoking() -> dict[str, Any]:
    """A first tool round in flight: two calls."""
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    calls = [sm.ToolCall("c1", "fs", "write", {"p": 1}), sm.ToolCall("c2", "fs", "read", {"p": 2})]
    turn.send(sm.ModelReplied(tool_calls=calls))
    return _snap(session)


def _fell_back() -> dict[str, Any]:
    """``max_retries=1``: a failure, a wait, a retry (attempt 1), a failure, the
    fallback (attempt 0 again), a reply."""
    settings = sm.Settings(fallback_models=("b",), max_retries=1)
    session = sm.Session(settings, seed=3, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 10))
    turn.send(fail("overloaded"))
    turn.send(sm.WaitDone())
    turn.send(fail("overloaded"))
    turn.send(sm.ModelReplied())
    data = _snap(session)
    assert data["turn"]["attempt"] == 0 and data["turn"]["path"][3][4] == 1
    return data


def _used() -> dict[str, Any]:
    """A reply at step 2 that cost 0.5 and reported its usage."""
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    usage = sm.Usage(input_tokens=3, output_tokens=4, cost_usd=0.5)
    turn.send(sm.ModelReplied(cost=0.5, usage=usage))
    data = _snap(session)
    assert [index for index, _ in data["turn"]["usages"]] == [2]
    return data


def _usage_at(*indexes: int, cost: float = 0.5) -> Forgery:
    def forge(d: dict[str, Any]) -> None:
        usage = dict(d["turn"]["usages"][0][1], cost_usd=cost)
        d["turn"]["usages"] = [[index, usage] for index in indexes]

    return forge


def _swap_first_steps(d: dict[str, Any]) -> None:
    path = d["turn"]["path"]
    path[0], path[1] = path[1], path[0]


def _in_turn(**fields: Any) -> Forgery:
    return lambda d: d["turn"].update(fields)


def _set(**fields: Any) -> Forgery:
    return lambda d: d.update(fields)


def _set_settings(**fields: Any) -> Forgery:
    return lambda d: d["settings"].update(fields)


def _both(first: Forgery, second: Forgery) -> Forgery:
    def forge(d: dict[str, Any]) -> None:
        first(d)
        second(d)

    return forge


def _after_a_call(event: sm.ModelReplied | sm.ModelFailed) -> dict[str, Any]:
    """A plain turn whose first call ended with ``event``."""
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    turn.send(event)
    return _snap(session)


def _answered() -> dict[str, Any]:
    """A plain turn whose reply asked for no tool call: completed."""
    data = _after_a_call(sm.ModelReplied())
    assert data["turn"]["path"][-1][:4] == ["calling", "ModelReplied", "no_tool_calls", "completed"]
    return data


def _final_answer_calling() -> dict[str, Any]:
    """``max_turns=1``: a turn, then the final-answer turn, waiting for its reply."""
    session = sm.Session(sm.Settings(max_turns=1), seed=1, clock=ManualClock())
    first = session.new_turn()
    first.start()
    first.send(sm.Assembled({"m": 1}, 5))
    first.send(sm.ModelReplied())
    final = session.new_turn()
    final.start()
    final.send(sm.Assembled({"m": 2}, 5))
    data = _snap(session)
    assert data["turn"]["final_answer"] and data["turn"]["state"] == "calling"
    return data


def _reduced() -> dict[str, Any]:
    """A plain turn whose call overflowed: reducing its context."""
    data = _after_a_call(fail("context_length_exceeded"))
    assert data["turn"]["actions"][-1]["reduce"] and data["turn"]["state"] == "reducing_context"
    return data


def _graft(source: Callable[[], dict[str, Any]], *keys: str) -> Forgery:
    """Give the turn the last step (row, action, time) of ``source``'s turn, and its
    ``keys``: a transition the engine took in another turn."""

    def forge(d: dict[str, Any]) -> None:
        taken = source()["turn"]
        for key in ("path", "actions", "times"):
            d["turn"][key].append(taken[key][-1])
        d["turn"].update({key: taken[key] for key in ("state", *keys)})

    return forge


SESSION_FORGED: dict[str, tuple[Callable[[], dict[str, Any]], Forgery, str]] = {
    "a limit that is no limit's status": (
        _ended_by_max_turns,
        _set(limit="completed"),
        r"^limit: completed is not a limit's status$",
    ),
    "a host's end over a final-answer turn that ended with its limit": (
        _ended_by_max_turns,
        _set(status="completed"),
        r"^status: completed, but the final-answer turn ended it with its limit$",
    ),
    "a host's end while a turn still runs": (
        _running,
        _set(status="cancelled"),
        r"^status: cancelled, but turn 1 is still calling$",
    ),
    "max_turns fired with max_turns unset": (
        _ended_by_max_turns,
        _set_settings(max_turns=None),
        r"^limit: error_max_turns fired but settings\.max_turns is unset$",
    ),
    "a wall-clock limit fired with no wall-clock bound, in a child with a budget above": (
        _child,
        _set(limit="error_max_wall_clock"),
        r"^limit: error_max_wall_clock fired but settings\.max_wall_clock_s is unset$",
    ),
    "a budget limit fired below the budget": (
        _child,
        _set(limit="error_max_budget_usd"),
        r"^limit: error_max_budget_usd fired at a spend of 1\.0$",
    ),
    "a doom run at the threshold, no limit": (
        _doomed,
        _set(limit=None),
        r"^doom_run: 3 identical calls in a row, but no limit has fired$",
    ),
    "a limit's status with no final-answer turn run": (
        _doomed,
        _set(status="error_doom_loop"),
        r"^status: the session ended, but not with a finished final-answer turn$",
    ),
    "denials over the threshold": (
        _snapshot,
        _set(denials=6, limit="error_denial_breaker"),
        r"^denials: 6 is over denial_threshold$",
    ),
    "a denial log with no denial window": (
        _snapshot,
        _set(denial_log="0"),
        r"^denial_log: longer than denial_window \(None\)$",
    ),
    "a denial breaker fired under its count": (
        _snapshot,
        _set(limit="error_denial_breaker"),
        r"^limit: error_denial_breaker fired, but the denials do not reach it$",
    ),
    "a doom window longer than doom_check_window": (
        _doom_checked,
        lambda d: d.__setitem__("doom_window", d["doom_window"] * 2),
        r"^doom_window: longer than doom_check_window$",
    ),
    "a second-tier check overdue": (
        _doom_checked,
        _set(doom_since=3),
        r"^doom_since: the second-tier check is overdue$",
    ),
    "an idle turn holding an attempt": (
        _idle,
        lambda d: d["turn"].__setitem__("attempt", 1),
        r"^turn\.attempt: an idle turn holds nothing yet, got 1$",
    ),
    "a fallback count that is not the model index": (
        _snapshot,
        _in_turn(model_index=0),
        r"^turn\.fallbacks: not one fallback per move down fallback_models$",
    ),
    "a final-answer turn that retried": (
        _ended_by_max_turns,
        _in_turn(attempt=1),
        r"^turn\.attempt: the final-answer turn makes one attempt only$",
    ),
    "two calls of a reply sharing an id": (
        _snapshot,
        lambda d: d["turn"].__setitem__("calls", d["turn"]["calls"] * 2),
        r"^turn\.calls: two calls in flight share an id$",
    ),
    "a call in flight that is not the reply's": (
        _reinvoked,
        lambda d: d["turn"]["in_flight"][0]["arguments"].__setitem__("p", 9),
        r"^turn\.in_flight: a call that is not one of the reply's$",
    ),
    "an outcome for a call the reply did not ask for": (
        _conflicted,
        lambda d: d["turn"]["outcomes"][1].__setitem__("call_id", "c9"),
        r"^turn\.outcomes: not one outcome per call of the reply$",
    ),
    "two outcomes for one call": (
        _conflicted,
        lambda d: d["turn"]["outcomes"][1].__setitem__("call_id", "c1"),
        r"^turn\.outcomes: not one outcome per call of the reply$",
    ),
    "a pending call twice": (
        _conflicted,
        _in_turn(pending=["c1", "c1"]),
        r"^turn\.pending: not distinct calls of the reply$",
    ),
    "a pending call the reply did not ask for": (
        _conflicted,
        _in_turn(pending=["c9"]),
        r"^turn\.pending: not distinct calls of the reply$",
    ),
    "a pending call that did not conflict": (
        _conflicted,
        _in_turn(pending=["c1", "c2"]),
        r"^turn\.pending: a call waits to be re-invoked, but did not conflict$",
    ),
    "backing off with nothing pending": (
        _conflicted,
        _in_turn(pending=[], conflict_attempt=0),
        r"^turn\.pending: backing off with no conflicting call to re-invoke$",
    ),
    "backing off with no re-invocation counted": (
        _conflicted,
        _in_turn(conflict_attempt=0),
        r"^turn\.pending: backing off with no conflicting call to re-invoke$",
    ),
    "re-invocations over max_conflict_retries": (
        _conflicted,
        _in_turn(conflict_attempt=4),
        r"^turn\.conflict_attempt: 4 is over max_conflict_retries$",
    ),
    "re-invocations counted with nothing pending": (
        _snapshot,
        _in_turn(conflict_attempt=1),
        r"^turn\.conflict_attempt: counts re-invocations, but no call is pending$",
    ),
    "a first tool round with an outcome already": (
        _reinvoked,
        _in_turn(pending=[], conflict_attempt=0),
        r"^turn\.in_flight: a first tool round has every call in flight, no outcome yet$",
    ),
    "a re-invocation that is not the first pending call alone": (
        _reinvoked,
        lambda d: d["turn"].__setitem__("in_flight", d["turn"]["calls"]),
        r"^turn\.in_flight: a re-invocation is the first pending call alone$",
    ),
    "a re-invocation before every call has an outcome": (
        _reinvoked,
        lambda d: d["turn"].__setitem__("outcomes", d["turn"]["outcomes"][:1]),
        r"^turn\.in_flight: a re-invocation is the first pending call alone$",
    ),
    "a re-invocation with none counted": (
        _reinvoked,
        _in_turn(conflict_attempt=0),
        r"^turn\.in_flight: a re-invocation is the first pending call alone$",
    ),
    "backing off before every call has an outcome": (
        _conflicted,
        lambda d: d["turn"].__setitem__("outcomes", d["turn"]["outcomes"][:1]),
        r"^turn\.outcomes: backing off before every call has an outcome$",
    ),
    "calls pending in a finished turn": (
        _conflicted,
        _in_turn(state="completed"),
        r"^turn\.pending: calls wait to be re-invoked in state 'completed'$",
    ),
    "reductions over max_context_reductions": (
        _snapshot,
        _in_turn(reductions=4),
        r"^turn\.reductions: 4 is over max_context_reductions$",
    ),
    "a model index past the fallback chain": (
        _snapshot,
        _in_turn(model_index=1),
        r"^turn\.model_index: 1 is out of range$",
    ),
    "a model index before the primary": (
        _snapshot,
        _in_turn(model_index=-2),
        r"^turn\.model_index: -2 is out of range$",
    ),
    "an action missing": (
        _snapshot,
        lambda d: d["turn"]["actions"].pop(),
        r"^turn\.actions: not one action per transition of turn\.path$",
    ),
    "a time missing": (
        _snapshot,
        lambda d: d["turn"]["times"].pop(),
        r"^turn\.times: not one time per transition of turn\.path$",
    ),
    "a transition taken before the one it follows": (
        _snapshot,
        lambda d: d["turn"]["times"].__setitem__(0, 5.0),
        r"^turn\.times: a transition was taken before the one it follows$",
    ),
    "a path that does not start idle": (
        _snapshot,
        _swap_first_steps,
        r"^turn\.path\[0\]: starts in 'assembling', but the turn was in 'idle'$",
    ),
    "a state that is not where the path ends": (
        _snapshot,
        _both(_set(finished_at=None), _in_turn(state="calling")),
        r"^turn\.state: 'calling' is not where the turn's path ends \('completed'\)$",
    ),
    "an attempt the last step does not record": (
        _snapshot,
        _in_turn(attempt=0),
        r"^turn\.path: its last counters \(1, 0, 1\) are not the turn's \(0, 0, 1\)$",
    ),
    "a request that is not the last CallModel's": (
        _snapshot,
        _in_turn(request={"m": 2}),
        r"^turn\.request: not the request of the turn's last CallModel$",
    ),
    "calls in flight that are not the last InvokeTools'": (
        _invoking,
        lambda d: d["turn"]["actions"][-1].__setitem__("calls", d["turn"]["calls"][:1]),
        r"^turn\.in_flight: the calls in flight are not those of the last InvokeTools$",
    ),
    "a step's attempt over max_retries, the turn's within": (
        _fell_back,
        _set_settings(max_retries=0),
        r"^turn\.path\[3\]: attempt 1 is over max_retries$",
    ),
    "a tool round's wait for another category": (
        _conflicted,
        lambda d: d["turn"]["actions"][-1].__setitem__("category", "process_crashed"),
        r"^turn\.actions\[3\]: a tool round's Wait for process_crashed$",
    ),
    "a tool round's wait at max_conflict_retries": (
        _conflicted,
        lambda d: d["turn"]["actions"][-1].__setitem__("attempt", 3),
        r"^turn\.actions\[3\]: Wait attempt 3 beyond max_conflict_retries$",
    ),
    "a tool round's wait naming a retry-after": (
        _conflicted,
        lambda d: d["turn"]["actions"][-1].__setitem__("retry_after", 0.1),
        r"^turn\.actions\[3\]: a tool round's Wait names a server's retry-after$",
    ),
    "a tool round's wait longer than any the settings ask for": (
        _conflicted,
        lambda d: d["turn"]["actions"][-1].__setitem__("seconds", 300.5),
        r"^turn\.actions\[3\]: a wait of 300\.5 s the settings cannot ask for$",
    ),
    "two costs kept for one step": (
        _snapshot,
        _in_turn(costs=[[4, 0.25], [4, 0.25]]),
        r"^turn\.costs\[1\]: step 4 is not a later step of the turn$",
    ),
    "a cost kept past the path": (
        _snapshot,
        _in_turn(costs=[[6, 0.5]]),
        r"^turn\.costs\[0\]: step 6 is not a later step of the turn$",
    ),
    "two usages kept for one step": (
        _used,
        _usage_at(2, 2),
        r"^turn\.usages\[1\]: step 2 is not a later step of the turn$",
    ),
    "a usage kept past the path": (
        _used,
        _usage_at(3),
        r"^turn\.usages\[0\]: step 3 is not a later step of the turn$",
    ),
    "a usage kept for a step that is no model call's outcome": (
        _used,
        _usage_at(1),
        r"^turn\.usages\[0\]: step 1 is no model call's outcome$",
    ),
    "a usage whose cost is not what its step charged": (
        _used,
        _usage_at(2, cost=0.25),
        r"^turn\.usages\[0\]: a cost of 0\.25 where the step charged another$",
    ),
    "a re-invocation of two calls": (
        _reinvoked,
        lambda d: d["turn"]["actions"][-1].__setitem__("calls", d["turn"]["calls"]),
        r"^turn\.actions\[4\]: a re-invocation is one call of the reply$",
    ),
    "a re-invocation of a call the reply did not ask for": (
        _reinvoked,
        lambda d: d["turn"]["actions"][-1]["calls"][0].__setitem__("id", "c9"),
        r"^turn\.actions\[4\]: a re-invocation is one call of the reply$",
    ),
    "a doom loop fired before any turn": (
        _fresh,
        _set(limit="error_doom_loop"),
        r"^limit: error_doom_loop fired before any turn$",
    ),
    "waits taken with no jitter drawn": (
        _snapshot,
        _set(draws=0),
        r"^waited_s: waits were taken, but no jitter was drawn$",
    ),
    "a doom run without its fingerprint": (
        _two_doomed_calls,
        _set(doom_last=None),
        r"^doom_run: a run of identical calls needs its fingerprint, and only then$",
    ),
    "issue 37: a plain turn ending on the final-answer turn's row": (
        _answered,
        lambda d: d["turn"]["path"][-1].__setitem__(2, "final_answer"),
        r"^turn\.path\[2\]: calling --ModelReplied \[final_answer\]--> completed fires only in "
        r"the final-answer turn$",
    ),
    "issue 37: a final-answer turn that reduced its context (no instruction)": (
        _final_answer_calling,
        _graft(_reduced, "reductions", "overflowed_size", "overflowed_request"),
        r"^turn\.path\[2\]: calling --ModelFailed \[context_length_exceeded & reductions_left\]"
        r"--> reducing_context never fires in the final-answer turn$",
    ),
    "a final-answer turn that invoked tools": (
        _final_answer_calling,
        _graft(_invoking, "calls", "in_flight", "reply"),
        r"^turn\.path\[2\]: calling --ModelReplied--> invoking_tools never fires in the "
        r"final-answer turn$",
    ),
    "a fingerprint without a doom run": (
        _running,
        _set(doom_last="40d62018d8c48257259682e2"),
        r"^doom_run: a run of identical calls needs its fingerprint, and only then$",
    ),
    # issue 38's sample (seed 20261207)
    "a child with no id": (
        _child,
        _set(session_id=None),
        r"^session_id: a child session has an id$",
    ),
    "a root with an ancestors' budget": (
        _running,
        _set(ancestor_budget_usd=1.0),
        r"^ancestor_budget_usd: a root session has no ancestors$",
    ),
}


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize("name", sorted(SESSION_FORGED))
def test_a_forged_session_field_is_refused_by_the_rule_it_breaks(name: str) -> None:
    """The session-wide rules, each broken alone on a snapshot the engine wrote: the
    rule's own message (so a rule skipped, whose state a later rule or nothing then
    refuses, fails here), the snapshot left as it was."""
    build, forge, message = SESSION_FORGED[name]
    data = build()
    assert _restores(copy.deepcopy(data))
    forge(data)
    before = copy.deepcopy(data)
    with pytest.raises(sm.SnapshotError, match=message):
        sm.Session.restore(data, clock=ManualClock())
    assert data == before


@pytest.mark.requirement("ER-38")
def test_a_doom_loop_that_fired_restores_and_a_run_under_the_threshold_needs_no_limit() -> None:
    """The states either side of the doom rules: the loop fired after three turns (a
    limit with turns behind it), and a run of two with no limit."""
    doomed = sm.Session.restore(_doomed(), clock=ManualClock())
    assert doomed.limit_reached is sm.SessionStatus.ERROR_DOOM_LOOP
    assert doomed.turns == 3
    assert sm.Session.restore(_two_doomed_calls(), clock=ManualClock()).limit_reached is None


@pytest.mark.requirement("ER-38")
def test_a_restored_childs_ancestors_budget_is_less_only_the_spend_since_it_was_read() -> None:
    """A child read its ancestors' budget (9.0) when it had spent 1.0: restored with
    no live parent, 9.0 is still left (the spend before the reading is in it), and a
    further 2.0 leaves 7.0."""
    data = _child()
    assert (data["ancestor_budget_usd"], data["ancestor_mark_usd"], data["cost_usd"]) == (
        9.0,
        1.0,
        1.0,
    )
    child = sm.Session.restore(data, clock=ManualClock())
    assert child.remaining_budget_usd == 9.0
    turn = child.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 2}, 5))
    turn.send(sm.ModelReplied(cost=2.0))
    assert child.remaining_budget_usd == 7.0


@pytest.mark.requirement("ER-38")
def test_the_longest_wait_is_the_jittered_cap_when_it_exceeds_max_server_wait_s() -> None:
    """With ``max_delay_ms`` 100 s and ``max_server_wait_s`` 10 s a backoff may wait up
    to 150 s (the cap times the largest jitter, 1.5): a real wait of 106.7 s and one
    of exactly 150 s restore, one just over is refused."""
    settings = sm.Settings(base_delay_ms=100_000, max_delay_ms=100_000, max_server_wait_s=10)
    session = sm.Session(settings, seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    wait = turn.send(fail("overloaded"))
    assert isinstance(wait, sm.Wait) and 100 < wait.seconds < 150
    data = _snap(session)
    assert _restores(copy.deepcopy(data))
    data["turn"]["actions"][2]["seconds"] = 150.0
    assert _restores(copy.deepcopy(data))
    data["turn"]["actions"][2]["seconds"] = 150.001
    with pytest.raises(sm.SnapshotError, match=r"^turn\.actions\[2\]: a wait of 150\.001 s"):
        sm.Session.restore(data, clock=ManualClock())


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize(("attempt", "seconds"), [(2, 0.0), (0, 300.0)])
def test_a_tool_rounds_wait_at_its_bounds_restores(attempt: int, seconds: float) -> None:
    """A conflict's wait may be the last one ``max_conflict_retries`` allows (attempt
    2 of 3), and as short as 0 s or as long as the longest wait (here
    ``max_server_wait_s``, 300 s)."""
    data = _conflicted()
    data["turn"]["actions"][-1].update(attempt=attempt, seconds=seconds)
    assert _restores(data)


_WINDOWS = {"breaker_window": 5, "breaker_window_threshold": 3}
_DENIAL_WINDOW = {"denial_window": 5, "denial_window_threshold": 3}


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize(
    ("name", "settings", "fields"),
    [
        ("turns", {}, {"turns": 1}),
        ("limit", {"max_wall_clock_s": 10}, {"limit": "error_max_wall_clock"}),
        ("retries", {}, {"retries": 1}),
        ("idle_s", {}, {"idle_s": 1.5}),
        ("tool_retries", {}, {"tool_retries": 1}),
        ("denials", {}, {"denials": 1}),
        ("denial_log", _DENIAL_WINDOW, {"denial_log": "0"}),
        ("crash_logs", _WINDOWS, {"crash_logs": {"fs": "1"}}),
        ("breakers", {}, {"breakers": {"fs": 1}}),
        ("doom_since", {}, {"doom_since": 1}),
        ("doom_run", {}, {"doom_run": 1, "doom_last": "40d62018d8c48257259682e2"}),
        ("finished_at", {}, {"finished_at": 0.0}),
        ("spent", {}, {"cost_usd": 0.5}),
    ],
)
def test_a_session_with_no_turn_that_counted_something_is_refused_naming_it(
    name: str, settings: dict[str, Any], fields: dict[str, Any]
) -> None:
    """Before its first turn a session has counted nothing: a fresh session's snapshot
    with one count forged (the settings it needs set) is refused naming that count; the
    same settings alone restore."""
    data = _fresh()
    data["settings"].update(settings)
    assert _restores(copy.deepcopy(data))
    data.update(fields)
    with pytest.raises(sm.SnapshotError, match=rf"^turn: missing, but the session has {name}\b"):
        sm.Session.restore(data, clock=ManualClock())


@pytest.mark.requirement("ER-38")
def test_a_restored_childs_ancestors_budget_binds_below_its_own() -> None:
    """A parent that spent 5.0 of its 10.0 spawns a child that spends 1.0: 4.0 is left
    above it, less than its own 9.0. Restored with no live parent and 2.0 spent more,
    2.0 is left: the reading less the spend since, not plus it."""

    def spend(session: sm.Session, cost: float) -> None:
        turn = session.new_turn()
        turn.start()
        turn.send(sm.Assembled({"m": 1}, 5))
        turn.send(sm.ModelReplied(cost=cost))

    parent = sm.Session(sm.Settings(max_cost_usd=10), seed=1, clock=ManualClock(), session_id="p")
    spend(parent, 5.0)
    child = parent.spawn()
    spend(child, 1.0)
    assert child.remaining_budget_usd == 4.0
    restored = sm.Session.restore(_snap(child), clock=ManualClock())
    spend(restored, 2.0)
    assert restored.remaining_budget_usd == 2.0


@pytest.mark.requirement("ER-38")
def test_a_session_with_no_turn_holds_its_childrens_spend_and_no_more() -> None:
    """A parent that never ran a turn but spawned a child that spent 1.0 holds that
    spend (its own is nothing): restored. A spend of its own beyond float rounding
    (1e-9) is refused; within it, restored."""
    parent = sm.Session(sm.Settings(), seed=1, clock=ManualClock(), session_id="p")
    child = parent.spawn()
    turn = child.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    turn.send(sm.ModelReplied(cost=1.0))
    data = _snap(parent)
    assert (data["turn"], data["cost_usd"], data["child_costs"]) == (None, 1.0, {"p.1": 1.0})
    assert _restores(data)
    fresh = _fresh()
    assert _restores({**fresh, "cost_usd": 1e-9})
    with pytest.raises(sm.SnapshotError, match=r"^turn: missing, but the session has spent"):
        sm.Session.restore({**fresh, "cost_usd": 2e-9}, clock=ManualClock())


def _cancelled(in_calling: bool) -> dict[str, Any]:
    """A turn cancelled while its model call was in flight, charged what the vendor
    reported (``in_calling``), or cancelled in its tool round, charged nothing."""
    session = sm.Session(SETTINGS, seed=1, clock=ManualClock(), session_id="s")
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    if in_calling:
        turn.send(sm.Cancelled("stop", cost=0.5, usage=sm.Usage(input_tokens=7)))
    else:
        turn.send(sm.ModelReplied(tool_calls=[sm.ToolCall("c1", "fs", "read", {})]))
        turn.send(sm.Cancelled("stop"))
    data: dict[str, Any] = json.loads(json.dumps(session.snapshot()))
    return data


@pytest.mark.requirement("ER-245")
def test_a_cost_kept_for_a_cancel_restores_only_where_a_model_call_was_in_flight() -> None:
    """A cancel of the model call in flight charges its cost and keeps its usage, and
    restores; the same cost and usage kept for a cancel of a tool round (no model call
    in flight) is refused, as the engine refuses to take it."""
    charged = _cancelled(in_calling=True)
    assert charged["turn"]["costs"] == [[2, 0.5]]
    assert _restores(charged)
    forged = _cancelled(in_calling=False)
    forged["cost_usd"] = 0.5
    forged["turn"]["costs"] = [[3, 0.5]]
    with pytest.raises(sm.SnapshotError, match=r"turn\.costs\[0\]: step 3 is no model call's"):
        sm.Session.restore(forged, clock=ManualClock())
    forged = _cancelled(in_calling=False)
    forged["turn"]["usages"] = [[3, charged["turn"]["usages"][0][1]]]
    forged["turn"]["usages"][0][1]["cost_usd"] = None
    with pytest.raises(sm.SnapshotError, match=r"turn\.usages\[0\]: step 3 is no model call's"):
        sm.Session.restore(forged, clock=ManualClock())


# -- issue 38's sample (seed 20261207) ---------------------------------------------------


def _replied(settings: sm.Settings, event: sm.ModelReplied) -> sm.Session:
    session = sm.Session(settings, seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    turn.send(event)
    return session


@pytest.mark.requirement("ER-38")
def test_a_budget_spent_exactly_and_a_denial_breaker_that_fired_restore() -> None:
    """Limits the engine reaches restore: ``max_cost_usd`` 1.0 spent to the cent (0 left,
    the limit fired), and the denial breaker tripped by one denial at
    ``denial_threshold=1``."""
    spent = _replied(sm.Settings(max_cost_usd=1.0), sm.ModelReplied(cost=1.0))
    spent.new_turn()
    assert spent.limit_reached is sm.SessionStatus.ERROR_MAX_BUDGET_USD
    restored = sm.Session.restore(_snap(spent), clock=ManualClock())
    assert restored.limit_reached is sm.SessionStatus.ERROR_MAX_BUDGET_USD

    call = sm.ToolCall("c1", "fs", "rm", {})
    denied = _replied(sm.Settings(denial_threshold=1), sm.ModelReplied(tool_calls=[call]))
    no = sm.ToolOutcome("c1", False, "no", category=sm.ToolErrorCategory.PERMISSION_DENIED)
    denied.current_turn.send(sm.ToolsDone((no,)))  # type: ignore[union-attr]
    assert denied.limit_reached is sm.SessionStatus.ERROR_DENIAL_BREAKER
    restored = sm.Session.restore(_snap(denied), clock=ManualClock())
    assert restored.limit_reached is sm.SessionStatus.ERROR_DENIAL_BREAKER


@pytest.mark.requirement("ER-38")
def test_a_usage_that_reports_a_zero_cost_on_a_free_call_restores() -> None:
    """A reply that charged nothing whose usage says it cost 0.0 (a cached or free call)
    restores: the usage agrees with the step."""
    usage = sm.Usage(input_tokens=3, cost_usd=0.0)
    session = _replied(sm.Settings(), sm.ModelReplied(usage=usage))
    restored = sm.Session.restore(_snap(session), clock=ManualClock())
    assert restored.snapshot()["turn"]["usages"] == _snap(session)["turn"]["usages"]


@pytest.mark.requirement("ER-38")
def test_a_turns_costs_may_exceed_the_sessions_spend_by_a_billionth() -> None:
    """The turn's costs (1.0) and the session's spend may differ by float rounding: by
    up to ``1e-9 * (1 + costs)``. A spend 1.5e-9 under restores; 3e-9 under is refused
    naming the costs."""
    data = _snap(_replied(sm.Settings(), sm.ModelReplied(cost=1.0)))
    data["cost_usd"] = 1.0 - 1.5e-9
    assert _restores(copy.deepcopy(data))
    data["cost_usd"] = 1.0 - 3e-9
    with pytest.raises(sm.SnapshotError, match=r"^turn\.costs: the turn spent more than"):
        sm.Session.restore(data, clock=ManualClock())
