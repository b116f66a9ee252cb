"""The fast paths of a worker's reads: a record laid out as a worker writes it is decoded
in one pass (``split_record``), and the most frequent journal entries are read by
decoders of their own. Each gives exactly what the general path gives, and anything
else goes the general path, which names what is wrong: forged bytes are refused with
the same errors as before."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as settings_
from hypothesis import strategies as st

import statemachine as sm
from statemachine.store import CorruptSession, InMemoryStore, Worker
from statemachine.store._core import decode_record
from statemachine.store._journal import read_session
from statemachine.store._record import _prefix_end, parse_record, split_record

from .store_worker import STOP, Clock, next_event, settings

_MAX = 1 << 20


def _worker(store: InMemoryStore, owner: str) -> Worker:
    return Worker(store, owner=owner, clock=lambda: 0.0, now=lambda: 1.0)


def _written(steps: int, seed: int = 1) -> list[bytes]:
    """The bytes of every record a worker wrote for one session over ``steps`` advances
    (turns with rate limits, tool calls with odd host data, compactions)."""
    store = InMemoryStore()
    w = _worker(store, "a")
    r = w.create("s", sm.Session(settings(), seed=seed, clock=lambda: 0.0))
    written = [store.load_payload("s")[1]]
    for _ in range(steps):
        event = next_event(r, turns=50)
        if event is STOP:
            break
        if isinstance(event, sm.Assembled) and r.session.turns % 3 == 0:
            # host data that looks like the record's keys (in one turn of three)
            event = sm.Assembled({"x": [1], "journal": ["é"], "saved_at": 2}, 7)
        r = w.advance("s", event, expected_version=r.version)
        written.append(store.load_payload("s")[1])
    return written


_RECORDS = _written(80)


def _general(payload: bytes) -> tuple[dict[str, Any], int | None]:
    data = decode_record("s", payload, _MAX)
    return data, _prefix_end(payload, len(data.get("journal", ())))


@pytest.mark.requirement("ER-77")
def test_a_record_a_worker_wrote_splits_into_exactly_its_json_and_prefix() -> None:
    """Every record of a long session (journals of 0 to 32 entries, host data holding
    ``"journal"`` and ``"saved_at"`` keys and non-ASCII text) decodes in one pass to
    the same data, in the same key order, with the same prefix end as the general
    path."""
    assert len(_RECORDS) > 40
    for payload in _RECORDS:
        split = split_record(payload)
        assert split is not None
        data, end = _general(payload)
        assert split[0] == data and list(split[0]) == list(data)
        assert split[1] == end


@pytest.mark.requirement("ER-77")
@settings_(max_examples=300, deadline=None)
@given(
    index=st.integers(0, len(_RECORDS) - 1),
    cuts=st.lists(
        st.tuples(st.floats(0, 1), st.integers(0, 12), st.binary(max_size=14)), max_size=3
    ),
)
def test_bytes_changed_anywhere_split_as_json_reads_them_or_not_at_all(
    index: int, cuts: list[tuple[float, int, bytes]]
) -> None:
    """Bytes deleted, inserted or replaced anywhere in a record: ``split_record`` gives
    what ``json.loads`` gives (and the general path's prefix end), or nothing, never
    another reading of the same bytes."""
    payload = _RECORDS[index]
    for where, drop, insert in cuts:
        at = int(where * len(payload))
        payload = payload[:at] + insert + payload[at + drop :]
    split = split_record(payload)
    if split is None:
        return
    data = json.loads(payload)
    assert split[0] == data and list(split[0]) == list(data)
    assert split[1] == _prefix_end(payload, len(data["journal"]))


@pytest.mark.requirement("ER-77")
@pytest.mark.parametrize(
    "forge",
    [
        # a second journal key before the journal: json.loads keeps the last one
        lambda p: p.replace(b'"snapshot":', b'"journal":[["s",0.0,null]],"snapshot":', 1),
        # a tail key before the journal
        lambda p: p.replace(b'"snapshot":', b'"elapsed_s":1.0,"snapshot":', 1),
        # an extra key after the tail's
        lambda p: p[:-1] + b',"x":1}',
        # the journal's entries not closed
        lambda p: p.replace(b'],"saved_at"', b',"saved_at"', 1),
        # NaN in the tail
        lambda p: p.replace(b'"elapsed_s":', b'"elapsed_s":NaN,"e":', 1),
    ],
)
def test_a_record_not_laid_out_as_a_worker_writes_it_goes_the_general_way(forge: Any) -> None:
    """Layouts the one-pass decoder must not guess at are left to the general path."""
    payload = forge(_RECORDS[12])
    assert payload != _RECORDS[12]
    assert split_record(payload) is None


@pytest.mark.requirement("ER-77")
def test_a_forged_record_is_refused_by_a_reader_with_the_same_error_as_before() -> None:
    """A record with a bad value in a tail key, in the snapshot or in a journal entry,
    laid out as a worker writes it (so the one-pass decoder reads it): the reader
    raises the very ``CorruptSession`` the general path raises, and the record is left
    as it was."""
    base = _RECORDS[12]
    forged = [
        base.replace(b'"saved_at":1.0', b'"saved_at":"x"', 1),
        base.replace(b'"category":"rate_limited"', b'"category":"rate_limitd"', 1),
        base.replace(b'["e",', b'["q",', 1),
        base.replace(b'"max_retries":5', b'"max_retries":-5', 1),
        base.replace(b'{"$type":"WaitDone"}', b'{"$type":"WaitDone","x":1}', 1),
    ]
    for payload in forged:
        assert payload != base
        store = InMemoryStore()
        key = store.key("s")
        store._data[key] = (3, payload, None, None)
        with pytest.raises(CorruptSession) as fast:
            _worker(store, "b").load("s")
        assert split_record(payload) is not None  # the one-pass decoder reads it
        with pytest.raises(CorruptSession) as general:
            read_session(parse_record("s", decode_record("s", payload, _MAX), payload))
        assert str(fast.value) == str(general.value)
        assert store._data[key][1] == payload


@pytest.mark.requirement("ER-70")
def test_readers_agree_whichever_path_read_the_record() -> None:
    """Workers sharing sessions at random (each read the other's records, in one pass)
    end where one worker alone ends."""
    rng = random.Random(7)
    store = InMemoryStore()
    workers = [_worker(store, f"w{i}") for i in range(4)]
    versions = {}
    for i in range(3):
        versions[f"s{i}"] = workers[0].create(
            f"s{i}", sm.Session(settings(), seed=i, clock=lambda: 0.0)
        )
    for _ in range(150):
        sid = f"s{rng.randrange(3)}"
        w = workers[rng.randrange(4)]
        r = w.load(sid)
        event = next_event(r, turns=50)
        versions[sid] = w.advance(sid, event, expected_version=r.version)
    for sid, last in versions.items():
        alone = InMemoryStore()
        w = _worker(alone, "x")
        r = w.create(sid, sm.Session(settings(), seed=int(sid[1:]), clock=lambda: 0.0))
        for _ in range(last.version - 1):
            r = w.advance(sid, next_event(r, turns=50), expected_version=r.version)
        shared = workers[3].load(sid).session.snapshot()
        assert w.load(sid).session.snapshot() == shared


@pytest.mark.requirement("ER-70")
@pytest.mark.parametrize("moved_on", [False, True])
def test_a_loaded_session_is_copied_when_read_and_is_the_session_as_loaded(
    moved_on: bool,
) -> None:
    """``Worker.load`` copies the session only when the caller reads ``session``; read
    late (the clocks moved on, and with ``moved_on`` the worker advanced the session
    meanwhile, so the copy comes from the bytes it loaded), it is the session a copy
    taken at the load would be: the same state, started at the same moment."""
    clock, wall = Clock(50.0), Clock(1000.0)
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=clock, now=wall)
    r = w.create("s", sm.Session(settings(), seed=3, clock=clock))
    for _ in range(4):
        r = w.advance("s", next_event(r), expected_version=r.version)
    wall.now += 2.0
    loaded = w.load("s")
    eager = Worker(store, owner="b", clock=clock, now=wall).load("s").session  # read at once
    clock.now += 7.0
    wall.now += 3.0  # the two clocks disagree on what passed: the start is fixed at the load
    if moved_on:
        w.advance("s", next_event(loaded), expected_version=loaded.version)
        assert w._held.live["s"].version == loaded.version + 1
    late = loaded.session
    assert late is loaded.session  # copied once
    assert late.snapshot() == eager.snapshot()
    assert late.elapsed_s == eager.elapsed_s
    assert late.current_turn.action == loaded.action  # type: ignore[union-attr]


@pytest.mark.requirement("ER-70")
def test_a_loaded_finish_with_a_retry_moment_is_on_the_workers_clock() -> None:
    """A pending ``Finish`` holds a reading (``retry_at``, a long retry-after): the load's
    action is the one its session holds, on the worker's clock."""
    clock = Clock(5000.0)
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=clock, now=Clock(1000.0))
    r = w.create("s", sm.Session(sm.Settings(max_server_wait_s=10), clock=clock))
    r = w.advance("s", None, expected_version=r.version)
    r = w.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
    error = sm.ModelError("rate_limited", retry_after_seconds=60)
    r = w.advance("s", sm.ModelFailed(error), expected_version=r.version)
    loaded = w.load("s")
    clock.now += 3.0
    assert isinstance(loaded.action, sm.Finish)
    assert loaded.action.retry_at == 5060.0
    assert loaded.action == loaded.session.current_turn.action  # type: ignore[union-attr]


def _plain_and_watched() -> tuple[list[InMemoryStore], list[Clock], Worker, Worker]:
    """Two stores, their wall clocks, a worker on each: the second has an observer, whose
    records it delivers after every write (the first release's one-piece advance was
    not taken then)."""
    stores = [InMemoryStore(), InMemoryStore()]
    walls = [Clock(1000.0), Clock(1000.0)]
    seen: list[Any] = []
    plain, watched = (
        Worker(store, owner="w", clock=lambda: 0.0, now=wall, observers=observers)
        for store, wall, observers in zip(stores, walls, ((), (seen.append,)), strict=True)
    )
    return stores, walls, plain, watched


@pytest.mark.requirement("ER-70")
def test_an_advance_writes_the_same_record_whether_or_not_it_is_watched() -> None:
    """Every advance goes one way (the step, its entry appended to the record's bytes,
    the compare-and-set); a worker that also delivers the steps to an observer, given
    the same events (idempotency keys, retry-after headers, tool calls and their claims,
    compactions), stores the same record at every version."""
    stores, walls, plain, watched = _plain_and_watched()
    results = [
        w.create("s", sm.Session(settings(), seed=5, clock=lambda: 0.0)) for w in (plain, watched)
    ]
    headers = sm.ModelError("rate_limited", headers={"retry-after": "1"})
    for i in range(90):
        event = next_event(results[0], turns=50)
        if isinstance(event, sm.ModelFailed) and i % 3 == 0:
            event = sm.ModelFailed(headers)
        key = f"k{i}" if i % 4 == 0 else None
        for wall in walls:  # the session idles between advances: its age grows
            wall.now += 0.25 * (i % 5)
        results = [
            w.advance("s", event, expected_version=r.version, key=key)
            for w, r in zip((plain, watched), results, strict=True)
        ]
        assert results[0].version == results[1].version
        assert results[0].action == results[1].action
        records = [json.loads(store.load_payload("s")[1]) for store in stores]
        for record in records:
            del record["incarnation"]
        assert records[0] == records[1]
    assert results[0].session.snapshot() == results[1].session.snapshot()


@pytest.mark.requirement("ER-70")
def test_turn_starts_and_compactions_write_the_same_bytes_whether_or_not_watched() -> None:
    """A turn's start and a write that compacts the record are written alike by both
    workers, byte for byte but the incarnation, at every version; the snapshot is
    written anew at turn starts only."""
    rate = sm.ModelFailed(sm.ModelError("rate_limited", "slow down", status=429))
    turn = [None, sm.Assembled({"m": 1}, 5), *[rate, sm.WaitDone()] * 3, sm.ModelReplied()]
    stores, walls, plain, watched = _plain_and_watched()
    session = sm.Settings(session_retry_ceiling=10**6)
    results = [
        w.create("s", sm.Session(session, seed=3, clock=lambda: 0.0)) for w in (plain, watched)
    ]
    journals = []
    for i, event in enumerate(turn * 8):
        for wall in walls:
            wall.now += 0.5 * (i % 3)
        results = [
            w.advance("s", event, expected_version=r.version)
            for w, r in zip((plain, watched), results, strict=True)
        ]
        assert results[0].action == results[1].action
        payloads = [store.load_payload("s")[1] for store in stores]
        records = [json.loads(payload) for payload in payloads]
        incarnations = [record["incarnation"] for record in records]
        assert payloads[0].replace(incarnations[0].encode(), b"") == payloads[1].replace(
            incarnations[1].encode(), b""
        )
        journals.append(len(records[0]["journal"]))
    compacted = [i for i, entries in enumerate(journals) if entries == 0]
    assert len(compacted) >= 2  # the snapshot written anew, more than once: at turn starts
    assert all(i % len(turn) == 0 for i in compacted)
    assert results[0].session.snapshot() == results[1].session.snapshot()


@pytest.mark.requirement("ER-70")
def test_a_result_read_while_another_thread_advances_its_session_is_the_session_it_wrote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A result's session is copied from the worker's own when the caller first reads it.
    Another thread's advance of that session landing between the check that the worker's
    own is still the written one and the copy must not step the session being copied:
    the copy is taken out of the worker's memory while it is made (the other advance
    reads the store instead), so the result's session is the state it wrote."""
    clock, wall = Clock(50.0), Clock(1000.0)
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=clock, now=wall)
    r = w.create("s", sm.Session(settings(), seed=3, clock=clock))
    r = w.advance("s", None, expected_version=r.version)
    r = w.advance("s", next_event(r), expected_version=r.version)
    assert isinstance(r.action, sm.CallModel)
    copy = Worker._on_clock
    raced: list[Any] = []

    def racing(self: Worker, *args: Any) -> sm.Session:
        if not raced:  # "another thread", between the check and the copy
            raced.append(
                w.advance("s", sm.ModelFailed(sm.ModelError("rate_limited")), expected_version=3)
            )
        return copy(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Worker, "_on_clock", racing)
    session = r.session
    assert raced and raced[0].status is sm.store.AdvanceStatus.APPLIED
    assert raced[0].version == r.version + 1  # the other advance did land
    assert session.current_turn is not None
    assert session.current_turn.state == "calling"
    assert session.current_turn.action == r.action
