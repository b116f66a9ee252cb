"""The Redis store against a real ``redis-server``: worker processes racing, a worker
SIGKILLed mid-turn, server restarts with and without persistence, and what only a
server can hold (keys of the wrong type, the key layout). Skipped locally without
``redis-server``; a failure when ``CI`` is set.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import statemachine as sm
from statemachine.store import (
    INTERRUPTED,
    AdvanceStatus,
    CorruptSession,
    InvalidSessionId,
    RedisStore,
    SessionNotFound,
    StoreUnavailable,
    Worker,
)

from .store_worker import Clock, RedisServer, read_line, settings, spawn
from .test_store import check_race, redis_server_or_skip

try:
    import redis
except ImportError:  # pragma: no cover - the extra is installed in CI
    if os.environ.get("CI"):
        raise
    pytest.skip("redis-py is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server (no persistence) for the process tests."""
    srv = redis_server_or_skip(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()


@pytest.fixture
def client(server: RedisServer) -> Iterator[Any]:
    """A client on an empty database."""
    c = redis.Redis(host="127.0.0.1", port=server.port)
    c.flushdb()
    yield c
    c.close()


def new_worker(client: Any, owner: str, now: Clock, **options: Any) -> Worker:
    """A worker on ``client`` with frozen session clocks."""
    return Worker(
        RedisStore(client, prefix="t"), owner=owner, clock=lambda: 0.0, now=now, **options
    )


def new_session() -> sm.Session:
    """A fresh session on a frozen clock."""
    return sm.Session(settings(), seed=3, clock=lambda: 0.0)


def finish(proc: subprocess.Popen[bytes]) -> None:
    """Let a worker process exit (killing it after 10 s), then close its pipes."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


@pytest.mark.requirement("ER-71")
def test_keys_are_namespaced_hashes_of_json(client: Any) -> None:
    """A session lives in one hash under prefix[:tenant]:session:{<id>} (the id its hash
    tag), its version a number and its record JSON holding the engine's snapshot."""
    session = new_session()
    Worker(RedisStore(client, prefix="app", tenant="acme"), owner="a").create("c-1", session)
    assert client.keys("*") == [b"app:acme:session:{c-1}"]
    stored = client.hgetall("app:acme:session:{c-1}")
    assert stored[b"version"] == b"1"
    assert json.loads(stored[b"record"])["snapshot"] == session.snapshot()
    port = client.connection_pool.connection_kwargs["port"]
    text_client = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)
    try:
        assert RedisStore(text_client, prefix="app", tenant="acme").load("c-1").version == 1
    finally:
        text_client.close()


@pytest.mark.requirement("ER-77")
def test_keys_of_the_wrong_kind_are_corrupt_and_left_alone(client: Any) -> None:
    """A key holding a string, or a hash whose version is not a number, is reported
    corrupt naming the session, for reads and writes, and is not overwritten."""
    store = RedisStore(client, prefix="t")
    client.set(store.key("s1"), b"hello")
    with pytest.raises(CorruptSession, match=r"session 's1'.*holds a string"):
        store.load("s1")
    with pytest.raises(CorruptSession, match=r"session 's1'.*not a hash; nothing was written"):
        store.compare_and_set("s1", 0, {"a": 1})
    assert client.get(store.key("s1")) == b"hello"
    client.hset(store.key("s2"), mapping={"version": "x", "record": "{}"})
    with pytest.raises(CorruptSession, match=r"session 's2'.*no valid version"):
        store.load("s2")
    with pytest.raises(CorruptSession, match=r"session 's2'.*version field x"):
        store.compare_and_set("s2", 1, {"a": 1})
    client.hset(store.key("s3"), mapping={"version": "2"})
    with pytest.raises(CorruptSession, match=r"session 's3'.*no record field"):
        store.load("s3")
    assert client.hgetall(store.key("s2")) == {b"version": b"x", b"record": b"{}"}
    client.hset(store.key("s4"), mapping={"version": "1", "record": b"\xff\xfe"})
    port = client.connection_pool.connection_kwargs["port"]
    text_client = redis.Redis(host="127.0.0.1", port=port, decode_responses=True)
    try:
        with pytest.raises(CorruptSession, match=r"session 's4'.*not UTF-8"):
            RedisStore(text_client, prefix="t").load("s4")
    finally:
        text_client.close()
    assert client.hget(store.key("s4"), "record") == b"\xff\xfe"


