"""Measurement 3: creating a session and a turn, and whether it grows with live turns.

* ``Session(settings, seed, clock)``, ``session.new_turn()`` and ``turn.start()``, each
  timed alone over a batch (median of interleaved rounds, GC off).
* Growth: with L session+turn pairs alive (each turn mid-flight in ``calling``), the
  time to create ``batch`` more (session + turn + start) for L = 1k, 10k, 100k. A flat
  line means no per-turn registration anywhere (no ``add_model`` into a shared machine).
* For comparison, ``transitions``' ``add_model`` into one shared machine at 1k and 10k
  registered models (the cost that grows), from the issue's reference points.
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

from transitions import Machine

import statemachine as sm

from ._timing import interleaved, ratio


def _clock() -> float:
    return 0.0


def _creation(n: int, repeats: int) -> dict[str, float]:
    settings = sm.Settings()
    session_cls = sm.Session

    def make_sessions(_: None) -> None:
        for i in range(n):
            session_cls(settings, i, _clock)

    def sessions() -> list[sm.Session]:
        return [session_cls(settings, i, _clock) for i in range(n)]

    def new_turns(ss: list[sm.Session]) -> None:
        for s in ss:
            s.new_turn()

    def turns() -> list[sm.Turn]:
        return [session_cls(settings, i, _clock).new_turn() for i in range(n)]

    def start(ts: list[sm.Turn]) -> None:
        for t in ts:
            t.start()

    def both(_: None) -> None:
        for i in range(n):
            session_cls(settings, i, _clock).new_turn()

    runs = interleaved(
        {
            "Session()": (lambda: None, make_sessions, n),
            "session.new_turn()": (sessions, new_turns, n),
            "turn.start()": (turns, start, n),
            "Session() + new_turn()": (lambda: None, both, n),
        },
        repeats=repeats,
    )
    return {name: statistics.median(values) * 1e6 for name, values in runs.items()}


def _live(count: int) -> list[sm.Turn]:
    request = {"messages": [{"role": "user", "content": "hi"}]}
    assembled = sm.Assembled(request, 1000)
    live = []
    for i in range(count):
        turn = sm.Session(seed=i, clock=_clock).new_turn()
        turn.start()
        turn.send(assembled)
        live.append(turn)
    return live


def _growth(levels: tuple[int, ...], batch: int, repeats: int) -> dict[str, float]:
    """Sweep the live count up (1k -> 10k -> 100k) and back down, timing creation at
    each stop; a level's figure is the median over both passes (drift cancels)."""
    settings = sm.Settings()
    runs: dict[int, list[float]] = {level: [] for level in levels}
    live: list[sm.Turn] = []

    def time_creation(level: int) -> None:
        for i in range(repeats + 1):
            gc.collect()
            gc.disable()
            t0 = time.perf_counter()
            for j in range(batch):
                sm.Session(settings, j, _clock).new_turn().start()
            t1 = time.perf_counter()
            gc.enable()
            if i:
                runs[level].append((t1 - t0) / batch * 1e6)

    for level in levels:
        live += _live(level - len(live))
        time_creation(level)
    for level in reversed(levels[:-1]):
        del live[level:]
        time_creation(level)
    del live
    gc.collect()
    return {f"{level} live": statistics.median(values) for level, values in runs.items()}


class _Plain:
    def __init__(self) -> None:
        self.state = "idle"


def _add_model(levels: tuple[int, ...], batch: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for level in levels:
        machine = Machine(model=None, states=["idle", "busy"], initial="idle")
        machine.add_transition("go", "idle", "busy")
        models = [_Plain() for _ in range(level)]
        machine.add_model(models)
        extra = [_Plain() for _ in range(batch)]
        gc.collect()
        gc.disable()
        t0 = time.perf_counter()
        for model in extra:
            machine.add_model(model)
        t1 = time.perf_counter()
        gc.enable()
        out[f"{level} registered"] = (t1 - t0) / batch * 1e6
        del machine, models, extra
        gc.collect()
    return out


def run(
    n: int = 5000,
    repeats: int = 7,
    levels: tuple[int, ...] = (1_000, 10_000, 100_000),
    batch: int = 2000,
    add_model_levels: tuple[int, ...] = (1_000, 10_000),
) -> dict[str, Any]:
    """Creation costs (µs) and creation time against the number of live turns."""
    creation = _creation(n, repeats)
    growth = _growth(levels, batch, max(repeats // 2, 1))
    values = list(growth.values())
    add_model = _add_model(add_model_levels, max(batch // 10, 1))
    am = list(add_model.values())
    turn_us = creation["session.new_turn()"]
    return {
        "unit": "µs (median)",
        "creation_us": creation,
        "growth_us_per_session_turn_start": growth,
        "growth_ratio_last_first": ratio(values[-1], values[0]),
        "transitions_add_model_us": add_model,
        "transitions_add_model_ratio_last_first": ratio(am[-1], am[0]),
        "target": {"new_turn_us": 10.0},
        "met": turn_us <= 10.0,
    }
