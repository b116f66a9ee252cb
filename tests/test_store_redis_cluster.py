"""The Redis store on a real Redis Cluster: three masters and three replicas started here
on loopback ports (``cluster-enabled yes``, ``cluster-node-timeout`` 1 s). Each
session's key is hash tagged, so each script touches one slot; spend reports and
endings between sessions on different masters stay exact; a master SIGKILLed under a
session loses no write the store acknowledged with ``replicas=1``; the throughput
benchmark runs on the cluster. Skipped locally without ``redis-server`` and
``redis-cli``; a failure when ``CI`` is set. Every wait polls with a deadline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import statemachine as sm
from benchmarks.redis_cluster import Cluster
from statemachine.store import AdvanceStatus, RedisStore, StoreUnavailable, Worker

from .store_worker import Clock, settings

try:
    from redis.cluster import RedisCluster
except ImportError:  # pragma: no cover - the extra is installed in CI
    if os.environ.get("CI"):
        raise
    pytest.skip("redis-py is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow  # server processes, a failover


def start_or_skip(directory: Path) -> Cluster:
    """A started cluster; skip when redis-server or redis-cli is missing (fail in CI)."""
    why = Cluster.available()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{why}, and CI is set: the cluster tests need them")
        pytest.skip(f"cannot start a Redis Cluster: {why}")
    cluster = Cluster(directory)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the tests that kill nothing."""
    started = start_or_skip(tmp_path_factory.mktemp("cluster"))
    yield started
    started.stop()


@pytest.fixture
def store(cluster: Cluster) -> Iterator[RedisStore]:
    """A store on an emptied cluster, through RedisStore.from_url(cluster=True)."""
    made = RedisStore.from_url(cluster.url, cluster=True, prefix="t")
    made.client.flushdb()
    yield made
    made.client.close()


def worker(store: RedisStore, owner: str, **options: Any) -> Worker:
    return Worker(store, owner=owner, clock=lambda: 0.0, now=Clock(), **options)


def ids_on_other_masters(cluster: Cluster, store: RedisStore, stem: str, count: int) -> list[str]:
    """``count`` ids ``<stem>.<n>``, each served by another master than the ones before
    (and than ``stem``'s)."""
    taken = {cluster.master_of(store.key(stem))}
    found: list[str] = []
    for n in range(200):
        candidate = f"{stem}.{n}"
        master = cluster.master_of(store.key(candidate))
        if master not in taken:
            taken.add(master)
            found.append(candidate)
            if len(found) == count:
                return found
    raise AssertionError(f"no {count} ids of {stem!r} on other masters")  # pragma: no cover


@pytest.mark.requirement("ER-71", "ER-70")
def test_each_session_lives_in_one_slot_and_sessions_spread_over_the_masters(
    cluster: Cluster, store: RedisStore
) -> None:
    """A session's key is <prefix>:session:{<id>}: its slot is its id's, whatever the
    prefix or tenant; the Lua read and compare-and-set run on its master; sessions
    spread over all three masters."""
    assert store.cluster
    w = worker(store, "a")
    masters = set()
    for n in range(12):
        sid = f"conv-{n}"
        created = w.create(sid, sm.Session(settings(), seed=n, clock=lambda: 0.0))
        started = w.advance(sid, None, expected_version=created.version)
        assert started.applied and started.version == 2
        key = store.key(sid)
        assert key == f"t:session:{{{sid}}}"
        assert store.client.keyslot(key) == store.client.keyslot(sid)
        tenant = RedisStore(store.client, prefix="other:app", tenant="acme").key(sid)
        assert store.client.keyslot(tenant) == store.client.keyslot(sid)
        masters.add(cluster.master_of(key))
        assert int(cluster.node(cluster.master_of(key)).hget(key, "version")) == 2
    assert len(masters) == 3
    stale = worker(store, "b").advance("conv-0", sm.Assembled("r", 1), expected_version=1)
    assert stale.status is AdvanceStatus.CONFLICT and stale.version == 2


