"""What a mutation sample of the store's worker (``store/_worker.py``, issue 28) found
untested."""

from __future__ import annotations

import json
from typing import Any

import pytest

import statemachine as sm
from statemachine.store import Advanced, AdvanceStatus, InMemoryStore, Worker
from statemachine.store import _worker as store_worker


class _CountingStore(InMemoryStore):
    """An in-memory store that lists the sessions whose record was read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def load_payload(self, session_id: str) -> tuple[int, bytes]:
        self.reads.append(session_id)
        return super().load_payload(session_id)


def _session(session_id: str) -> sm.Session:
    return sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0, session_id=session_id)


@pytest.mark.requirement("ER-70")
def test_a_worker_forgets_the_session_it_used_least_recently() -> None:
    """``remember=2``: after ``a`` and ``b`` are written and ``a`` advanced again, a third
    session pushes out ``b``, not ``a``: ``a``'s next advance reads nothing from the
    store, ``b``'s reads its record."""
    store = _CountingStore()
    worker = Worker(store, owner="w", clock=lambda: 0.0, now=lambda: 1.0, remember=2)
    a = worker.create("a", _session("a"))
    b = worker.create("b", _session("b"))
    a = worker.advance("a", None, expected_version=a.version)
    worker.create("c", _session("c"))
    store.reads.clear()
    a = worker.advance("a", sm.Assembled({"m": 1}, 5), expected_version=a.version)
    assert a.applied and store.reads == []
    b = worker.advance("b", None, expected_version=b.version)
    assert b.applied and store.reads == ["b"]


@pytest.mark.requirement("ER-70")
def test_a_session_created_again_after_another_worker_deleted_it_is_the_latest_used() -> None:
    """Worker ``a`` still remembers ``s`` when worker ``b`` deletes it; ``a`` then writes
    ``t`` and creates ``s`` anew. The new ``s`` is ``a``'s most recent session (not kept
    at the old one's place): a third session pushes out ``t``, and ``s`` advances
    without reading the store."""
    store = _CountingStore()
    a = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0, remember=2)
    b = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0, remember=2)
    a.create("s", _session("s"))
    assert b.delete("s")
    a.create("t", _session("t"))
    s = a.create("s", _session("s"))
    a.create("u", _session("u"))
    store.reads.clear()
    s = a.advance("s", None, expected_version=s.version)
    assert s.applied and store.reads == []
    t = a.load("t")
    assert t.version == 1 and store.reads == ["t"]


# -- issue 38's sample (seed 20261207) ---------------------------------------------------


class _JsonStore(InMemoryStore):
    """A store of ours subclassed: a worker gives and takes its records as JSON data."""


def _started(worker: Worker, session_id: str) -> Advanced:
    r = worker.create(session_id, _session(session_id))
    return worker.advance(session_id, None, expected_version=r.version)


@pytest.mark.requirement("ER-93")
def test_a_fraction_of_a_second_in_the_store_counts_toward_a_sessions_age() -> None:
    """With ``count_idle`` (the default) the time a session spent in the store between two
    workers counts toward its age, however short: read half a second after its write,
    its elapsed time is 0.5 s on the reader's clock."""
    store = InMemoryStore()
    wall = [1000.0]
    writer = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: wall[0])
    writer.create("s", _session("s"))
    wall[0] = 1000.5
    reader = Worker(store, owner="b", clock=lambda: 7.0, now=lambda: wall[0])
    assert reader.load("s").session.elapsed_s == 0.5


@pytest.mark.requirement("ER-70")
def test_a_results_session_is_its_versions_whenever_it_is_asked_for() -> None:
    """A result's session is the session at the result's version whenever it is asked
    for: an advance's, asked for after the worker forgot the session (``remember=1``,
    another session used since); a load's from a store whose records a worker takes as
    JSON data, asked for after the worker advanced the session again."""
    store = InMemoryStore()
    worker = Worker(store, owner="w", clock=lambda: 0.0, now=lambda: 1.0, remember=1)
    first = _started(worker, "s")
    worker.create("t", _session("t"))  # "s" is forgotten
    turn = first.session.current_turn
    assert turn is not None and turn.state == "assembling"

    worker = Worker(_JsonStore(), owner="w", clock=lambda: 0.0, now=lambda: 1.0)
    _started(worker, "s")
    loaded = worker.load("s")
    second = worker.advance("s", sm.Assembled({"m": 1}, 5), expected_version=loaded.version)
    assert isinstance(second.action, sm.CallModel)
    turn = loaded.session.current_turn
    assert turn is not None and turn.state == "assembling"
    assert second.session.current_turn.state == "calling"  # type: ignore[union-attr]


