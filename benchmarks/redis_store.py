"""Measurement: sessions advanced per second through Redis on loopback, and the CAS
conflict rate, with 1, 4 and 16 worker processes.

A private ``redis-server`` (no persistence) is started on 127.0.0.1 in a temporary
directory, or ``url=`` / ``$STATEMACHINE_REDIS_URL`` is used (its database is
flushed). ``sessions`` sessions are created; each worker process then makes
``steps // workers`` attempts, each one:

1. pick a session at random (all workers share all sessions: real contention),
2. ``Worker.load`` it (one Lua read) and let a scripted host choose the event the
   pending action asks for (assemble, a rate limit then success, tools, next turn),
3. ``Worker.advance`` it with that version (one Lua read, restore, one engine event,
   snapshot, one Lua compare-and-set).

An attempt is *applied* when its compare-and-set wins, a *conflict* when another
worker advanced that session between this worker's read and write. Throughput is
applied advances per second of wall time, from the moment all workers pass a Redis
barrier to the moment the last one finishes. The conflict rate is conflicts /
attempts. Records are 1-3 KB of JSON (settings, counters, the current turn's trace).

Each worker count runs ``rounds`` times, alternating with the floor (the same two Lua
scripts with a record of the same size, no engine): figures are medians over rounds,
the ratio ``of_floor`` the median of per-round ratios. Beside the rates, the worker
processes' CPU microseconds per attempt (``cpu_us_per_attempt``, ours and the floor's):
on a shared machine the steadier figure of what an attempt costs.

A third fleet runs in each round too, the *JSON floor*: the floor's two scripts with
one of our round's real records, which each attempt reads with ``json.loads`` and
writes back with ``json.dumps`` (no engine, no check, no journal). It is what any store
that keeps a session as JSON pays at the least when another worker changed it, so
``json_floor_of_floor`` bounds ``of_floor`` for every such design on this machine.

What does not scale out: the Redis server's CPU per attempt (``server_cpu_us_per_attempt``,
each fleet's), read from ``INFO cpu`` (``used_cpu_sys + used_cpu_user`` of the server's
process; on a cluster summed over its nodes) before and after each fleet's attempts and
divided by them; the barrier and the reports add a few commands per worker. More worker
machines share the workers' CPU; every advance still costs the server this much.
``server_cpu_of_floor`` is the median of per-round ratios of ours to the floor's; the
time inside the commands (``server_command_us_per_attempt``, the ``usec`` of ``INFO
commandstats`` summed; ``server_command_of_floor``) is beside it. Both grow per attempt
the slower a client sends, for the same commands: on the 2-core VM the floor's own
scripts sent 100 µs apart cost the server 1.6-2.6 x their CPU sent back to back
(``benchmarks/README.md``), so a fleet slower than the floor reads above it here.

``affinity=0.9`` (``--affinity 0.9``) adds two fleets to every round, ours and the floor,
in which a session's step goes to the worker that took its previous step with that
probability, else to another worker drawn at random (seeded): a sticky load balancer.
Each round draws one plan (:func:`affinity_plan`: ``steps`` steps on sessions drawn at
random, a session's first step on worker ``session % workers``) that both fleets follow;
every worker steps its sessions in the plan's order, so a session's steps may run out
of the plan's order across workers. ``steps_on_previous_worker`` is measured: the share
of applied advances whose previous version was applied by the same worker (about
``1 / workers`` in the default fleets). The results are under ``affinity``.

    python -m benchmarks.redis_store [--workers 1,4,16] [--steps 4000] [--sessions 32]
        [--rounds 3] [--affinity 0.9]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import statemachine as sm
from statemachine.store import AdvanceStatus, RedisStore, Worker

PREFIX = "bench"
_TIMEOUT_S = 30.0
"""The store's reply timeout here: a busy shared machine can hold a reply past the
default 2 s, which would end a measurement, not describe it."""
_WAIT_S = 600.0
"""The reply timeout of the clients that wait at the barrier and for the reports
(redis-py 8 gives every client a 5 s one by default)."""

Plan = list[list[int]]
"""The sessions (by number) each worker steps, in order, indexed by worker."""


def _client(url: str, timeout: float) -> Any:
    import redis

    if url.startswith("redis+cluster://"):  # benchmarks.redis_cluster's rounds
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url.replace("+cluster", "", 1), socket_timeout=timeout)
    return redis.Redis.from_url(url, socket_timeout=timeout)


def _settings() -> sm.Settings:
    return sm.Settings(session_retry_ceiling=10**9)


def _next_event(result: Any) -> object | None:
    """The scripted host: one rate limit per turn, then a reply with one tool call."""
    action = result.action
    if action is None or isinstance(action, sm.Finish):
        return None
    turn = result.session.current_turn
    if isinstance(action, sm.Assemble):
        return sm.Assembled({"turn": turn.index}, 100)
    if isinstance(action, sm.CallModel):
        if action.attempt == 0:
            return sm.ModelFailed(sm.ModelError("rate_limited"))
        call = sm.ToolCall(f"t{turn.index}", "p", "search", {"q": turn.index})
        return sm.ModelReplied(tool_calls=(call,), cost=0.001)
    if isinstance(action, sm.Wait):
        return sm.WaitDone()
    if isinstance(action, sm.InvokeTools):
        return sm.ToolsDone(tuple(sm.ToolOutcome(c.id, True, "ok") for c in action.calls))
    raise AssertionError(f"unexpected action {action!r}")


def _barrier(client: Any, round_: str, parties: int) -> tuple[dict[str, int], float]:
    """Wait until all ``parties`` of the round have arrived; zeroed counts and the start
    (the process's CPU time at the start is kept in the counts, as ``cpu``)."""
    if client.incr(f"{round_}:arrived") == parties:
        client.rpush(f"{round_}:gate", *["go"] * parties)
    client.blpop([f"{round_}:gate"], timeout=60)
    counts = {status.value: 0 for status in AdvanceStatus}
    counts["cpu"] = time.process_time()  # type: ignore[assignment]
    return counts, time.monotonic()


def _report(
    client: Any,
    round_: str,
    start: float,
    counts: dict[str, int],
    versions: list[tuple[int, int]] | None = None,
) -> None:
    """Push one process's counts, times, CPU seconds since the barrier and the
    ``(session, version)`` of each advance it applied to the round's results, and
    disconnect."""
    end = time.monotonic()
    counts["cpu"] = time.process_time() - counts["cpu"]  # type: ignore[assignment]
    report = {"start": start, "end": end, **counts, "versions": versions or []}
    client.rpush(f"{round_}:results", json.dumps(report))
    client.close()


def _server_s(client: Any) -> tuple[float, float]:
    """The Redis server's CPU seconds so far (``used_cpu_sys + used_cpu_user`` of its
    process from ``INFO cpu``) and its seconds inside commands (the ``usec`` of
    ``INFO commandstats``), each summed over a cluster's nodes."""
    if hasattr(client, "get_nodes"):  # a RedisCluster: every node, replicas too
        nodes = [client.get_redis_connection(node) for node in client.get_nodes()]
    else:
        nodes = [client]
    cpu = commands = 0.0
    for node in nodes:
        info = node.info("cpu")
        cpu += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        commands += sum(stat["usec"] for stat in node.info("commandstats").values()) / 1e6
    return cpu, commands


def _per_attempt_us(
    before: tuple[float, float], after: tuple[float, float], attempts: int
) -> dict[str, float]:
    """The server's CPU and command time between two :func:`_server_s` readings, in
    µs per attempt."""
    cpu, commands = (a - b for a, b in zip(after, before, strict=True))
    per = 1e6 / attempts if attempts else 0.0
    return {"server_cpu_us_per_attempt": cpu * per, "server_command_us_per_attempt": commands * per}


def affinity_plan(workers: int, steps: int, sessions: int, affinity: float, seed: int) -> Plan:
    """Which sessions each of ``workers`` steps, in order: ``steps`` steps, each on a
    session drawn at random; the step goes to the worker that took the session's
    previous step with probability ``affinity``, else to another worker drawn at random
    (a session's first step to worker ``session % workers``)."""
    rng = random.Random(seed)
    holder: dict[int, int] = {}
    plan: list[list[int]] = [[] for _ in range(workers)]
    for _ in range(steps):
        session = rng.randrange(sessions)
        worker = holder.get(session, session % workers)
        if session in holder and workers > 1 and rng.random() >= affinity:
            other = rng.randrange(workers - 1)
            worker = other + (other >= worker)
        holder[session] = worker
        plan[worker].append(session)
    return plan


def _draws(index: int, sessions: int, attempts: int, plan: Plan | None) -> Iterator[int]:
    """The sessions worker ``index`` steps: its part of ``plan``, or ``attempts`` drawn
    at random (seeded by ``index``)."""
    if plan is not None:
        yield from plan[index]
        return
    rng = random.Random(index)
    for _ in range(attempts):
        yield rng.randrange(sessions)


def _on_previous_worker(reports: list[dict[str, Any]]) -> float:
    """The share of applied advances (after each session's first) whose previous
    version was applied by the same worker."""
    applier = {
        (session, version): index
        for index, report in enumerate(reports)
        for session, version in report["versions"]
    }
    follows = [(key, index) for key, index in applier.items() if (key[0], key[1] - 1) in applier]
    same = sum(applier[(session, version - 1)] == index for (session, version), index in follows)
    return same / len(follows) if follows else 1.0


def _cpu_us(reports: list[dict[str, Any]], attempts: int) -> float:
    """The worker processes' CPU microseconds (user + system) per attempt: on a shared
    machine a steadier figure than the rate, which also counts the waits."""
    return sum(r["cpu"] for r in reports) / attempts * 1e6 if attempts else 0.0


def _worker(
    url: str,
    round_: str,
    parties: int,
    index: int,
    sessions: int,
    attempts: int,
    options: dict[str, Any],
    plan: Plan | None,
) -> None:
    """One worker process: wait at the barrier, make ``attempts`` attempts (or its part
    of ``plan``), report (``options``: more options of its ``RedisStore``)."""
    # the barrier and the report on a client of their own: the store sets its
    # reply timeout on its client's pool, and the barrier may wait longer
    client = _client(url, _WAIT_S)
    store = RedisStore(_client(url, _TIMEOUT_S), prefix=PREFIX, timeout_s=_TIMEOUT_S, **options)
    worker = Worker(store, owner=f"w{index}")
    versions: list[tuple[int, int]] = []
    counts, start = _barrier(client, round_, parties)
    for session in _draws(index, sessions, attempts, plan):
        session_id = f"s{session}"
        result = worker.load(session_id)
        event = _next_event(result)
        outcome = worker.advance(session_id, event, expected_version=result.version)
        counts[outcome.status.value] += 1
        if outcome.status is AdvanceStatus.APPLIED:
            versions.append((session, outcome.version))
    _report(client, round_, start, counts, versions)


def json_round_trip(record: bytes) -> bytes:
    """What the JSON floor does to a record between its two scripts: parse it, write it
    back (as the store writes a record: compact, UTF-8)."""
    return json.dumps(json.loads(record), separators=(",", ":")).encode()


def _floor_worker(
    url: str,
    round_: str,
    parties: int,
    index: int,
    sessions: int,
    attempts: int,
    record: bytes,
    through_json: bool,
    plan: Plan | None = None,
) -> None:
    """The floor: the same two Lua scripts per attempt (load, then compare-and-set at
    the version read) writing ``record``, no engine; with ``through_json`` (the JSON
    floor) the record read is parsed and written back as JSON in between; with
    ``plan``, its part of the plan instead of ``attempts`` sessions drawn at random."""

    from statemachine.store._redis import _CAS, _LOAD

    client = _client(url, _WAIT_S)
    load, cas = client.register_script(_LOAD), client.register_script(_CAS)
    counts, start = _barrier(client, round_, parties)
    for session in _draws(index, sessions, attempts, plan):
        key = f"floor:session:s{session}"
        reply = load(keys=[key], args=[10**9])
        version = int(reply[1])
        payload = json_round_trip(reply[2]) if through_json else record
        won = cas(keys=[key], args=[version, payload, 0, "i"])[0] == 1
        counts["applied" if won else "conflict"] += 1
    _report(client, round_, start, counts)


def _floor_round(
    url: str,
    workers: int,
    steps: int,
    sessions: int,
    record: bytes,
    floor_worker: Any,
    through_json: bool = False,
    plan: Plan | None = None,
) -> dict[str, Any]:
    """The raw Lua compare-and-set rate with ``workers`` processes of ``floor_worker``
    writing ``record`` (``through_json``: the JSON floor; ``plan``: the sessions each
    worker steps), measured the way :func:`_round` measures the worker."""

    from statemachine.store._redis import _CAS

    client = _client(url, _WAIT_S)
    try:
        cas = client.register_script(_CAS)
        for i in range(sessions):
            key = f"floor:session:s{i}"
            client.delete(key)
            cas(keys=[key], args=[0, record, 0, "i"])
        round_ = f"{'json' if through_json else ''}floor{workers}{'plan' if plan else ''}"
        server = _server_s(client)
        reports = _run_processes(
            client,
            round_,
            workers,
            floor_worker,
            (url, round_, workers),
            (sessions, max(1, steps // workers), record, through_json, plan),
        )
        after = _server_s(client)
        applied = sum(r["applied"] for r in reports)
        total = sum(r["applied"] + r["conflict"] for r in reports)
        wall = max(r["end"] for r in reports) - min(r["start"] for r in reports)
        return {
            "sessions_per_s": applied / wall if wall else float("inf"),
            "conflict_rate": (total - applied) / total if total else 0.0,
            "cpu_us_per_attempt": _cpu_us(reports, total),
            **_per_attempt_us(server, after, total),
        }
    finally:
        client.close()


def _run_processes(
    client: Any,
    round_: str,
    workers: int,
    target: Any,
    head: tuple[Any, ...],
    tail: tuple[Any, ...],
) -> list[dict[str, Any]]:
    """Start ``workers`` processes of ``target(*head, index, *tail)`` and collect their
    reports."""
    context = multiprocessing.get_context("fork" if os.name == "posix" else "spawn")
    procs = [
        context.Process(target=target, args=(*head, i, *tail), daemon=True) for i in range(workers)
    ]
    for proc in procs:
        proc.start()
    reports: list[dict[str, Any]] = []
    deadline = time.monotonic() + 300
    try:
        while len(reports) < workers:
            item = client.blpop([f"{round_}:results"], timeout=1)
            if item is not None:
                reports.append(json.loads(item[1]))
                continue
            # a worker that died (an exception, a broken script) ends the round at once
            failed = [proc.exitcode for proc in procs if proc.exitcode not in (None, 0)]
            if failed:
                raise RuntimeError(
                    f"a worker of the {workers}-worker round {round_} exited with {failed[0]}"
                )
            if time.monotonic() > deadline or all(proc.exitcode == 0 for proc in procs):
                missing = workers - len(reports)
                raise RuntimeError(
                    f"{missing} worker(s) of the {workers}-worker round {round_} never reported"
                )
    finally:
        for proc in procs:
            proc.join(timeout=30 if len(reports) == workers else 0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    return reports


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def _server(url: str | None) -> Iterator[tuple[str, str]]:
    """A Redis URL to use, and a description of the server."""
    import redis

    if url:
        yield url, f"given: {url}"
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not on PATH (or pass url=)")
    with tempfile.TemporaryDirectory() as directory:
        port = _free_port()
        command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory]
        command += ["--save", "", "--appendonly", "no", "--loglevel", "warning"]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)  # noqa: S603 - our own argv
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    break
                except redis.exceptions.ConnectionError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
                    with suppress(subprocess.TimeoutExpired):  # a bounded wait
                        proc.wait(timeout=0.02)
            version = client.info("server").get("redis_version", "?")
            yield url, f"redis-server {version} on 127.0.0.1, no persistence"
        finally:
            client.close()
            proc.terminate()
            proc.wait(timeout=10)


def _round(
    url: str,
    workers: int,
    steps: int,
    sessions: int,
    options: dict[str, Any],
    plan: Plan | None = None,
) -> dict[str, Any]:
    """Our fleet's round: ``sessions`` fresh sessions, ``workers`` processes of
    :func:`_worker` (each with its part of ``plan``, or its share of ``steps`` drawn at
    random)."""

    client = _client(url, _WAIT_S)
    try:
        client.flushdb()
        # the store on a client of its own (it sets its reply timeout on its pool)
        store = RedisStore(_client(url, _TIMEOUT_S), prefix=PREFIX, timeout_s=_TIMEOUT_S, **options)
        setup = Worker(store, owner="setup")
        for i in range(sessions):
            setup.create(f"s{i}", sm.Session(_settings(), seed=i))
        round_ = f"round{workers}{'plan' if plan else ''}"
        server = _server_s(client)
        reports = _run_processes(
            client,
            round_,
            workers,
            _worker,
            (url, round_, workers),
            (sessions, max(1, steps // workers), options, plan),
        )
        after = _server_s(client)
        applied = sum(r["applied"] for r in reports)
        conflicts = sum(r["conflict"] for r in reports)
        total = sum(sum(r[s.value] for s in AdvanceStatus) for r in reports)
        wall = max(r["end"] for r in reports) - min(r["start"] for r in reports)
        versions = sum(setup.load(f"s{i}").version - 1 for i in range(sessions))
        records = [client.hget(store.key(f"s{i}"), "record") for i in range(sessions)]
        record_bytes = sum(len(record) for record in records) / max(1, sessions)
        if versions != applied:
            raise AssertionError(f"{applied} advances applied but versions moved {versions}")
        return {
            "attempts": total,
            "applied": applied,
            "conflicts": conflicts,
            "wall_s": wall,
            "sessions_per_s": applied / wall if wall else float("inf"),
            "conflict_rate": conflicts / total if total else 0.0,
            "record_bytes": round(record_bytes),
            "cpu_us_per_attempt": _cpu_us(reports, total),
            **_per_attempt_us(server, after, total),
            "steps_on_previous_worker": _on_previous_worker(reports),
            # the JSON floor's: the record nearest the mean size
            "record": min(records, key=lambda record: abs(len(record) - record_bytes)),
        }
    finally:
        client.close()


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def run(
    workers: Sequence[int] = (1, 4, 16),
    steps: int = 4000,
    sessions: int = 32,
    url: str | None = None,
    rounds: int = 3,
    *,
    affinity: float | None = None,
    store_options: dict[str, Any] | None = None,
    floor_worker: Any = _floor_worker,
) -> dict[str, Any]:
    """Sessions advanced per second and CAS conflict rate for each worker count, beside
    the floor and the JSON floor: interleaved (for each worker count, our round, the
    floor's, the JSON floor's, and ``rounds`` times over), medians over rounds, the
    ratios the medians of per-round ratios to the floor. ``affinity``: also ours and the
    floor on a plan where a session's step lands on the worker that took its previous
    step with that probability (results under ``affinity``). ``store_options``: more
    options of every ``RedisStore``; ``floor_worker``: the process that makes the
    floors' attempts (``benchmarks.redis_cluster`` gives its own)."""
    options = store_options or {}
    url = url or os.environ.get("STATEMACHINE_REDIS_URL")
    fleets = ("ours", "floor", "json_floor", "ours_affinity", "floor_affinity")
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {
        fleet: {str(count): [] for count in workers} for fleet in fleets
    }
    with _server(url) as (server_url, server):
        for round_ in range(rounds):
            for count in workers:
                mine = _round(server_url, count, steps, sessions, options)
                rows["ours"][str(count)].append(mine)
                filler = b"x" * mine["record_bytes"]
                floor_round = (server_url, count, steps, sessions)
                rows["floor"][str(count)].append(_floor_round(*floor_round, filler, floor_worker))
                rows["json_floor"][str(count)].append(
                    _floor_round(*floor_round, mine["record"], floor_worker, True)
                )
                if affinity is None:
                    continue
                plan = affinity_plan(count, steps, sessions, affinity, seed=round_ * 1000 + count)
                rows["ours_affinity"][str(count)].append(
                    _round(server_url, count, steps, sessions, options, plan)
                )
                rows["floor_affinity"][str(count)].append(
                    _floor_round(*floor_round, filler, floor_worker, plan=plan)
                )
    result = {
        "unit": "sessions advanced (one event applied with CAS) per second, N worker processes",
        "server": server,
        "sessions": sessions,
        "steps": steps,
        "rounds": rounds,
        "cpus": os.cpu_count(),
        **_summary(rows["ours"], rows["floor"], rows["json_floor"]),
    }
    if affinity is not None:
        result["affinity"] = {
            "share": affinity,
            **_summary(rows["ours_affinity"], rows["floor_affinity"], None),
        }
    return result


Rows = dict[str, list[dict[str, Any]]]
"""A fleet's rounds' results by worker count."""


def _median_of(rows: Rows, field: str, digits: int) -> dict[str, Any]:
    return {k: round(_median([r[field] for r in v]), digits) for k, v in rows.items()}


def _per_round(tops: Rows, bottoms: Rows, field: str) -> dict[str, list[float]]:
    """Each round's ``field`` of ``tops`` over the same round's of ``bottoms``."""
    return {
        k: [
            a[field] / f[field] if f[field] else float("inf")
            for a, f in zip(tops[k], bottoms[k], strict=True)
        ]
        for k in tops
    }


def _ratios(name: str, per_round: dict[str, list[float]]) -> dict[str, Any]:
    return {
        name: {k: round(_median(v), 3) for k, v in per_round.items()},
        f"{name}_rounds": {k: [round(r, 3) for r in v] for k, v in per_round.items()},
    }


def _summary(ours: Rows, floors: Rows, json_floors: Rows | None) -> dict[str, Any]:
    """The medians and per-round ratios of our fleet, its floor and (if run) its JSON
    floor."""
    summary = {
        "sessions_per_s": _median_of(ours, "sessions_per_s", 1),
        "conflict_rate": _median_of(ours, "conflict_rate", 4),
        "applied": _median_of(ours, "applied", 0),
        "conflicts": _median_of(ours, "conflicts", 0),
        "mean_record_bytes": _median_of(ours, "record_bytes", 0),
        "steps_on_previous_worker": _median_of(ours, "steps_on_previous_worker", 3),
        "floor_sessions_per_s": _median_of(floors, "sessions_per_s", 1),
        "floor_conflict_rate": _median_of(floors, "conflict_rate", 4),
        "cpu_us_per_attempt": _median_of(ours, "cpu_us_per_attempt", 1),
        "floor_cpu_us_per_attempt": _median_of(floors, "cpu_us_per_attempt", 1),
        "server_cpu_us_per_attempt": _median_of(ours, "server_cpu_us_per_attempt", 1),
        "floor_server_cpu_us_per_attempt": _median_of(floors, "server_cpu_us_per_attempt", 1),
        "server_command_us_per_attempt": _median_of(ours, "server_command_us_per_attempt", 1),
        "floor_server_command_us_per_attempt": _median_of(
            floors, "server_command_us_per_attempt", 1
        ),
        **_ratios("of_floor", _per_round(ours, floors, "sessions_per_s")),
        **_ratios("server_cpu_of_floor", _per_round(ours, floors, "server_cpu_us_per_attempt")),
        **_ratios(
            "server_command_of_floor", _per_round(ours, floors, "server_command_us_per_attempt")
        ),
    }
    if json_floors is not None:
        summary |= {
            "json_floor_sessions_per_s": _median_of(json_floors, "sessions_per_s", 1),
            "json_floor_conflict_rate": _median_of(json_floors, "conflict_rate", 4),
            "json_floor_cpu_us_per_attempt": _median_of(json_floors, "cpu_us_per_attempt", 1),
            "json_floor_server_cpu_us_per_attempt": _median_of(
                json_floors, "server_cpu_us_per_attempt", 1
            ),
            **_ratios("json_floor_of_floor", _per_round(json_floors, floors, "sessions_per_s")),
        }
    return summary


def lines(result: dict[str, Any]) -> list[str]:
    """The printed report of :func:`run`'s result: one row per worker count."""
    out = [f"  {result['unit']}; {result['server']}"]
    out += _rows(result, "random sessions")
    if "affinity" in result:
        share = result["affinity"]["share"]
        out += _rows(result["affinity"], f"{share:.0%} of a session's steps on its previous worker")
    return out


def _rows(r: dict[str, Any], title: str) -> list[str]:
    """One row per worker count of a fleet's summary."""
    out = [
        f"  {title}:",
        "    workers  ours/s  floor/s  of floor  conflicts  on previous worker"
        "  server µs/attempt, ours / floor (ratio): CPU; in commands",
    ]
    out += [_row(r, k) for k in r["sessions_per_s"]]
    return out


def _row(r: dict[str, Any], k: str) -> str:
    server, floor = r["server_cpu_us_per_attempt"][k], r["floor_server_cpu_us_per_attempt"][k]
    inside = r["server_command_us_per_attempt"][k]
    floor_inside = r["floor_server_command_us_per_attempt"][k]
    return (
        f"    {k:>7}  {r['sessions_per_s'][k]:>6,.0f}  {r['floor_sessions_per_s'][k]:>7,.0f}"
        f"  {r['of_floor'][k]:>8.0%}  {r['conflict_rate'][k]:>9.1%}"
        f"  {r['steps_on_previous_worker'][k]:>18.0%}"
        f"  {server:,.0f} / {floor:,.0f} ({r['server_cpu_of_floor'][k]:.2f});"
        f" {inside:,.1f} / {floor_inside:,.1f} ({r['server_command_of_floor'][k]:.2f})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,4,16")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--url", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--affinity",
        type=float,
        default=None,
        help="also run fleets where this share of a session's steps lands on its previous worker",
    )
    args = parser.parse_args(argv)
    workers = tuple(int(w) for w in args.workers.split(","))
    result = run(workers, args.steps, args.sessions, args.url, args.rounds, affinity=args.affinity)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
