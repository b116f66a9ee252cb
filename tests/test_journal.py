"""The record's journal: the steps a worker appends instead of writing the whole snapshot,
replayed by every other reader. Forged entries are refused naming the entry; readers
that know part of the journal and readers that know nothing agree with the writer."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as settings_
from hypothesis import strategies as st

import statemachine as sm
from statemachine.core._codec import compact, decode, encode
from statemachine.core._state_text import json_text
from statemachine.store import AdvanceStatus, CorruptSession, InMemoryStore, Worker
from statemachine.store import _held as store_held
from statemachine.store import _record as store_record
from statemachine.store import _worker as store_worker
from statemachine.store._journal import EVENT, entry_text
from statemachine.store._record import COMPACT_EVERY, MAX_JOURNAL

from .store_worker import STOP, next_event, settings

DATA = Path(__file__).parent / "data"


def _worker(store: InMemoryStore, owner: str, **options: Any) -> Worker:
    return Worker(store, owner=owner, clock=lambda: 0.0, now=lambda: 1.0, **options)


def _payload(store: InMemoryStore, session_id: str) -> bytes:
    return store._data[store.key(session_id)][1]


def _journaled(events: int = 6) -> tuple[InMemoryStore, Worker, Any]:
    """A store with session "s" advanced ``events`` times by one worker (a rate limit
    in the middle), its journal holding those steps."""
    store = InMemoryStore()
    w = _worker(store, "a")
    r = w.create("s", sm.Session(settings(), seed=1, clock=lambda: 0.0))
    r = w.advance("s", None, expected_version=r.version)
    script = [
        sm.Assembled({"m": 1}, 5),
        sm.ModelFailed(sm.ModelError("rate_limited")),
        sm.WaitDone(),
    ]
    for event in script[: events - 1]:
        r = w.advance("s", event, expected_version=r.version)
    assert json.loads(_payload(store, "s"))["journal"]
    return store, w, r


def _forge(store: InMemoryStore, change: Any) -> bytes:
    """Rewrite the stored record's data with ``change`` (in place); the forged bytes."""
    version, payload = store.load_payload("s")
    data = json.loads(payload)
    change(data)
    store.compare_and_set("s", version, data)
    return _payload(store, "s")


def _set_entry(index: int, entry: Any) -> Any:
    def change(data: dict[str, Any]) -> None:
        data["journal"][index] = entry

    return change


def _edit_entry(index: int, edit: Any) -> Any:
    def change(data: dict[str, Any]) -> None:
        edit(data["journal"][index])

    return change


FORGERIES: dict[str, tuple[Any, str]] = {
    "an unknown step": (_set_entry(1, ["x", None, None]), r"journal\[1\]: unknown step"),
    "an event step without its event": (_set_entry(1, ["e", 0.0, None]), r"journal\[1\]"),
    "a moment that is text": (
        _edit_entry(1, lambda e: e.__setitem__(1, "0.0")),
        r"journal\[1\]: at: must be a number",
    ),
    "a reading before the session started": (
        _edit_entry(1, lambda e: e.__setitem__(1, -1.0)),
        r"journal\[1\]: at: a session clock reading before",
    ),
    "a reading too large for a float": (
        _edit_entry(1, lambda e: e.__setitem__(1, 10**400)),
        r"journal\[1\]: at: .* is not a finite number",
    ),
    "a wall reading that is text": (
        _edit_entry(1, lambda e: e.__setitem__(2, "now")),
        r"journal\[1\]: wall: must be a number",
    ),
    "an action where an event belongs": (
        _edit_entry(
            1,
            lambda e: e.__setitem__(
                3, {"$type": "ToolCall", "id": "a", "provider": "p", "name": "n"}
            ),
        ),
        r"journal\[1\]: event: must be an encoded event, got ToolCall",
    ),
    "an unknown value type": (
        _edit_entry(1, lambda e: e.__setitem__(3, {"$type": "Nope"})),
        r"journal\[1\]: event: unknown value type",
    ),
    "an event the state does not take": (
        _edit_entry(1, lambda e: e.__setitem__(3, {"$type": "WaitDone"})),
        r"journal\[1\]: .*WaitDone",
    ),
    "a step without its moment": (
        _edit_entry(1, lambda e: e.__setitem__(1, None)),
        r"journal\[1\]: at: the step recorded no clock reading",
    ),
    "a moment that is a list (version 2's readings in a version-3 record)": (
        _edit_entry(1, lambda e: e.__setitem__(1, [0.0])),
        r"journal\[1\]: at: must be a number",
    ),
    "an entry that is text": (
        _set_entry(1, "s"),
        r"journal\[1\]: must be a list \[op, at, wall",
    ),
    "an entry of two items": (
        _set_entry(1, ["s", 0.0]),
        r"journal\[1\]: must be a list \[op, at, wall",
    ),
    "a moment that is an object": (
        _edit_entry(1, lambda e: e.__setitem__(1, {})),
        r"journal\[1\]: at: must be a number",
    ),
    "an event before any turn": (
        _set_entry(0, ["e", 0.0, None, {"$type": "WaitDone"}]),
        r"journal\[0\]: the session has no turn yet",
    ),
    "a child spend of a number id": (
        _set_entry(1, ["c", None, None, 5, 1.0]),
        r"journal\[1\]: unknown step",
    ),
    "a budget that is text": (
        _set_entry(1, ["b", None, None, "all"]),
        r"journal\[1\]: unknown step",
    ),
    "a journal that is not a list": (
        lambda data: data.__setitem__("journal", {"0": 1}),
        r"journal: must be a list",
    ),
    "a journal longer than any worker writes": (
        lambda data: data.__setitem__("journal", [["s", 0.0, None]] * (MAX_JOURNAL + 1)),
        rf"journal: {MAX_JOURNAL + 1} entries, more than {MAX_JOURNAL}",
    ),
    "elapsed_s that is text": (
        lambda data: data.__setitem__("elapsed_s", "1"),
        r"elapsed_s: must be a finite number",
    ),
}