@pytest.mark.requirement("ER-70")
def test_a_results_session_is_a_copy_of_the_workers_own_not_a_decoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Asked for while the worker still holds the session at the result's version, a
    result's session is a copy of what the worker holds: no record is decoded again."""
    decoded: list[str] = []
    real = store_worker.read_session

    def counted(record: Any, *args: Any) -> Any:
        decoded.append(record.session_id)
        return real(record, *args)

    monkeypatch.setattr(store_worker, "read_session", counted)
    worker = Worker(InMemoryStore(), owner="w", clock=lambda: 0.0, now=lambda: 1.0)
    started = _started(worker, "s")
    assert started.session.current_turn.state == "assembling"  # type: ignore[union-attr]
    assert decoded == []


@pytest.mark.requirement("ER-70")
def test_advance_refuses_a_negative_expected_version() -> None:
    """``expected_version=-1`` is bad input, not a stale version: ``ValueError`` naming it
    (not a ``CONFLICT``), nothing written."""
    store = InMemoryStore()
    worker = Worker(store, owner="w", clock=lambda: 0.0, now=lambda: 1.0)
    started = _started(worker, "s")
    with pytest.raises(ValueError, match=r"session 's': expected_version must be an int >= 0"):
        worker.advance("s", sm.Assembled({"m": 1}, 5), expected_version=-1)
    assert worker.load("s").version == started.version


@pytest.mark.requirement("ER-70")
def test_a_turn_start_writes_the_snapshot_anew_once_the_journal_holds_24_entries() -> None:
    """Turns of three steps each (start, request, reply): a turn's start appends to the
    journal while it holds fewer than 24 entries, and writes the snapshot anew (an empty
    journal) once it holds 24, before the bound of 32 any write keeps."""
    store = InMemoryStore()
    worker = Worker(store, owner="w", clock=lambda: 0.0, now=lambda: 1.0)
    r = worker.create("s", _session("s"))
    at_start = []
    for _ in range(9):
        before = len(json.loads(store.load_payload("s")[1])["journal"])
        r = worker.advance("s", None, expected_version=r.version)
        at_start.append((before, len(json.loads(store.load_payload("s")[1])["journal"])))
        r = worker.advance("s", sm.Assembled({"m": 1}, 5), expected_version=r.version)
        r = worker.advance("s", sm.ModelReplied(), expected_version=r.version)
    assert at_start == [(0, 1), *((n, n + 1) for n in range(3, 22, 3)), (24, 0)]


@pytest.mark.requirement("ER-70")
def test_the_worker_that_ended_a_session_holds_it() -> None:
    """After ``end``, the ending worker holds the ended session: ending it again with the
    same status answers ``UNCHANGED`` without reading the store."""
    store = _CountingStore()
    worker = Worker(store, owner="w", clock=lambda: 0.0, now=lambda: 1.0)
    started = _started(worker, "s")
    ended = worker.end("s", "cancelled", expected_version=started.version)
    store.reads.clear()
    again = worker.end("s", "cancelled", expected_version=ended.version)
    assert again.status is AdvanceStatus.UNCHANGED
    assert store.reads == []


@pytest.mark.requirement("ER-200")
def test_a_worker_remembering_one_session_completes_a_parent_with_children() -> None:
    """``remember=1``: reading the children while it checks that none runs makes the
    worker forget the parent; ``end("completed")`` then reads the parent again and
    completes it."""
    store = InMemoryStore()
    root = _session("r")
    kid = root.spawn(session_id="r.kid")
    writer = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    writer.create("r", root)
    writer.create("r.kid", kid)
    worker = Worker(store, owner="w", clock=lambda: 0.0, now=lambda: 1.0, remember=1)
    worker.load("r")
    completed = worker.end("r", "completed", expected_version=1)
    assert completed.applied
    assert completed.session.status is sm.SessionStatus.COMPLETED


@pytest.mark.requirement("ER-70")
def test_a_worker_forgets_the_session_it_deleted() -> None:
    """Worker ``a`` deletes ``s``, which it held at version 1, and worker ``b`` creates a
    new ``s`` (version 1 again, another incarnation): ``a``'s advance at version 1 steps
    the new session, not the one it had held."""
    store = InMemoryStore()
    a = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    b = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0)
    a.create("s", sm.Session(sm.Settings(max_turns=3), seed=1, clock=lambda: 0.0))
    assert a.delete("s")
    b.create("s", sm.Session(sm.Settings(max_turns=7), seed=2, clock=lambda: 0.0))
    started = a.advance("s", None, expected_version=1)
    assert started.status is AdvanceStatus.APPLIED
    assert started.session.settings.max_turns == 7