def test_a_plain_client_on_a_cluster_node_is_a_config_error(cluster: Cluster) -> None:
    """A redis.Redis on one node of a cluster cannot serve the store (its keys live on
    other nodes): every call names the fix, and nothing is written."""
    node = cluster.node(cluster.ports[0])
    try:
        store = RedisStore(node, prefix="plain")
        for n in range(6):
            with pytest.raises(sm.ConfigError, match=r"Redis Cluster node .*cluster=True"):
                worker(store, "a").create(f"s{n}", sm.Session(settings(), clock=lambda: 0.0))
        client = RedisCluster(host="127.0.0.1", port=cluster.ports[0])
        assert client.keys("plain*") == []
        client.close()
    finally:
        node.close()
    with pytest.raises(sm.ConfigError, match=r"does not lead to a Redis Cluster"):
        RedisStore.from_url(cluster.url.replace("/0", "/1"), cluster=True)
    with pytest.raises(StoreUnavailable, match=r"Redis Cluster at redis://127.0.0.1:1/0 is"):
        RedisStore.from_url("redis://127.0.0.1:1/0", cluster=True)


@pytest.mark.requirement("ER-82", "ER-200")
def test_spend_and_endings_cross_masters_exactly(cluster: Cluster, store: RedisStore) -> None:
    """A parent and two children, each served by another master: each child's spend
    reaches the parent's record by its own compare-and-set (nothing lost or doubled,
    a lost report pulled at the parent's next turn); ending the parent cancels both
    children on their masters."""
    kids = ids_on_other_masters(cluster, store, "p", 2)
    a, b, c = worker(store, "a"), worker(store, "b"), worker(store, "c")
    parent = sm.Session(sm.Settings(max_cost_usd=10.0), seed=1, clock=lambda: 0.0, session_id="p")
    children = [parent.spawn(session_id=kid) for kid in kids]
    a.create("p", parent)
    for kid, child in zip(kids, children, strict=True):
        b.create(kid, child)
    spends = {kids[0]: [0.25, 0.5], kids[1]: [0.125]}
    for kid, costs in spends.items():
        for cost in costs:
            result = b.advance(kid, None, expected_version=b.load(kid).version)
            result = b.advance(kid, sm.Assembled("req", 10), expected_version=result.version)
            result = b.advance(kid, sm.ModelReplied(cost=cost), expected_version=result.version)
            assert result.applied
    loaded = a.load("p").session
    assert loaded.child_costs == {kids[0]: 0.75, kids[1]: 0.125}
    assert loaded.cost_usd == 0.875  # binary fractions: exact, not approximately

    c._report_spend = lambda *_report: None  # type: ignore[method-assign]  # it dies
    result = c.advance(kids[1], None, expected_version=c.load(kids[1]).version)
    result = c.advance(kids[1], sm.Assembled("req", 10), expected_version=result.version)
    c.advance(kids[1], sm.ModelReplied(cost=1.0), expected_version=result.version)
    assert a.load("p").session.cost_usd == 0.875  # the report was lost...
    started = a.advance("p", None, expected_version=a.load("p").version)
    assert started.session.cost_usd == 1.875  # ...and pulled at the parent's turn start

    ended = a.end("p", "cancelled", expected_version=started.version, reason="user left")
    assert ended.status is AdvanceStatus.APPLIED
    assert set(ended.ended) == set(kids)
    fresh = worker(store, "d", remember=0)
    for kid in kids:
        assert fresh.load(kid).session.status is sm.SessionStatus.CANCELLED
    assert fresh.load("p").session.cost_usd == 1.875


def test_the_benchmark_runs_on_the_cluster(cluster: Cluster, store: RedisStore) -> None:
    """A tiny run of benchmarks/redis_cluster.py (benchmarks.redis_store's rounds on the
    cluster, the stores waiting for a replica): every applied advance moved a version
    (it checks)."""
    from benchmarks import redis_cluster

    result = redis_cluster.run_on(cluster.url, (1, 2), steps=40, sessions=4, rounds=1, replicas=1)
    assert result["applied"]["1"] == 40
    assert all(rate > 0 for rate in result["floor_sessions_per_s"].values())
    assert 0 <= result["conflict_rate"]["2"] < 1
    assert result["mean_record_bytes"]["1"] > 500  # the floor writes records of that size


def _wait_for(cluster: Cluster, done: Any, what: str, timeout: float = 30.0) -> None:
    cluster.wait(done, time.monotonic() + timeout, what)