@pytest.mark.requirement("ER-77")
@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_forged_journal_is_refused_naming_the_entry(name: str) -> None:
    """Every reader, whether it knows nothing of the session or all but the forged part,
    refuses the record with CorruptSession naming the entry and what is wrong with it,
    and the stored bytes stay as they were."""
    change, message = FORGERIES[name]
    store, _, _ = _journaled()
    follower = _worker(store, "b")
    follower.load("s")  # knows the record as it was: it reads only what follows
    forged = _forge(store, change)
    for reader in (follower, _worker(store, "c")):
        with pytest.raises(CorruptSession, match=message):
            reader.load("s")
        assert _payload(store, "s") == forged


@pytest.mark.requirement("ER-77")
def test_forged_bytes_after_a_known_prefix_are_read_as_a_reader_that_knows_nothing() -> None:
    """Bytes that begin with the journal a worker knows but go on with keys of their own
    (a second "snapshot" or "journal" after the journal, to be read as JSON reads
    them: the last wins) are not taken as grown by entries: they are read in full, and
    the worker answers as one that never saw the session."""
    store, _, _ = _journaled()
    follower = _worker(store, "b")
    follower.load("s")
    version, payload = store.load_payload("s")
    extra = b',"journal":[["s",0.0,null]]}'
    forged = payload[:-1] + extra
    store._data[store.key("s")] = (version, forged, None, store._data[store.key("s")][3])
    outcomes = []
    for reader in (follower, _worker(store, "c")):
        try:
            outcomes.append(reader.load("s").session.snapshot())
        except CorruptSession as exc:
            outcomes.append(str(exc).split(": ", 1)[1])
    assert outcomes[0] == outcomes[1]


@pytest.mark.requirement("ER-77")
def test_a_forged_journal_that_runs_the_clock_back_still_gives_a_reachable_state() -> None:
    """Readings that go back in time are read as the last reading: the turn's steps
    never go back, and the session a reader gets restores from its own snapshot."""
    store, _, _ = _journaled()

    def back(data: dict[str, Any]) -> None:
        for i, entry in enumerate(data["journal"]):
            if entry[1] is not None:
                entry[1] = 100.0 - i
        data["journal"][-1][1] = 0.0
        data["elapsed_s"] = 100.0  # the record's age is never before its last step

    _forge(store, back)
    session = _worker(store, "c").load("s").session
    turn = session.snapshot()["turn"]
    assert turn["times"] == sorted(turn["times"])
    assert turn["times"][-1] == 100.0
    sm.Session.restore(session.snapshot(), clock=lambda: 0.0)