@pytest.mark.requirement("ER-74")
def test_two_worker_processes_race_and_each_step_has_one_winner(
    server: RedisServer, client: Any
) -> None:
    """Two worker processes start together (a Redis barrier) and drive one session
    with the same scripted host: every version is advanced by exactly one process,
    and the session's retries equal the ModelFailed events applied."""
    Worker(RedisStore(client, prefix="t"), owner="setup").create("race", new_session())
    procs = [spawn("race", server, "t", "race", owner) for owner in ("a", "b")]
    log: list[tuple[int, str, str]] = []
    try:
        for proc in procs:
            while "done" not in (line := json.loads(read_line(proc, timeout=20))):
                log.append((line["v"], line["status"], line["event"]))
    finally:
        for proc in procs:
            finish(proc)
    assert [proc.returncode for proc in procs] == [0, 0]
    check_race(log, new_worker(client, "check", Clock()).load("race"))


@pytest.mark.requirement("ER-76", "ER-75")
def test_a_sigkilled_worker_is_resumed_with_the_same_counters(
    server: RedisServer, client: Any
) -> None:
    """A worker process claims a search and a write and is SIGKILLed while "running"
    them. Another worker resumes from Redis: same retries, turns and cost; the write
    comes back to the model as an interrupted error, the idempotent search is run
    again, and the turn completes."""
    Worker(RedisStore(client, prefix="t"), owner="setup").create("kill", new_session())
    proc = spawn("claim", server, "t", "kill", "doomed")
    try:
        claimed = json.loads(read_line(proc, timeout=20))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        finish(proc)
    assert proc.returncode == -signal.SIGKILL
    assert claimed["calls"] == ["t1-s", "t1-w"]
    now = Clock(1000.0)  # the dead worker's clock: its lease still holds
    heir = new_worker(client, "heir", now, idempotent={"search"})
    assert heir.resume("kill").status is AdvanceStatus.BUSY
    now.now += 301  # past the dead worker's 300 s lease
    taken = heir.resume("kill")
    assert taken.status is AdvanceStatus.APPLIED
    session = taken.session
    assert (session.retries_used, session.turns, session.cost_usd) == (
        claimed["retries"],
        claimed["turns"],
        claimed["cost"],
    )
    assert session.retries_used == 2
    assert [c.id for c in taken.action.calls] == ["t1-s"]
    done = heir.advance(
        "kill", sm.ToolsDone([sm.ToolOutcome("t1-s", True, "hits")]), expected_version=taken.version
    )
    assert done.applied
    assert [(r.call_id, r.content, r.is_error, r.category) for r in done.action.tool_results] == [
        ("t1-s", "hits", False, None),
        ("t1-w", INTERRUPTED, True, sm.ToolErrorCategory.CANCELLED),
    ]
    assert done.session.retries_used == 2


def _drive(worker: Worker, session_id: str, steps: int, version: int) -> Any:
    result = worker.load(session_id)
    assert result.version == version
    events = iter(
        [
            None,
            sm.Assembled("req", 10),
            sm.ModelFailed(sm.ModelError("rate_limited")),
            sm.WaitDone(),
            sm.ModelFailed(sm.ModelError("overloaded")),
            sm.WaitDone(),
        ][version - 1 : version - 1 + steps]
    )
    for event in events:
        result = worker.advance(session_id, event, expected_version=result.version)
        assert result.applied
    return result


