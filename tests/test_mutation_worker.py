"""What a mutation sample of the store's worker (``store/_worker.py``, issue 28) found
untested."""

from __future__ import annotations

import pytest

import statemachine as sm
from statemachine.store import InMemoryStore, Worker


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