@pytest.mark.requirement("ER-77")
def test_a_record_whose_clock_fields_disagree_with_its_journal_is_refused() -> None:
    """The tail's ages are what the journal says: an ``elapsed_s`` before the journal's
    last step, a ``finished_s`` while the journal's turn still runs (its Finish entry
    dropped), or one that puts the finish elsewhere, is refused naming the key, by a
    worker and by the store API alike (before, a damaged record was accepted, and the
    next compaction wrote a state every other worker refused)."""
    store, w, r = _journaled(4)  # start, Assembled, rate limit, WaitDone: calling
    r = w.advance("s", sm.ModelReplied(cost=0.5), expected_version=r.version)
    assert isinstance(r.action, sm.Finish)
    _, payload = store.load_payload("s")
    good = json.loads(payload)
    assert good["finished_s"] == 0.0 and good["journal"][-1][3]["$type"] == "ModelReplied"
    forgeries = {
        "elapsed_s": lambda d: d["journal"][-1].__setitem__(1, d["elapsed_s"] + 5.0),
        "finished_s": lambda d: d["journal"].pop(),  # the Finish's entry dropped
    }
    for key, change in forgeries.items():
        data = json.loads(payload)
        change(data)
        store.compare_and_set("s", store.load_payload("s")[0], data)
        for reader in (_worker(store, "c"), w):
            with pytest.raises(CorruptSession, match=rf"record's {key}: "):
                reader.load("s")
        with pytest.raises(CorruptSession, match=rf"record's {key}: "):
            store.load("s")
    data = json.loads(payload)
    data["elapsed_s"] += 10.0
    data["finished_s"] = 3.0  # the journal says the turn finished 10 s ago
    store.compare_and_set("s", store.load_payload("s")[0], data)
    with pytest.raises(CorruptSession, match=r"record's finished_s: 3\.0, but the last turn"):
        _worker(store, "c").load("s")
    data["finished_s"] = 10.0
    store.compare_and_set("s", store.load_payload("s")[0], data)
    assert _worker(store, "c").load("s").session.idle_s >= 10.0


@pytest.mark.requirement("ER-70", "ER-74")
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_workers_sharing_sessions_agree_with_every_write(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three workers advance four sessions in a random order (each loading first), the
    journal compacted every few entries: after every write, each worker's load of the
    session, and a worker that never saw it, give the session the writer holds."""
    monkeypatch.setattr(store_held, "COMPACT_EVERY", 7)
    monkeypatch.setattr(store_worker, "COMPACT_AT_START", 4)
    rng = random.Random(seed)
    store = InMemoryStore()
    workers = [_worker(store, f"w{i}") for i in range(3)]
    ids = [f"s{i}" for i in range(4)]
    for i, sid in enumerate(ids):
        workers[0].create(sid, sm.Session(settings(), seed=i, clock=lambda: 0.0))
    applied = compacted = 0
    for _ in range(300):
        sid, w = rng.choice(ids), rng.choice(workers)
        result = w.load(sid)
        event = next_event(result, turns=3, failures=2)
        if event is STOP:
            continue
        result = w.advance(sid, event, expected_version=result.version)
        assert result.status is AdvanceStatus.APPLIED
        applied += 1
        compacted += not json.loads(_payload(store, sid))["journal"]
        expected = result.session.snapshot()
        for reader in [*workers, _worker(store, "fresh", remember=0)]:
            assert reader.load(sid).session.snapshot() == expected
    assert applied > 60
    assert compacted > 5


@pytest.mark.requirement("ER-70")
def test_a_result_read_after_the_worker_moved_on_holds_its_own_version() -> None:
    """An applied result's session is copied only when asked for: asked for after the
    worker has advanced the session again, it is still the session as that result's
    write stored it (read back from those bytes), and it is the caller's."""
    store = InMemoryStore()
    w = _worker(store, "a")
    r = w.create("s", sm.Session(settings(), seed=1, clock=lambda: 0.0))
    first = w.advance("s", None, expected_version=r.version)
    at_first = _worker(store, "b", remember=0).load("s").session.snapshot()
    second = w.advance("s", sm.Assembled({"m": 1}, 5), expected_version=first.version)
    assert first.session.snapshot() == at_first
    assert second.session.snapshot() != at_first
    first.session.current_turn.send(sm.Assembled({"by": "hand"}, 5))  # type: ignore[union-attr]
    third = w.advance("s", sm.ModelReplied(), expected_version=second.version)
    assert third.applied
    assert _worker(store, "b", remember=0).load("s").session.snapshot() == third.session.snapshot()


@pytest.mark.requirement("ER-70")
def test_a_version_1_record_is_read_and_continued() -> None:
    """A record written before the journal (version 1: the snapshot current, no journal,
    no ages) is read, and the next write continues it as version 3."""
    store = InMemoryStore()
    session = sm.Session(settings(), seed=1, clock=lambda: 0.0)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"m": 1}, 5))
    record = {
        "format": "statemachine.store.record",
        "version": 1,
        "session_id": "s",
        "saved_at": 1.0,
        "keys": [],
        "claim": None,
        "carried": [],
        "incarnation": "i-1",
        "snapshot": session.snapshot(),
    }
    store.compare_and_set("s", 0, record)
    w = _worker(store, "a")
    loaded = w.load("s")
    assert loaded.session.snapshot() == session.snapshot()
    after = w.advance("s", sm.ModelReplied(), expected_version=loaded.version)
    assert after.applied
    assert json.loads(_payload(store, "s"))["version"] == 3
    assert _worker(store, "b").load("s").session.snapshot() == after.session.snapshot()


