"""Measurement 6: where state is copied, against the floors measured in the same run.

* ``snapshot()`` + ``Session.restore()`` of a session mid-turn (in ``backing_off``
  after two rate limits), against ``json.dumps`` + ``json.loads`` of that same
  snapshot: the target is at most 1.5x (issue 29; restore checks every field and the
  reachable-state rules, which a JSON round trip does not).
* ``Worker.advance`` on an ``InMemoryStore`` (one event per compare-and-set, the
  worker's remembered record reused; 4 turns of 8 events per session, so the
  snapshot is written anew within the measured advances), against the same events
  sent by hand: the target is at most 4x (issue 29). ``json.dumps`` of the stored record is
  measured beside it: what a store that writes its JSON records whole pays per write.

All contenders run interleaved, round by round, so a ratio compares like with like.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

import statemachine as sm
from statemachine.store import InMemoryStore, Worker

from ._timing import interleaved, ratio

REQUEST = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
RATE = sm.ModelFailed(sm.ModelError("rate_limited", "slow down", status=429))
WAIT_DONE = sm.WaitDone()


def _mid_turn() -> sm.Session:
    session = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0, wall_clock=lambda: 1.7e9)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(REQUEST, 100))
    turn.send(RATE)
    turn.send(WAIT_DONE)
    turn.send(RATE)
    return session


def _snapshot_variants(n: int) -> dict[str, Any]:
    session = _mid_turn()
    data = session.snapshot()

    def copy_through_engine(_: None) -> None:
        for _ in range(n):
            sm.Session.restore(session.snapshot(), clock=lambda: 0.0)

    def copy_through_json(_: None) -> None:
        for _ in range(n):
            json.loads(json.dumps(data))

    def snapshot_only(_: None) -> None:
        for _ in range(n):
            session.snapshot()

    def restore_only(_: None) -> None:
        for _ in range(n):
            sm.Session.restore(data, clock=lambda: 0.0)

    return {
        "snapshot() + restore()": (lambda: None, copy_through_engine, n),
        "json.dumps + json.loads of that snapshot": (lambda: None, copy_through_json, n),
        "snapshot() alone": (lambda: None, snapshot_only, n),
        "restore() alone": (lambda: None, restore_only, n),
    }


_TURNS = 4
"""Turns per session in the advance comparison: long enough that the worker writes the
snapshot anew (every ``COMPACT_EVERY`` journal entries) within the measured advances."""


def _turn_events() -> list[object | None]:
    """One turn: start (``None``), Assembled, (rate limit, wait) x 3, then a reply."""
    return [
        None,
        sm.Assembled(REQUEST, 100),
        *[e for _ in range(3) for e in (RATE, WAIT_DONE)],
        sm.ModelReplied(cost=0.001),
    ]


def _advance_variants(n: int) -> dict[str, Any]:
    events = _turn_events() * _TURNS
    settings = sm.Settings(session_retry_ceiling=10**9)

    def worker_setup() -> tuple[Worker, list[tuple[str, int]]]:
        worker = Worker(InMemoryStore(), clock=lambda: 0.0, now=lambda: 1.7e9)
        created = []
        for i in range(n):
            sid = f"s{i}"
            session = sm.Session(settings, seed=i, clock=lambda: 0.0)
            created.append((sid, worker.create(sid, session).version))
        return worker, created

    def through_worker(state: tuple[Worker, list[tuple[str, int]]]) -> None:
        worker, created = state
        for sid, first in created:
            version = first
            for event in events:
                version = worker.advance(sid, event, expected_version=version).version

    def engine_setup() -> list[sm.Session]:
        return [sm.Session(settings, seed=i, clock=lambda: 0.0) for i in range(n)]

    def by_hand(sessions: list[sm.Session]) -> None:
        for session in sessions:
            turn = None
            for event in events:
                if event is None:
                    turn = session.new_turn()
                    turn.start()
                else:
                    turn.send(event)  # type: ignore[union-attr]

    def record_setup() -> Any:
        worker, created = worker_setup()
        sid, version = created[0]
        for event in events[:-1]:
            version = worker.advance(sid, event, expected_version=version).version
        return worker.store.load(sid).record

    def dumps(record: Any) -> None:
        for _ in range(n * len(events)):
            json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    ops = n * len(events)
    return {
        "Worker.advance, InMemoryStore": (worker_setup, through_worker, ops),
        "one engine event (turn.send)": (engine_setup, by_hand, ops),
        "json.dumps of the stored record": (record_setup, dumps, ops),
    }


def run(n: int = 400, repeats: int = 7) -> dict[str, Any]:
    """µs per operation of each contender (median of rounds) and the two ratios."""
    snap = interleaved(_snapshot_variants(n), repeats=repeats)
    adv = interleaved(_advance_variants(max(n // 32, 3)), repeats=repeats)

    def med(runs: dict[str, list[float]]) -> dict[str, float]:
        return {name: statistics.median(values) * 1e6 for name, values in runs.items()}

    def per_round(runs: dict[str, list[float]], a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(runs[a], runs[b], strict=True))

    snapshot_us, advance_us = med(snap), med(adv)
    copy_ratio = per_round(
        snap, "snapshot() + restore()", "json.dumps + json.loads of that snapshot"
    )
    advance_ratio = per_round(adv, "Worker.advance, InMemoryStore", "one engine event (turn.send)")
    return {
        "unit": "µs per operation (median of interleaved rounds)",
        "snapshot_us": snapshot_us,
        "advance_us": advance_us,
        "snapshot_restore_over_json": copy_ratio,
        "advance_over_event": advance_ratio,
        "record_dumps_over_event": ratio(
            advance_us["json.dumps of the stored record"],
            advance_us["one engine event (turn.send)"],
        ),
        "target": {"snapshot_restore_over_json": 1.5, "advance_over_event": 4.0},
        "met": copy_ratio <= 1.5 and advance_ratio <= 4.0,
    }
