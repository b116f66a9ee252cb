"""Ending a stored session on purpose (``Worker.end``), on both stores: the in-memory one
and a real ``redis-server`` on loopback (skipped locally without it, a failure when
``CI`` is set); and ``Session.end("completed")`` in one process while a child runs."""

from __future__ import annotations

from typing import Any

import pytest

import statemachine as sm
from statemachine.store import (
    AdvanceStatus,
    InMemoryStore,
    InvalidSessionId,
    SessionNotFound,
    StaleWrite,
    StoreError,
    Worker,
)
from statemachine.store import _ending as store_ending

from . import test_store as shared
from .store_worker import Clock
from .test_store import Backend, worker

backend = shared.backend  # the store suite's fixtures: each test once per store
now = shared.now
redis_server = shared.redis_server


def tree(store: Any, now: Clock) -> tuple[Worker, Worker, int, int]:
    """A root ``p`` (stored by worker ``a``) with a child ``p.kid`` and a grandchild
    ``p.kid.g``, the child's turn calling the model under worker ``b``. Returns the
    workers, the root's version and the child's."""
    a, b = worker(store, "a", now), worker(store, "b", now)
    root = sm.Session(sm.Settings(max_cost_usd=5.0), seed=1, clock=lambda: 0.0, session_id="p")
    child = root.spawn(session_id="p.kid")
    grandchild = child.spawn(session_id="p.kid.g")
    a.create("p", root)
    b.create("p.kid", child)
    b.create("p.kid.g", grandchild)
    result = b.advance("p.kid", None, expected_version=1)
    result = b.advance("p.kid", sm.Assembled("req", 10), expected_version=result.version)
    assert isinstance(result.action, sm.CallModel)
    return a, b, 1, result.version


@pytest.mark.requirement("ER-200")
@pytest.mark.parametrize("status", ["cancelled", "failed"])
def test_ending_a_parent_reaches_children_held_by_other_workers(
    backend: Backend, now: Clock, status: str
) -> None:
    """``a`` ends the root; the child whose turn ``b`` holds, and its child, end
    ``cancelled`` by compare-and-set; ``b``'s reply then meets a ``CONFLICT`` with the
    child ended, and charges no one: no child is left running."""
    store = backend.make()
    a, b, root_version, child_version = tree(store, now)
    ended = a.end("p", status, expected_version=root_version, reason="user left")
    assert ended.status is AdvanceStatus.APPLIED
    assert ended.version == root_version + 1
    assert ended.session.status == status
    assert ended.ended == ("p.kid", "p.kid.g")
    late = b.advance("p.kid", sm.ModelReplied(cost=0.5), expected_version=child_version)
    assert late.status is AdvanceStatus.CONFLICT
    assert late.session.status is sm.SessionStatus.CANCELLED
    turn = late.session.current_turn
    assert turn is not None
    assert turn.status is sm.TurnStatus.CANCELLED
    assert isinstance(late.action, sm.Finish)
    with pytest.raises(sm.SessionEnded):
        b.advance("p.kid", None, expected_version=late.version)
    fresh = worker(backend.make(), "c", now, remember=0)
    for session_id, expected in (("p", status), ("p.kid", "cancelled"), ("p.kid.g", "cancelled")):
        assert fresh.load(session_id).session.status == expected
    assert fresh.load("p").session.cost_usd == 0.0  # the late reply charged nothing


@pytest.mark.requirement("ER-200")
def test_ending_cancels_the_running_turn_and_drops_its_claim(backend: Backend, now: Clock) -> None:
    """Ended ``failed`` while its tool calls are out: the turn finishes ``cancelled``
    (the result's action), the claim is gone, so no resume hands the calls out again;
    the record is an ended one (its TTL applies)."""
    store = backend.make(ended_ttl_s=60)
    w = worker(store, "a", now)
    w.create("s", sm.Session(seed=2, clock=lambda: 0.0, session_id="s"))
    result = w.advance("s", None, expected_version=1)
    result = w.advance("s", sm.Assembled("req", 10), expected_version=result.version)
    call = sm.ToolCall("c1", "srv", "write", {"x": 1})
    result = w.advance("s", sm.ModelReplied((call,)), expected_version=result.version)
    assert isinstance(result.action, sm.InvokeTools)
    ended = w.end("s", sm.SessionStatus.FAILED, expected_version=result.version)
    assert isinstance(ended.action, sm.Finish)
    assert ended.action.status is sm.TurnStatus.CANCELLED
    assert ended.session.status is sm.SessionStatus.FAILED
    now.now += 10_000  # every lease long gone
    resumed = worker(store, "b", now).resume("s")
    assert resumed.status is AdvanceStatus.UNCHANGED
    assert resumed.interrupted == ()
    if isinstance(store, InMemoryStore):
        assert store._data[store.key("s")][2] is not None  # an expiry: the record is ended