@pytest.mark.requirement("ER-70")
def test_the_journal_never_outgrows_its_bound() -> None:
    """However a session is driven, a record's journal holds at most COMPACT_EVERY
    entries: the write after writes the snapshot anew."""
    store = InMemoryStore()
    w = _worker(store, "a")
    r = w.create(
        "s",
        sm.Session(
            sm.Settings(max_retries=10**3, session_retry_ceiling=10**4), seed=1, clock=lambda: 0.0
        ),
    )
    r = w.advance("s", None, expected_version=r.version)
    r = w.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    lengths = []
    for i in range(3 * COMPACT_EVERY):
        event = sm.WaitDone() if i % 2 else sm.ModelFailed(sm.ModelError("overloaded"))
        r = w.advance("s", event, expected_version=r.version)
        lengths.append(len(json.loads(_payload(store, "s"))["journal"]))
    assert max(lengths) == COMPACT_EVERY
    assert lengths.count(0) >= 2


_TEXT = st.text(max_size=12)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)
_ERRORS = st.builds(
    sm.ModelError,
    st.sampled_from([c.value for c in sm.ErrorCategory]),
    _TEXT,
    retry_after_seconds=st.none()
    | st.floats(min_value=0)
    | st.sampled_from([float("nan"), float("inf")]),
    headers=st.none()
    | st.dictionaries(st.sampled_from(["retry-after", "x-a", "Retry-After-Ms"]), _TEXT, max_size=2),
    code=st.none() | _TEXT,
    status=st.none() | st.integers(100, 599),
    body=st.none() | _JSON,
)
_FAILED = st.builds(
    sm.ModelFailed,
    _ERRORS,
    partial=st.booleans(),
    cost=st.sampled_from([0.0, 0, 0.25, 3, 1e-300]),
)


@pytest.mark.requirement("ER-70")
@given(
    event=_FAILED,
    at=st.floats(0, 1e9),
    wall=st.none() | st.floats(0, 2e9) | st.integers(0, 2**40),
)
@settings_(max_examples=300, deadline=None)
def test_a_hand_written_entry_decodes_as_the_general_encoding(
    event: sm.ModelFailed, at: float, wall: float | None
) -> None:
    """The hand-written text of a rate limit's entry reads back as the general encoding
    reads back: the same data, the same event."""
    text = entry_text((EVENT, event), at, wall)
    general = json_text(["e", at, wall, compact(event)])
    assert json.loads(text) == json.loads(general)
    assert json_text(encode(decode(json.loads(text)[3], "event"))) == json_text(encode(event))


_DATE = "Wed, 21 Oct 2015 07:28:00 GMT"


@pytest.mark.requirement("ER-77")
def test_a_steps_wall_time_is_journaled_and_replayed() -> None:
    """A rate limit whose retry-after is an HTTP date is measured against the step's wall
    time: the entry holds it, a replay gives it back (and so waits the same), and an
    entry whose wall time was taken out replays as a step with no wall time (the date
    is not usable: a plain backoff, no longer the server's wait). The wall clock may
    give whole numbers: they are written and read back as they came."""
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1_445_412_000)
    r = w.create("s", sm.Session(settings(), seed=1, clock=lambda: 0.0))
    r = w.advance("s", None, expected_version=r.version)
    r = w.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    error = sm.ModelError("rate_limited", headers={"retry-after": _DATE})
    r = w.advance("s", sm.ModelFailed(error), expected_version=r.version)
    journal = json.loads(_payload(store, "s"))["journal"]
    assert journal[2][2] == 1_445_412_000
    assert isinstance(r.action, sm.Finish)  # 480 s: more than the settings' server wait
    assert r.action.status is sm.TurnStatus.RETRY_DEFERRED
    reader = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0)
    assert reader.load("s").session.snapshot() == r.session.snapshot()

    def unwalled(data: dict[str, Any]) -> None:
        data["journal"][2][2] = None
        data["finished_s"] = None  # no longer finished: the tail says what the journal says

    _forge(store, unwalled)
    replayed = _worker(store, "c").load("s")
    assert isinstance(replayed.action, sm.Wait) and replayed.action.retry_after is None


