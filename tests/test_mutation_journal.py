"""What a mutation sample of the record's journal (``store/_journal.py``, issue 28) found
untested: each test writes steps through one worker and reads the record back through
another, which replays the journal."""

from __future__ import annotations

import json
from typing import Any

import pytest

import statemachine as sm
from statemachine.store import CorruptSession, InMemoryStore, Worker


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


@pytest.mark.requirement("ER-82")
def test_a_childs_spend_report_in_the_parents_journal_is_replayed() -> None:
    """A child's spend reaches its parent's record as a journal entry
    ``["c", null, null, child_id, total]``; a worker that knows nothing of the parent
    replays it: the child's total under the child's id, and the tree's spend."""
    store, writer, reader = _workers()
    parent = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0, session_id="p")
    child = parent.spawn(session_id="p.kid")
    writer.create("p", parent)
    r = writer.create("p.kid", child)
    r = writer.advance("p.kid", None, expected_version=r.version)
    r = writer.advance("p.kid", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    writer.advance("p.kid", sm.ModelReplied(cost=0.25), expected_version=r.version)
    entries = json.loads(store.load_payload("p")[1])["journal"]
    assert ["c", None, None, "p.kid", 0.25] in entries
    replayed = reader.load("p").session
    assert replayed.child_costs == {"p.kid": 0.25}
    assert replayed.cost_usd == 0.25


def _invoking() -> tuple[InMemoryStore, dict[str, Any]]:
    """A record whose session invokes two tools, claimed by its worker."""
    store, writer, _ = _workers()
    r = writer.create("s", sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0))
    r = writer.advance("s", None, expected_version=r.version)
    r = writer.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    calls = [sm.ToolCall("c1", "fs", "read", {}), sm.ToolCall("c2", "fs", "read", {"p": 2})]
    writer.advance("s", sm.ModelReplied(tool_calls=calls), expected_version=r.version)
    data: dict[str, Any] = json.loads(store.load_payload("s")[1])
    assert data["claim"]["calls"] == ["c1", "c2"] and data["carried"] == []
    return store, data


def _outcome(call_id: str) -> dict[str, Any]:
    return {"$type": "ToolOutcome", "call_id": call_id, "ok": True, "content": "ok"}


@pytest.mark.requirement("ER-77")
@pytest.mark.parametrize(
    ("claim", "carried", "message"),
    [
        (
            ["c1", "c1"],
            [_outcome("c2")],
            r"claim: names calls \['c1', 'c1'\] not in flight once each",
        ),
        (["c9"], [], r"claim: names calls \['c9'\] not in flight once each"),
        (["c1"], [_outcome("c9")], r"carried: holds outcomes \['c9'\] for calls not in flight"),
        (
            ["c1"],
            [_outcome("c2"), _outcome("c2")],
            r"carried: holds outcomes \['c2', 'c2'\] for calls not in flight once each",
        ),
        (["c1"], [], r"claim: claims \['c1'\] beside outcomes for \[\]: each call in flight"),
    ],
)
def test_a_claim_and_carried_outcomes_must_cover_the_calls_in_flight_once(
    claim: list[str], carried: list[dict[str, Any]], message: str
) -> None:
    """A takeover's record holds a claim on the calls being run and the outcomes already
    in: each call in flight is claimed or answered, once. Each way of breaking that is
    refused naming the key; the record as written loads."""
    store, data = _invoking()
    reader = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0, remember=0)
    assert reader.load("s").session.current_turn.state == "invoking_tools"  # type: ignore[union-attr]
    data["claim"]["calls"] = claim
    data["carried"] = carried
    store.compare_and_set("s", store.load_payload("s")[0], data)
    with pytest.raises(CorruptSession, match=rf"record's {message}"):
        reader.load("s")


@pytest.mark.requirement("ER-77")
def test_a_finished_s_that_disagrees_with_the_turn_says_which_way() -> None:
    """The record's ``finished_s`` and the journal's last turn: a finish while a turn
    runs, and no finish after the turn finished, are refused with what each says."""
    store, writer, _ = _workers()
    r = writer.create("s", sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0))
    r = writer.advance("s", None, expected_version=r.version)
    r = writer.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    running: dict[str, Any] = json.loads(store.load_payload("s")[1])
    r = writer.advance("s", sm.ModelReplied(), expected_version=r.version)
    finished: dict[str, Any] = json.loads(store.load_payload("s")[1])
    assert running["finished_s"] is None and finished["finished_s"] == 0.0
    reader = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0, remember=0)
    for data, forged, message in (
        (running, 0.0, "the record says a finish, but a turn is running"),
        (finished, None, "the record says no finish, but the last turn has finished"),
    ):
        data["finished_s"] = forged
        store.compare_and_set("s", store.load_payload("s")[0], data)
        with pytest.raises(CorruptSession, match=rf"record's finished_s: {message}$"):
            reader.load("s")
