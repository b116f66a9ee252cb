"""Measurement: :mod:`benchmarks.redis_store`'s rounds on a Redis Cluster.

A private cluster is started on 127.0.0.1 (three masters, each with one replica,
``cluster-enabled yes``, no persistence) in a temporary directory, and
:func:`benchmarks.redis_store.run`'s rounds run on it: the workers' stores on
``redis.cluster.RedisCluster`` clients, and the floor (the same two Lua scripts, no
engine) sent straight to the node serving each key, as the store sends them; the floor
on the same cluster, interleaved with the workers' rounds. The 32 sessions' keys are
hash tagged by id, so they spread over the three masters; each script touches one key.

``--replicas 1`` measures the stores with ``RedisStore(replicas=1)``: every write waits
for its master's replica to acknowledge it (``WAIT``), the floor does not.

    python -m benchmarks.redis_cluster [--workers 1,4,16] [--steps 4000] [--sessions 32]
        [--rounds 3] [--replicas 0]

:class:`Cluster` is also what the cluster tests start (``tests/test_store_redis_cluster.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from benchmarks import redis_store

CLUSTER_SCHEME = "redis+cluster://"
"""How :mod:`benchmarks.redis_store` is told to make ``RedisCluster`` clients."""


def _port_pair_free(port: int) -> bool:
    """Whether ``port`` and its cluster bus port (``port + 10000``) are both free."""
    for candidate in (port, port + 10000):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                return False
    return True


def _free_ports(count: int) -> list[int]:
    """``count`` ports on 127.0.0.1 whose bus ports are free too (below 55535)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port < 55535 and port not in ports and _port_pair_free(port):
            ports.append(port)
    return ports