@pytest.mark.requirement("ER-77")
def test_a_forged_entry_after_the_known_ones_is_named_by_its_place_in_the_journal() -> None:
    """A worker that knows the first entries reads only the ones after them; a forged
    one among those is named by its index in the whole journal."""
    store, w, r = _journaled()
    follower = _worker(store, "b")
    known = len(json.loads(follower.load("s") and _payload(store, "s"))["journal"])
    r = w.advance("s", sm.ModelFailed(sm.ModelError("overloaded")), expected_version=r.version)
    version, payload = store.load_payload("s")
    forged = payload.replace(b'"category":"overloaded"', b'"category":"no-such"')
    assert forged != payload
    store._data[store.key("s")] = (version, forged, None, store._data[store.key("s")][3])
    with pytest.raises(CorruptSession, match=rf"journal\[{known}\]: event.*no-such"):
        follower.load("s")


@pytest.mark.requirement("ER-77")
def test_a_reading_before_the_snapshots_last_step_is_read_as_that_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The snapshot holds the turn's step times; a journal entry that goes back before
    the last of them replays as taken at that time, so the turn's times never decrease."""
    clock = [0.0]
    store = InMemoryStore()
    # the time between advances passes in the store: idle time, on the wall clock
    w = Worker(store, owner="a", clock=lambda: clock[0], now=lambda: clock[0])
    r = w.create("s", sm.Session(settings(), seed=1, clock=lambda: clock[0]))
    monkeypatch.setattr(store_held, "COMPACT_EVERY", 0)  # every write a snapshot
    r = w.advance("s", None, expected_version=r.version)
    clock[0] = 5.0
    r = w.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    assert json.loads(_payload(store, "s"))["journal"] == []
    monkeypatch.setattr(store_held, "COMPACT_EVERY", 32)
    clock[0] = 6.0
    r = w.advance("s", sm.ModelFailed(sm.ModelError("overloaded")), expected_version=r.version)

    def back(data: dict[str, Any]) -> None:
        data["journal"][0][1] = 1.0

    _forge(store, back)
    times = _worker(store, "c").load("s").session.snapshot()["turn"]["times"]
    assert times == sorted(times)
    assert times[-1] == 5.0


@pytest.mark.requirement("ER-70", "ER-71")
def test_a_record_written_by_hand_in_the_documented_format_is_read() -> None:
    """The journal's format is the documented one (``_journal.py``): a record written
    by hand, a start, an assembled request and a child's spend, reads as the steps say,
    in the format a worker writes (version 3) and in the one the last release wrote
    (version 2: each step's clock readings as lists)."""
    session = sm.Session(settings(), seed=1, clock=lambda: 0.0, session_id="s")
    kid = session.spawn().session_id
    snapshot = json.dumps(session.snapshot(), separators=(",", ":"))
    v3 = (
        '{"format":"statemachine.store.record","version":3,"session_id":"s",'
        f'"incarnation":"i-1","snapshot":{snapshot},"journal":['
        '["s",0.0,null],'
        '["e",0.0,null,{"$type":"Assembled","request":{"m":1},"size":5}],'
        f'["c",null,null,"{kid}",0.5]],'
        '"saved_at":1.0,"keys":[],"claim":null,"carried":[],"elapsed_s":0.0,"finished_s":null}'
    )
    v2 = (
        '{"format":"statemachine.store.record","version":2,"session_id":"s",'
        f'"incarnation":"i-1","snapshot":{snapshot},"journal":['
        '["s",[0.0,0.0],[]],'
        '["e",[0.0],[],{"$type":"Assembled","request":{"m":1},"size":5}],'
        f'["c",[],[],"{kid}",0.5]],'
        '"saved_at":1.0,"keys":[],"claim":null,"carried":[],"elapsed_s":0.0,"finished_s":null}'
    )
    for text in (v3, v2):
        store = InMemoryStore()
        store.compare_and_set("s", 0, json.loads(text))
        loaded = _worker(store, "a").load("s")
        assert loaded.session.turns == 1
        assert isinstance(loaded.action, sm.CallModel)
        assert loaded.action.request == {"m": 1}
        assert loaded.session.cost_usd == 0.5


@pytest.mark.requirement("ER-70")
def test_a_replayed_retry_at_is_on_the_readers_clock() -> None:
    """A turn deferred by a long retry-after finishes with ``retry_at`` on the session
    clock; a worker that replays the step gets it on its own clock, as the writer has
    it when their clocks agree."""
    store = InMemoryStore()
    a = Worker(store, owner="a", clock=lambda: 5000.0, now=lambda: 1000.0)
    fresh = Worker(store, owner="b", clock=lambda: 5000.0, now=lambda: 1000.0, remember=0)
    r = a.create("s", sm.Session(sm.Settings(max_server_wait_s=10), clock=lambda: 5000.0))
    r = a.advance("s", None, expected_version=r.version)
    r = a.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    error = sm.ModelError("rate_limited", retry_after_seconds=60)
    r = a.advance("s", sm.ModelFailed(error), expected_version=r.version)
    assert isinstance(r.action, sm.Finish)
    assert r.action.retry_at == 5060.0
    assert fresh.load("s").action.retry_at == 5060.0  # type: ignore[union-attr]
    assert fresh.load("s").session.snapshot() == r.session.snapshot()


