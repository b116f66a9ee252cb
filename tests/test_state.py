"""One declared state: stale handles, restore of reachable states only, values checked
at the door, finite waits, and version-1 snapshots."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import attrs
import pytest

import statemachine as sm
from statemachine.core._state import SessionState, TurnState, copy_session_state, stored_fields

from .helpers import ManualClock, calling_turn, complete_turn, fail, new_session

V1 = json.loads((Path(__file__).parent / "data" / "snapshots-v1.json").read_text("utf-8"))


def _public(session: sm.Session) -> tuple[Any, ...]:
    turn = session.current_turn
    return (
        session.turns,
        session.retries_used,
        session.cost_usd,
        session.status,
        session.limit_reached,
        session.tripped_providers,
        dict(session.crash_counts),
        None if turn is None else (turn.state, turn.status, len(turn.trace)),
    )


# -- ER-37: a turn is a handle ----------------------------------------------------------


@pytest.mark.requirement("ER-37")
def test_a_replaced_idle_turn_takes_no_event() -> None:
    """A never-started turn replaced by a second new_turn() refuses start() and events."""
    session = new_session()
    old = session.new_turn()
    new = session.new_turn()
    before = _public(session)
    with pytest.raises(sm.IllegalEvent, match="replaced by turn 1"):
        old.start()
    with pytest.raises(sm.IllegalEvent):
        old.send(sm.Assembled("r", 1))
    assert _public(session) == before
    assert not old.current and new.current
    assert isinstance(new.start(), sm.Assemble)


@pytest.mark.requirement("ER-37")
def test_a_stale_handle_cannot_spend_or_invoke_tools_after_the_session_ended() -> None:
    """After max_turns ended the session, a held stale handle cannot reach InvokeTools or
    add to the spend."""
    session = new_session(max_turns=1)
    stale = session.new_turn()  # replaced before it starts
    complete_turn(session)  # turn 1 fires the limit
    final = session.new_turn()
    final.start()
    final.send(sm.Assembled("r", 1))
    final.send(sm.ModelReplied(cost=1.0))
    assert session.status is sm.SessionStatus.ERROR_MAX_TURNS
    before = _public(session)
    for handle in (stale, final):
        with pytest.raises((sm.IllegalEvent, sm.SessionEnded)):
            handle.start()
        with pytest.raises((sm.IllegalEvent, sm.SessionEnded)):
            handle.send(sm.ModelReplied([sm.ToolCall("c", "p", "t")], cost=5.0))
    assert _public(session) == before
    with pytest.raises(sm.SessionEnded):
        session.new_turn()


@pytest.mark.requirement("ER-37")
def test_a_finished_turn_replaced_by_the_next_refuses_events() -> None:
    """The previous turn's handle refuses everything once the next turn exists."""
    session = new_session()
    complete_turn(session)
    first = session.current_turn
    assert first is not None
    second = calling_turn(session)
    with pytest.raises(sm.IllegalEvent, match="only the session's current turn"):
        first.send(fail("rate_limited"))
    assert session.retries_used == 0
    assert isinstance(second.send(fail("rate_limited")), sm.Wait)


# -- ER-38: restore takes exactly the reachable states --------------------------------


def _mid_turn() -> dict[str, Any]:
    session = new_session(breaker_threshold=2, max_turns=4)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": [1]}, 10))
    turn.send(sm.ModelReplied([sm.ToolCall("c1", "p", "read", {"a": 1})], cost=0.5))
    turn.send(sm.ToolsDone([sm.ToolOutcome("c1", False, "died", "process_crashed")]))
    calling = session.new_turn()
    calling.start()
    calling.send(sm.Assembled("r", 10))
    calling.send(fail("overloaded"))
    return json.loads(json.dumps(session.snapshot()))


def _deep(levels: int) -> Any:
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


