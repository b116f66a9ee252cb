"""Measurement 4a: memory per live turn, with ``n`` (10,000) turns alive at once.

Measured with ``tracemalloc`` (net bytes allocated and still held, after a full
collection). Every turn lives in its own session and is *mid-flight*. Two shapes:

* ``calling``: start -> Assembled -> now in ``calling`` (2 trace entries);
* ``after 1 retry``: start -> Assembled -> ModelFailed(rate_limited) -> WaitDone ->
  now in ``calling`` again, attempt 1 (4 trace entries, holding a ``Wait`` and two
  ``CallModel`` actions);
* ``after 5 retries``: the same with five retries, attempt 5 (12 trace entries): the
  largest a turn gets on one call with default settings, since the trace grows with
  every transition.

Reported per session+turn and per turn alone (the sessions' bytes measured first and
subtracted). The request object and the events are shared (they are the host's data).
For comparison, at a smaller count: a ``random.Random``, a ``transitions`` machine
per object, and one shared machine with every object ``add_model``-ed.
"""

from __future__ import annotations

import gc
import random
import tracemalloc
from collections.abc import Callable
from typing import Any

from transitions import Machine

import statemachine as sm

REQUEST = {"messages": [{"role": "user", "content": "hi"}]}
ASSEMBLED = sm.Assembled(REQUEST, 1000)
FAILED = sm.ModelFailed(sm.ModelError("rate_limited"))
DONE = sm.WaitDone()


def _clock() -> float:
    return 0.0


def _net(build: Callable[[], Any]) -> tuple[int, Any]:
    """Bytes still allocated by ``build()`` (kept alive by its return value)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return after - before, kept


def _advance(turn: sm.Turn, retries: int) -> None:
    turn.start()
    turn.send(ASSEMBLED)
    for _ in range(retries):
        turn.send(FAILED)
        turn.send(DONE)


def _shape(n: int, retries: int) -> dict[str, float]:
    settings = sm.Settings()
    sessions_bytes, sessions = _net(lambda: [sm.Session(settings, i, _clock) for i in range(n)])

    def turns(sessions: list[sm.Session] = sessions) -> list[sm.Turn]:
        out = []
        for session in sessions:
            turn = session.new_turn()
            _advance(turn, retries)
            out.append(turn)
        return out

    turns_bytes, kept = _net(turns)
    assert all(t.state == "calling" for t in kept)
    del kept, sessions
    return {
        "per_session_bytes": sessions_bytes / n,
        "per_turn_bytes": turns_bytes / n,
        "per_session_and_turn_bytes": (sessions_bytes + turns_bytes) / n,
    }


class _Plain:
    def __init__(self) -> None:
        self.state = "idle"


def _transitions(count: int) -> dict[str, float]:
    states = ["idle", "assembling", "calling", "backing_off", "done"]

    def per_object() -> list[Any]:
        kept = []
        for _ in range(count):
            obj = _Plain()
            machine = Machine(model=obj, states=states, initial="idle", auto_transitions=False)
            machine.add_transition("go", "idle", "assembling")
            kept.append((obj, machine))
        return kept

    def shared() -> list[Any]:
        machine = Machine(model=None, states=states, initial="idle", auto_transitions=False)
        machine.add_transition("go", "idle", "assembling")
        models = [_Plain() for _ in range(count)]
        machine.add_model(models)
        return [machine, models]

    def plain() -> list[Any]:
        return [_Plain() for _ in range(count)]

    per_object_bytes, kept = _net(per_object)
    del kept
    shared_bytes, kept = _net(shared)
    del kept
    plain_bytes, kept = _net(plain)
    del kept
    random_bytes, kept = _net(lambda: [random.Random(i) for i in range(count)])
    del kept
    return {
        "transitions machine per object (5 states)": per_object_bytes / count,
        "transitions shared machine, per add_model-ed object": (shared_bytes - plain_bytes) / count,
        "random.Random": random_bytes / count,
    }


def run(n: int = 10_000, compare: int = 1000) -> dict[str, Any]:
    """Bytes per live turn / session+turn, and the comparison points."""
    shapes = {
        "calling": _shape(n, 0),
        "after 1 retry": _shape(n, 1),
        "after 5 retries": _shape(n, 5),
    }
    worst = max(shape["per_session_and_turn_bytes"] for shape in shapes.values())
    return {
        "unit": "bytes (tracemalloc, net)",
        "live": n,
        "shapes": shapes,
        "comparison": _transitions(compare),
        "target": {"per_session_and_turn_bytes": 2048},
        "met": worst <= 2048,
    }
