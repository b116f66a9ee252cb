"""What the mutation run of ``core/_state.py`` found untested (specs/mutation.md): forged
snapshot fields each kind must refuse, a zero wait, and the shared trace steps."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

import statemachine as sm

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