def read_until_promoted(
    cluster: Cluster, replica: int, reader: Worker, session_id: str, acknowledged: Any
) -> None:
    """Read the session again and again until the replica on ``replica`` is promoted
    (deadline 30 s): each read is StoreUnavailable within three reply timeouts, or the
    ``acknowledged`` (version, snapshot)."""
    bound = 3 * reader.store.timeout_s  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while not cluster.promoted(replica):
        assert time.monotonic() < deadline, f"replica {replica} was never promoted"
        start = time.monotonic()
        try:
            early = reader.load(session_id)
        except StoreUnavailable:
            assert time.monotonic() - start < bound  # bounded, no hang
        else:
            assert (early.version, early.session.snapshot()) == acknowledged


@pytest.mark.requirement("ER-79")
def test_a_failover_loses_no_write_the_store_acknowledged(tmp_path: Path) -> None:
    """With replicas=1 each write is reported once the master's replica holds it. The
    master of the session is SIGKILLed: until its replica is promoted each call gives
    StoreUnavailable in bounded time; after, the session is at the last acknowledged
    version with the same state (as is any read that succeeds before every node
    agrees), and the same store goes on. A write the promoted master cannot copy (no
    replica yet) is StoreUnavailable, applied on the master and told apart by its key;
    once the old master is back as a replica, writes are acknowledged again."""
    cluster = start_or_skip(tmp_path)
    try:
        store = RedisStore.from_url(
            cluster.url, cluster=True, prefix="t", replicas=1, replica_timeout_s=0.5
        )
        w = worker(store, "a")
        result = w.create("f", sm.Session(settings(), seed=5, clock=lambda: 0.0))
        events = [None, sm.Assembled("req", 10), sm.ModelFailed(sm.ModelError("rate_limited"))]
        for event in events:
            result = w.advance("f", event, expected_version=result.version)
            assert result.applied
        acknowledged = (result.version, result.session.snapshot())
        master = cluster.master_of(store.key("f"))
        replica = cluster.replica_of(master)
        cluster.kill(master)

        start = time.monotonic()
        with pytest.raises(StoreUnavailable, match=r"session 'f': Redis is unavailable"):
            w.advance("f", sm.WaitDone(), expected_version=result.version, key="k1")
        assert time.monotonic() - start < 3 * store.timeout_s  # bounded, no hang
        reader = worker(store, "b", remember=0)
        read_until_promoted(cluster, replica, reader, "f", acknowledged)
        fresh = reader.load("f")
        assert (fresh.version, fresh.session.snapshot()) == acknowledged
        with pytest.raises(StoreUnavailable, match=r"0 of 1 replica\(s\) acknowledged"):
            w.advance("f", sm.WaitDone(), expected_version=result.version, key="k1")
        unsure = RedisStore.from_url(cluster.url, cluster=True, prefix="t")  # no WAIT
        again = worker(unsure, "c").advance(
            "f", sm.WaitDone(), expected_version=result.version, key="k1"
        )
        assert again.status is AdvanceStatus.DUPLICATE  # the unsure write had landed
        assert again.version == result.version + 1

        cluster.restart(master)  # back, as the replica of its successor
        assert cluster.replica_of(replica) == master
        deadline = time.monotonic() + 20
        while True:  # a replica just synced may be slow to its first ack on a busy machine
            try:
                after = w.advance("f", sm.ModelReplied(), expected_version=again.version, key="k2")
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "no write acknowledged after the restart"
        assert after.status in (AdvanceStatus.APPLIED, AdvanceStatus.DUPLICATE)
        assert after.version == again.version + 1
        unsure.client.close()
        store.client.close()
    finally:
        cluster.stop()


def test_a_moved_slot_is_followed(cluster: Cluster, store: RedisStore) -> None:
    """A manual failover (CLUSTER FAILOVER on a replica) moves a session's slot while a
    store's map of the slots is stale: its next read and acknowledged write meet MOVED,
    follow it, and apply; the replica count still holds."""
    durable = RedisStore.from_url(
        cluster.url, cluster=True, prefix="t", replicas=1, replica_timeout_s=1.5
    )
    w = worker(durable, "a")
    result = w.create("m", sm.Session(settings(), seed=6, clock=lambda: 0.0))
    master = cluster.master_of(store.key("m"))
    replica = cluster.replica_of(master)
    node = cluster.node(replica)
    try:
        assert node.execute_command("CLUSTER FAILOVER")
    finally:
        node.close()
    _wait_for(cluster, lambda: cluster.promoted(replica), f"replica {replica} to take over")
    _wait_for(cluster, cluster.healthy, "the old master to sync as a replica")
    assert durable.client.get_node_from_key(store.key("m")).port == master  # stale map
    for event in (None, sm.Assembled("req", 10)):
        result = w.advance("m", event, expected_version=result.version)
        assert result.applied
    fresh = worker(store, "b", remember=0).load("m")
    assert fresh.version == result.version == 3
    assert cluster.master_of(store.key("m")) == replica
    assert cluster.info(master, "replication")["role"] == "slave"  # the old master
    durable.client.close()