@pytest.mark.requirement("ER-70")
def test_a_workers_observers_never_see_the_steps_it_replays() -> None:
    """Observers see a transition once, where it was taken: a worker that replays the
    steps another worker appended passes none of them to its own observers."""
    store = InMemoryStore()
    seen: list[Any] = []
    a = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0, observers=[seen.append])
    b = _worker(store, "b")
    r = a.create("s", sm.Session(settings(), seed=1, clock=lambda: 0.0))
    r = a.advance("s", None, expected_version=r.version)
    assert len(seen) == 1
    r = b.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    r = b.advance("s", sm.ModelFailed(sm.ModelError("rate_limited")), expected_version=r.version)
    assert a.load("s").session.snapshot() == r.session.snapshot()
    assert len(seen) == 1
    a.advance("s", sm.WaitDone(), expected_version=r.version)
    assert len(seen) == 2  # its own step, once


def _family(store: InMemoryStore) -> Worker:
    w = _worker(store, "a")
    root = sm.Session(settings(), seed=1, clock=lambda: 0.0, session_id="p")
    w.create("p", root)
    w.create("p.k", root.spawn(session_id="p.k"))
    w.advance("p", None, expected_version=1)
    return w


@pytest.mark.requirement("ER-77")
@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('["c",null,null,"p.k",1' + "0" * 400 + "]", "child spend: an int of .* is not a finite"),
        ('["c",null,null,"p.k",1e999]', "child spend: inf is not a finite amount"),
        ('["c",null,null,"p.k",-0.5]', "child spend: -0.5 is not a finite amount >= 0"),
        ('["b",null,null,1e999]', "budget: inf is not a finite amount"),
        ('["b",null,null,1' + "0" * 400 + "]", "budget: an int of .* is not a finite amount"),
        ('["b",null,null,1.0]', "this session has no parent, so no ancestors' budget"),
    ],
)
def test_forged_amounts_are_refused(entry: str, message: str) -> None:
    """A spend in an entry must be a finite amount >= 0 and a budget a finite amount (an
    int too large for a float included; siblings may overspend a budget, so it may be
    below 0), and a budget only reaches a child: else CorruptSession, never an
    OverflowError or a session whose snapshot is not JSON."""
    store = InMemoryStore()
    _family(store)
    version, payload = store.load_payload("p")
    forged = payload.replace(b'["s",0.0,null]', b'["s",0.0,null],' + entry.encode(), 1)
    assert forged != payload
    store._data[store.key("p")] = (version, forged, None, store._data[store.key("p")][3])
    with pytest.raises(CorruptSession, match=message):
        _worker(store, "b").load("p")


@pytest.mark.requirement("ER-77")
def test_a_tail_number_too_large_for_a_float_is_refused() -> None:
    store = InMemoryStore()
    _family(store)
    version, payload = store.load_payload("p")
    forged = payload.replace(b'"saved_at":1.0', b'"saved_at":1' + b"0" * 400)
    store._data[store.key("p")] = (version, forged, None, store._data[store.key("p")][3])
    with pytest.raises(CorruptSession, match="saved_at: must be a finite number"):
        _worker(store, "b").load("p")


@pytest.mark.requirement("ER-70")
def test_the_doom_checks_verdicts_are_journaled_not_asked_again() -> None:
    """The host's second-tier doom check is asked once, by the worker that takes the
    step; its verdict is in the entry (the reply's ``doom_verdict``), and a replay reads
    it from there (a check that answers differently the second time, or raises, changes
    nothing for readers). An entry in the previous release's form (the verdicts beside
    the reply) that holds more verdicts than the step asks for is refused."""
    answers = iter([False, True])
    asked: list[int] = []

    def judge(window: Any) -> bool:
        asked.append(len(window))
        return next(answers)

    def refuse(_window: Any) -> bool:
        raise AssertionError("a replay must not ask the doom check")

    store = InMemoryStore()
    a = _worker(store, "a", doom_check=judge)
    r = a.create("s", sm.Session(sm.Settings(doom_check_window=2), seed=1, clock=lambda: 0.0))
    r = a.advance("s", None, expected_version=r.version)
    r = a.advance("s", sm.Assembled("req", 1), expected_version=r.version)
    calls = (sm.ToolCall("a", "fs", "ls", {"d": 1}), sm.ToolCall("b", "fs", "ls", {"d": 2}))
    r = a.advance("s", sm.ModelReplied(calls), expected_version=r.version)
    assert asked == [2]
    entry = json.loads(_payload(store, "s"))["journal"][-1]
    assert len(entry) == 4 and entry[3]["doom_verdict"] is False
    reader = _worker(store, "b", doom_check=refuse, remember=0)
    assert reader.load("s").session.snapshot() == r.session.snapshot()
    version, payload = store.load_payload("s")
    forged = payload.replace(b',"doom_verdict":false}]', b"},[false,true]]")
    assert forged != payload
    store._data[store.key("s")] = (version, forged, None, store._data[store.key("s")][3])
    with pytest.raises(CorruptSession, match="more doom-check verdicts than it asks for"):
        reader.load("s")