@pytest.mark.requirement("ER-200")
def test_completed_is_refused_while_any_childs_turn_runs(backend: Backend, now: Clock) -> None:
    """``end("completed")`` while the child's turn runs (under another worker), or the
    session's own: ``TurnInProgress``, nothing written. Once the child's turn has
    finished, it completes, and the idle children are left as they are (as in one
    process)."""
    store = backend.make()
    a, b, root_version, child_version = tree(store, now)
    with pytest.raises(sm.TurnInProgress, match=r"child session 'p\.kid' is running a turn"):
        a.end("p", "completed", expected_version=root_version)
    assert a.load("p").version == root_version
    assert a.load("p").session.status is None
    done = b.advance("p.kid", sm.ModelReplied(cost=0.5), expected_version=child_version)
    assert isinstance(done.action, sm.Finish)
    loaded = a.load("p")
    completed = a.end("p", "completed", expected_version=loaded.version)
    assert completed.applied
    assert completed.session.status is sm.SessionStatus.COMPLETED
    assert completed.ended == ()
    assert completed.session.cost_usd == pytest.approx(0.5)
    w = worker(store, "c", now)
    w.create("solo", sm.Session(seed=3, clock=lambda: 0.0, session_id="solo"))
    started = w.advance("solo", None, expected_version=1)
    with pytest.raises(sm.TurnInProgress, match="session 'solo' is running a turn"):
        w.end("solo", "completed", expected_version=started.version)
    assert w.load("solo").version == started.version


@pytest.mark.requirement("ER-200")
def test_end_is_compare_and_set_and_checks_its_input(backend: Backend, now: Clock) -> None:
    """A stale version is a ``CONFLICT`` and a retried key a ``DUPLICATE`` (nothing
    written either way); a status a host does not end with, a bad version or key:
    ``ValueError`` naming it, nothing written; another ending of an ended session:
    ``SessionEnded``."""
    store = backend.make()
    w = worker(store, "a", now)
    w.create("s", sm.Session(seed=2, clock=lambda: 0.0, session_id="s"))
    started = w.advance("s", None, expected_version=1)
    stale = w.end("s", "cancelled", expected_version=1)
    assert stale.status is AdvanceStatus.CONFLICT
    assert stale.session.status is None
    assert stale.version == started.version
    for bad, message in (
        ("error_max_turns", "status: 'error_max_turns' is not a status a host ends"),
        ("done", "status: 'done'"),
        (None, "status: None"),
    ):
        with pytest.raises(ValueError, match=message):
            w.end("s", bad, expected_version=started.version)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected_version"):
        w.end("s", "cancelled", expected_version=-1)
    with pytest.raises(ValueError, match="key"):
        w.end("s", "cancelled", expected_version=started.version, key="")
    assert w.load("s").version == started.version
    ended = w.end("s", "cancelled", expected_version=started.version, key="stop-1")
    assert ended.applied
    again = worker(store, "b", now).end(
        "s", "cancelled", expected_version=started.version, key="stop-1"
    )
    assert again.status is AdvanceStatus.DUPLICATE
    assert again.version == ended.version
    repeat = w.end("s", "cancelled", expected_version=ended.version)
    assert repeat.status is AdvanceStatus.UNCHANGED
    assert repeat.version == ended.version
    with pytest.raises(sm.SessionEnded, match="already ended"):
        w.end("s", "failed", expected_version=ended.version)