def test_a_slot_being_migrated_is_followed_with_asking(cluster: Cluster, store: RedisStore) -> None:
    """Mid-reshard (the slot MIGRATING on its master, IMPORTING on another, the session's
    key already moved), the old master answers ASK: a read and an acknowledged write
    follow it to the new master; once the slot is handed over they go there directly."""
    durable = RedisStore.from_url(
        cluster.url, cluster=True, prefix="t", replicas=1, replica_timeout_s=1.5
    )
    w = worker(durable, "a")
    result = w.create("ask", sm.Session(settings(), seed=7, clock=lambda: 0.0))
    key = store.key("ask")
    source = cluster.master_of(key)
    targets: list[int] = []

    def agreed_target() -> bool:
        """Another master, by the source's view and by its own (after the MOVED test's
        failover a node's view of the old master may lag a moment)."""
        rows = cluster.nodes(source)
        mine = [r["port"] for r in rows if r["role"] == "master" and r["port"] != source]
        roles = {port: cluster.info(port, "replication")["role"] for port in mine}
        targets[:] = [port for port in mine if roles[port] == "master"]
        return bool(targets)

    _wait_for(cluster, agreed_target, "the source to agree with another master on its role")
    target = targets[0]
    ids = {row["port"]: row["id"] for row in cluster.nodes(source)}
    slot = store.client.keyslot(key)
    src, dst = cluster.node(source), cluster.node(target)
    try:
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source])
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[target])
        src.execute_command("MIGRATE", "127.0.0.1", target, key, 0, 5000)
        assert src.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0  # moved away
        for event in (None, sm.Assembled("req", 10)):
            result = w.advance("ask", event, expected_version=result.version)
            assert result.applied
        assert worker(durable, "b", remember=0).load("ask").version == result.version == 3
        for node in (dst, src):
            node.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[target])
    finally:
        src.close()
        dst.close()
    _wait_for(cluster, lambda: cluster.master_of(key) == target, "the slot to be handed over")
    result = w.advance("ask", sm.ModelReplied(), expected_version=result.version)
    assert result.applied and result.version == 4
    durable.client.close()


def to_legacy_key(store: RedisStore, session_id: str) -> str:
    """Move the session's hash to the key the previous release wrote it under (no
    hash tag: on a cluster, another slot), field for field; that key."""
    client: Any = store.client
    new, old = store.key(session_id), store.key(session_id).replace("{", "").replace("}", "")
    fields = client.hgetall(new)
    client.delete(new)
    client.hset(old, mapping=fields)
    return old


