"""A fleet through an outage: many sessions against one vendor that fails, then recovers.

    python -m benchmarks.fleet                    # 200 sessions, every row (about 90 s)
    python -m benchmarks.fleet --sessions 1000 --only engine
    python -m benchmarks.fleet --scale 0.2        # the same story five times faster

A loopback vendor (OpenAI Chat Completions over plain HTTP/1.1, in a thread of its
own) serves :data:`CAPACITY` requests per second (a token bucket; a request over it
gets a bare 429). From ``OUTAGE.start`` every request gets 429 with ``retry-after``,
from ``OUTAGE.throttled_until`` 503 without one, and from ``OUTAGE.down_until`` it is
healthy again. The sessions start spread over the first three seconds (seeded), and
each needs one successful call. Every row runs the same story with its own client,
library defaults throughout:

* ``engine``: ``sm.arun_turn`` with ``AsyncOpenAIModel`` (the client's retries off:
  the engine owns them), each session its own ``sm.Session()``, no fleet state: what
  this engine does today;
* ``openai``: the raw ``openai.AsyncOpenAI`` client (``max_retries=2``);
* ``pydantic-ai`` and ``openai-agents``: an agent run over that client.

Per row: the requests the vendor received during the outage, the requests over its
capacity after it recovered, the time from recovery until 95 % of the sessions had
completed (``None`` when fewer did), and how many sessions ended with each status.
Issue 39's targets, for 200 sessions: at most 26 requests during the outage, every
session completed, 95 % done within 1 s of recovery; for 1,000 sessions, at most 5 %
of the requests after recovery over capacity. Wall-clock and real sockets: the
numbers move by a few percent between runs on a loaded machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from statemachine.dev._vendor import openai_completion, openai_error

MODEL = "gpt-4.1"
CAPACITY = 50.0
"""Requests per second the healthy vendor serves (also its burst)."""


@dataclass(frozen=True)
class Outage:
    """The story's moments, in seconds from the vendor's start (before ``scale``)."""

    start: float = 2.0
    throttled_until: float = 7.0  # 429 with retry-after until here
    down_until: float = 12.0  # 503 without retry-after until here; healthy after
    retry_after: float = 5.0
    arrivals: float = 3.0  # the sessions start spread over [0, arrivals)


OUTAGE = Outage()

_REPLY = json.dumps(openai_completion("done", tokens=(10, 2)).body).encode()
_THROTTLED = json.dumps(openai_error(429, "Rate limit reached", "rate_limit_error").body).encode()
_OVER = json.dumps(openai_error(429, "Over capacity", "rate_limit_error").body).encode()
_DOWN = json.dumps(openai_error(503, "The server is overloaded", "server_error").body).encode()
"""The bodies, as the project's loopback vendor writes them (``statemachine.dev._vendor``)."""


@dataclass
class Vendor:
    """The loopback vendor: every request is logged as ``(moment, kind)``.

    ``kind`` is ``ok``, ``over`` (a 429 for want of capacity), ``throttled`` (the
    outage's 429) or ``down`` (its 503); moments are in story seconds (real seconds
    divided by ``scale``).
    """

    outage: Outage = OUTAGE
    scale: float = 1.0
    capacity: float = CAPACITY
    log: list[tuple[float, str]] = field(default_factory=list)
    _tokens: float = 0.0
    _filled: float = 0.0
    _t0: float = 0.0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    url: str = ""

    def __post_init__(self) -> None:
        self._tokens = self.capacity

    def now(self) -> float:
        return (time.monotonic() - self._t0) / self.scale

    def start(self) -> None:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            server = loop.run_until_complete(
                asyncio.start_server(self._connection, "127.0.0.1", 0, backlog=2048)
            )
            port = server.sockets[0].getsockname()[1]
            self.url = f"http://127.0.0.1:{port}/v1"
            ready.set()
            loop.run_forever()
            server.close()
            loop.run_until_complete(server.wait_closed())
            loop.close()

        self._thread = threading.Thread(target=serve, name="fleet-vendor", daemon=True)
        self._thread.start()
        ready.wait()
        self.restart_clock()

    def restart_clock(self) -> None:
        self._t0 = time.monotonic()
        self._tokens, self._filled = self.capacity, 0.0
        self.log.clear()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    def _answer(self) -> tuple[int, dict[str, str], bytes]:
        moment, story = self.now(), self.outage
        if story.start <= moment < story.throttled_until:
            self.log.append((moment, "throttled"))
            wait = story.retry_after * self.scale
            header = (
                {"retry-after": f"{wait:g}"}
                if self.scale == 1
                else {"retry-after-ms": f"{wait * 1000:.0f}"}
            )
            return 429, header, _THROTTLED
        if story.throttled_until <= moment < story.down_until:
            self.log.append((moment, "down"))
            return 503, {}, _DOWN
        self._tokens = min(self.capacity, self._tokens + (moment - self._filled) * self.capacity)
        self._filled = moment
        if self._tokens < 1:
            self.log.append((moment, "over"))
            return 429, {}, _OVER
        self._tokens -= 1
        self.log.append((moment, "ok"))
        return 200, {}, _REPLY

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readline():
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                status, headers, body = self._answer()
                head = [f"HTTP/1.1 {status} X", "content-type: application/json"]
                head += [f"{k}: {v}" for k, v in headers.items()]
                head.append(f"content-length: {len(body)}")
                writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