class Cluster:
    """A Redis Cluster of ``redis-server`` child processes on 127.0.0.1: ``masters``
    masters with ``replicas`` replicas each, data in ``directory``, no persistence.

    ``node_timeout_ms`` is ``cluster-node-timeout``: a master that stops answering
    for that long is marked failed and its replica promoted (about twice that, with
    the election). Every wait here polls with a deadline.
    """

    def __init__(
        self,
        directory: Path,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1000,
    ) -> None:
        self.directory = directory
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.ports: list[int] = []
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    @staticmethod
    def available() -> str | None:
        """Why a cluster cannot be started here, or ``None`` when it can."""
        missing = [name for name in ("redis-server", "redis-cli") if shutil.which(name) is None]
        if missing:
            return f"{' and '.join(missing)} not on PATH"
        return None

    @property
    def url(self) -> str:
        """A URL of one live node (any node leads a cluster client to all of them)."""
        return f"redis://127.0.0.1:{self.live()[0]}/0"

    def _command(self, port: int) -> list[str]:
        return [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            f"nodes-{port}.conf",
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            # a replica may always stand for election, however long its link was down
            "--cluster-replica-validity-factor",
            "0",
            "--repl-diskless-sync-delay",
            "0",
            "--appendonly",
            "no",
            "--save",
            "",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]

    def node(self, port: int, timeout: float = 2.0) -> Any:
        """A plain client on one node (not cluster-aware)."""
        import redis

        return redis.Redis(
            host="127.0.0.1", port=port, socket_timeout=timeout, socket_connect_timeout=timeout
        )

    def start(self, timeout: float = 60.0) -> None:
        """Start the nodes, join them into a cluster, and return once every slot is
        served and every replica is in sync (bounded by ``timeout``)."""
        deadline = time.monotonic() + timeout
        count = self.masters * (1 + self.replicas)
        self.ports = _free_ports(count)
        for port in self.ports:
            self.procs[port] = subprocess.Popen(  # noqa: S603 - our own argv
                self._command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        for port in self.ports:
            self.wait(lambda port=port: self._answers(port), deadline, f"node {port} to start")
        addresses = [f"127.0.0.1:{port}" for port in self.ports]
        create = ["redis-cli", "--cluster", "create", *addresses]
        create += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        subprocess.run(  # noqa: S603 - our own argv
            create,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=max(1.0, deadline - time.monotonic()),
        )
        self.wait(self.healthy, deadline, "the cluster to be healthy")
        self.wait(self.replicated, deadline, "every master's replicas to be in sync")
        self.wait(self.acknowledged, deadline, "every master's replicas to acknowledge a write")

    def _answers(self, port: int) -> bool:
        import redis

        client = self.node(port, 0.5)
        try:
            return bool(client.ping())
        except redis.exceptions.RedisError:
            proc = self.procs.get(port)
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {port} exited") from None
            return False
        finally:
            client.close()

    def wait(self, done: Callable[[], bool], deadline: float, what: str) -> None:
        """Poll ``done`` until it holds; ``TimeoutError`` naming ``what`` at ``deadline``."""
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up waiting for {what}")
            with suppress(subprocess.TimeoutExpired):  # a bounded pause between polls
                self.procs[self.live()[0]].wait(timeout=0.05)

    def live(self) -> list[int]:
        """The ports of the nodes still running."""
        return [port for port, proc in self.procs.items() if proc.poll() is None]

    def info(self, port: int, section: str) -> dict[str, Any]:
        client = self.node(port, 0.5)
        try:
            data: dict[str, Any] = client.info(section)
            return data
        finally:
            client.close()

    def nodes(self, port: int) -> list[dict[str, Any]]:
        """``CLUSTER NODES`` as seen from ``port``: one dict per node (``port``,
        ``role``, ``failed``, ``master_id``, ``id``, ``slots`` as (low, high) pairs)."""
        client = self.node(port, 0.5)
        try:
            table = client.execute_command("CLUSTER NODES")  # redis-py parses it
        finally:
            client.close()
        rows = []
        for address, fields in table.items():
            flags = fields["flags"].split(",")
            rows.append(
                {
                    "id": fields["node_id"],
                    "port": int(address.rsplit(":", 1)[1]),
                    "role": "master" if "master" in flags else "replica",
                    "failed": "fail" in flags or "fail?" in flags,
                    "master_id": None if fields["master_id"] == "-" else fields["master_id"],
                    "slots": [(int(span[0]), int(span[-1])) for span in fields["slots"]],
                }
            )
        return rows

    def healthy(self) -> bool:
        """Every live node says ``cluster_state:ok`` and knows every live node; every
        live replica's link to its master is up."""
        import redis

        live = self.live()
        try:
            for port in live:
                if self.info_cluster(port).get("cluster_state") != "ok":
                    return False
                rows = self.nodes(port)
                if {row["port"] for row in rows if not row["failed"]} != set(live):
                    return False
                replication = self.info(port, "replication")
                if replication.get("role") == "slave" and (
                    replication.get("master_link_status") != "up"
                    or replication.get("master_sync_in_progress")
                ):
                    return False
        except redis.exceptions.RedisError:
            return False
        return True

    def info_cluster(self, port: int) -> dict[str, str]:
        client = self.node(port, 0.5)
        try:
            table: dict[str, str] = client.execute_command("CLUSTER INFO")  # parsed
            return table
        finally:
            client.close()

    def master_of(self, key: str) -> int:
        """The port of the master serving ``key``'s slot, as the live nodes say."""
        import redis

        client = self.node(self.live()[0])
        try:
            slot = int(client.execute_command("CLUSTER KEYSLOT", key))
        finally:
            client.close()
        for row in self.nodes(self.live()[0]):
            if row["role"] != "master" or row["failed"]:
                continue
            if any(low <= slot <= high for low, high in row["slots"]):
                return int(row["port"])
        raise redis.exceptions.ClusterDownError(f"no master serves slot {slot}")

    def replica_of(self, master: int) -> int:
        """The port of a replica in sync with the master on ``master`` (by the master's
        own account: ``INFO replication``)."""
        for port in self._online_replicas(master):
            return port
        raise LookupError(f"no replica of the master on {master} is in sync")

    def _online_replicas(self, master: int) -> list[int]:
        import redis

        try:
            replication = self.info(master, "replication")
        except redis.exceptions.RedisError:
            return []
        return [
            int(value["port"])
            for value in replication.values()
            if isinstance(value, dict) and value.get("state") == "online"
        ]

    def acknowledged(self) -> bool:
        """Whether every live master's ``replicas`` replicas acknowledge a write (``WAIT``)
        within 100 ms. A replica its master lists as online right after its first sync
        may not acknowledge for up to a second (Redis 7 starts sending it writes and
        acknowledgement requests only once it has heard from it again), so a store with
        ``replicas`` set would find its first write unacknowledged."""
        import redis
        from redis.crc import key_slot

        try:
            masters = [row for row in self.nodes(self.live()[0]) if row["role"] == "master"]
            for row in masters:
                if row["failed"] or not row["slots"]:
                    continue
                low, high = row["slots"][0]
                key = next(
                    f"probe:{{{i}}}"
                    for i in range(100_000)
                    if low <= key_slot(f"{{{i}}}".encode()) <= high
                )
                client = self.node(row["port"], 1.0)
                try:
                    client.set(key, "1")
                    acked = int(client.execute_command("WAIT", self.replicas, 100))
                    client.delete(key)
                finally:
                    client.close()
                if acked < self.replicas:
                    return False
        except (redis.exceptions.RedisError, StopIteration):
            return False
        return True

    def replicated(self) -> bool:
        """Whether every live master has ``replicas`` replicas in sync."""
        import redis

        try:
            masters = [p for p in self.live() if self.info(p, "replication")["role"] == "master"]
        except redis.exceptions.RedisError:
            return False
        return all(len(self._online_replicas(port)) >= self.replicas for port in masters)

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (no shutdown, no goodbye to its replica)."""
        proc = self.procs[port]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def restart(self, port: int, timeout: float = 30.0) -> None:
        """Start the node on ``port`` again (its ``nodes-<port>.conf`` brings it back
        into the cluster: a killed master returns as its successor's replica) and
        return once the cluster is healthy."""
        self.procs[port] = subprocess.Popen(  # noqa: S603 - our own argv
            self._command(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        self.wait(lambda: self._answers(port), deadline, f"node {port} to restart")
        self.wait(lambda: self._in_sync(port), deadline, f"node {port} to sync as a replica")
        self.wait(self.healthy, deadline, "the cluster to be healthy again")
        self.wait(self.acknowledged, deadline, "every master's replicas to acknowledge a write")

    def _in_sync(self, port: int) -> bool:
        """Whether the node on ``port`` is a replica its master counts as in sync."""
        import redis

        try:
            mine = self.info(port, "replication")
        except redis.exceptions.RedisError:
            return False
        if mine.get("role") != "slave" or mine.get("master_link_status") != "up":
            return False
        return port in self._online_replicas(int(mine["master_port"]))

    def promoted(self, port: int) -> bool:
        """Whether the node on ``port`` is a master by its own account and by every
        other live node's, and the cluster is ok again."""
        import redis

        try:
            if self.info(port, "replication").get("role") != "master":
                return False
            for other in self.live():
                row = next(r for r in self.nodes(other) if r["port"] == port)
                if row["role"] != "master" or self.info_cluster(other)["cluster_state"] != "ok":
                    return False
        except (redis.exceptions.RedisError, StopIteration, KeyError):
            return False
        return True

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@contextmanager
def started(**options: Any) -> Iterator[Cluster]:
    """A started :class:`Cluster` in a temporary directory, stopped on exit."""
    why = Cluster.available()
    if why is not None:
        raise RuntimeError(f"cannot start a Redis Cluster: {why}")
    with tempfile.TemporaryDirectory() as directory:
        cluster = Cluster(Path(directory), **options)
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()


def _floor_worker(
    url: str,
    round_: str,
    parties: int,
    index: int,
    sessions: int,
    attempts: int,
    record: bytes,
    through_json: bool,
    plan: redis_store.Plan | None = None,
) -> None:
    """:func:`benchmarks.redis_store._floor_worker` on a cluster: the same two scripts
    per attempt, each sent straight to the node serving the key (as ``RedisStore``
    sends them, not through redis-py's slower routing of a script), no engine."""
    from statemachine.store._redis import _CAS, _LOAD

    client = redis_store._client(url, redis_store._WAIT_S)
    for primary in client.get_primaries():
        for source in (_LOAD, _CAS):
            client.get_redis_connection(primary).script_load(source)
    load, cas = client.register_script(_LOAD).sha, client.register_script(_CAS).sha
    round_trip = redis_store.json_round_trip
    counts, start = redis_store._barrier(client, round_, parties)
    for session in redis_store._draws(index, sessions, attempts, plan):
        key = f"floor:session:s{session}"
        node = client.get_redis_connection(client.get_node_from_key(key))
        reply = node.evalsha(load, 1, key, 10**9)
        payload = round_trip(reply[2]) if through_json else record
        won = node.evalsha(cas, 1, key, int(reply[1]), payload, 0, "i")[0] == 1
        counts["applied" if won else "conflict"] += 1
    redis_store._report(client, round_, start, counts)


def run_on(
    url: str,
    workers: Sequence[int] = (1, 4, 16),
    steps: int = 4000,
    sessions: int = 32,
    rounds: int = 3,
    replicas: int = 0,
) -> dict[str, Any]:
    """:func:`benchmarks.redis_store.run` on the cluster at ``url`` (its database is
    flushed), the floor's scripts sent to each key's node, the stores with
    ``replicas`` (``RedisStore(replicas=...)``)."""
    cluster_url = CLUSTER_SCHEME + url.removeprefix("redis://")
    return redis_store.run(
        workers,
        steps,
        sessions,
        url=cluster_url,
        rounds=rounds,
        store_options={"replicas": replicas},
        floor_worker=_floor_worker,
    )


def run(
    workers: Sequence[int] = (1, 4, 16),
    steps: int = 4000,
    sessions: int = 32,
    rounds: int = 3,
    replicas: int = 0,
) -> dict[str, Any]:
    """:func:`run_on` a private cluster."""
    with started() as cluster:
        result = run_on(cluster.url, workers, steps, sessions, rounds, replicas)
    result["server"] = (
        f"Redis Cluster: {cluster.masters} masters + {cluster.masters * cluster.replicas} "
        "replicas on 127.0.0.1, no persistence; the stores "
        + (f"wait for {replicas} replica(s) per write" if replicas else "do not wait for replicas")
    )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,4,16")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=0)
    args = parser.parse_args(argv)
    workers = tuple(int(w) for w in args.workers.split(","))
    result = run(workers, args.steps, args.sessions, args.rounds, args.replicas)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    os.environ.pop("STATEMACHINE_REDIS_URL", None)  # the cluster is always our own
    main()