@pytest.mark.requirement("ER-79")
def test_state_survives_a_restart_with_persistence(tmp_path: Path) -> None:
    """With append-only persistence, a Redis restart between two steps loses nothing:
    the next worker continues at the same version with the same counters."""
    srv = redis_server_or_skip(tmp_path, persistent=True)
    c = redis.Redis(host="127.0.0.1", port=srv.port)
    try:
        w = new_worker(c, "a", Clock())
        w.create("durable", new_session())
        before = _drive(w, "durable", 3, 1)
        srv.restart()
        after = w.load("durable")
        assert after.version == before.version == 4
        assert after.session.snapshot() == before.session.snapshot()
        result = _drive(w, "durable", 3, 4)
        assert result.session.retries_used == 2
    finally:
        c.close()
        srv.stop()


@pytest.mark.requirement("ER-79")
def test_a_restart_without_persistence_is_a_clear_error(tmp_path: Path) -> None:
    """Without persistence a restart loses the session: the next step raises
    SessionNotFound naming it. While the server is down, StoreUnavailable does."""
    srv = redis_server_or_skip(tmp_path)
    no_backoff = redis.retry.Retry(redis.backoff.NoBackoff(), 1)  # fail fast while down
    c = redis.Redis(host="127.0.0.1", port=srv.port, retry=no_backoff)
    try:
        w = new_worker(c, "a", Clock())
        w.create("fleeting", new_session())
        before = _drive(w, "fleeting", 2, 1)
        srv.stop()
        with pytest.raises(StoreUnavailable, match="session 'fleeting': Redis is unavailable"):
            w.advance("fleeting", sm.ModelReplied(), expected_version=before.version)
        srv.start(keep_port=True)
        with pytest.raises(SessionNotFound, match="session 'fleeting': no record"):
            w.advance("fleeting", sm.ModelReplied(), expected_version=before.version)
    finally:
        c.close()
        srv.stop()


def test_the_benchmark_reports_throughput_and_conflict_rate(server: RedisServer) -> None:
    """A tiny run of benchmarks/redis_store.py: a rate and a conflict rate per worker
    count, and every applied advance moved a version (the benchmark checks it); the
    JSON floor's rates and ratios beside the floor's."""
    from benchmarks import redis_store

    result = redis_store.run(workers=(1, 2), steps=60, sessions=4, url=server.url())
    assert set(result["sessions_per_s"]) == {"1", "2"}
    assert all(rate > 0 for rate in result["sessions_per_s"].values())
    assert result["conflict_rate"]["1"] == 0
    assert 0 <= result["conflict_rate"]["2"] < 1
    assert result["applied"]["1"] == 60
    assert set(result["json_floor_of_floor"]) == {"1", "2"}
    assert all(rate > 0 for rate in result["json_floor_sessions_per_s"].values())
    assert result["json_floor_conflict_rate"]["1"] == 0
    assert [len(r) for r in result["json_floor_of_floor_rounds"].values()] == [3, 3]
    assert "record" not in result  # the sample record stays out of the report


def test_the_json_floor_writes_back_the_record_it_read() -> None:
    """The JSON floor's work on a record is a real parse and write: the same JSON
    value, compact, and a record that is not JSON fails as it would in a store."""
    from benchmarks import redis_store

    record = b'{"a": [1, 2.5, "\\u00e9"], "b": {"c": null}}'
    written = redis_store.json_round_trip(record)
    assert json.loads(written) == json.loads(record)
    assert written == b'{"a":[1,2.5,"\\u00e9"],"b":{"c":null}}'
    with pytest.raises(json.JSONDecodeError, match="Expecting value"):
        redis_store.json_round_trip(b"x" * 10)


