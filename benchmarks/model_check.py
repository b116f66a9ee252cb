"""Measurement 5a: the exhaustive model check of default settings, timed.

Calls ``statemachine.dev.check.check(Settings())`` ``repeats`` times and reports the
median wall time (and the CPU time the process spent, which a busy shared machine
inflates less) and the state count the report gives. Skips with a message if the
checker is not importable. Target: < 5 s.
"""

from __future__ import annotations

import importlib
import statistics
import time
from typing import Any

import statemachine as sm

_COUNT_NAMES = (
    "states",
    "state_count",
    "n_states",
    "num_states",
    "states_explored",
    "explored",
    "visited",
    "configurations",
)


def _count(report: Any) -> int | None:
    """The number of states explored, whatever the report calls it."""
    for name in _COUNT_NAMES:
        value = report.get(name) if isinstance(report, dict) else getattr(report, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, list | tuple | set | frozenset | dict):
            return len(value)
    return None


def run(repeats: int = 3) -> dict[str, Any]:
    """Seconds and state count of ``check(Settings())`` (or a skip message)."""
    try:
        module = importlib.import_module("statemachine.dev.check")
        check = module.check
    except (ImportError, AttributeError) as exc:
        return {"skipped": f"statemachine.dev.check.check is not available yet ({exc})"}
    settings = sm.Settings()
    times = []
    cpu = []
    report: Any = None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            report = check(settings)
        except NotImplementedError as exc:
            return {"skipped": f"check() is not implemented yet ({exc})"}
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    seconds = statistics.median(times)
    violations = getattr(report, "violations", None)
    return {
        "seconds": seconds,
        # the CPU this process spent: on a shared machine, closer to what an idle one takes
        "cpu_seconds": statistics.median(cpu),
        "states": _count(report),
        "edges": getattr(report, "edges", None),
        "exact": getattr(report, "exact", None),
        "violations": len(violations) if violations is not None else None,
        "checker_seconds": getattr(report, "seconds", None),
        "target": {"seconds": 5.0},
        "met": seconds < 5.0,
    }