FORGED: dict[str, tuple[dict[str, Any], str]] = {
    "a status with no limit": ({"status": "error_max_turns"}, "^status:"),
    "a limit whose bound is unset": ({"limit": "error_max_budget_usd"}, "^limit:"),
    "a tripped provider with no limit": ({"tripped": ["p"]}, "^tripped:"),
    "a breaker limit with no tripped provider": ({"limit": "error_circuit_breaker"}, "^limit:"),
    "a count at the threshold, not tripped": ({"breakers": {"p": 2}}, r"^breakers\.p:"),
    "retries over the ceiling": ({"retries": 21}, "^retries:"),
    "a huge integer": ({"draws": 10**40}, "^draws:"),
    "an attempt over max_retries": ({"turn.attempt": 6}, r"^turn\.attempt:"),
    "a trace whose counters are not the state's": ({"turn.reductions": 1}, r"^turn\.path:"),
    "a deeply nested request": ({"turn.request": _deep(5000)}, r"^turn\.request:"),
    "a request with NaN": ({"turn.request": {"x": math.nan}}, r"^turn\.request:"),
    "a non-JSON request": ({"turn.request": {1, 2}}, r"^turn\.request:"),
    "a mangled path": ({"turn.path": [["idle", "start"]]}, r"^turn\.path\[0\]:"),
    "path and actions of different lengths": ({"turn.actions": []}, r"^turn\.actions:"),
    "a final-answer turn with no limit": ({"turn.final_answer": True}, r"^turn\.instruction:"),
    "an unknown key": ({"turn.extra": 1}, r"^turn\.extra:"),
    "deep nesting in an action": (
        {"turn.actions": [{"$type": "Assemble", "reduce": _deep(5000)}]},
        r"^turn\.actions",
    ),
}


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize("name", sorted(FORGED))
def test_restore_refuses_states_the_engine_cannot_reach(name: str) -> None:
    """Each forged snapshot is a SnapshotError naming the key, never another exception."""
    changes, match = FORGED[name]
    data = copy.deepcopy(_mid_turn())
    for path, value in changes.items():
        target = data
        *parents, last = path.split(".")
        for key in parents:
            target = target[key]
        target[last] = value
    with pytest.raises(sm.SnapshotError, match=match):
        sm.Session.restore(data, clock=ManualClock())


@pytest.mark.requirement("ER-38")
def test_restore_of_the_real_snapshot_is_accepted_and_continues() -> None:
    """The unforged snapshot restores and its own snapshot is the same data."""
    data = _mid_turn()
    restored = sm.Session.restore(data, clock=ManualClock())
    assert json.loads(json.dumps(restored.snapshot())) == data


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize("entry", V1, ids=[e["name"] for e in V1])
def test_version_1_snapshots_of_the_first_release_restore_and_continue(
    entry: dict[str, Any],
) -> None:
    """Snapshots written by the first release (tests/data/snapshots-v1.json) restore with
    the same counters and trace, and write themselves back as the current version."""
    data = entry["snapshot"]
    restored = sm.Session.restore(data, clock=ManualClock())
    assert restored.retries_used == data["retries"]
    assert restored.turns == data["turns"]
    assert restored.status == (data["status"] and sm.SessionStatus(data["status"]))
    turn = restored.current_turn
    if data["turn"] is not None:
        assert turn is not None
        assert turn.state == data["turn"]["state"]
        assert len(turn.trace) == len(data["turn"]["trace"])
        assert turn.trace[-1].session_retries == data["retries"]
        assert turn.attempt == data["turn"]["attempt"]
    again = restored.snapshot()
    assert again["version"] == 5
    assert sm.Session.restore(again, clock=ManualClock()).snapshot()["retries"] == data["retries"]


@pytest.mark.requirement("ER-38")
def test_a_version_1_snapshot_with_a_status_that_does_not_fit_is_refused() -> None:
    """Version 1 carried the turn's status beside its trace: they must agree."""
    data = copy.deepcopy(next(e["snapshot"] for e in V1 if e["name"] == "backing-off"))
    data["turn"]["status"] = "completed"
    with pytest.raises(sm.SnapshotError, match=r"^turn\.status"):
        sm.Session.restore(data, clock=ManualClock())


# -- ER-39: what is accepted can be saved; no infinite wait -------------------------------


@pytest.mark.requirement("ER-39")
@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: sm.Assembled(_deep(200), 1), "^request: must be JSON data"),
        (lambda: sm.Assembled("\ud800", 1), "^request: .*lone surrogate"),
        (lambda: sm.Assembled("r", 10**30), "^size: must be < 2"),
        (lambda: sm.ModelReplied(reply=object()), "^ModelReplied.reply: a builtins.object has no JSON form"),
        (lambda: sm.ModelReplied(cost=10**400), "^cost: must be a finite number"),
        (lambda: sm.ToolCall("c", "p", "t", {"x": math.inf}), "^ToolCall.arguments"),
        (lambda: sm.ToolOutcome("c", True, content=b"bytes"), "^ToolOutcome.content"),
    ],
)
def test_values_that_could_not_be_saved_are_refused_when_built(build: Any, match: str) -> None:
    """Every value an event carries is JSON data, or the event is never built."""
    with pytest.raises((ValueError, TypeError), match=match):
        build()