@pytest.mark.requirement("ER-71", "ER-70")
def test_a_record_of_the_previous_release_on_a_cluster_is_found_and_moved_once(
    store: RedisStore,
) -> None:
    """The previous release ran on a RedisCluster client too (one key per script), so a
    cluster may hold sessions at the untagged key, in another slot than the new key.
    Such a session is found; creating the id again is refused; its next write moves it
    (the new key at the next version, the old key gone); a worker that read it before
    the move gets CONFLICT; a record of another incarnation there is not overwritten;
    delete removes either key."""
    client: Any = store.client
    w = worker(store, "a")
    created = w.create("leg", sm.Session(settings(), seed=8, clock=lambda: 0.0))
    started = w.advance("leg", None, expected_version=created.version)
    old = to_legacy_key(store, "leg")
    assert client.keyslot(old) != client.keyslot(store.key("leg"))
    reader, late = worker(store, "b", remember=0), worker(store, "c", remember=0)
    loaded = reader.load("leg")
    assert (loaded.version, loaded.session.snapshot()) == (
        started.version,
        started.session.snapshot(),
    )
    assert late.load("leg").version == started.version
    with pytest.raises(sm.store.StaleWrite, match=r"session 'leg' already exists \(version 2\)"):
        store.compare_and_set("leg", 0, {"a": 1})
    assert not client.exists(store.key("leg"))
    moved = reader.advance("leg", sm.Assembled("r", 10), expected_version=loaded.version)
    assert moved.applied and moved.version == started.version + 1
    assert not client.exists(old)
    assert int(client.hget(store.key("leg"), "version")) == moved.version
    raced = late.advance("leg", sm.Assembled("r", 10), expected_version=loaded.version)
    assert raced.status is AdvanceStatus.CONFLICT and raced.version == moved.version

    old = to_legacy_key(store, "leg")
    client.hset(old, "incarnation", "another")
    with pytest.raises(sm.store.StaleWrite, match=r"created again"):
        store.compare_and_set_payload("leg", moved.version, b"{}", incarnation="mine")
    assert int(client.hget(old, "version")) == moved.version
    assert not client.exists(store.key("leg"))
    with pytest.raises(sm.store.StaleWrite, match=r"expected version 1, the store holds"):
        store.compare_and_set("leg", 1, {"a": 1})
    assert store.delete("leg") is True
    assert client.exists(old, store.key("leg")) == 0

    client.set("t:session:odd", b"hello")  # a legacy key of another kind: corrupt, left alone
    with pytest.raises(sm.store.CorruptSession, match=r"key 't:session:odd' holds a string"):
        store.load("odd")
    with pytest.raises(sm.store.CorruptSession, match=r"'t:session:odd' holds a string, not a"):
        store.compare_and_set("odd", 1, {"a": 1})
    with pytest.raises(sm.store.CorruptSession, match=r"'t:session:odd' holds a string, not a"):
        store.compare_and_set("odd", 0, {"a": 1})
    assert client.get("t:session:odd") == b"hello"
    assert not client.exists(store.key("odd"))


@pytest.mark.requirement("ER-74")
@pytest.mark.parametrize("moment", ["before the peek", "after the peek"])
def test_two_workers_moving_one_legacy_record_on_a_cluster_have_one_winner(
    cluster: Cluster, store: RedisStore, moment: str
) -> None:
    """The move on a cluster is two steps (the old key is in another slot). Another
    worker's whole move is forced between them, before or after this worker reads
    the old key: exactly one write applies, the loser is told CONFLICT at the
    winner's version, and the record is at the new key only."""
    client: Any = store.client
    w = worker(store, "a")
    created = w.create("duel", sm.Session(settings(), seed=9, clock=lambda: 0.0))
    old = to_legacy_key(store, "duel")
    loser_store = RedisStore.from_url(cluster.url, cluster=True, prefix="t")
    winner, loser = worker(store, "w", remember=0), worker(loser_store, "l", remember=0)
    read = loser.load("duel")
    assert read.version == created.version
    won: list[Any] = []
    run = loser_store._run

    def interleaved(session_id: str, script: Any, keys: list[str], *args: Any) -> list[Any]:
        peek = script is loser_store._peek
        if peek and moment == "before the peek" and not won:
            won.append(winner.advance("duel", None, expected_version=read.version))
        reply = run(session_id, script, keys, *args)
        if peek and moment == "after the peek" and not won:
            won.append(winner.advance("duel", None, expected_version=read.version))
        return reply

    loser_store._run = interleaved  # type: ignore[method-assign]
    lost = loser.advance("duel", None, expected_version=read.version)
    assert len(won) == 1 and won[0].applied and won[0].version == created.version + 1
    assert lost.status is AdvanceStatus.CONFLICT and lost.version == won[0].version
    assert not client.exists(old)
    assert int(client.hget(store.key("duel"), "version")) == won[0].version
    loser_store.client.close()