@pytest.mark.requirement("ER-70", "ER-77")
def test_a_record_whose_entries_hold_the_previous_releases_verdicts_replays_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record the previous release wrote (tests/data/store-v3-verdicts.json: replies
    stepped with a doom check, their verdicts ``[]``, ``[false]`` and ``[true]`` beside
    them, and one without) is read as that release read it, by a worker with no check,
    by one whose check must not be asked, and by the store API; a worker of this
    release then steps it on, appending entries of its own form to the old ones."""
    data = json.loads((DATA / "store-v3-verdicts.json").read_text())
    store = InMemoryStore()
    store.compare_and_set("s", 0, data["record"])

    def refuse(_window: Any) -> bool:
        raise AssertionError("a replay must not ask the doom check")

    for check in (None, refuse):
        loaded = _worker(store, "b", doom_check=check, remember=0).load("s")
        assert loaded.session.snapshot() == data["snapshot"]
        assert loaded.session.limit_reached is sm.SessionStatus.ERROR_DOOM_LOOP
    assert store.load("s").record["snapshot"] == data["snapshot"]
    monkeypatch.setattr(store_record, "REPLAY_AT_MOST", MAX_JOURNAL)  # appended, not compacted
    w = _worker(store, "c", doom_check=lambda window: False)
    r = w.load("s")
    r = w.advance(
        "s", sm.ToolsDone((sm.ToolOutcome("c5", True, "ok"),)), expected_version=r.version
    )
    r = w.advance("s", None, expected_version=r.version)
    assert r.session.current_turn.final_answer  # type: ignore[union-attr]
    journal = json.loads(_payload(store, "s"))["journal"]
    assert len(journal) == len(data["record"]["journal"]) + 2
    fresh = _worker(store, "d", remember=0).load("s")
    assert fresh.session.snapshot() == r.session.snapshot()


@pytest.mark.requirement("ER-77")
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ((b',"doom_verdict":false}]', b"},[1]]"), "verdicts: must be a list of true/false"),
        ((b',"doom_verdict":false}]', b'},"no"]'), "verdicts: must be a list of true/false"),
        ((b',"doom_verdict":false}]', b"},[]]"), "asks the doom check more often than it recorded"),
        ((b"false}]", b"false},[false]]"), "verdicts: beside a reply that holds its own"),
        ((b'"doom_verdict":false', b'"doom_verdict":1'), "doom_verdict: must be True, False"),
    ],
)
def test_forged_doom_verdicts_are_refused(change: tuple[bytes, bytes], message: str) -> None:
    """A reply's verdict must be true/false; the verdicts an entry of the previous
    release's form holds must be true/false, one per time the step asks, beside a reply
    without one."""
    store = InMemoryStore()
    a = _worker(store, "a", doom_check=lambda window: False)
    r = a.create("s", sm.Session(sm.Settings(doom_check_window=2), seed=1, clock=lambda: 0.0))
    r = a.advance("s", None, expected_version=r.version)
    r = a.advance("s", sm.Assembled("req", 1), expected_version=r.version)
    calls = (sm.ToolCall("a", "fs", "ls", {"d": 1}), sm.ToolCall("b", "fs", "ls", {"d": 2}))
    a.advance("s", sm.ModelReplied(calls), expected_version=r.version)
    version, payload = store.load_payload("s")
    forged = payload.replace(*change)
    assert forged != payload
    store._data[store.key("s")] = (version, forged, None, store._data[store.key("s")][3])
    with pytest.raises(CorruptSession, match=message):
        _worker(store, "b", doom_check=lambda window: False).load("s")


@pytest.mark.requirement("ER-77")
def test_a_forged_loop_verdict_where_none_is_due_is_refused() -> None:
    """``doom_verdict: true`` on a reply whose calls are due no verdict (the first of a
    window of two) is refused, named by its entry; the same reply with ``false`` is the
    state the worker wrote."""
    store = InMemoryStore()
    a = _worker(store, "a", doom_check=lambda window: False)
    r = a.create("s", sm.Session(sm.Settings(doom_check_window=2), seed=1, clock=lambda: 0.0))
    r = a.advance("s", None, expected_version=r.version)
    r = a.advance("s", sm.Assembled("req", 1), expected_version=r.version)
    r = a.advance(
        "s", sm.ModelReplied((sm.ToolCall("a", "fs", "ls", {}),)), expected_version=r.version
    )
    version, payload = store.load_payload("s")
    assert _worker(store, "b", remember=0).load("s").session.snapshot() == r.session.snapshot()
    forged = payload.replace(b'"doom_verdict":false', b'"doom_verdict":true')
    assert forged != payload
    store._data[store.key("s")] = (version, forged, None, store._data[store.key("s")][3])
    with pytest.raises(CorruptSession, match=r"journal\[2\]: ModelReplied .* no second-tier"):
        _worker(store, "b", remember=0).load("s")


@pytest.mark.requirement("ER-70")
def test_a_result_holds_its_own_version_when_another_thread_advances_at_once() -> None:
    """The bytes a result decodes itself from, when read late, are taken before its
    record is remembered: an advance by another thread right after (forced here at the
    moment the record is remembered) grows the record, not the result."""
    store = InMemoryStore()
    w = _worker(store, "a")
    r = w.create("s", sm.Session(settings(), seed=1, clock=lambda: 0.0))
    r = w.advance("s", None, expected_version=r.version)
    real_remember = w._held.remember
    other: list[Any] = []
    armed = [True]

    def remember_then_interleave(session_id: str, live: Any) -> None:
        """The other thread's advance, run as soon as the write's record is remembered."""
        real_remember(session_id, live)
        if armed[0] and store.load_payload("s")[0] == 3 and not other:
            armed[0] = False
            other.append(
                w.advance("s", sm.ModelFailed(sm.ModelError("rate_limited")), expected_version=3)
            )

    w._held.remember = remember_then_interleave  # type: ignore[method-assign]
    third = w.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    w._held.remember = real_remember  # type: ignore[method-assign]
    assert other and other[0].version == 4
    assert third.version == 3
    assert third.session.current_turn.state == "calling"  # type: ignore[union-attr]
    assert third.session.retries_used == 0


@pytest.mark.requirement("ER-82")
def test_a_childs_spend_is_not_reported_to_a_parent_re_created_under_its_id() -> None:
    """A parent deleted and created again under its id does not know the child: the
    child's advance that spent is applied and answered, and the new parent is not charged."""
    store = InMemoryStore()
    w = _family(store)
    w.delete("p")
    w.create("p", sm.Session(settings(), seed=2, clock=lambda: 0.0, session_id="p"))
    r = w.advance("p.k", None, expected_version=1)
    r = w.advance("p.k", sm.Assembled("q", 1), expected_version=r.version)
    r = w.advance("p.k", sm.ModelReplied(cost=0.5), expected_version=r.version)
    assert r.applied
    assert w.load("p").session.cost_usd == 0.0


