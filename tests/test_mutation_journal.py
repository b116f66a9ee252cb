"""What a mutation sample of the record's journal (``store/_journal.py``, issue 28) found
untested: each test writes steps through one worker and reads the record back through
another, which replays the journal."""

from __future__ import annotations

import json

import pytest

import statemachine as sm
from statemachine.store import InMemoryStore, Worker


def _workers() -> tuple[InMemoryStore, Worker, Worker]:
    store = InMemoryStore()
    writer = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    reader = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0, remember=0)
    return store, writer, reader


@pytest.mark.requirement("ER-70")
def test_a_failed_calls_usage_is_journaled_and_replayed() -> None:
    """A failed call that reports its usage (what the provider billed for it) is
    written to the journal with that usage: another worker's replay holds the same
    usage and cost (the hand-written entry of a plain failure carries none)."""
    store, writer, reader = _workers()
    r = writer.create("s", sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0))
    r = writer.advance("s", None, expected_version=r.version)
    r = writer.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    usage = sm.Usage(input_tokens=7, output_tokens=0, cost_usd=0.25)
    error = sm.ModelError("overloaded")
    r = writer.advance(
        "s", sm.ModelFailed(error, cost=0.25, usage=usage), expected_version=r.version
    )
    entries = json.loads(store.load_payload("s")[1])["journal"]
    assert entries[-1][3]["usage"]["input_tokens"] == 7
    replayed = reader.load("s").session
    assert replayed.snapshot() == r.session.snapshot()
    assert replayed.snapshot()["turn"]["usages"][0][1]["input_tokens"] == 7
