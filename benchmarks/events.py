"""Measurement 2: µs per event on every path of a turn.

Each path is a list of steps (``start()`` or an event). ``n`` turns, each in its own
session (so no cross-turn effect such as the doom-loop detector or the session retry
ceiling changes the path), are brought to the step, then the step alone is timed
across all ``n`` turns: the median over repeats, per event. Events are built once and
shared (building them is the host's job).

Paths:

* ``happy``: start -> Assembled -> ModelReplied() (completed).
* ``retry``: start -> Assembled -> ModelFailed(rate_limited) -> WaitDone -> ModelReplied.
* ``reduction``: start -> Assembled(1000) -> ModelFailed(context_length_exceeded)
  -> Assembled(500) -> ModelReplied.
* ``tool crash``: start -> Assembled -> ModelReplied(one tool call) -> ToolsDone(one
  ``process_crashed`` outcome) (completed, with an error-flagged tool result).
"""

from __future__ import annotations

import statistics
from typing import Any

import statemachine as sm

from ._timing import Variant, interleaved

START = "start()"
REQUEST = {"messages": [{"role": "user", "content": "hi"}]}
SMALLER = {"messages": []}

CALL = sm.ToolCall("call-1", "plugin-a", "search", {"query": "weather", "limit": 3})
CRASH = sm.ToolOutcome("call-1", ok=False, content="plugin died", category="process_crashed")

PATHS: dict[str, list[tuple[str, Any]]] = {
    "happy": [
        ("start", START),
        ("Assembled", sm.Assembled(REQUEST, 1000)),
        ("ModelReplied", sm.ModelReplied()),
    ],
    "retry": [
        ("start", START),
        ("Assembled", sm.Assembled(REQUEST, 1000)),
        ("ModelFailed(rate_limited)", sm.ModelFailed(sm.ModelError("rate_limited"))),
        ("WaitDone", sm.WaitDone()),
        ("ModelReplied", sm.ModelReplied()),
    ],
    "reduction": [
        ("start", START),
        ("Assembled", sm.Assembled(REQUEST, 1000)),
        (
            "ModelFailed(context_length_exceeded)",
            sm.ModelFailed(sm.ModelError("context_length_exceeded")),
        ),
        ("Assembled(smaller)", sm.Assembled(SMALLER, 500)),
        ("ModelReplied", sm.ModelReplied()),
    ],
    "tool crash": [
        ("start", START),
        ("Assembled", sm.Assembled(REQUEST, 1000)),
        ("ModelReplied(1 tool call)", sm.ModelReplied(tool_calls=(CALL,))),
        ("ToolsDone(process_crashed)", sm.ToolsDone((CRASH,))),
    ],
}

EXPECTED_END = {
    "happy": sm.TurnStatus.COMPLETED,
    "retry": sm.TurnStatus.COMPLETED,
    "reduction": sm.TurnStatus.COMPLETED,
    "tool crash": sm.TurnStatus.COMPLETED,
}


def _step(turn: sm.Turn, event: Any) -> Any:
    return turn.start() if event is START else turn.send(event)


def _turns_at(steps: list[tuple[str, Any]], k: int, n: int) -> list[sm.Turn]:
    turns = []
    for i in range(n):
        turn = sm.Session(seed=i, clock=lambda: 0.0).new_turn()
        for _, event in steps[:k]:
            _step(turn, event)
        turns.append(turn)
    return turns


def step_variant(steps: list[tuple[str, Any]], k: int, n: int) -> Variant:
    """(setup, body, ops) timing step ``k`` alone across ``n`` turns brought to it."""
    event = steps[k][1]
    if event is START:

        def body(turns: list[sm.Turn]) -> None:
            for turn in turns:
                turn.start()

    else:

        def body(turns: list[sm.Turn]) -> None:
            for turn in turns:
                turn.send(event)

    return (lambda: _turns_at(steps, k, n), body, n)


def run(n: int = 2000, repeats: int = 9) -> dict[str, Any]:
    """Median µs for every step of every path, and per path the mean and worst step.

    Every step of every path is one contender of an interleaved comparison (one batch
    of each per round), so a burst of machine noise lands on one round of every step
    rather than on all the repeats of one step.
    """
    variants: dict[str, Variant] = {}
    for name, steps in PATHS.items():
        # sanity: the path ends where it should
        (turn,) = _turns_at(steps, len(steps), 1)
        assert turn.status is EXPECTED_END[name], (name, turn.status, turn.trace)
        for k, (label, _) in enumerate(steps):
            variants[f"{name}\0{label}"] = step_variant(steps, k, n)
    runs = interleaved(variants, repeats=repeats)
    paths: dict[str, Any] = {}
    for name, steps in PATHS.items():
        per_step = {label: statistics.median(runs[f"{name}\0{label}"]) * 1e6 for label, _ in steps}
        best = {label: min(runs[f"{name}\0{label}"]) * 1e6 for label, _ in steps}
        values = list(per_step.values())
        paths[name] = {
            "steps_us": per_step,
            "steps_best_us": best,
            "mean_us_per_event": statistics.fmean(values),
            "median_us_per_event": statistics.median(values),
            "worst_us": max(values),
        }
    worst = max(p["worst_us"] for p in paths.values())
    worst_best = max(max(p["steps_best_us"].values()) for p in paths.values())
    return {
        "unit": "µs per event (median over interleaved rounds, each over n turns)",
        "worst_event_best_us": worst_best,
        "paths": paths,
        "worst_event_us": worst,
        "target": {"worst_event_us": 5.0},
        "met": worst <= 5.0,
    }
