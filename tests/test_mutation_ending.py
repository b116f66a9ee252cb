"""What issue 38's mutation sample of a stored session's ending (``store/_ending.py``,
seed 20261207) found untested: a tree more than two levels deep, the walk's bound, and
what the worker that ran an ending holds of the children it read."""

from __future__ import annotations

import pytest

import statemachine as sm
from statemachine.store import AdvanceStatus, InMemoryStore, Worker

_DEPTH = 18
"""Descendants under the root of :func:`_chain`: one more than an ending reaches."""


class _CountingStore(InMemoryStore):
    """An in-memory store that lists the sessions whose record was read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def load_payload(self, session_id: str) -> tuple[int, bytes]:
        self.reads.append(session_id)
        return super().load_payload(session_id)


def _worker(store: InMemoryStore, owner: str) -> Worker:
    return Worker(store, owner=owner, clock=lambda: 0.0, now=lambda: 1.0)


def _root(session_id: str) -> sm.Session:
    return sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0, session_id=session_id)


def _chain(store: InMemoryStore, running: int | None = None) -> Worker:
    """Stores a root ``n0`` and a chain of descendants ``n1`` (its child) to ``n18``,
    each the only child of the one before, written by worker ``b``; the turn of
    ``n<running>`` is started (it runs). Returns worker ``a``, which has read none."""
    b = _worker(store, "b")
    chain = [_root("n0")]
    for level in range(1, _DEPTH + 1):
        chain.append(chain[-1].spawn(session_id=f"n{level}"))
    for level, session in enumerate(chain):
        b.create(f"n{level}", session)
    if running is not None:
        started = b.advance(f"n{running}", None, expected_version=1)
        assert started.applied and started.action is not None
    return _worker(store, "a")


def _status(store: InMemoryStore, session_id: str) -> sm.SessionStatus | None:
    return (
        Worker(store, owner="reader", clock=lambda: 0.0, now=lambda: 1.0, remember=0)
        .load(session_id)
        .session.status
    )


@pytest.mark.requirement("ER-200")
def test_an_ending_reaches_seventeen_levels_of_descendants_and_no_deeper() -> None:
    """An ending walks the tree 16 levels below the session's children, as the spend
    settlement does: a root ended ``cancelled`` ends its 17 nearest levels of
    descendants (``n1`` to ``n17``, each through its own record), a running turn at
    level 17 refuses ``completed``; the 18th level is out of the walk's reach (its
    running turn refuses nothing, its session is not ended). The bound is what keeps
    an ending over records that name each other from running without end."""
    store = InMemoryStore()
    a = _chain(store)
    ended = a.end("n0", "cancelled", expected_version=1)
    assert ended.applied
    assert ended.ended == tuple(f"n{level}" for level in range(1, 18))
    assert _status(store, "n17") is sm.SessionStatus.CANCELLED
    assert _status(store, "n18") is None

    store = InMemoryStore()
    a = _chain(store, running=17)
    with pytest.raises(sm.TurnInProgress, match="child session 'n17' is running a turn"):
        a.end("n0", "completed", expected_version=1)
    assert _status(store, "n0") is None

    store = InMemoryStore()
    a = _chain(store, running=18)
    completed = a.end("n0", "completed", expected_version=1)
    assert completed.applied and completed.ended == ()
    assert _status(store, "n18") is None


@pytest.mark.requirement("ER-200")
def test_an_ending_over_records_that_name_each_other_stops() -> None:
    """Forged records that loop (``x``'s child is ``y`` and ``y``'s is ``x``, each naming
    the other its parent): ending ``x`` ``completed`` or ``cancelled`` returns (the walk
    is bounded); ``cancelled`` ends ``y`` once."""
    x = _root("y").spawn(session_id="x")  # x: parent y
    y = x.spawn(session_id="y")  # y: parent x
    y.spawn(session_id="x")  # y's child x
    for status, ended in (("completed", ()), ("cancelled", ("y",))):
        store = InMemoryStore()
        b = _worker(store, "b")
        b.create("x", x)
        b.create("y", y)
        result = _worker(store, "a").end("x", status, expected_version=1)
        assert result.applied
        assert result.ended == ended


@pytest.mark.requirement("ER-200")
def test_completed_passes_over_a_child_record_that_is_gone_or_another_parents() -> None:
    """``completed`` checks only the store's children of the session: a child whose
    record was deleted is skipped, and so is a record under a child's id that another
    session created (its parent is not this one) even while its turn runs; the root
    then completes and ends none of them."""
    store = InMemoryStore()
    b = _worker(store, "b")
    root = _root("r")
    gone = root.spawn(session_id="r.gone")
    root.spawn(session_id="r.taken")
    b.create("r", root)
    b.create("r.gone", gone)
    assert b.delete("r.gone")
    other = _root("q").spawn(session_id="r.taken")  # another parent's child, same id
    taken = b.create("r.taken", other)
    started = b.advance("r.taken", None, expected_version=taken.version)
    assert started.action is not None  # its turn runs
    completed = _worker(store, "a").end("r", "completed", expected_version=1)
    assert completed.applied
    assert completed.session.status is sm.SessionStatus.COMPLETED
    assert completed.ended == ()
    assert _status(store, "r.taken") is None


@pytest.mark.requirement("ER-70")
def test_the_worker_that_ran_an_ending_holds_each_child_it_read() -> None:
    """Worker ``a`` ends a root whose children another worker wrote: one it ended, one
    that had ended on its own, one whose id another session's child took. Each record
    the cascade read is held in ``a``'s memory as the store has it: ``a``'s next ending
    of each reads no record from the store (and answers as the store would)."""
    store = _CountingStore()
    b = _worker(store, "b")
    root = _root("r")
    kid = root.spawn(session_id="r.kid")
    done = root.spawn(session_id="r.done")
    root.spawn(session_id="r.taken")
    b.create("r", root)
    b.create("r.kid", kid)
    b.create("r.done", done)
    failed = b.end("r.done", "failed", expected_version=1)
    taken = b.create("r.taken", _root("q").spawn(session_id="r.taken"))
    a = _worker(store, "a")
    ended = a.end("r", "cancelled", expected_version=1)
    assert ended.ended == ("r.kid",)
    store.reads.clear()
    again = a.end("r.kid", "cancelled", expected_version=2)
    assert again.status is AdvanceStatus.UNCHANGED
    unchanged = a.end("r.done", "failed", expected_version=failed.version)
    assert unchanged.status is AdvanceStatus.UNCHANGED
    other = a.end("r.taken", "cancelled", expected_version=taken.version)
    assert other.applied and other.session.status is sm.SessionStatus.CANCELLED
    assert store.reads == []
