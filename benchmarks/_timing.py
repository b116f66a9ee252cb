"""Shared timing helpers: warm up, repeat, take the median, with the GC off.

Every micro-timing runs a *batch* of operations between two ``time.perf_counter()``
reads (so the clock's own cost is spread over the batch), repeats the batch several
times on freshly prepared state, discards a warm-up run, and reports the median per
operation. The cyclic garbage collector is disabled while a batch runs (and enabled
between batches): none of the code measured here creates reference cycles per
operation, and a collection landing in one batch would only add noise.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any, TypeVar

S = TypeVar("S")

FULL_COLLECT = True
"""Run a full ``gc.collect()`` before every batch (the runner turns it off for ``--quick``)."""


def measure(
    setup: Callable[[], S],
    body: Callable[[S], Any],
    ops: int,
    *,
    repeats: int = 7,
    warmup: int = 1,
) -> dict[str, float]:
    """Median / min / max seconds per operation of ``body(setup())`` doing ``ops`` ops."""
    if ops <= 0:
        raise ValueError(f"ops: must be > 0, got {ops}")
    runs: list[float] = []
    for i in range(warmup + repeats):
        state = setup()
        if FULL_COLLECT:
            gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            body(state)
            t1 = time.perf_counter()
        finally:
            gc.enable()
        if i >= warmup:
            runs.append((t1 - t0) / ops)
    return {
        "median_us": statistics.median(runs) * 1e6,
        "min_us": min(runs) * 1e6,
        "max_us": max(runs) * 1e6,
        "repeats": float(repeats),
        "ops": float(ops),
    }


def ratio(a: float, b: float) -> float:
    """``a / b``, or ``inf`` for a zero denominator."""
    return a / b if b else float("inf")


Variant = tuple[Callable[[], Any], Callable[[Any], Any], int]
"""(setup, body, ops): one contender of an interleaved comparison."""


def interleaved(
    variants: dict[str, Variant], *, repeats: int = 7, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds per op of each variant, one batch of each per round, rounds repeated.

    Running the contenders round-robin (rather than all repeats of one, then all of
    the next) exposes them to the same machine noise, so a ratio taken within a round
    compares like with like even on a busy machine.
    """
    runs: dict[str, list[float]] = {name: [] for name in variants}
    for i in range(warmup + repeats):
        for name, (setup, body, ops) in variants.items():
            state = setup()
            if FULL_COLLECT:
                gc.collect()
            gc.disable()
            try:
                t0 = time.perf_counter()
                body(state)
                t1 = time.perf_counter()
            finally:
                gc.enable()
            if i >= warmup:
                runs[name].append((t1 - t0) / ops)
    return runs
