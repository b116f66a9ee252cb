"""What the mutation run of ``core/_state.py`` found untested (specs/mutation.md): forged
snapshot fields each kind must refuse, a zero wait, and the shared trace steps."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

import statemachine as sm
from statemachine.store import InMemoryStore, Worker
from statemachine.store._record import COMPACT_EVERY

from .helpers import ManualClock, fail


def _snapshot(settings: sm.Settings | None = None) -> dict[str, Any]:
    """A snapshot mid-retry with a fallback taken: every list field holds something."""
    session = sm.Session(
        settings or sm.Settings(fallback_models=("b",), max_retries=1), seed=3, clock=ManualClock()
    )
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={"m": 1}, size=10))
    turn.send(fail("overloaded"))
    turn.send(sm.WaitDone())
    turn.send(fail("overloaded"))  # retries spent: the fallback
    turn.send(sm.ModelReplied(cost=0.5, tool_calls=[sm.ToolCall("c1", "fs", "read", {})]))
    return json.loads(json.dumps(session.snapshot()))


def _refused(data: dict[str, Any], match: str) -> None:
    with pytest.raises(sm.SnapshotError, match=match):
        sm.Session.restore(data, clock=ManualClock())


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize("seed", [7.0, True, "7"])
def test_a_seed_that_is_not_an_int_is_refused(seed: object) -> None:
    data = _snapshot()
    data["seed"] = seed
    _refused(data, "seed: must be int")


@pytest.mark.requirement("ER-38")
def test_tool_calls_that_are_not_tool_calls_are_refused() -> None:
    data = _snapshot()
    data["turn"]["calls"] = [{"$type": "ModelError", "category": "unknown", "message": "x"}]
    _refused(data, r"turn\.calls: must hold ToolCall values")


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize("entry", [[4, 0.5, 9], [4], "4:0.5"])
def test_a_cost_entry_must_be_a_step_and_a_cost(entry: object) -> None:
    data = _snapshot()
    assert data["turn"]["costs"]
    data["turn"]["costs"] = [entry]
    _refused(data, r"turn\.costs\[0\]: must be \[step, cost\]")


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize("source", [[], {"a": 1}, 1])
def test_a_path_entry_that_names_no_row_is_refused_whatever_its_types(source: object) -> None:
    """A non-text state in a path entry (even an unhashable one) is a SnapshotError."""
    data = _snapshot()
    data["turn"]["path"][0][0] = source
    _refused(data, r"turn\.path\[0\]: .* is not a transition of this engine's table")


@pytest.mark.requirement("ER-38")
def test_a_fallback_must_name_its_model_as_text() -> None:
    data = _snapshot()
    assert data["turn"]["fallbacks"]
    forged = copy.deepcopy(data)
    forged["turn"]["fallbacks"][0]["to_model"] = 5
    _refused(forged, r"turn\.fallbacks: must hold Fallback values")


@pytest.mark.requirement("ER-26")
def test_a_wait_of_zero_seconds_restores() -> None:
    """With no base delay the engine waits 0 s; a snapshot holding that wait restores."""
    session = sm.Session(sm.Settings(base_delay_ms=0), seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={}, size=1))
    wait = turn.send(fail("rate_limited"))
    assert isinstance(wait, sm.Wait)
    assert wait.seconds == 0.0
    restored = sm.Session.restore(json.loads(json.dumps(session.snapshot())), clock=ManualClock())
    assert restored.current_turn is not None
    assert restored.current_turn.action == wait


@pytest.mark.requirement("ER-97")
def test_restored_traces_share_their_steps() -> None:
    """A step (row and counters) met before is shared, not copied: two sessions restored
    from one snapshot hold the same step objects, so a trace costs a pointer a step."""
    data = _snapshot()
    one = sm.Session.restore(data, clock=ManualClock()).state.turn
    two = sm.Session.restore(data, clock=ManualClock()).state.turn
    assert one is not None and two is not None
    assert len(one.path) == len(two.path) > 3
    assert all(a is b for a, b in zip(one.path, two.path, strict=True))


# -- a second sample (seed 14) ---------------------------------------------------------


@pytest.mark.requirement("ER-38")
def test_a_seed_must_fit_64_bits() -> None:
    data = _snapshot()
    data["seed"] = 2**64 - 1
    assert sm.Session.restore(data, clock=ManualClock()).seed == 2**64 - 1
    data["seed"] = 2**64
    _refused(data, r"^seed: must be a 64-bit unsigned int, got an int of 65 bits")


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize(("calls", "shown"), [([], r"\(\)"), (["c1"], r"\('c1',\)")])
def test_an_invoke_tools_action_must_carry_tool_calls(calls: list[Any], shown: str) -> None:
    """A forged InvokeTools with no calls, or with calls that are not ToolCalls, is not
    an action the engine writes."""
    data = _snapshot()
    data["turn"]["actions"][-1]["calls"] = calls
    _refused(
        data, rf"^turn\.actions\[5\]: InvokeTools\.calls: {shown} is not what the engine writes"
    )


@pytest.mark.requirement("ER-97")
@pytest.mark.parametrize("times", [{}, "", {"0": 0.0}])
def test_step_times_must_be_a_list(times: object) -> None:
    data = _snapshot()
    data["turn"]["times"] = times
    _refused(data, r"^turn\.times: must be list, got (dict|str)")


# the fields formats 3 and 4 added, written out (a test that read the declaration would
# move with a mutated ``since``)
_SINCE_3 = (
    "session_id", "parent_id", "children", "child_costs", "ancestor_budget_usd",
    "ancestor_mark_usd", "tool_retries", "denials", "denial_log", "crash_logs",
    "doom_window", "doom_since", "idle_s", "finished_at",
)  # fmt: skip
_TURN_SINCE_3 = ("in_flight", "outcomes", "pending", "conflict_attempt", "costs")


@pytest.mark.requirement("ER-38")
def test_a_format_2_snapshot_restores_with_the_later_fields_at_their_defaults() -> None:
    """A version-2 snapshot has none of the fields formats 3 and 4 added: it restores,
    each of them at its declared default, and snapshots again as today's format. (It
    did not: the empty child costs and crash windows were filled in as null, which the
    reader refuses, so every stored version-2 session failed to restore.)"""
    session = sm.Session(sm.Settings(), seed=3, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={"m": 1}, size=10))
    data = json.loads(json.dumps(session.snapshot()))
    data["version"] = 2
    for key in _SINCE_3:
        del data[key]
    for key in (*_TURN_SINCE_3, "times"):
        del data["turn"][key]
    restored = sm.Session.restore(data, clock=ManualClock())
    again = restored.snapshot()
    assert again["version"] == 5
    assert (again["parent_id"], again["ancestor_mark_usd"], again["children"]) == (None, 0.0, 0)
    assert (again["child_costs"], again["crash_logs"]) == ({}, {})
    assert again["turn"]["times"] == [None, None]


@pytest.mark.requirement("ER-38")
def test_the_store_text_of_a_snapshot_writes_optional_numbers_as_numbers() -> None:
    """The store's text of a snapshot and ``json.dumps`` of it agree byte for byte,
    also for the optional numbers (an overflowed request's size, an ancestor's budget)
    once they hold one."""
    from statemachine.core._snapshot import write_snapshot
    from statemachine.core._state_text import json_text

    parent = sm.Session(sm.Settings(max_cost_usd=5.0), seed=3, clock=ManualClock())
    child = parent.spawn()
    turn = child.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={"m": 1}, size=10))
    turn.send(fail("context_length_exceeded"))
    state = child.state
    assert state.turn is not None and state.turn.overflowed_size == 10
    assert state.ancestor_budget_usd == 5.0
    now = 1000.0
    text = json_text(write_snapshot(child.settings, state, now))
    expected = json.dumps(child.snapshot(), separators=(",", ":"), ensure_ascii=False)
    assert json.loads(text) == json.loads(expected)
    assert text == expected


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize(
    ("where", "key", "message"),
    [
        ((), "tripped", "must be list of provider names"),
        (("turn",), "costs", "must be list"),
        (("turn",), "path", "must be list"),
        (("turn",), "actions", "must be list"),
    ],
)
@pytest.mark.parametrize("value", ["", {}])
def test_a_list_field_that_holds_no_list_is_refused(
    where: tuple[str, ...], key: str, message: str, value: object
) -> None:
    """An empty text or object where a list belongs is refused by name (iterating it
    would read it as an empty list)."""
    data = _snapshot()
    target = data
    for step in where:
        target = target[step]
    target[key] = value
    name = ".".join((*where, key)).replace(".", r"\.")
    _refused(data, rf"^{name}: {message}, got (str|dict)")


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize("counter", [0.0, False, 1.0, True])
def test_a_path_counter_that_is_not_an_int_is_refused(counter: object) -> None:
    """A step's counters are ints: ``0.0``, ``false`` (equal to 0 in Python) and their
    like are refused by name, not read as the number."""
    data = _snapshot()
    data["turn"]["path"][0][4] = counter
    _refused(data, r"^turn\.path\[0\]\[4\]: must be int, got (float|bool)")


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize("turn", [5, "turn", [], True])
def test_a_turn_that_is_not_an_object_is_a_snapshot_error(turn: object) -> None:
    """A forged ``turn`` of the wrong type is a SnapshotError naming the key (never a
    TypeError from deeper in the reader)."""
    data = _snapshot()
    data["turn"] = turn
    _refused(data, r"^turn: must be a JSON object, got ")


@pytest.mark.requirement("ER-70")
def test_a_second_compaction_in_a_turn_whose_costs_stopped_growing_writes_valid_json() -> None:
    """A turn with many retries is compacted twice by the store (every 32 entries); its
    costs grew before the first compaction and not after, so the second writes the
    costs the first wrote and nothing more. The record reads back, as JSON and as the
    session the worker holds (before: the text writer could append an empty ``,``)."""
    settings = sm.Settings(max_retries=100, session_retry_ceiling=1000, max_delay_ms=1000)
    store = InMemoryStore()
    worker = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    r = worker.create("s", sm.Session(settings, seed=1, clock=lambda: 0.0))
    r = worker.advance("s", None, expected_version=r.version)
    r = worker.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    steps = 0
    for attempt in range(COMPACT_EVERY + 2):  # two compactions: 2 entries per retry
        cost = 0.01 if attempt < 4 else 0.0
        error = sm.ModelError("rate_limited")
        r = worker.advance("s", sm.ModelFailed(error, cost=cost), expected_version=r.version)
        r = worker.advance("s", sm.WaitDone(), expected_version=r.version)
        steps += 2
    payload = store.load_payload("s")[1]
    data = json.loads(payload)  # valid JSON
    assert data["snapshot"]["turn"]["costs"] == [[i, 0.01] for i in (2, 4, 6, 8)]
    # the snapshot is the second compaction's (the first came half-way, at attempt 15)
    assert COMPACT_EVERY // 2 < data["snapshot"]["turn"]["attempt"] <= COMPACT_EVERY + 2
    assert 0 < len(data["journal"]) < COMPACT_EVERY
    fresh = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0, remember=0)
    assert fresh.load("s").session.snapshot() == r.session.snapshot()
    assert steps > 2 * COMPACT_EVERY


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize(("seed", "shown"), [(-1, "-1"), (1 << 64, "an int of 65 bits")])
def test_a_seed_outside_64_unsigned_bits_is_refused(seed: int, shown: str) -> None:
    """-1 and 2**64 are refused by name; 0 and 2**64 - 1, the ends of the range, restore."""
    data = _snapshot()
    data["seed"] = seed
    _refused(data, rf"^seed: must be a 64-bit unsigned int, got {shown}$")
    for edge in (0, (1 << 64) - 1):
        data["seed"] = edge
        assert sm.Session.restore(data, clock=ManualClock()).seed == edge


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize(("value", "shown"), [(5, "int"), ("\ud800", "str")])
def test_a_text_field_must_be_valid_text(value: object, shown: str) -> None:
    """A text field (here the doom run's fingerprint) holding a number, or a string
    that is not valid Unicode (a lone surrogate, which no JSON writer can encode), is
    refused by name."""
    data = _snapshot()
    data["doom_last"] = value
    _refused(data, rf"^doom_last: must be str or null, got {shown}$")


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize(
    ("breakers", "message"),
    [
        ([], r"^breakers: must be dict of provider: count, got list$"),
        ("fs", r"^breakers: must be dict of provider: count, got str$"),
        ({"": 1}, r"^breakers: provider names must be non-empty str, got ''$"),
        ({"fs": 1.0}, r"^breakers\.fs: must be int, got float$"),
    ],
)
def test_crash_counts_must_map_provider_names_to_counts(breakers: object, message: str) -> None:
    """The breakers' crash counts: an object of non-empty provider names to ints, each
    refusal naming the key."""
    data = _snapshot()
    data["breakers"] = breakers
    _refused(data, message)


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize("value", ["5", float("inf"), float("nan"), True])
def test_a_signed_number_must_be_finite(value: object) -> None:
    """The ancestors' budget last read (which may be negative: overspent) must be a
    finite number or null."""
    data = _snapshot()
    data["ancestor_budget_usd"] = value
    _refused(data, r"^ancestor_budget_usd: must be a finite number or null, got ")


def _crash_window_snapshot() -> dict[str, Any]:
    """A tool's provider crashed once with a crash window kept (``breaker_window``)."""
    settings = sm.Settings(breaker_window=5, breaker_window_threshold=3)
    session = sm.Session(settings, seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    turn.send(sm.ModelReplied(tool_calls=[sm.ToolCall("c1", "fs", "read", {})]))
    crashed = sm.ToolOutcome("c1", False, "x", category=sm.ToolErrorCategory.PROCESS_CRASHED)
    turn.send(sm.ToolsDone((crashed,)))
    data: dict[str, Any] = json.loads(json.dumps(session.snapshot()))
    assert data["crash_logs"] == {"fs": "1"}
    return data


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize(
    ("logs", "message"),
    [
        ({"fs": "012"}, r"^crash_logs\.fs: must be a str of 0s and 1s, got '012'$"),
        ({"fs": 1}, r"^crash_logs\.fs: must be a str of 0s and 1s, got 1$"),
        ({"": "1"}, r"^crash_logs: provider names must be non-empty str, got ''$"),
        ([], r"^crash_logs: must be dict of provider: window, got list$"),
    ],
)
def test_crash_windows_must_map_provider_names_to_windows(logs: object, message: str) -> None:
    """A crash window is a text of 0s and 1s per provider: the engine's restores, a
    forged one is refused naming the key."""
    data = _crash_window_snapshot()
    assert sm.Session.restore(copy.deepcopy(data), clock=ManualClock()).snapshot() == data
    data["crash_logs"] = logs
    _refused(data, message)


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize("child", ["", "\ud800"])
def test_a_child_id_must_be_valid_non_empty_text(child: str) -> None:
    data = _snapshot()
    data["child_costs"] = {child: 0.0}
    _refused(data, r"^child_costs: session ids must be non-empty str, got ")


@pytest.mark.requirement("ER-38")
def test_a_usage_entry_is_a_step_and_a_usage() -> None:
    """A usage kept per model call: the engine's ``[step, usage]`` restores; an entry
    of three items is refused naming it."""
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    turn.send(sm.ModelReplied(cost=0.5, usage=sm.Usage(input_tokens=3, cost_usd=0.5)))
    data: dict[str, Any] = json.loads(json.dumps(session.snapshot()))
    assert sm.Session.restore(copy.deepcopy(data), clock=ManualClock()).snapshot() == data
    data["turn"]["usages"][0].append(1)
    _refused(data, r"^turn\.usages\[0\]: must be \[step, usage\], got ")


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize("pending", ["c1", [""], [1], {}])
def test_pending_calls_must_be_a_list_of_call_ids(pending: object) -> None:
    data = _snapshot()
    data["turn"]["pending"] = pending
    _refused(data, r"^turn\.pending: must be a list of call ids, got ")


@pytest.mark.requirement("ER-38")
def test_an_action_count_is_read_up_to_the_largest_count() -> None:
    """An action's attempt is a count up to 2**63 - 1: that is read (and then refused by
    the reachable-state rule, which compares it with its step), one more is refused
    while decoding."""
    data = _snapshot()
    data["turn"]["actions"][1]["attempt"] = (1 << 63) - 1
    _refused(copy.deepcopy(data), r"^turn\.actions\[1\]: CallModel attempt 9223372036854775807, ")
    data["turn"]["actions"][1]["attempt"] = 1 << 63
    _refused(data, r"^turn\.actions\[1\]: CallModel\.attempt: 9223372036854775808 is not what")


@pytest.mark.requirement("ER-38")
@pytest.mark.parametrize(
    ("value", "shown"), [("soon", "'soon'"), (float("inf"), "inf"), (True, "True")]
)
def test_a_deferred_finishs_retry_at_must_be_a_finite_number(value: object, shown: str) -> None:
    """A turn deferred by a long server wait ends with a Finish carrying ``retry_at``:
    restored as written; a forged one that is no finite number is refused by the
    action's check, naming the field."""
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    turn.send(sm.ModelFailed(sm.ModelError("rate_limited", retry_after_seconds=10_000)))
    data: dict[str, Any] = json.loads(json.dumps(session.snapshot()))
    assert data["turn"]["actions"][-1]["retry_at"] == 10_000.0
    assert sm.Session.restore(copy.deepcopy(data), clock=ManualClock()).snapshot() == data
    data["turn"]["actions"][-1]["retry_at"] = value
    _refused(
        data, rf"^turn\.actions\[2\]: Finish\.retry_at: {shown} is not what the engine writes$"
    )


# -- issue 38's sample (seed 20261207) ---------------------------------------------------


@pytest.mark.requirement("ER-38")
def test_a_tripped_breaker_restores_naming_its_provider() -> None:
    """A session whose breaker tripped on provider ``fs`` (a crash at the threshold of 1)
    restores with ``fs`` tripped and the breaker's limit, and its snapshot reads back
    as written."""
    session = sm.Session(sm.Settings(breaker_threshold=1), seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    turn.send(sm.ModelReplied(tool_calls=[sm.ToolCall("c1", "fs", "read", {})]))
    crashed = sm.ToolOutcome("c1", False, "x", category=sm.ToolErrorCategory.PROCESS_CRASHED)
    turn.send(sm.ToolsDone((crashed,)))
    assert session.tripped_providers == frozenset({"fs"})
    data = json.loads(json.dumps(session.snapshot()))
    assert data["tripped"] == ["fs"]
    restored = sm.Session.restore(data, clock=ManualClock())
    assert restored.tripped_providers == frozenset({"fs"})
    assert restored.limit_reached is sm.SessionStatus.ERROR_CIRCUIT_BREAKER
    assert json.loads(json.dumps(restored.snapshot())) == data


@pytest.mark.requirement("ER-97")
def test_live_traces_share_their_steps() -> None:
    """Sessions stepping through the same rows with the same counters in one process
    hold the same step objects (a trace costs a pointer a step), as restored ones do."""
    paths = []
    for seed in (1, 2):
        session = sm.Session(sm.Settings(), seed=seed, clock=ManualClock())
        turn = session.new_turn()
        turn.start()
        turn.send(sm.Assembled({"m": seed}, 5))
        turn.send(fail("overloaded"))
        state = session.state.turn
        assert state is not None
        paths.append(state.path)
    one, two = paths
    assert len(one) == len(two) == 3
    assert all(a is b for a, b in zip(one, two, strict=True))
