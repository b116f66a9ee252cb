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