@pytest.mark.requirement("ER-39")
def test_a_spend_that_would_overflow_is_refused_and_changes_nothing() -> None:
    """Two finite costs whose sum is infinite: the second is refused, nothing changes."""
    session = new_session()
    calling_turn(session).send(sm.ModelReplied(cost=1e308))
    turn = calling_turn(session)
    before = _public(session)
    with pytest.raises(sm.IllegalEvent, match="cost"):
        turn.send(sm.ModelReplied(cost=1e308))
    assert _public(session) == before
    json.dumps(session.snapshot(), allow_nan=False)


@pytest.mark.requirement("ER-39", "ER-21")
@pytest.mark.parametrize(
    "error",
    [
        sm.ModelError("unknown", retry_after_seconds=object()),  # type: ignore[arg-type]
        sm.ModelError("rate_limited", retry_after_seconds=10**400),
        sm.ModelError("rate_limited", headers={"retry-after": "9" * 5000}),
        sm.ModelError("rate_limited", retry_after_seconds=True),  # type: ignore[arg-type]
        sm.ModelError("unknown", message=b"raw", body=b"\xff\xfe", code=404, status="x"),  # type: ignore[arg-type]
    ],
)
def test_provider_garbage_is_dropped_never_raised_and_always_saved(error: sm.ModelError) -> None:
    """Garbage retry-afters and non-text fields never raise, are never waited on, and the
    session that took them can be snapshotted."""
    session = new_session()
    action = calling_turn(session).send(sm.ModelFailed(error))
    if isinstance(action, sm.Wait):
        assert math.isfinite(action.seconds) and 0 <= action.seconds <= 0.75
    json.dumps(session.snapshot(), allow_nan=False)


@pytest.mark.requirement("ER-39")
def test_no_wait_is_infinite_with_settings_near_the_float_limit() -> None:
    """A base delay, factor and cap near the largest float still give finite waits."""
    session = new_session(
        base_delay_ms=1e308, backoff_factor=1e300, max_delay_ms=1.7e308, max_retries=4
    )
    turn = calling_turn(session)
    for _ in range(4):
        wait = turn.send(fail("rate_limited"))
        assert isinstance(wait, sm.Wait)
        assert math.isfinite(wait.seconds) and wait.seconds > 0
        turn.send(sm.WaitDone())


@pytest.mark.requirement("ER-39")
def test_integer_settings_beyond_64_bits_are_refused() -> None:
    """A ceiling too large for a snapshot counter is a ConfigError naming the field."""
    with pytest.raises(sm.ConfigError, match=r"^session_retry_ceiling: must be < 2"):
        sm.Settings(session_retry_ceiling=2**70)
    with pytest.raises(sm.ConfigError, match=r"^base_delay_ms"):
        sm.Settings(base_delay_ms=10**400)


# -- the declaration is the one place ------------------------------------------------------


def test_every_declared_field_is_in_the_snapshot_and_nothing_else() -> None:
    """The snapshot's keys are the declared fields it stores (plus format, version,
    settings); the fields kept in process only (the turn's events) are not written."""
    data = _mid_turn()
    session_keys = {f.metadata["snapshot_key"] or f.name for f in stored_fields(SessionState)}
    turn_keys = {f.metadata["snapshot_key"] or f.name for f in stored_fields(TurnState)}
    assert {"events"} <= {f.name for f in attrs.fields(TurnState)} - turn_keys
    assert set(data) == session_keys | {"format", "version", "settings"}
    assert set(data["turn"]) == turn_keys


def test_the_declared_copy_is_independent() -> None:
    """Changing a copy of the state (as the model checker does) leaves the original."""
    session = new_session()
    calling_turn(session).send(fail("rate_limited"))
    state = session.state
    copied = copy_session_state(state)
    assert copied.turn is not None and state.turn is not None
    copied.retries += 5
    copied.turn.path.clear()
    assert state.retries == 1 and state.turn.path
    assert session.retries_used == 1