@pytest.mark.requirement("ER-79")
def test_a_frozen_server_is_unavailable_in_bounded_time(tmp_path: Path) -> None:
    """A SIGSTOPped redis-server (accepting nothing, answering nothing) gives
    StoreUnavailable from the store's own socket timeout, on a client that left its
    timeouts unset (as redis-py 5 does by default). The write may still land when the
    server wakes: after SIGCONT the same advance with the same key is APPLIED (it had
    not landed) or DUPLICATE (it had), never applied twice."""
    srv = redis_server_or_skip(tmp_path)
    c = redis.Redis(
        host="127.0.0.1",
        port=srv.port,
        socket_timeout=None,
        socket_connect_timeout=None,
        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
    )
    try:
        store = RedisStore(c, prefix="t", timeout_s=0.3, connect_timeout_s=0.3)
        kwargs = c.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 0.3 and kwargs["socket_connect_timeout"] == 0.3
        w = Worker(store, owner="a", clock=lambda: 0.0, now=Clock())
        created = w.create("frozen", new_session())
        first = w.advance("frozen", None, expected_version=created.version)
        assert srv.proc is not None
        os.kill(srv.proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable, match="session 'frozen': Redis is unavailable"):
                w.advance("frozen", sm.Assembled("r", 10), expected_version=first.version, key="k1")
        finally:
            os.kill(srv.proc.pid, signal.SIGCONT)
        c.connection_pool.disconnect()
        again = Worker(store, owner="b", clock=lambda: 0.0, now=Clock())
        result = again.advance(
            "frozen", sm.Assembled("r", 10), expected_version=first.version, key="k1"
        )
        assert result.status in (AdvanceStatus.APPLIED, AdvanceStatus.DUPLICATE)
        assert result.version == first.version + 1
        assert result.session.current_turn is not None
        assert result.session.current_turn.state == "calling"
    finally:
        c.close()
        srv.stop()


def test_store_timeouts_are_validated() -> None:
    """A timeout that is not a finite positive number, a replica count that is not an
    int >= 0, or a wait for replicas as long as the reply timeout: a ConfigError naming it."""
    client = redis.Redis(host="127.0.0.1", port=1)
    for bad in (0, -1, float("inf"), "2", True):
        with pytest.raises(sm.ConfigError, match=r"^timeout_s"):
            RedisStore(client, timeout_s=bad)  # type: ignore[arg-type]
    with pytest.raises(sm.ConfigError, match=r"^connect_timeout_s"):
        RedisStore.from_url("redis://127.0.0.1:1/0", connect_timeout_s=0)
    explicit = redis.Redis(host="127.0.0.1", port=1, socket_timeout=7.0)
    store = RedisStore(explicit, timeout_s=0.5)
    assert explicit.connection_pool.connection_kwargs["socket_timeout"] == 7.0
    assert store.timeout_s == 7.0
    with pytest.raises(sm.ConfigError, match=r"^replicas: must be an int >= 0"):
        RedisStore(client, replicas=-1)
    fresh = redis.Redis(host="127.0.0.1", port=1, socket_timeout=None)
    before = dict(fresh.connection_pool.connection_kwargs)
    with pytest.raises(sm.ConfigError, match=r"^replica_timeout_s: must be shorter .*\(2 s\)"):
        RedisStore(fresh, replicas=1, replica_timeout_s=2.0)  # the store's 2 s would apply
    with pytest.raises(sm.ConfigError, match=r"^replica_timeout_s: must be shorter .*\(7 s\)"):
        RedisStore(explicit, replicas=1, replica_timeout_s=7.0)  # the client's own 7 s
    assert RedisStore(explicit, replicas=1, replica_timeout_s=2.0).replica_timeout_s == 2.0
    with pytest.raises(InvalidSessionId, match=r"^prefix 'a b' is invalid"):
        RedisStore(fresh, prefix="a b")
    assert fresh.connection_pool.connection_kwargs == before  # refused: client untouched
    with pytest.raises(sm.ConfigError, match=r"^replica_timeout_s: must be a finite"):
        RedisStore(client, replicas=1, replica_timeout_s=0)


def test_a_client_that_is_not_a_redis_client_is_refused() -> None:
    """Only a synchronous redis.Redis or RedisCluster will do: a pipeline, an asyncio
    client or anything else is a ConfigError naming what was given."""
    client = redis.Redis(host="127.0.0.1", port=1)
    for bad in (client.pipeline(), redis.asyncio.Redis(host="127.0.0.1", port=1), "redis://x"):
        with pytest.raises(sm.ConfigError, match=r"^client: must be a redis.Redis or a redis"):
            RedisStore(bad)  # type: ignore[arg-type]