@pytest.mark.requirement("ER-200")
def test_a_cascade_a_dead_worker_left_half_done_is_finished_by_a_repeat(
    backend: Backend, now: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker that ended the root died before reaching the children (its cascade
    never ran): ending the root again with the same status is ``UNCHANGED`` and ends
    them; meanwhile a child between turns starts no turn (``SessionEnded``). A child whose worker keeps winning the race is retried, and after too many
    conflicts the caller is told to call again (``StoreError``)."""
    store = backend.make()
    a, b, root_version, _ = tree(store, now)
    with monkeypatch.context() as patch:
        patch.setattr(store_ending, "cascade", lambda *args, **kwargs: [])
        dead = a.end("p", "cancelled", expected_version=root_version)
    assert dead.ended == ()
    assert b.load("p.kid").session.status is None  # left running
    repeat = worker(store, "c", now).end("p", "cancelled", expected_version=dead.version)
    assert repeat.status is AdvanceStatus.UNCHANGED
    assert repeat.ended == ("p.kid", "p.kid.g")
    assert b.load("p.kid").session.status is sm.SessionStatus.CANCELLED

    store3 = backend.make(prefix="idle")
    a3, b3, version3, child3 = tree(store3, now)
    done = b3.advance("p.kid", sm.ModelReplied(), expected_version=child3)
    assert isinstance(done.action, sm.Finish)  # the child is between turns
    with monkeypatch.context() as patch:
        patch.setattr(store_ending, "cascade", lambda *args, **kwargs: [])
        a3.end("p", "failed", expected_version=version3)  # dies before the children
    with pytest.raises(sm.SessionEnded, match=r"its parent 'p' has ended \(failed\)"):
        b3.advance("p.kid", None, expected_version=done.version)  # it starts no turn
    assert b3.load("p.kid").version == done.version  # nothing written

    store2 = backend.make(prefix="race")
    a2, _, version2, _ = tree(store2, now)
    real_write = store_ending.write_end
    lost: list[str] = []

    def always_beaten(held: Any, session_id: str, *args: Any) -> None:
        if session_id == "p":
            return real_write(held, session_id, *args)
        lost.append(session_id)
        raise StaleWrite("beaten", session_id=session_id, expected=1, actual=2)

    monkeypatch.setattr(store_ending, "write_end", always_beaten)
    with pytest.raises(StoreError, match=r"'p\.kid': 16 conflicting writes.*call end again"):
        a2.end("p", "failed", expected_version=version2)
    assert lost == ["p.kid"] * 16


@pytest.mark.requirement("ER-201")
def test_session_end_completed_is_refused_while_a_childs_turn_runs() -> None:
    """In one process: ``end("completed")`` while a child's (or a grandchild's) turn
    runs raises ``TurnInProgress`` naming it and changes nothing; once that turn has
    finished the parent completes; ``cancelled`` ends the running descendants."""
    parent = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0, session_id="p")
    child = parent.spawn()
    grandchild = child.spawn()
    turn = grandchild.new_turn()
    turn.start()
    with pytest.raises(sm.TurnInProgress, match=r"child session 'p\.1\.1' is running a turn"):
        parent.end("completed")
    assert (parent.status, child.status, grandchild.status) == (None, None, None)
    turn.send(sm.Assembled("req", 1))
    turn.send(sm.ModelReplied(cost=0.25))
    assert parent.end("completed") is None
    assert parent.status is sm.SessionStatus.COMPLETED
    assert parent.cost_usd == pytest.approx(0.25)

    other = sm.Session(seed=1, clock=lambda: 0.0, session_id="q")
    kid = other.spawn()
    running = kid.new_turn()
    running.start()
    other.end("cancelled")
    assert kid.status is sm.SessionStatus.CANCELLED
    assert running.status is sm.TurnStatus.CANCELLED


def test_end_with_bad_input_names_it_and_writes_nothing(backend: Backend, now: Clock) -> None:
    """A hostile caller's endings: an unknown id, an id that is not one, a version that
    is not an int, a stale version, another status after an ending, a child ended on
    its own and then again. Each error names what was wrong; the records (both
    versions and statuses) are as they were."""
    store = backend.make()
    w = worker(store, "a", now)
    root = sm.Session(seed=3, clock=lambda: 0.0, session_id="r")
    w.create("r", root)
    w.create("r.kid", root.spawn(session_id="r.kid"))

    def states() -> list[tuple[int, object]]:
        fresh = worker(store, "reader", now)
        return [(fresh.load(i).version, fresh.load(i).session.status) for i in ("r", "r.kid")]

    before = states()
    with pytest.raises(SessionNotFound, match="session 'nosuch': no record"):
        w.end("nosuch", "cancelled", expected_version=1)
    for bad_id in ("", "a b", 5):
        with pytest.raises(InvalidSessionId, match=f"session id {bad_id!r} is invalid"):
            w.end(bad_id, "cancelled", expected_version=1)  # type: ignore[arg-type]
    for bad_version in (True, 1.0, "1", None):
        with pytest.raises(ValueError, match=r"session 'r': expected_version must be an int"):
            w.end("r", "cancelled", expected_version=bad_version)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reason: must be a str"):
        w.end("r", "cancelled", expected_version=1, reason=5)  # type: ignore[arg-type]
    assert w.end("r", "failed", expected_version=7).status is AdvanceStatus.CONFLICT
    assert states() == before

    # a child ended directly is ended alone; ending it again otherwise is refused
    kid = w.end("r.kid", "failed", expected_version=1)
    assert kid.applied and kid.ended == () and kid.session.status is sm.SessionStatus.FAILED
    with pytest.raises(sm.SessionEnded, match=r"session 'r.kid' has already ended \(failed\)"):
        w.end("r.kid", "cancelled", expected_version=kid.version)
    assert states() == [before[0], (kid.version, sm.SessionStatus.FAILED)]
    # its parent completes (no child runs) and a stale repeat is a CONFLICT, not a write
    done = w.end("r", "completed", expected_version=1)
    assert done.applied and done.ended == ()
    assert w.end("r", "completed", expected_version=1).status is AdvanceStatus.CONFLICT
    assert states() == [(done.version, sm.SessionStatus.COMPLETED), (kid.version, "failed")]