def test_a_counter_added_to_the_declaration_is_snapshotted_checked_and_restored() -> None:
    """``waited_s`` was added as one declared field plus one line in the ``wait`` effect:
    it sums the waits, is in the snapshot, is checked on restore and comes back."""
    session = new_session(seed=5)
    turn = calling_turn(session)
    waits = []
    for _ in range(3):
        wait = turn.send(fail("rate_limited"))
        assert isinstance(wait, sm.Wait)
        waits.append(wait.seconds)
        turn.send(sm.WaitDone())
    assert session.waited_s == pytest.approx(sum(waits))
    data = json.loads(json.dumps(session.snapshot()))
    assert data["waited_s"] == session.waited_s
    assert sm.Session.restore(data, clock=ManualClock()).waited_s == session.waited_s
    data["waited_s"] = -1.0
    with pytest.raises(sm.SnapshotError, match=r"^waited_s: must be a finite number"):
        sm.Session.restore(data, clock=ManualClock())


@pytest.mark.requirement("ER-38")
def test_from_state_refuses_an_unreachable_state() -> None:
    """``Session.from_state`` checks the same invariants as restore unless told not to."""
    session = new_session()
    calling_turn(session)
    state = session.state
    state.retries = 99
    with pytest.raises(sm.SnapshotError, match=r"^retries:"):
        sm.Session.from_state(session.settings, state, ManualClock())
    with pytest.raises(sm.ConfigError, match=r"^state:"):
        sm.Session.from_state(session.settings, {"retries": 1}, ManualClock())  # type: ignore[arg-type]
    good = session.state
    again = sm.Session.from_state(session.settings, good, ManualClock())
    assert again.current_turn is not None and again.current_turn.state == "calling"


@pytest.mark.requirement("ER-39")
def test_host_data_is_owned_by_the_engine_once_sent() -> None:
    """A host that goes on changing its list after sending it changes nothing in the
    engine: the retry resends what was sent, and the snapshot stays JSON."""
    session = new_session()
    turn = session.new_turn()
    turn.start()
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    call = turn.send(sm.Assembled({"messages": messages, "ids": {1: "a"}, "pair": (1, 2)}, 10))
    messages.append(math.nan)
    assert isinstance(call, sm.CallModel)
    turn.send(fail("rate_limited"))
    retry = turn.send(sm.WaitDone())
    assert isinstance(retry, sm.CallModel)
    assert retry.request == {
        "messages": [{"role": "user", "content": "hi"}],
        "ids": {"1": "a"},
        "pair": [1, 2],
    }
    json.dumps(session.snapshot(), allow_nan=False)


@pytest.mark.requirement("ER-38", "ER-39")
def test_a_subclassed_model_error_is_saved_as_a_model_error() -> None:
    """A host's subclass of ModelError passes the door and is saved (and restored) as
    the ModelError it is."""

    @attrs.frozen
    class VendorError(sm.ModelError):
        pass

    session = new_session()
    calling_turn(session).send(sm.ModelFailed(VendorError("auth_error", "no key")))
    data = json.loads(json.dumps(session.snapshot(), allow_nan=False))
    restored = sm.Session.restore(data, clock=ManualClock())
    assert restored.current_turn is not None
    finish = restored.current_turn.finish
    assert finish is not None and type(finish.error) is sm.ModelError
    assert finish.error.message == "no key"


@pytest.mark.requirement("ER-38")
def test_a_forged_finish_status_is_refused() -> None:
    """A Finish whose status is missing or not its row's is a SnapshotError."""
    session = new_session()
    calling_turn(session).send(fail("auth_error"))
    base = json.loads(json.dumps(session.snapshot()))
    for status in (None, "completed", 3):
        data = copy.deepcopy(base)
        data["turn"]["actions"][-1]["status"] = status
        with pytest.raises(sm.SnapshotError, match=r"^turn\.actions"):
            sm.Session.restore(data, clock=ManualClock())


@pytest.mark.requirement("ER-38")
def test_restore_refuses_tools_after_a_limit() -> None:
    """A forged limit on a running, non-final turn would let it invoke tools after the
    bound: refused."""
    session = new_session(max_turns=1)
    session.new_turn()
    data = session.snapshot()
    data["limit"] = "error_max_turns"
    with pytest.raises(sm.SnapshotError, match=r"^limit|^turn"):
        sm.Session.restore(data, clock=ManualClock())