def _legacy(client: Any, store: RedisStore, session_id: str) -> str:
    """Move the session's record to the key the previous release wrote it under (the
    same hash, byte for byte); that key."""
    old = store.key(session_id).replace("{", "").replace("}", "")
    client.rename(store.key(session_id), old)
    return old


@pytest.mark.requirement("ER-71", "ER-70")
def test_a_record_of_the_previous_release_is_read_and_moved_by_its_next_write(
    client: Any,
) -> None:
    """A session stored at prefix:session:<id> (no hash tag, as the previous release
    wrote it) is found; the next write moves it to the tagged key in the same script
    (the old key gone, the version one up); a second worker that read the old key
    before the move gets CONFLICT, not a second copy."""
    store = RedisStore(client, prefix="t")
    first = new_worker(client, "a", Clock())
    created = first.create("old", new_session())
    started = first.advance("old", None, expected_version=created.version)
    old = _legacy(client, store, "old")
    assert client.keys("*") == [old.encode()]
    reader = new_worker(client, "b", Clock())
    loaded = reader.load("old")
    assert loaded.version == started.version
    assert loaded.session.snapshot() == started.session.snapshot()
    late = new_worker(client, "c", Clock())
    assert late.load("old").version == started.version
    moved = reader.advance("old", sm.Assembled("r", 10), expected_version=loaded.version)
    assert moved.applied and moved.version == started.version + 1
    assert client.keys("*") == [store.key("old").encode()]
    assert int(client.hget(store.key("old"), "version")) == moved.version
    raced = late.advance("old", sm.Assembled("r", 10), expected_version=loaded.version)
    assert raced.status is AdvanceStatus.CONFLICT
    assert raced.version == moved.version
    assert client.keys("*") == [store.key("old").encode()]
    # a legacy key of the wrong type is reported under its own name and left alone
    client.set("t:session:odd", b"hello")
    with pytest.raises(CorruptSession, match=r"key 't:session:odd' holds a string"):
        store.load("odd")
    with pytest.raises(CorruptSession, match=r"key 't:session:odd' holds a string, not a hash"):
        store.compare_and_set("odd", 0, {"a": 1})
    assert client.get("t:session:odd") == b"hello"
    assert not client.exists(store.key("odd"))
    # delete removes a record under either key
    _legacy(client, store, "old")
    assert store.delete("old") is True
    assert client.keys("*") == [b"t:session:odd"]


@pytest.mark.requirement("ER-79")
def test_a_write_no_replica_acknowledges_is_unavailable_and_told_apart_by_its_key(
    client: Any,
) -> None:
    """With replicas=1 on a server that has none, WAIT times out after
    replica_timeout_s: StoreUnavailable says the write may or may not be durable. It is
    on the master: the same advance with the same key is DUPLICATE, not applied twice."""
    store = RedisStore(client, prefix="t", replicas=1, replica_timeout_s=0.05)
    w = Worker(store, owner="a", clock=lambda: 0.0, now=Clock())
    with pytest.raises(StoreUnavailable, match=r"0 of 1 replica\(s\) acknowledged it within"):
        w.create("w", new_session())
    plain = new_worker(client, "b", Clock())
    assert plain.load("w").version == 1
    with pytest.raises(StoreUnavailable, match=r"may or may not survive a failover"):
        w.advance("w", None, expected_version=1, key="k1")
    again = plain.advance("w", None, expected_version=1, key="k1")
    assert again.status is AdvanceStatus.DUPLICATE
    assert again.version == 2
    stale_write = w.advance("w", None, expected_version=1)  # refused: nothing to wait for
    assert stale_write.status is AdvanceStatus.CONFLICT