@pytest.mark.requirement("ER-70", "ER-71")
def test_the_store_api_gives_the_record_with_its_journal_applied() -> None:
    """``store.load(id).record`` (the SessionStore protocol) holds the session's current
    snapshot and an empty journal, whatever the stored bytes journal: a host reading a
    session without a worker restores exactly what the worker holds."""
    store, _, r = _journaled()
    assert json.loads(_payload(store, "s"))["journal"]
    record = store.load("s").record
    assert record["journal"] == []
    assert record["snapshot"] == r.session.snapshot()
    restored = sm.Session.restore(record["snapshot"], clock=lambda: 0.0)
    assert restored.snapshot() == r.session.snapshot()
    _forge(store, _set_entry(1, ["x", None, None]))
    with pytest.raises(CorruptSession, match=r"journal\[1\]: unknown step"):
        store.load("s")


@pytest.mark.requirement("ER-82")
@pytest.mark.parametrize("budget", [0.0, -0.15])
def test_an_ancestors_budget_spent_or_overspent_is_replayed(budget: float) -> None:
    """A budget entry of 0 (the ancestors have spent it all) or below (siblings spent
    past it) is replayed like any other."""
    store = InMemoryStore()
    _family(store)
    version, payload = store.load_payload("p.k")
    data = json.loads(payload)
    data["journal"] = [["b", None, None, budget]]
    store.compare_and_set("p.k", version, data)
    assert _worker(store, "b").load("p.k").session.remaining_budget_usd == budget
