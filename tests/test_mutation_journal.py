"""What a mutation sample of the record's journal (``store/_journal.py``, issue 28) found
untested: each test writes steps through one worker and reads the record back through
another, which replays the journal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

import statemachine as sm
from statemachine.core._codec import compact, decode
from statemachine.core._events import EVENT_TYPES
from statemachine.core._state_text import json_text
from statemachine.store import CorruptSession, InMemoryStore, Worker
from statemachine.store._journal import EVENT, entry_text


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


# -- issue 38's sample (seed 20261207) ---------------------------------------------------

_DATA = Path(__file__).parent / "data"


@pytest.mark.requirement("ER-70")
@pytest.mark.parametrize(
    "event",
    [
        *(cls() for cls in EVENT_TYPES if not attrs.fields(cls)),
        sm.Assembled({"m": [1, "x"]}, 5),
        sm.Assembled("q", 0),
        sm.ModelReplied(),
        sm.ModelReplied(cost=0.0),
        sm.ModelReplied(cost=0),
        sm.ModelReplied(cost=0.25),
        sm.ModelReplied(cost=3, reply={"text": "hi", "n": [1]}),
        sm.ModelReplied(reply=None),
    ],
    ids=repr,
)
def test_a_hand_written_entry_holds_what_the_general_encoding_holds(event: Any) -> None:
    """The journal writes its most frequent events (a fieldless event, an assembled
    request, a reply with no tool call) by hand: each entry holds the same JSON data as
    the general encoding (a field at its default left out, a zero cost and a missing
    reply included), so any reader of the journal sees one form per event."""
    for at, wall in ((0.5, None), (2.0, 1_700_000_000.25)):
        text = entry_text((EVENT, event), at, wall)
        assert json.loads(text) == json.loads(json_text(["e", at, wall, compact(event)]))
        assert decode(json.loads(text)[3], "event") == event


@pytest.mark.requirement("ER-82")
def test_a_childs_spend_of_zero_in_a_journal_is_read() -> None:
    """A journal entry charging a child's total of exactly 0 (``["c", null, null, id,
    0]``: a step the engine takes, changing nothing) is read, not refused as corrupt; a
    negative total is refused naming it."""
    store, writer, reader = _workers()
    parent = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0, session_id="p")
    parent.spawn(session_id="p.kid")
    writer.create("p", parent)
    data: dict[str, Any] = json.loads(store.load_payload("p")[1])
    for total in (0, 0.0):
        data["journal"] = [["c", None, None, "p.kid", total]]
        store.compare_and_set("p", store.load_payload("p")[0], data)
        loaded = reader.load("p").session
        assert loaded.child_costs == {"p.kid": 0.0}
        assert loaded.cost_usd == 0.0
    data["journal"] = [["c", None, None, "p.kid", -0.5]]
    store.compare_and_set("p", store.load_payload("p")[0], data)
    with pytest.raises(CorruptSession, match=r"journal\[0\]: child spend: -0.5 is not"):
        reader.load("p")


@pytest.mark.requirement("ER-70", "ER-77")
def test_a_version_2_record_whose_replies_hold_verdicts_reads_as_version_3() -> None:
    """A record of version 2 (entries ``[op, times, walls, ...]``) whose replies hold the
    doom check's verdicts beside them (``[]``, ``[false]``) was stepped with a check: it
    reads as the version 3 record of the same steps does (each verdict put in its
    reply), by a worker whose check must not be asked."""
    data = json.loads((_DATA / "store-v3-verdicts.json").read_text())["record"]
    data["journal"] = data["journal"][:7]  # to the reply to c2, its verdicts [false]
    data["claim"] = {"owner": "c", "calls": ["c2"], "until": 301.0}
    old = {
        **data,
        "version": 2,
        "journal": [
            [op, [] if at is None else [at], [] if wall is None else [wall], *rest]
            for op, at, wall, *rest in data["journal"]
        ],
    }
    assert [len(entry) for entry in old["journal"]] == [3, 4, 5, 4, 3, 4, 5]

    def refuse(_window: Any) -> bool:
        raise AssertionError("a replay must not ask the doom check")

    read = []
    for record in (data, old):
        store = InMemoryStore()
        store.compare_and_set("s", 0, record)
        reader = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0, doom_check=refuse)
        read.append(reader.load("s").session)
    assert read[0].snapshot() == read[1].snapshot()
    assert read[1].current_turn.action.calls[0].id == "c2"  # type: ignore[union-attr]


@pytest.mark.requirement("ER-140")
def test_a_version_2_records_actions_that_are_not_objects_are_refused() -> None:
    """The previous release's deferred turn (record version 2, snapshot version 4), read
    on its worker's clock, whose snapshot's actions hold a number beside the Finish: the
    reader refuses the record as corrupt, naming the snapshot (no crash)."""
    data = json.loads((_DATA / "store-v2-deferred.json").read_text())
    data["snapshot"]["turn"]["actions"].insert(0, 5)
    store = InMemoryStore()
    store.compare_and_set("s", 0, data)
    reader = Worker(store, owner="b", clock=lambda: 5000.0, now=lambda: 1000.0, remember=0)
    with pytest.raises(CorruptSession, match=r"the stored snapshot is unusable: snapshot\.turn"):
        reader.load("s")


@pytest.mark.requirement("ER-77")
def test_a_finished_s_near_zero_is_held_to_a_millionth_of_a_second() -> None:
    """A record's ``finished_s`` may lie a rounding from what its journal says: within
    ``1e-6`` s (scaled by the value when it is above 1 s). A turn that finished at the
    record's age (``finished_s`` 0) read with ``finished_s`` 0.9 µs loads; with 1.5 µs it
    is refused naming the key."""
    store, writer, reader = _workers()
    r = writer.create("s", sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0))
    r = writer.advance("s", None, expected_version=r.version)
    r = writer.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    writer.advance("s", sm.ModelReplied(), expected_version=r.version)
    data: dict[str, Any] = json.loads(store.load_payload("s")[1])
    assert data["finished_s"] == 0.0
    data["finished_s"] = 0.9e-6
    store.compare_and_set("s", store.load_payload("s")[0], data)
    assert reader.load("s").session.current_turn.done  # type: ignore[union-attr]
    data["finished_s"] = 1.5e-6
    store.compare_and_set("s", store.load_payload("s")[0], data)
    with pytest.raises(CorruptSession, match=r"finished_s: 1.5e-06, but the last turn finished"):
        reader.load("s")