def test_replica_settings_and_urls_are_validated_before_anything_changes() -> None:
    """replicas and replica_timeout_s that are not what they say (a bool, a negative,
    NaN, infinity, text, a wait as long as the reply timeout), and URLs redis-py cannot
    parse: a ConfigError naming the setting or the url, the client's settings as they
    were, and from_url checks them before it connects (an unreachable cluster address
    with a bad setting is that setting's ConfigError, not StoreUnavailable)."""
    fresh = redis.Redis(host="127.0.0.1", port=1, socket_timeout=None)
    before = dict(fresh.connection_pool.connection_kwargs)
    for bad in (True, -1, 1.0, float("nan"), float("inf"), "1", None):
        with pytest.raises(sm.ConfigError, match=r"^replicas: must be an int >= 0"):
            RedisStore(fresh, replicas=bad)  # type: ignore[arg-type]
        with pytest.raises(sm.ConfigError, match=r"^replicas: must be an int >= 0"):
            RedisStore.from_url("redis://127.0.0.1:1/0", cluster=True, replicas=bad)
    for bad in (True, False, -1, 0, float("nan"), float("inf"), -float("inf"), "0.5", None):
        with pytest.raises(sm.ConfigError, match=r"^replica_timeout_s: must be a finite"):
            RedisStore(fresh, replicas=1, replica_timeout_s=bad)  # type: ignore[arg-type]
        with pytest.raises(sm.ConfigError, match=r"^replica_timeout_s: must be a finite"):
            RedisStore.from_url("redis://127.0.0.1:1/0", cluster=True, replica_timeout_s=bad)
    for url, options in (
        ("redis://127.0.0.1:1/0", {}),
        ("redis://127.0.0.1:1/0", {"cluster": True}),
    ):
        with pytest.raises(
            sm.ConfigError, match=r"^replica_timeout_s: must be shorter .*\(0.5 s\)"
        ):
            RedisStore.from_url(url, replicas=1, timeout_s=0.5, replica_timeout_s=0.5, **options)
    assert fresh.connection_pool.connection_kwargs == before
    for cluster in (False, True):
        for not_text in (42, None, b"redis://127.0.0.1:1/0"):
            with pytest.raises(sm.ConfigError, match=r"^url: must be a str"):
                RedisStore.from_url(not_text, cluster=cluster)  # type: ignore[arg-type]
        for bad_url in ("", "http://127.0.0.1:1", "redis://127.0.0.1:port/0", "127.0.0.1:6379"):
            with pytest.raises(sm.ConfigError, match=r"^url: .* is not a Redis URL"):
                RedisStore.from_url(bad_url, cluster=cluster)
        with pytest.raises(InvalidSessionId, match=r"^prefix 'a b' is invalid"):
            RedisStore.from_url("redis://127.0.0.1:1/0", cluster=cluster, prefix="a b")


@pytest.mark.requirement("ER-71", "ER-70")
def test_a_legacy_record_of_a_tenant_moves_with_its_ended_ttl_and_the_new_key_wins(
    client: Any,
) -> None:
    """A tenant's record at the previous release's key: ending it moves it to the new
    key with the ended TTL (the old key gone). A worker of the previous release that
    writes the old key after the move (it found nothing there and created the id
    again) does not shadow the moved session: the new key wins, and delete removes
    both."""
    store = RedisStore(client, prefix="app", tenant="acme", ended_ttl_s=60)
    w = Worker(store, owner="a", clock=lambda: 0.0, now=Clock())
    created = w.create("t-1", new_session())
    old = _legacy(client, store, "t-1")
    assert old == "app:acme:session:t-1"
    ended = w.end("t-1", "cancelled", expected_version=created.version, reason="left")
    assert ended.status is AdvanceStatus.APPLIED and ended.version == created.version + 1
    assert client.keys("*") == [b"app:acme:session:{t-1}"]
    assert 0 < client.pttl(store.key("t-1")) <= 60_000
    client.hset(old, mapping={"version": 1, "record": b"{}", "incarnation": ""})  # an old worker
    loaded = Worker(store, owner="b", clock=lambda: 0.0, now=Clock()).load("t-1")
    assert loaded.version == ended.version
    assert loaded.session.status is sm.SessionStatus.CANCELLED
    assert store.delete("t-1") is True
    assert client.keys("*") == []
    with pytest.raises(SessionNotFound):
        store.load("t-1")
