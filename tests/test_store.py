"""The session store suite, run against both stores: the in-memory one and a real
``redis-server`` on loopback (skipped locally without it, a failure when ``CI`` is set).

Worker processes, SIGKILL and server restarts are in ``test_store_redis.py``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import statemachine as sm
from statemachine.store import (
    INTERRUPTED,
    AdvanceStatus,
    CorruptSession,
    InMemoryStore,
    InvalidSessionId,
    RecordTooLarge,
    RedisStore,
    SessionNotFound,
    SessionStore,
    StaleWrite,
    Stored,
    Worker,
)
from statemachine.store import _held as store_held
from statemachine.store._record import COMPACT_EVERY, Record

from .helpers import fail
from .store_worker import STOP, Clock, RedisServer, next_event, settings


def redis_server_or_skip(directory: Path, *, persistent: bool = False) -> RedisServer:
    """A started server; skip without ``redis-server`` locally, fail in CI."""
    if not RedisServer.available():
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed, and CI is set: the store tests need it")
        pytest.skip("redis-server is not installed")
    server = RedisServer(directory, persistent=persistent)
    server.start()
    return server


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server (no persistence) for this module's tests."""
    server = redis_server_or_skip(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


class Backend:
    """Makes stores of one kind that share one backend, and reaches under them."""

    kind = ""

    def make(self, **options: Any) -> Any:
        raise NotImplementedError

    def put_raw(self, store: Any, session_id: str, version: int, payload: bytes) -> None:
        """Write ``payload`` under the session's key, bypassing every check."""
        raise NotImplementedError

    def raw(self, store: Any, session_id: str) -> tuple[int, bytes] | None:
        """What is stored under the session's key, bypassing every check."""
        raise NotImplementedError


class MemoryBackend(Backend):
    kind = "memory"

    def __init__(self) -> None:
        self.clock = Clock()
        self.base = InMemoryStore(clock=self.clock)

    def make(self, **options: Any) -> InMemoryStore:
        store = InMemoryStore(clock=self.clock, **options)
        store._data = self.base._data
        store._lock = self.base._lock
        return store

    def put_raw(self, store: Any, session_id: str, version: int, payload: bytes) -> None:
        store._data[store.key(session_id)] = (version, payload, None, None)

    def raw(self, store: Any, session_id: str) -> tuple[int, bytes] | None:
        entry = store._data.get(store.key(session_id))
        return None if entry is None else (entry[0], entry[1])


class RedisBackend(Backend):
    kind = "redis"

    def __init__(self, client: Any) -> None:
        self.client = client

    def make(self, **options: Any) -> RedisStore:
        return RedisStore(self.client, **options)

    def put_raw(self, store: Any, session_id: str, version: int, payload: bytes) -> None:
        self.client.hset(store.key(session_id), mapping={"version": version, "record": payload})

    def raw(self, store: Any, session_id: str) -> tuple[int, bytes] | None:
        data = self.client.hgetall(store.key(session_id))
        return (int(data[b"version"]), data[b"record"]) if data else None


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Each test runs once per store."""
    if request.param == "memory":
        yield MemoryBackend()
        return
    import redis

    server: RedisServer = request.getfixturevalue("redis_server")
    client = redis.Redis(host="127.0.0.1", port=server.port)
    client.flushdb()
    yield RedisBackend(client)
    client.close()


@pytest.fixture
def now() -> Clock:
    """The workers' shared wall clock."""
    return Clock(10_000.0)


def worker(store: Any, owner: str, now: Clock, **options: Any) -> Worker:
    """A worker on injected clocks (sessions' monotonic clock frozen at 0)."""
    return Worker(store, owner=owner, clock=lambda: 0.0, now=now, **options)


def new_session(**options: Any) -> sm.Session:
    """A fresh session on a frozen clock."""
    base = settings()
    return sm.Session(sm.Settings(**{**base.to_dict(), **options}), seed=3, clock=lambda: 0.0)


def run_until(w: Worker, session_id: str, done: Callable[[Any], bool], **plan: Any) -> Any:
    """Drive the session with the scripted host until ``done(result)``."""
    result = w.load(session_id)
    while not done(result):
        event = next_event(result, **plan)
        assert event is not STOP
        result = w.advance(session_id, event, expected_version=result.version)
        assert result.status is AdvanceStatus.APPLIED
    return result


def claimed(result: Any) -> bool:
    """Whether tool calls were just handed out."""
    return isinstance(result.action, sm.InvokeTools)


# -- the store protocol --------------------------------------------------------------------


@pytest.mark.requirement("ER-70")
def test_create_and_load_round_trip(backend: Backend, now: Clock) -> None:
    """A created session loads back at version 1 with the same snapshot, from a store
    that satisfies the SessionStore protocol."""
    store = backend.make()
    assert isinstance(store, SessionStore)
    session = new_session()
    turn = session.new_turn()
    turn.start()
    w = worker(store, "a", now)
    assert w.create("conv-1", session).version == 1
    loaded = w.load("conv-1")
    assert loaded.status is AdvanceStatus.UNCHANGED
    assert loaded.version == 1
    assert loaded.session.snapshot() == session.snapshot()
    assert loaded.action == sm.Assemble(reduce=False)
    stored = store.load("conv-1")
    assert isinstance(stored, Stored)
    assert stored.record["snapshot"] == session.snapshot()


@pytest.mark.requirement("ER-70")
def test_compare_and_set_refuses_stale_writes(backend: Backend, now: Clock) -> None:
    """A write at the wrong version raises StaleWrite (with both versions) and changes
    nothing; a write to a vanished record raises SessionNotFound."""
    store = backend.make()
    w = worker(store, "a", now)
    w.create("conv-1", new_session())
    before = backend.raw(store, "conv-1")
    with pytest.raises(StaleWrite, match=r"'conv-1' already exists \(version 1\)") as exc:
        w.create("conv-1", new_session(max_turns=9))
    assert (exc.value.expected, exc.value.actual, exc.value.session_id) == (0, 1, "conv-1")
    record = store.load("conv-1").record
    with pytest.raises(StaleWrite, match="expected version 5, the store holds version 1"):
        store.compare_and_set("conv-1", 5, record)
    assert backend.raw(store, "conv-1") == before
    assert store.compare_and_set("conv-1", 1, record) == 2
    with pytest.raises(SessionNotFound, match=r"'gone'.*expected version 2"):
        store.compare_and_set("gone", 2, record)
    with pytest.raises(SessionNotFound, match="'gone'"):
        store.load("gone")
    assert store.delete("conv-1") is True
    assert store.delete("conv-1") is False


@pytest.mark.requirement("ER-72")
def test_ended_sessions_expire_and_running_ones_do_not(backend: Backend, now: Clock) -> None:
    """With ended_ttl_s, the write that ends a session sets its expiry; a running
    session has none."""
    store = backend.make(ended_ttl_s=60)
    w = worker(store, "a", now)
    w.create("short", new_session(max_turns=1))
    w.create("long", new_session())
    result = run_until(w, "short", lambda r: r.session.status is not None, turns=5, failures=0)
    assert result.session.status is sm.SessionStatus.ERROR_MAX_TURNS
    with pytest.raises(sm.SessionEnded):
        w.advance("short", None, expected_version=result.version)
    if isinstance(backend, RedisBackend):
        ttl = backend.client.pttl(store.key("short"))
        assert 0 < ttl <= 60_000
        assert backend.client.pttl(store.key("long")) == -1
        return
    assert isinstance(backend, MemoryBackend)
    backend.clock.now += 59.9
    assert w.load("short").version == result.version
    backend.clock.now += 0.2
    with pytest.raises(SessionNotFound, match=r"'short'.*expired"):
        w.load("short")
    assert w.load("long").version == 1


# -- advancing ------------------------------------------------------------------------------


@pytest.mark.requirement("ER-73")
def test_advance_applies_one_event_at_the_expected_version(backend: Backend, now: Clock) -> None:
    """An event is applied only at the version it was computed from: a stale one is a
    CONFLICT carrying the fresh state, and the counters move once."""
    w = worker(backend.make(), "a", now)
    w.create("conv-1", new_session())
    first = w.advance("conv-1", None, expected_version=1)
    assert first.applied
    assert first.version == 2
    calling = w.advance("conv-1", sm.Assembled("req", 10), expected_version=2)
    failed = sm.ModelFailed(sm.ModelError("rate_limited"))
    waiting = w.advance("conv-1", failed, expected_version=calling.version)
    assert isinstance(waiting.action, sm.Wait)
    again = w.advance("conv-1", failed, expected_version=calling.version)
    assert again.status is AdvanceStatus.CONFLICT
    assert again.version == waiting.version
    assert again.action == waiting.action
    assert again.session.retries_used == 1
    assert w.load("conv-1").session.retries_used == 1


@pytest.mark.requirement("ER-73")
def test_engine_errors_write_nothing(backend: Backend, now: Clock) -> None:
    """An illegal event (or a turn started twice) raises the engine's error and the
    stored version does not move."""
    w = worker(backend.make(), "a", now)
    w.create("conv-1", new_session())
    with pytest.raises(sm.IllegalEvent, match="'conv-1' has no turn yet"):
        w.advance("conv-1", sm.WaitDone(), expected_version=1)
    w.advance("conv-1", None, expected_version=1)
    with pytest.raises(sm.IllegalEvent, match="WaitDone is not legal in state 'assembling'"):
        w.advance("conv-1", sm.WaitDone(), expected_version=2)
    with pytest.raises(sm.TurnInProgress):
        w.advance("conv-1", None, expected_version=2)
    assert w.load("conv-1").version == 2


class Interleaving:
    """A store that lets another worker write just before this one's write."""

    def __init__(self, store: Any, meddle: Callable[[], None]) -> None:
        self.store = store
        self.meddle = meddle

    def load(self, session_id: str) -> Stored:
        result: Stored = self.store.load(session_id)
        return result

    def compare_and_set(self, session_id: str, expected: int, record: Any, **kw: Any) -> int:
        meddle, self.meddle = self.meddle, lambda: None
        meddle()
        version: int = self.store.compare_and_set(session_id, expected, record, **kw)
        return version

    def delete(self, session_id: str) -> bool:
        deleted: bool = self.store.delete(session_id)
        return deleted


@pytest.mark.requirement("ER-73")
def test_a_lost_race_reloads_and_reports_conflict(backend: Backend, now: Clock) -> None:
    """When another worker writes between this one's read and write, the write is
    refused; the result is CONFLICT with the other worker's state, and the event is
    applied exactly once."""
    store = backend.make()
    other = worker(store, "b", now)
    failed = sm.ModelFailed(sm.ModelError("overloaded"))
    other.create("conv-1", new_session())
    other.advance("conv-1", None, expected_version=1)
    other.advance("conv-1", sm.Assembled("req", 10), expected_version=2)
    w = worker(
        Interleaving(store, lambda: other.advance("conv-1", failed, expected_version=3)), "a", now
    )
    result = w.advance("conv-1", failed, expected_version=3)
    assert result.status is AdvanceStatus.CONFLICT
    assert result.version == 4
    assert isinstance(result.action, sm.Wait)
    assert result.session.retries_used == 1
    assert w.load("conv-1").session.retries_used == 1


@pytest.mark.requirement("ER-73")
def test_a_retried_write_with_its_key_is_a_duplicate(backend: Backend, now: Clock) -> None:
    """Sending the same keyed event again (a retry after a lost reply) is DUPLICATE,
    not applied again, even after other events moved the session on; a lost race to
    the same key is DUPLICATE too."""
    store = backend.make()
    w = worker(store, "a", now)
    w.create("conv-1", new_session())
    w.advance("conv-1", None, expected_version=1, key="e1")
    calling = w.advance("conv-1", sm.Assembled("req", 10), expected_version=2, key="e2")
    failed = sm.ModelFailed(sm.ModelError("rate_limited"))
    w.advance("conv-1", failed, expected_version=calling.version, key="e3")
    w.advance("conv-1", sm.WaitDone(), expected_version=calling.version + 1, key="e4")
    retry = w.advance("conv-1", failed, expected_version=calling.version, key="e3")
    assert retry.status is AdvanceStatus.DUPLICATE
    assert retry.session.retries_used == 1
    twin = worker(store, "b", now)
    racing = Interleaving(
        store, lambda: twin.advance("conv-1", failed, expected_version=5, key="e5")
    )
    lost = worker(racing, "a", now).advance("conv-1", failed, expected_version=5, key="e5")
    assert lost.status is AdvanceStatus.DUPLICATE
    assert lost.session.retries_used == 2
    with pytest.raises(ValueError, match="key: must be a non-empty str"):
        w.advance("conv-1", failed, expected_version=6, key="")


@pytest.mark.requirement("ER-74")
def test_two_threads_racing_apply_each_step_once(backend: Backend, now: Clock) -> None:
    """Two workers in threads drive one session with the scripted host: each version
    is advanced by exactly one of them, and the retries counted equal the retry
    events applied (none lost, none doubled)."""
    store = backend.make()
    worker(store, "setup", now).create("conv-1", new_session())
    logs: dict[str, list[tuple[int, str, str]]] = {"a": [], "b": []}
    gate = threading.Barrier(2)

    def run(owner: str) -> None:
        w = worker(store, owner, now)
        gate.wait(timeout=10)
        result = w.load("conv-1")
        while (event := next_event(result)) is not STOP:
            expected = result.version
            result = w.advance("conv-1", event, expected_version=expected)
            logs[owner].append((expected, result.status.value, type(event).__name__))

    threads = [threading.Thread(target=run, args=(owner,)) for owner in logs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    check_race(logs["a"] + logs["b"], worker(store, "check", now).load("conv-1"))


def check_race(log: list[tuple[int, str, str]], final: Any) -> None:
    """Every version from 1 to the last was advanced exactly once; the retries
    the session counted are the ModelFailed events applied."""
    applied = sorted(v for v, status, _ in log if status == "applied")
    assert applied == list(range(1, final.version))
    retries = sum(1 for _, status, event in log if status == "applied" and event == "ModelFailed")
    assert retries == final.session.retries_used
    assert final.session.retries_used == 6 * 2
    assert final.session.turns == 6
    assert isinstance(final.action, sm.Finish)
    assert all(status in {"applied", "conflict"} for _, status, _ in log)


# -- tool calls in flight when a worker dies -----------------------------------------------


@pytest.mark.requirement("ER-75")
def test_resume_interrupts_claimed_calls_and_reruns_idempotent_ones(
    backend: Backend, now: Clock
) -> None:
    """Worker A is handed a search (idempotent) and a write, then never comes back.
    While its lease holds, resume is BUSY; after it, B gets the search again, the
    write comes back as an error marked interrupted, and the counters are A's."""
    store = backend.make()
    a = worker(store, "a", now, lease_s=30)
    a.create("conv-1", new_session())
    handed = run_until(a, "conv-1", claimed)
    assert [c.name for c in handed.action.calls] == ["search", "write"]
    assert store.load("conv-1").record["claim"]["owner"] == "a"
    b = worker(store, "b", now, idempotent={"search"}, lease_s=30)
    busy = b.resume("conv-1")
    assert busy.status is AdvanceStatus.BUSY
    assert busy.version == handed.version
    now.now += 31
    taken = b.resume("conv-1")
    assert taken.status is AdvanceStatus.APPLIED
    assert [c.name for c in taken.action.calls] == ["search"]
    assert taken.interrupted == (
        sm.ToolOutcome("t1-w", False, INTERRUPTED, sm.ToolErrorCategory.CANCELLED),
    )
    assert taken.session.retries_used == handed.session.retries_used == 2
    assert taken.session.cost_usd == handed.session.cost_usd
    assert worker(store, "c", now, idempotent={"search"}).resume("conv-1").status is (
        AdvanceStatus.BUSY
    )
    assert b.load("conv-1").action == taken.action
    done = b.advance(
        "conv-1",
        sm.ToolsDone([sm.ToolOutcome("t1-s", True, "3 hits")]),
        expected_version=taken.version,
    )
    assert done.action.status is sm.TurnStatus.COMPLETED
    assert done.action.tool_results == (
        sm.ToolResult("t1-s", "3 hits"),
        sm.ToolResult("t1-w", INTERRUPTED, True, sm.ToolErrorCategory.CANCELLED),
    )
    assert store.load("conv-1").record["claim"] is None


@pytest.mark.requirement("ER-75")
def test_resume_without_idempotent_tools_finishes_the_turn(backend: Backend, now: Clock) -> None:
    """With no idempotent tool, resume turns every claimed call into an interrupted
    error at once and the turn finishes; the late worker's ToolsDone is a CONFLICT
    and is not applied."""
    store = backend.make()
    a = worker(store, "a", now)
    a.create("conv-1", new_session())
    handed = run_until(a, "conv-1", claimed)
    taken = worker(store, "b", now).resume("conv-1", force=True)
    assert taken.status is AdvanceStatus.APPLIED
    assert isinstance(taken.action, sm.Finish)
    assert [(r.call_id, r.content, r.is_error) for r in taken.action.tool_results] == [
        ("t1-s", INTERRUPTED, True),
        ("t1-w", INTERRUPTED, True),
    ]
    assert taken.session.crash_counts == {}
    late = a.advance(
        "conv-1",
        sm.ToolsDone([sm.ToolOutcome(c.id, True, "ran") for c in handed.action.calls]),
        expected_version=handed.version,
    )
    assert late.status is AdvanceStatus.CONFLICT
    assert late.action == taken.action


@pytest.mark.requirement("ER-75")
def test_resume_with_nothing_in_flight_changes_nothing(backend: Backend, now: Clock) -> None:
    """A session waiting on a model call (or on nothing) is not taken over: resume
    returns the pending action to repeat, UNCHANGED, at the same version."""
    store = backend.make()
    a = worker(store, "a", now)
    a.create("conv-1", new_session())
    assert a.resume("conv-1").action is None
    calling = run_until(a, "conv-1", lambda r: isinstance(r.action, sm.CallModel))
    resumed = worker(store, "b", now).resume("conv-1", force=True)
    assert resumed.status is AdvanceStatus.UNCHANGED
    assert resumed.version == calling.version
    assert resumed.action == calling.action


@pytest.mark.requirement("ER-75")
def test_a_resumer_that_dies_too_is_resumed_again(backend: Backend, now: Clock) -> None:
    """B re-runs the idempotent search and dies as well; C's resume hands the search
    out again and keeps the write's interrupted outcome from B's takeover."""
    store = backend.make()
    a = worker(store, "a", now)
    a.create("conv-1", new_session())
    run_until(a, "conv-1", claimed)
    worker(store, "b", now, idempotent={"search"}).resume("conv-1", force=True)
    now.now += 10_000
    c = worker(store, "c", now, idempotent={"search"})
    taken = c.resume("conv-1")
    assert [call.id for call in taken.action.calls] == ["t1-s"]
    assert taken.interrupted == ()
    done = c.advance(
        "conv-1", sm.ToolsDone([sm.ToolOutcome("t1-s", True, "x")]), expected_version=taken.version
    )
    assert [r.content for r in done.action.tool_results] == ["x", INTERRUPTED]


def test_idle_time_in_the_store_counts_toward_the_wall_clock(backend: Backend, now: Clock) -> None:
    """Time a session spends stored between workers counts as elapsed, as it would in
    one process; with count_idle=False it does not."""
    store = backend.make()
    w = worker(store, "a", now)
    w.create("conv-1", new_session())
    now.now += 42
    assert w.load("conv-1").session.elapsed_s == pytest.approx(42)
    assert worker(store, "b", now, count_idle=False).load("conv-1").session.elapsed_s == 0


# -- bad and hostile input --------------------------------------------------------------------


def _record(session_id: str = "conv-1", **changes: Any) -> dict[str, Any]:
    snapshot = new_session().snapshot()
    record: dict[str, Any] = {
        "format": "statemachine.store.record",
        "version": 1,
        "session_id": session_id,
        "saved_at": 10_000.0,
        "keys": [],
        "claim": None,
        "carried": [],
        "snapshot": snapshot,
    }
    for key, value in changes.items():
        if key.startswith("snapshot_"):
            snapshot[key.removeprefix("snapshot_")] = value
        else:
            record[key] = value
    return record


def _bytes(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode()


CORRUPTIONS = {
    "garbage": (b"\xff\xfe not json", "not valid JSON"),
    "truncated": (_bytes(_record())[:150], "not valid JSON"),
    "not an object": (b"[1, 2, 3]", "not a JSON object"),
    "NaN": (_bytes(_record()).replace(b'"saved_at": 10000.0', b'"saved_at": NaN'), "NaN"),
    "deeply nested": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "foreign format": (_bytes(_record(format="other.app")), "format: 'other.app'"),
    "foreign record version": (_bytes(_record(version=99)), "version: 99 is not supported"),
    "foreign snapshot version": (
        _bytes(_record(snapshot_version=99)),
        r"snapshot\.version: 99 is not supported",
    ),
    "snapshot key missing": (
        _bytes(_record(snapshot_retries="many")),
        r"snapshot\.retries: must be int",
    ),
    "another session's record": (_bytes(_record("conv-2")), "holds session 'conv-2'"),
    "bad claim": (_bytes(_record(claim={"owner": 1})), "claim: must be"),
    "bad carried": (_bytes(_record(carried=[{"$type": "Nope"}])), "carried"),
    "oversized": (b" " * 5000 + _bytes(_record()), "over the store's max_bytes"),
}


@pytest.mark.requirement("ER-77")
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupt_record_is_a_clear_error_and_left_untouched(
    backend: Backend, now: Clock, corruption: str
) -> None:
    """Corrupt, truncated, foreign-version or oversized data raises CorruptSession
    naming the session and what was wrong, for load, advance and resume alike, and
    the stored bytes and version are exactly as they were."""
    payload, reason = CORRUPTIONS[corruption]
    store = backend.make(max_bytes=4096 if corruption == "oversized" else 1_000_000)
    backend.put_raw(store, "conv-1", 7, payload)
    w = worker(store, "a", now)
    for attempt in (
        lambda: w.load("conv-1"),
        lambda: w.advance("conv-1", None, expected_version=7),
        lambda: w.resume("conv-1", force=True),
    ):
        with pytest.raises(CorruptSession, match=rf"session 'conv-1'.*{reason}") as exc:
            attempt()
        assert exc.value.session_id == "conv-1"
        assert isinstance(exc.value, sm.SnapshotError)
    assert backend.raw(store, "conv-1") == (7, payload)


@pytest.mark.requirement("ER-77")
def test_an_oversized_write_is_refused(backend: Backend, now: Clock) -> None:
    """A record over max_bytes is not written: RecordTooLarge names the session and
    the sizes, and the stored version stays."""
    store = backend.make(max_bytes=4096)
    w = worker(store, "a", now)
    w.create("conv-1", new_session())
    w.advance("conv-1", None, expected_version=1)
    with pytest.raises(RecordTooLarge, match=r"'conv-1'.* bytes, over the store's max_bytes"):
        w.advance("conv-1", sm.Assembled("x" * 5000, 10), expected_version=2)
    assert w.load("conv-1").version == 2
    with pytest.raises(ValueError, match="max_bytes: must be an int >= 256"):
        backend.make(max_bytes=10)


BAD_IDS = ["", "a:b", "x" * 129, "../etc", "a*", "tenant-b:session:x", "a b", "é", "a\n", 7]


@pytest.mark.requirement("ER-78")
@pytest.mark.parametrize("bad", BAD_IDS)
def test_invalid_session_ids_are_refused(backend: Backend, now: Clock, bad: Any) -> None:
    """Ids outside [A-Za-z0-9._-]{1,128} are refused before any key is touched."""
    store = backend.make()
    w = worker(store, "a", now)
    with pytest.raises(InvalidSessionId, match=r"session id .* is invalid"):
        w.create(bad, new_session())
    with pytest.raises(InvalidSessionId):
        store.load(bad)
    with pytest.raises(InvalidSessionId):
        w.advance(bad, None, expected_version=1)


@pytest.mark.requirement("ER-78")
def test_tenants_cannot_reach_each_other(backend: Backend, now: Clock) -> None:
    """Two tenants on one backend may use the same session id: each sees only its
    own record, and neither a bad tenant name nor an id can escape the namespace."""
    alpha = worker(backend.make(tenant="alpha"), "a", now)
    beta = worker(backend.make(tenant="beta"), "b", now)
    alpha.create("conv-1", new_session(max_turns=3))
    with pytest.raises(SessionNotFound):
        beta.load("conv-1")
    beta.create("conv-1", new_session(max_turns=4))
    assert alpha.load("conv-1").session.settings.max_turns == 3
    assert beta.load("conv-1").session.settings.max_turns == 4
    key = alpha.store.key("conv-1")  # Redis braces the id: its hash tag
    assert key.endswith(
        ":alpha:session:{conv-1}" if backend.kind == "redis" else ":alpha:session:conv-1"
    )
    with pytest.raises(InvalidSessionId, match="tenant 'al:pha' is invalid"):
        backend.make(tenant="al:pha")
    with pytest.raises(InvalidSessionId):
        beta.load("alpha:session:conv-1")


# -- stateful: many workers with stale views against a one-session reference ------------------


class StaleWorkers(RuleBasedStateMachine):
    """Three workers on one InMemoryStore, each acting on its own (often stale) view,
    one of them now and then "dying" with tool calls handed out and another resuming.
    A reference session gets exactly the events the store reports APPLIED: the stored
    snapshot must always equal it, so no event is lost or applied twice."""

    def __init__(self) -> None:
        super().__init__()
        now = Clock(10_000.0)
        store = InMemoryStore(clock=now)
        self.workers = [worker(store, f"w{i}", now, count_idle=False) for i in range(3)]
        self.reference = new_session()
        self.workers[0].create("conv", new_session())
        self.views = [w.load("conv") for w in self.workers]

    @rule(i=st.integers(0, 2))
    def act(self, i: int) -> None:
        """Worker i sends the event its view asks for, at its view's version."""
        view = self.views[i]
        event = next_event(view, turns=10**6)
        result = self.workers[i].advance("conv", event, expected_version=view.version)
        if result.status is AdvanceStatus.APPLIED:
            ref = self.reference
            expected = ref.new_turn().start() if event is None else ref.current_turn.send(event)
            assert result.action == expected
            assert result.version == view.version + 1
        else:
            assert result.status is AdvanceStatus.CONFLICT
            assert view.version < result.version
        self.views[i] = result

    @rule(i=st.integers(0, 2))
    def refresh(self, i: int) -> None:
        """Worker i reads the current state."""
        self.views[i] = self.workers[i].load("conv")

    @rule(i=st.integers(0, 2))
    def resume(self, i: int) -> None:
        """Worker i takes over, as if the claim's owner had died."""
        result = self.workers[i].resume("conv", force=True)
        if result.status is AdvanceStatus.APPLIED:
            turn = self.reference.current_turn
            assert turn is not None
            assert result.action == turn.send(sm.ToolsDone(result.interrupted))
            assert all(o.content == INTERRUPTED for o in result.interrupted)
        else:
            assert result.status is AdvanceStatus.UNCHANGED
        self.views[i] = result

    @invariant()
    def store_matches_reference(self) -> None:
        """The stored session is the reference session."""
        stored = self.workers[0].load("conv").session
        assert stored.snapshot() == self.reference.snapshot()


TestStaleWorkers = StaleWorkers.TestCase
TestStaleWorkers.settings = hypothesis_settings(max_examples=40, stateful_step_count=40)


def test_worker_options_are_checked() -> None:
    """A bad lease, owner or idempotent list is refused with a ConfigError naming the
    option."""
    store = InMemoryStore()
    with pytest.raises(sm.ConfigError, match="lease_s: must be a finite number > 0"):
        Worker(store, lease_s=float("inf"))
    with pytest.raises(ValueError, match="owner: must be a non-empty str"):
        Worker(store, owner="")
    with pytest.raises(ValueError, match="idempotent: a collection of tool names"):
        Worker(store, idempotent="search")
    with pytest.raises(ValueError, match="ended_ttl_s: must be a number > 0"):
        InMemoryStore(ended_ttl_s=0)
    assert Worker(store, idempotent=lambda call: call.name == "x").owner


@pytest.mark.requirement("ER-75")
def test_a_stored_request_with_a_lone_surrogate_is_corrupt_at_load() -> None:
    """A record whose request holds "\\ud800" (valid JSON, not valid Unicode) is refused at
    load with CorruptSession naming the key, and left untouched; such a request is
    refused at the door when an event carries it."""
    store = InMemoryStore()
    w = Worker(store, clock=lambda: 0.0, now=lambda: 1.0)
    created = w.create("s", sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0))
    started = w.advance("s", None, expected_version=created.version)
    w.advance("s", sm.Assembled({"m": "x"}, 1), expected_version=started.version)
    key = store.key("s")
    version, payload, expires, incarnation = store._data[key]
    forged = payload.replace(b'{"m":"x"}', b'{"m":"\\ud800"}')
    assert forged != payload
    store._data[key] = (version, forged, expires, incarnation)
    with pytest.raises(CorruptSession, match=r"request: .*lone surrogate"):
        Worker(store).load("s")
    assert store._data[key][1] == forged
    with pytest.raises(ValueError, match="lone surrogate"):
        sm.Assembled({"m": "\ud800"}, 1)


# -- the worker's remembered records --------------------------------------------------------


@pytest.mark.requirement("ER-70")
def test_a_session_created_again_under_its_id_is_never_overwritten_from_memory(
    backend: Backend, now: Clock
) -> None:
    """A worker remembers the record it wrote; another worker deletes the session and
    creates a new one under the same id up to the same version. The first worker's next
    advance at that version is refused (another incarnation) and answered from the store:
    the new session is left as it was."""
    store = backend.make()
    w1, w2 = worker(store, "a", now), worker(store, "b", now)
    w1.create("same", new_session())
    w1.advance("same", None, expected_version=1)
    w2.delete("same")
    other = sm.Session(settings(), seed=99, clock=lambda: 0.0)
    w2.create("same", other)
    w2.advance("same", None, expected_version=1)
    result = w1.advance("same", sm.Assembled("x", 1), expected_version=2)
    assert result.status is AdvanceStatus.CONFLICT
    assert w2.load("same").session.seed == 99
    assert w2.load("same").version == 2


@pytest.mark.requirement("ER-70")
def test_remembered_and_read_sessions_answer_alike(backend: Backend, now: Clock) -> None:
    """The same advances through a worker that remembers and one that does not
    (``remember=0``) give the same actions, versions and stored records."""
    results = []
    for remember in (1024, 0):
        store = backend.make(prefix=f"r{remember}")
        w = worker(store, "a", now, remember=remember)
        r = w.create("s", new_session())
        r = w.advance("s", None, expected_version=r.version)
        events = [sm.Assembled({"m": ["hi"]}, 10), fail("rate_limited"), sm.WaitDone()]
        events += [sm.ModelReplied(reply={"text": "ok"})]
        actions = []
        for event in events:
            r = w.advance("s", event, expected_version=r.version)
            actions.append(r.action)
        stored = store.load("s").record
        results.append((actions, r.version, stored["snapshot"], stored["keys"]))
    assert results[0] == results[1]
    with pytest.raises(sm.ConfigError, match=r"^remember"):
        worker(backend.make(), "a", now, remember=-1)


@pytest.mark.requirement("ER-70")
def test_observers_see_only_stored_transitions(backend: Backend, now: Clock) -> None:
    """An advance computed from a remembered state that another worker has moved past is
    a CONFLICT, and its observers saw nothing of it; an applied one is seen once."""
    seen: list[sm.TraceRecord] = []
    store = backend.make()
    w1 = worker(store, "a", now, observers=[seen.append])
    w2 = worker(store, "b", now)
    w1.create("o", new_session())
    w1.advance("o", None, expected_version=1)
    before = len(seen)
    w2.advance("o", sm.Cancelled(), expected_version=2)
    result = w1.advance("o", sm.Assembled("r", 1), expected_version=2)
    assert result.status is AdvanceStatus.CONFLICT
    assert len(seen) == before
    fresh = w1.advance("o", None, expected_version=result.version)
    assert fresh.applied and len(seen) == before + 1


# -- spend across the session tree (ER-82) ---------------------------------------------


@pytest.mark.requirement("ER-82")
def test_a_childs_spend_reaches_its_parents_record_across_workers(
    backend: Backend, now: Clock
) -> None:
    """A child advanced by one worker charges its parent's record (compare-and-set); a
    report a worker never made is pulled when the parent's next turn starts; nothing
    is counted twice."""
    store = backend.make()
    a, b = worker(store, "a", now), worker(store, "b", now)
    parent = sm.Session(sm.Settings(max_cost_usd=1.0), seed=1, clock=lambda: 0.0, session_id="p")
    child = parent.spawn(session_id="p.kid")
    a.create("p", parent)
    b.create("p.kid", child)
    result = b.advance("p.kid", None, expected_version=1)
    result = b.advance("p.kid", sm.Assembled("req", 10), expected_version=result.version)
    result = b.advance("p.kid", sm.ModelReplied(cost=0.4), expected_version=result.version)
    assert result.applied and result.session.cost_usd == 0.4
    assert a.load("p").session.cost_usd == pytest.approx(0.4)
    assert a.load("p").session.child_costs == {"p.kid": pytest.approx(0.4)}

    silent = worker(store, "c", now)
    silent._report_spend = lambda *_report: None  # type: ignore[method-assign]  # it dies
    result = silent.advance("p.kid", None, expected_version=result.version)
    result = silent.advance("p.kid", sm.Assembled("req", 10), expected_version=result.version)
    silent.advance("p.kid", sm.ModelReplied(cost=0.7), expected_version=result.version)
    loaded = a.load("p")
    assert loaded.session.cost_usd == pytest.approx(0.4)  # the report was lost...
    started = a.advance("p", None, expected_version=loaded.version)
    assert started.session.cost_usd == pytest.approx(1.1)  # ...and pulled at the turn start
    assert started.session.current_turn is not None
    assert started.session.current_turn.final_answer  # the tree's spend fired the budget
    again = b.load("p.kid").session
    b._report_spend(again.parent_id, again.session_id, again.cost_usd)
    assert a.load("p").session.cost_usd == pytest.approx(1.1)  # a repeat counts nothing


@pytest.mark.requirement("ER-82", "ER-245")
def test_a_childs_cancelled_call_that_was_billed_reaches_its_parent(
    backend: Backend, now: Clock
) -> None:
    """A child's turn cancelled while its model call was in flight, with the cost the
    vendor reported: the journal keeps the cost and usage (a fresh worker reads the
    same spend back) and the parent's record is charged, as for a reply."""
    store = backend.make()
    a, b = worker(store, "a", now), worker(store, "b", now)
    parent = sm.Session(sm.Settings(max_cost_usd=1.0), seed=1, clock=lambda: 0.0, session_id="p")
    child = parent.spawn(session_id="p.kid")
    a.create("p", parent)
    b.create("p.kid", child)
    result = b.advance("p.kid", None, expected_version=1)
    result = b.advance("p.kid", sm.Assembled("req", 10), expected_version=result.version)
    cancel = sm.Cancelled("user left", cost=0.4, usage=sm.Usage(output_tokens=12))
    result = b.advance("p.kid", cancel, expected_version=result.version)
    assert result.applied and result.session.cost_usd == 0.4
    loaded = worker(store, "c", now).load("p.kid").session
    assert loaded.cost_usd == 0.4
    assert loaded.current_turn is not None
    assert loaded.current_turn.status is sm.TurnStatus.CANCELLED
    assert loaded.current_turn.trace[-1].usage == sm.Usage(output_tokens=12, cost_usd=0.4)
    assert a.load("p").session.child_costs == {"p.kid": pytest.approx(0.4)}


@pytest.mark.requirement("ER-82")
@pytest.mark.requirement("ER-93")
def test_spend_reports_and_store_idle_time_keep_the_wall_clock_honest(
    backend: Backend, now: Clock
) -> None:
    """A child's reports do not add the parent's idle time twice; with
    wall_clock_counts_idle = false a session read back from the store leaves its time
    between turns out, as the worker that cached it does; a tree's store ids are its
    session ids."""
    store = backend.make()
    mono = Clock(0.0)
    w = Worker(store, owner="a", clock=mono, now=now, remember=0)
    root = sm.Session(sm.Settings(max_wall_clock_s=500), clock=mono, session_id="r")
    child = root.spawn()
    w.create("r", root)
    w.create(child.session_id or "", child)
    result = w.advance("r.1", None, expected_version=1)
    for _ in range(3):
        now.now += 100
        mono.now += 100
        result = w.advance("r.1", sm.Assembled("req", 1), expected_version=result.version)
        result = w.advance("r.1", sm.ModelReplied(cost=0.1), expected_version=result.version)
        result = w.advance("r.1", None, expected_version=result.version)
    assert w.load("r").session.elapsed_s == pytest.approx(300)

    settings = sm.Settings(max_wall_clock_s=50, wall_clock_counts_idle=False)
    for remember in (1024, 0):
        sid = f"s{remember}"
        w = Worker(backend.make(), owner="b", clock=mono, now=now, remember=remember)
        w.create(sid, sm.Session(settings, clock=mono, session_id=sid))
        result = w.advance(sid, None, expected_version=1)
        result = w.advance(sid, sm.Assembled("req", 1), expected_version=result.version)
        result = w.advance(sid, sm.ModelReplied(), expected_version=result.version)
        now.now += 1000
        mono.now += 1000
        result = w.advance(sid, None, expected_version=result.version)
        assert result.session.limit_reached is None, remember
        assert result.session.idle_s == pytest.approx(1000), remember

    with pytest.raises(sm.ConfigError, match=r"^session_id"):
        worker(backend.make(), "c", now).create("conv", sm.Session(session_id="other"))
    unnamed = sm.Session()
    unnamed.spawn()
    with pytest.raises(sm.ConfigError, match=r"^session_id"):
        worker(backend.make(), "c", now).create("conv", unnamed)


@pytest.mark.requirement("ER-87")
def test_a_worker_passes_its_second_tier_doom_check_to_every_session(
    backend: Backend, now: Clock
) -> None:
    """The hook is a host function: the worker hands it to each session it restores."""
    seen: list[int] = []

    def judge(calls: tuple[sm.ToolCall, ...]) -> bool:
        seen.append(len(calls))
        return True

    for remember in (1024, 0):
        w = worker(backend.make(), "a", now, doom_check=judge, remember=remember)
        sid = f"doom{remember}"
        w.create(sid, new_session(doom_check_window=2))
        result = w.advance(sid, None, expected_version=1)
        result = w.advance(sid, sm.Assembled("req", 1), expected_version=result.version)
        calls = (sm.ToolCall("a", "fs", "ls", {"d": 1}), sm.ToolCall("b", "fs", "ls", {"d": 2}))
        result = w.advance(sid, sm.ModelReplied(calls), expected_version=result.version)
        assert result.session.limit_reached is sm.SessionStatus.ERROR_DOOM_LOOP, remember
    assert seen == [2, 2]
    with pytest.raises(sm.ConfigError, match=r"^doom_check"):
        worker(backend.make(), "a", now, doom_check="yes")


@pytest.mark.requirement("ER-81")
def test_a_child_in_the_store_sees_its_siblings_spend_at_its_next_turn(
    backend: Backend, now: Clock
) -> None:
    """Siblings advanced by other workers spend the parent's budget; a child's next turn
    reads the parent's remaining budget from its record and takes the limit-reached
    path when nothing is left."""
    store = backend.make()
    w = worker(store, "a", now)
    root = sm.Session(sm.Settings(max_cost_usd=1.0), seed=1, clock=lambda: 0.0, session_id="t")
    first, second = root.spawn(), root.spawn()
    for s in (root, first, second):
        w.create(s.session_id or "", s)
    result = w.advance("t.2", None, expected_version=1)
    result = w.advance("t.2", sm.Assembled("req", 1), expected_version=result.version)
    w.advance("t.2", sm.ModelReplied(cost=1.0), expected_version=result.version)
    assert w.load("t").session.cost_usd == pytest.approx(1.0)
    started = worker(store, "b", now).advance("t.1", None, expected_version=1)
    assert started.session.remaining_budget_usd == pytest.approx(0.0)
    assert started.session.current_turn is not None
    assert started.session.current_turn.final_answer
    assert started.session.limit_reached is sm.SessionStatus.ERROR_MAX_BUDGET_USD


# -- the bytes a worker writes ---------------------------------------------------------------


class _ProxyStore:
    """Another store (not one of ours): the worker hands it records as JSON data."""

    def __init__(self, inner: InMemoryStore) -> None:
        self.inner = inner

    def load(self, session_id: str) -> Stored:
        return self.inner.load(session_id)

    def compare_and_set(
        self, session_id: str, expected_version: int, record: Any, *, ended: bool = False
    ) -> int:
        return self.inner.compare_and_set(session_id, expected_version, record, ended=ended)

    def delete(self, session_id: str) -> bool:
        return self.inner.delete(session_id)


def _payload(store: InMemoryStore, session_id: str) -> bytes:
    return store._data[store.key(session_id)][1]


def _fresh(store: Any, session_id: str, clock: Any = lambda: 0.0, wall: Any = lambda: 1.0) -> Any:
    """The session as a worker that has never seen it reads it from ``store`` (the
    record's snapshot restored, its journal replayed)."""
    reader = Worker(store, owner="fresh", clock=clock, now=wall, remember=0, count_idle=False)
    return reader.load(session_id).session


@pytest.mark.requirement("ER-70")
@pytest.mark.parametrize("remember", [1024, 0])
def test_the_bytes_a_worker_builds_hold_the_session_it_holds(
    remember: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker writes our stores the record's bytes built from what changed since its
    last write (journal entries appended, the snapshot written anew every
    ``COMPACT_EVERY`` entries); a worker that has never seen the session reads from them
    the session the writer holds, and the same as from a store that takes JSON data (a
    whole snapshot on every write), on every write of several turns with retries, tool
    claims, idempotency keys, a takeover (claim and carried outcomes) and a moving clock."""
    monkeypatch.setattr(store_held, "COMPACT_EVERY", 5)  # several compactions
    fast_store, slow_inner = InMemoryStore(), InMemoryStore()
    clocks = {"fast": Clock(5.0), "slow": Clock(5.0)}
    walls = {"fast": Clock(10_000.0), "slow": Clock(10_000.0)}
    workers = {
        "fast": Worker(
            fast_store,
            owner="w",
            clock=clocks["fast"],
            now=walls["fast"],
            idempotent={"search"},
            remember=remember,
        ),
        "slow": Worker(
            _ProxyStore(slow_inner),
            owner="w",
            clock=clocks["slow"],
            now=walls["slow"],
            idempotent={"search"},
            remember=remember,
        ),
    }
    assert workers["fast"]._held.payload_cas is not None
    assert workers["slow"]._held.payload_cas is None
    results = {
        name: w.create("s", sm.Session(settings(), seed=3, clock=clocks[name]))
        for name, w in workers.items()
    }
    incarnations = {
        name: json.loads(_payload(store, "s"))["incarnation"]
        for name, store in (("fast", fast_store), ("slow", slow_inner))
    }
    writes = 0
    seen: set[str] = set()
    journals: set[int] = set()
    for step in range(200):
        event = next_event(results["fast"], turns=3, failures=2)
        if event is STOP:
            break
        for name, w in workers.items():
            clocks[name].now += 0.125
            walls[name].now += 0.5
            if isinstance(event, sm.ToolsDone) and step % 2:
                walls[name].now += 1000.0  # the claim's lease runs out: take it over
                results[name] = w.resume("s", force=True)
            else:
                results[name] = w.advance(
                    "s", event, expected_version=results[name].version, key=f"k{step}"
                )
        fast = _fresh(fast_store, "s", clocks["fast"], walls["fast"]).snapshot()
        slow = _fresh(slow_inner, "s", clocks["slow"], walls["slow"]).snapshot()
        assert fast == slow == results["fast"].session.snapshot(), f"step {step}"
        assert results["slow"].session.snapshot() == fast
        writes += 1
        written = json.loads(_payload(fast_store, "s"))
        assert json.loads(_payload(slow_inner, "s"))["journal"] == []
        assert written["incarnation"] == incarnations["fast"]
        seen |= {key for key in ("claim", "carried") if written[key]}
        journals.add(len(written["journal"]))
    assert writes > 20
    assert seen == {"claim", "carried"}
    assert results["fast"].session.turns == 3
    assert journals == set(range(5 + 1))  # every length, and compacted after the last
    record = json.loads(_payload(fast_store, "s"))
    assert record["keys"] and record["snapshot"]["turn"]


@pytest.mark.requirement("ER-70")
def test_changing_the_returned_session_does_not_change_what_the_worker_writes() -> None:
    """The session a worker returns is the caller's: sending it an event by hand moves
    neither the store nor the worker's memory of the record."""
    store = InMemoryStore()
    w = Worker(store, owner="w", clock=lambda: 0.0, now=lambda: 1.0)
    created = w.create("s", sm.Session(settings(), seed=3, clock=lambda: 0.0))
    started = w.advance("s", None, expected_version=created.version)
    turn = started.session.current_turn
    assert turn is not None
    turn.send(sm.Assembled({"by": "hand"}, 5))  # the caller's own copy moves on
    after = w.advance("s", sm.Assembled({"by": "worker"}, 7), expected_version=started.version)
    assert after.status is AdvanceStatus.APPLIED
    stored = _fresh(store, "s").snapshot()["turn"]
    assert stored["request"] == {"by": "worker"}
    assert stored["size"] == 7


@pytest.mark.requirement("ER-70")
def test_a_worker_knows_its_own_bytes_again_and_checks_any_others(
    backend: Backend, now: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading back the very bytes it wrote, a worker uses the state it knows instead of
    decoding and checking them again; bytes that grow what it knows by journal entries
    (another worker's advances) cost it only those entries, replayed; any other bytes
    (a worker that never saw the session, a record changed under it) are decoded and
    checked in full."""
    store = backend.make()
    w = worker(store, "w", now)
    created = w.create("s", new_session())
    w.advance("s", None, expected_version=created.version)
    restores: list[str] = []
    replayed: list[int] = []
    real_read, real_replay = store_held.read_session, store_held.replay_record

    def counted_read(record: Record, *args: Any) -> Any:
        restores.append(record.session_id)
        return real_read(record, *args)

    def counted_replay(session: Any, record: Record, entries: Any, *args: Any) -> None:
        replayed.append(len(entries))
        real_replay(session, record, entries, *args)

    monkeypatch.setattr(store_held, "read_session", counted_read)
    monkeypatch.setattr(store_held, "replay_record", counted_replay)
    loaded = w.load("s")
    assert restores == [] and replayed == []
    assert loaded.session.snapshot() == _fresh(store, "s", wall=now).snapshot()
    restores.clear()
    replayed.clear()
    other = worker(store, "other", now)
    moved = other.advance("s", sm.Assembled({"q": 1}, 10), expected_version=loaded.version)
    assert restores == ["s"]  # the other worker had never seen these bytes
    again = w.load("s")
    assert restores == ["s"]  # w knows all but the entry the other worker appended
    assert replayed[-1] == 1
    assert again.version == moved.version
    assert again.session.snapshot() == moved.session.snapshot()
    version, payload = store.load_payload("s")
    data = json.loads(payload)
    data["saved_at"] += 1.0  # the same journal, a changed tail: only the tail is read
    store.compare_and_set("s", version, data)
    assert w.load("s").session.snapshot() == moved.session.snapshot()
    assert restores == ["s"]
    version, payload = store.load_payload("s")
    data = json.loads(payload)
    store.compare_and_set("s", version, dict(reversed(data.items())))  # other bytes
    assert w.load("s").session.snapshot() == moved.session.snapshot()
    assert restores == ["s", "s"]


class _Float(float):
    """A float subclass with its own repr, like numpy's ``float64``."""

    def __repr__(self) -> str:
        return f"_Float({float(self)!r})"


@pytest.mark.requirement("ER-70")
def test_the_bytes_hold_plain_json_numbers_for_a_float_subclass_cost() -> None:
    """A cost given as a float subclass (numpy's ``float64``) is written as JSON writes
    the number, never by the subclass's repr: another worker reads the record."""
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    r = w.create("s", sm.Session(settings(), seed=1, clock=lambda: 0.0))
    r = w.advance("s", None, expected_version=r.version)
    r = w.advance("s", sm.Assembled({"q": 1}, 5), expected_version=r.version)
    r = w.advance("s", sm.ModelReplied(cost=_Float(0.25)), expected_version=r.version)
    payload = _payload(store, "s")
    assert b"_Float" not in payload
    assert json.loads(payload)["journal"][-1][3]["cost"] == 0.25
    other = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0).load("s")
    assert other.session.cost_usd == 0.25


@pytest.mark.requirement("ER-70")
def test_host_data_changed_in_place_after_an_advance_is_stored_as_the_session_holds_it() -> None:
    """A host that changes a request the engine handed out (``action.request``) in
    place changes its own session's copy; the record holds the request as the event
    carried it, and every write, compactions included, stays readable by another
    worker (the turn's request and its last CallModel's are the same data)."""
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    r = w.create(
        "s",
        sm.Session(
            sm.Settings(max_retries=20, session_retry_ceiling=100), seed=1, clock=lambda: 0.0
        ),
    )
    r = w.advance("s", None, expected_version=r.version)
    r = w.advance("s", sm.Assembled({"messages": ["hi"]}, 5), expected_version=r.version)
    assert isinstance(r.action, sm.CallModel)
    r.action.request["messages"].append("changed")
    r = w.advance("s", fail("rate_limited"), expected_version=r.version)
    turn = _fresh(store, "s").snapshot()["turn"]
    assert turn["request"] == turn["actions"][1]["request"] == {"messages": ["hi"]}
    for _ in range(COMPACT_EVERY):
        event = sm.WaitDone() if isinstance(r.action, sm.Wait) else fail("rate_limited")
        r = w.advance("s", event, expected_version=r.version)
        turn = _fresh(store, "s").snapshot()["turn"]
        calls = [a for a in turn["actions"] if a["$type"] == "CallModel"]
        assert turn["request"] == calls[-1]["request"]


@pytest.mark.requirement("ER-70")
def test_the_record_encoder_keeps_nothing_between_calls() -> None:
    """After a value fails to encode (a NaN), the same containers, fixed, encode: the
    encoder holds no state between calls."""
    from statemachine.core._state_text import json_text

    value: list[Any] = [1.0, {"x": float("nan")}]
    with pytest.raises(ValueError, match="Out of range float"):
        json_text(value)
    value[1]["x"] = 0.0
    assert json_text(value) == '[1.0,{"x":0.0}]'


@pytest.mark.requirement("ER-70")
def test_each_turns_trace_is_written_from_its_own_entries() -> None:
    """Short turns one after another (a turn's number can equal the entries the last
    one left): every write's snapshot is what the session's own ``snapshot()`` says."""
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    r = w.create("s", sm.Session(settings(), seed=1, clock=lambda: 0.0))
    for turn in range(1, 6):
        r = w.advance("s", None, expected_version=r.version)
        for event in (sm.Assembled({"turn": turn}, 5), sm.ModelReplied(cost=0.001)):
            r = w.advance("s", event, expected_version=r.version)
            assert _fresh(store, "s").snapshot() == r.session.snapshot(), turn


@pytest.mark.requirement("ER-70", "ER-82")
def test_fallbacks_and_child_spend_reports_are_written_as_the_sessions_hold_them() -> None:
    """Through a fallback, and through the reports a child's spend makes to its
    parent's record, every stored snapshot is what the session restored from it would
    snapshot (the bytes built from what changed hold the whole state)."""
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    base = sm.Settings(fallback_models=("b", "c"), max_retries=0, session_retry_ceiling=100)
    parent = sm.Session(base, seed=1, clock=lambda: 0.0, session_id="p")
    child = parent.spawn()
    assert child.session_id is not None
    rp = w.create("p", parent)
    rc = w.create(child.session_id, child)

    def stored_is_whole(session_id: str) -> None:
        snapshot = _fresh(store, session_id).snapshot()
        assert sm.Session.restore(snapshot, clock=lambda: 0.0).snapshot() == snapshot
        assert w.load(session_id).session.snapshot() == snapshot

    for turn in range(2):
        for sid in ("p", child.session_id):
            r = w.advance(sid, None, expected_version=(rp if sid == "p" else rc).version)
            for event in (
                sm.Assembled({"turn": turn}, 5),
                fail("overloaded"),  # no retries: straight to the fallback
                sm.ModelReplied(cost=0.01),
            ):
                r = w.advance(sid, event, expected_version=r.version)
                stored_is_whole(sid)
                stored_is_whole("p")
            rp, rc = (r, rc) if sid == "p" else (w.load("p"), r)
    parent_record = _fresh(store, "p").snapshot()
    assert parent_record["child_costs"] == {child.session_id: pytest.approx(0.02)}
    assert parent_record["turn"]["fallbacks"]