class FakeNode:
    """A node connection that answers every script with ``reply`` (an exception is
    raised, as redis-py raises a reply error), counting the calls."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.calls = 0

    def evalsha(self, *_args: Any) -> Any:
        self.calls += 1
        if isinstance(self.reply, BaseException):
            raise self.reply
        return self.reply

    def script_load(self, _script: str) -> None:
        """Loading a script changes nothing here (the reply stays NOSCRIPT)."""


def test_cluster_errors_are_translated_in_bounded_calls(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Replies a test cluster does not give on demand, from a node stand-in: an endless
    MOVED or NOSCRIPT ends after 5 tries; TRYAGAIN, CLUSTERDOWN, MASTERDOWN and a
    replica's READONLY are StoreUnavailable at once; a lost connection is sent again
    once for a read, never for a write (it may have landed), and a reply timeout is
    never sent again. Nothing raw from redis-py escapes."""
    from redis import exceptions as errors

    refreshes: list[None] = []
    monkeypatch.setattr(store._router, "refresh", lambda: refreshes.append(None))
    cases: list[tuple[Any, str, int, str]] = [
        (errors.MovedError("1 127.0.0.1:1"), "load", 5, r"redirected 5 times"),
        (errors.MovedError("1 127.0.0.1:1"), "write", 5, r"redirected 5 times.*nothing was"),
        (errors.NoScriptError("NOSCRIPT"), "write", 5, r"redirected 5 times"),
        (errors.TryAgainError("TRYAGAIN"), "write", 1, r"no master .* serves its slot"),
        (errors.ClusterDownError("CLUSTERDOWN"), "load", 1, r"no master .* serves its slot"),
        (errors.MasterDownError("MASTERDOWN"), "write", 1, r"no master .* serves its slot"),
        (errors.ReadOnlyError("READONLY"), "write", 1, r"nothing was written"),
        (errors.ConnectionError("reset"), "load", 2, r"Redis is unavailable: reset"),
        (errors.ConnectionError("reset"), "write", 1, r"may still be applied"),
        (errors.TimeoutError("timed out"), "load", 1, r"may still be applied"),
        (errors.TimeoutError("timed out"), "write", 1, r"may still be applied"),
    ]
    calls: dict[str, Callable[[], object]] = {
        "load": lambda: store.load("x"),
        "write": lambda: store.compare_and_set("x", 3, {}),
    }
    for reply, call, sends, message in cases:
        node = FakeNode(reply)

        def to_node(_key: str, _asking: str | None, node: FakeNode = node) -> FakeNode:
            return node

        monkeypatch.setattr(store._router, "node", to_node)
        with pytest.raises(StoreUnavailable, match=message) as caught:
            calls[call]()
        assert node.calls == sends, (reply, call)
        assert caught.value.session_id == "x"
    assert len(refreshes) == 5 + 5 + 2 + 1 + 1 + 1  # MOVED twice, each lost or late reply

    def lost_map(_key: str, _asking: str | None) -> FakeNode:
        raise errors.RedisClusterException("Redis Cluster cannot be connected")

    monkeypatch.setattr(store._router, "node", lost_map)
    for call in calls.values():
        with pytest.raises(StoreUnavailable, match=r"no master .*cannot be connected"):
            call()


def test_a_slot_no_master_serves_is_unavailable_at_once_and_nothing_is_written(
    cluster: Cluster, store: RedisStore
) -> None:
    """The session's master forgets its slot (CLUSTER DELSLOTS): it answers CLUSTERDOWN,
    and a read and a write are StoreUnavailable at once (no redirect chased, nothing
    written); once the slot is served again (ADDSLOTS) the same store goes on at the
    version it had."""
    w = worker(store, "a")
    created = w.create("down", sm.Session(settings(), seed=10, clock=lambda: 0.0))
    key = store.key("down")
    master = cluster.master_of(key)
    slot = store.client.keyslot(key)  # type: ignore[union-attr]
    node = cluster.node(master)
    try:
        assert node.execute_command("CLUSTER DELSLOTS", slot)
        for call in (
            lambda: w.load("down"),
            lambda: w.advance("down", None, expected_version=created.version, key="k1"),
        ):
            start = time.monotonic()
            with pytest.raises(
                StoreUnavailable, match=r"no master .* serves its slot .*ClusterDown"
            ):
                call()
            assert time.monotonic() - start < store.timeout_s  # refused, not waited out
    finally:
        node.execute_command("CLUSTER ADDSLOTS", slot)
        node.close()
    assert int(cluster.node(master).hget(key, "version")) == created.version

    def served() -> bool:
        try:
            worker(store, "b", remember=0).load("down")
        except StoreUnavailable:
            return False
        return True

    _wait_for(cluster, served, "the slot to be served again")
    result = w.advance("down", None, expected_version=created.version, key="k1")
    assert result.status is AdvanceStatus.APPLIED and result.version == created.version + 1