# -- the rows: one session's call, per library ----------------------------------------

Call = Callable[[], Awaitable[str]]
"""One session's work: returns its status (``completed`` or what it ended with)."""


def _client(url: str, **kwargs: Any) -> Any:
    import openai

    return openai.AsyncOpenAI(base_url=url, api_key="sk-fleet", **kwargs)


def _failure(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    return f"{type(exc).__name__}" + (f" {status}" if status else "")


def _engine(url: str) -> tuple[Call, Any]:
    import statemachine as sm
    from statemachine.providers import AsyncOpenAIModel

    client = _client(url, max_retries=0)  # the engine owns retries
    model = AsyncOpenAIModel(client, model=MODEL)
    messages = [{"role": "user", "content": "hi"}]

    class Context:
        async def assemble(self, _action: Any) -> Any:
            return sm.Assembled({"messages": messages}, size=2)

    class Tools:
        async def invoke(self, call: Any) -> Any:  # pragma: no cover - no tools offered
            raise AssertionError(call)

    async def call() -> str:
        turn = sm.Session().new_turn()
        finish = await sm.arun_turn(turn, model=model, tools=Tools(), context=Context())
        return str(finish.status.value)

    return call, client


def _openai(url: str) -> tuple[Call, Any]:
    client = _client(url)

    async def call() -> str:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
        return "completed"

    return call, client


def _pydantic_ai(url: str) -> tuple[Call, Any]:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = _client(url)
    agent = Agent(OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client)))

    async def call() -> str:
        await agent.run("hi")
        return "completed"

    return call, client


def _openai_agents(url: str) -> tuple[Call, Any]:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        Runner,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    client = _client(url)
    agent = Agent(name="assistant", model=OpenAIChatCompletionsModel(MODEL, client))

    async def call() -> str:
        await Runner.run(agent, "hi")
        return "completed"

    return call, client


ROWS: dict[str, Callable[[str], tuple[Call, Any]]] = {
    "engine": _engine,
    "openai": _openai,
    "pydantic-ai": _pydantic_ai,
    "openai-agents": _openai_agents,
}


# -- one run ---------------------------------------------------------------------------


async def _fleet(vendor: Vendor, call: Call, sessions: int, seed: int) -> list[tuple[float, str]]:
    arrivals = random.Random(seed)
    starts = sorted(arrivals.uniform(0, vendor.outage.arrivals) for _ in range(sessions))

    async def one(start: float) -> tuple[float, str]:
        await asyncio.sleep(max(0.0, start - vendor.now()) * vendor.scale)
        try:
            status = await call()
        except Exception as exc:  # a library giving up is this row's result
            status = _failure(exc)
        return vendor.now(), status

    vendor.restart_clock()
    return await asyncio.gather(*(one(start) for start in starts))


def summarize(vendor: Vendor, ends: list[tuple[float, str]]) -> dict[str, Any]:
    """The row's numbers from the vendor's log and the sessions' ends."""
    story = vendor.outage
    after = [kind for moment, kind in vendor.log if moment >= story.down_until]
    done = sorted(moment for moment, status in ends if status == "completed")
    needed = math.ceil(0.95 * len(ends))
    return {
        "sessions": len(ends),
        "requests": len(vendor.log),
        "outage_requests": sum(
            story.start <= moment < story.down_until for moment, _ in vendor.log
        ),
        "after_recovery_requests": len(after),
        "over_capacity_after_recovery": after.count("over"),
        "p95_after_recovery_s": (
            round(max(0.0, done[needed - 1] - story.down_until), 3) if len(done) >= needed else None
        ),
        "statuses": dict(collections.Counter(status for _, status in ends)),
    }


def play(row: str, sessions: int = 200, scale: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """Run the outage once against ``row`` with ``sessions`` sessions."""
    vendor = Vendor(scale=scale)
    vendor.start()
    try:
        call, client = ROWS[row](vendor.url)

        async def run() -> list[tuple[float, str]]:
            try:
                return await _fleet(vendor, call, sessions, seed)
            finally:
                await client.close()

        ends = asyncio.run(run())
        return summarize(vendor, ends)
    finally:
        vendor.stop()


def run(
    sessions: int = 200, scale: float = 1.0, rows: tuple[str, ...] = tuple(ROWS), seed: int = 0
) -> dict[str, Any]:
    """Every row, one after the other (the runner's entry point)."""
    result: dict[str, Any] = {"sessions": sessions, "scale": scale, "rows": {}}
    for row in rows:
        try:
            result["rows"][row] = play(row, sessions, scale, seed)
        except ImportError as exc:
            result["rows"][row] = {"skipped": str(exc)}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__)
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--only", default=",".join(ROWS), help="rows, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = tuple(name for name in args.only.split(",") if name)
    unknown = [name for name in rows if name not in ROWS]
    if unknown:
        parser.error(f"--only: no row named {', '.join(unknown)} (rows: {', '.join(ROWS)})")
    print(json.dumps(run(args.sessions, args.scale, rows, args.seed), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
