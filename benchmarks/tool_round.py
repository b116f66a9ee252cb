"""Measurement 8: a tool round of n calls, per call, from 1 to 64 calls.

One round is ``ModelReplied`` with n tool calls (to four providers, distinct
arguments, so the doom-loop detector fingerprints every call) and the ``ToolsDone``
with one outcome each (a quarter of them ``process_crashed``). The cost per call should
be flat in n and at most twice a 1-call round's: nothing in a round may cost more than
linearly in its calls. Rounds of every size run interleaved.
"""

from __future__ import annotations

import statistics
from typing import Any

import statemachine as sm

from ._timing import interleaved

SIZES = (1, 2, 4, 8, 16, 32, 64)


def _round(n: int, turns: int) -> Any:
    calls = tuple(sm.ToolCall(f"c{i}", f"plugin-{i % 4}", "search", {"query": i}) for i in range(n))
    reply = sm.ModelReplied(calls)
    done = sm.ToolsDone(
        tuple(
            sm.ToolOutcome(c.id, False, "died", "process_crashed")
            if i % 4 == 3
            else sm.ToolOutcome(c.id, True, "ok")
            for i, c in enumerate(calls)
        )
    )
    settings = sm.Settings(breaker_threshold=10**6, doom_loop_threshold=5)

    def setup() -> list[sm.Turn]:
        out = []
        for i in range(turns):
            session = sm.Session(settings, seed=i, clock=lambda: 0.0)
            turn = session.new_turn()
            turn.start()
            turn.send(sm.Assembled("r", 10))
            out.append(turn)
        return out

    def body(ready: list[sm.Turn]) -> None:
        for turn in ready:
            turn.send(reply)
            turn.send(done)

    return setup, body, turns * n


def run(turns: int = 300, repeats: int = 7) -> dict[str, Any]:
    """µs per call of a round of each size, and the largest over the 1-call round's."""
    runs = interleaved({str(n): _round(n, turns) for n in SIZES}, repeats=repeats)
    per_call = {n: statistics.median(values) * 1e6 for n, values in runs.items()}
    one = per_call["1"]
    worst = max(per_call.values()) / one if one else float("inf")
    return {
        "unit": "µs per tool call of a round (ModelReplied + ToolsDone), median of rounds",
        "per_call_us": per_call,
        "worst_over_one_call": worst,
        "target": {"worst_over_one_call": 2.0},
        "met": worst <= 2.0,
    }
