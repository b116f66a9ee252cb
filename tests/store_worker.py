"""Helpers for the session-store tests: a real ``redis-server`` on loopback, a scripted
host that picks the next event from the stored state, and a worker *process*.

Run as a worker (the tests do this)::

    python -m tests.store_worker race  --port P --prefix X --session S --owner A
    python -m tests.store_worker claim --port P --prefix X --session S --owner A

``race`` advances the session to the end of the plan, printing one JSON line per
attempt; ``claim`` advances it until tool calls are handed out, prints one JSON line
``{"claimed": ...}`` and then blocks (on stdin) until it is killed.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import statemachine as sm
from statemachine.store import Advanced, AdvanceStatus, RedisStore, Worker

STOP = object()
"""What ``next_event`` returns when the plan is done."""

TURNS = 6
FAILURES = 2
"""The race plan: six turns, each with two rate limits before a reply with one tool call."""


def settings() -> sm.Settings:
    """The settings every store test uses (retries ample, no bound fires early)."""
    return sm.Settings(session_retry_ceiling=1000)


def next_event(result: Advanced, *, turns: int = TURNS, failures: int = FAILURES) -> object:
    """The scripted host: the event owed for ``result.action``, ``None`` for a new
    turn, or ``STOP`` once ``turns`` turns have finished (or the session ended).

    Turn n: Assembled -> ``failures`` rate limits (each followed by WaitDone) ->
    a reply asking for a ``search`` (idempotent) and a ``write`` call -> ToolsDone.
    """
    action = result.action
    session = result.session
    turn = session.current_turn
    if action is None or isinstance(action, sm.Finish):
        if session.status is not None or session.turns >= turns:
            return STOP
        return None
    assert turn is not None
    if isinstance(action, sm.Assemble):
        return sm.Assembled({"turn": turn.index}, 100)
    if isinstance(action, sm.CallModel):
        if action.attempt < failures:
            return sm.ModelFailed(sm.ModelError("rate_limited", "slow down"))
        return sm.ModelReplied(
            tool_calls=(
                sm.ToolCall(f"t{turn.index}-s", "index", "search", {"q": turn.index}),
                sm.ToolCall(f"t{turn.index}-w", "disk", "write", {"n": turn.index}),
            ),
            cost=0.01,
        )
    if isinstance(action, sm.Wait):
        return sm.WaitDone()
    if isinstance(action, sm.InvokeTools):
        return sm.ToolsDone(tuple(sm.ToolOutcome(c.id, True, "ok") for c in action.calls))
    raise AssertionError(f"unexpected action {action!r}")  # pragma: no cover


class Clock:
    """A clock the test moves by hand (``clock.now += 5``)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


# -- a real redis-server ----------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """A ``redis-server`` child process on 127.0.0.1, its data in ``directory``.

    ``persistent``: append-only file with ``appendfsync always`` (every write is on
    disk before the reply); otherwise no persistence at all (``--save ''``,
    ``--appendonly no``), so a restart loses everything.
    """

    def __init__(self, directory: Path, *, persistent: bool = False) -> None:
        self.directory = directory
        self.persistent = persistent
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("redis-server") is not None

    def command(self) -> list[str]:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
            if self.persistent
            else ["--appendonly", "no", "--save", ""]
        )
        return [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--protected-mode",
            "yes",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            *persistence,
        ]

    def start(self, timeout: float = 10.0, *, keep_port: bool = False) -> None:
        """Start it and return once it answers PING (bounded by ``timeout``).

        The free port may be taken between the probe and the bind: then another port
        is tried, unless ``keep_port`` (a restart must come back where it was).
        """
        import redis

        for _ in range(1 if keep_port else 3):
            self.proc = subprocess.Popen(
                self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1.0)
            deadline = time.monotonic() + timeout
            try:
                while time.monotonic() < deadline:
                    try:
                        if client.ping():
                            return
                    except redis.exceptions.ConnectionError:  # refused, or still loading
                        pass
                    try:  # a bounded wait that also notices an early exit
                        self.proc.wait(timeout=0.02)
                    except subprocess.TimeoutExpired:
                        continue
                    break
            finally:
                client.close()
            self._reap()
            if not keep_port:
                self.port = free_port()
        raise RuntimeError(f"redis-server did not start: {self.command()}")

    def _reap(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                proc.kill()
                proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        self.proc = None

    def stop(self) -> None:
        """Stop it (SIGTERM: a clean shutdown) and wait for the process to end."""
        self._reap()

    def restart(self) -> None:
        """Stop it and start it again on the same port and directory."""
        self.stop()
        self.start(keep_port=True)

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


# -- reading a child's lines with a deadline ---------------------------------------------


def read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The next line ``proc`` prints, waiting at most ``timeout`` seconds."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while not buffer.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not selector.select(left):
                raise TimeoutError(f"no line from worker {proc.args!r} in {timeout} s")
            chunk = os.read(proc.stdout.fileno(), 1)
            if not chunk:
                raise EOFError(f"worker {proc.args!r} exited: {buffer!r}")
            buffer += chunk
    return buffer.decode()


def spawn(mode: str, server: RedisServer, prefix: str, session_id: str, owner: str) -> Any:
    """Start a worker process in ``mode`` (see the module docstring)."""
    root = Path(__file__).resolve().parent.parent
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.store_worker",
            mode,
            "--port",
            str(server.port),
            "--prefix",
            prefix,
            "--session",
            session_id,
            "--owner",
            owner,
        ],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(root)},
    )


# -- the worker process ------------------------------------------------------------------


def _barrier(client: Any, prefix: str, parties: int = 2) -> None:
    """Wait until ``parties`` workers have arrived; the last one opens the gate."""
    if client.incr(f"{prefix}:arrived") == parties:
        client.rpush(f"{prefix}:gate", *["go"] * parties)
    if client.blpop([f"{prefix}:gate"], timeout=20) is None:
        raise TimeoutError("the other worker never arrived")


def _race(worker: Worker, client: Any, prefix: str, session_id: str) -> None:
    _barrier(client, prefix)
    result = worker.load(session_id)
    while True:
        event = next_event(result)
        if event is STOP:
            break
        expected = result.version
        result = worker.advance(session_id, event, expected_version=expected)
        line = {"v": expected, "status": result.status.value, "event": type(event).__name__}
        sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.write(json.dumps({"done": result.version}) + "\n")
    sys.stdout.flush()


def _claim(worker: Worker, session_id: str) -> None:
    result = worker.load(session_id)
    while not isinstance(result.action, sm.InvokeTools):
        event = next_event(result, turns=2)
        result = worker.advance(session_id, event, expected_version=result.version)
        if result.status is not AdvanceStatus.APPLIED:
            raise AssertionError(f"unexpected {result.status}")
    session = result.session
    line = {
        "claimed": result.version,
        "calls": [c.id for c in result.action.calls],
        "retries": session.retries_used,
        "turns": session.turns,
        "cost": session.cost_usd,
    }
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()
    sys.stdin.read()  # "run the tools" until killed


def main(argv: list[str] | None = None) -> None:
    import redis

    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["race", "claim"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--owner", required=True)
    args = parser.parse_args(argv)
    client = redis.Redis(host="127.0.0.1", port=args.port)
    worker = Worker(
        RedisStore(client, prefix=args.prefix),
        owner=args.owner,
        clock=lambda: 0.0,
        now=lambda: 1000.0,
    )
    try:
        if args.mode == "race":
            _race(worker, client, args.prefix, args.session)
        else:
            _claim(worker, args.session)
    finally:
        client.close()


if __name__ == "__main__":
    main()
