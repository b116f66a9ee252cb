"""Measurement 4b: events per second through the asyncio driver ``sm.arun_turn``.

``n`` (10,000) turns, each in its own session, run concurrently with
``asyncio.gather`` through zero-latency fake providers (coroutines that return at
once). Half the turns take the happy path (3 transitions), half a tool round (the
model asks for two tool calls, one of which crashes: 4 transitions), and every
fifth model call first fails with a rate limit that the driver turns into a
``Wait`` (a no-op ``sleep``) and a retry. Events per second = transitions taken (the
sum of the turns' trace lengths) / wall-clock seconds of the ``gather``. Also
reported: the same turns driven by hand through ``turn.send`` (no asyncio), to show
what the driver adds, and µs per event through the driver for each path alone.

If the driver is not implemented yet (``NotImplementedError``), the measurement is
skipped with a message.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from typing import Any

import statemachine as sm

REQUEST = {"messages": [{"role": "user", "content": "hi"}]}
ASSEMBLED = sm.Assembled(REQUEST, 1000)
CALLS = (
    sm.ToolCall("call-1", "plugin-a", "search", {"query": "weather"}),
    sm.ToolCall("call-2", "plugin-b", "fetch", {"url": "http://127.0.0.1/"}),
)
REPLY_TOOLS = sm.ModelReplied(tool_calls=CALLS)
REPLY = sm.ModelReplied()
RATE_LIMITED = sm.ModelError("rate_limited")


class _RateLimited(Exception):
    """A provider-neutral 429: ``sm.classify`` reads its ``status_code``."""

    status_code = 429


class FakeContext:
    """Zero-latency context provider."""

    async def assemble(self, _action: Any) -> Any:
        return ASSEMBLED


class FakeModel:
    """Zero-latency model: with ``tools`` the first reply asks for two tool calls;
    with ``flaky`` the first call fails with a rate limit."""

    def __init__(self, *, tools: bool, flaky: bool) -> None:
        self.tools = tools
        self.flaky = flaky

    async def complete(self, action: Any) -> Any:
        if self.flaky and action.attempt == 0:
            raise RATE_LIMITED_EXC
        return REPLY_TOOLS if self.tools else REPLY


class FakeTools:
    """Zero-latency tools: ``plugin-b`` crashes."""

    async def invoke(self, call: Any) -> Any:
        if call.provider == "plugin-b":
            return sm.ToolOutcome(call.id, ok=False, content="died", category="process_crashed")
        return sm.ToolOutcome(call.id, ok=True, content="sunny")


async def _noop_sleep(_seconds: float) -> None:
    return None


def _rate_limited_exception() -> Exception:
    """What a real SDK raises for HTTP 429: ``anthropic.RateLimitError`` if installed."""
    try:
        import anthropic
        import httpx2 as httpx  # what current anthropic SDKs are built on

        request = httpx.Request("POST", "http://127.0.0.1/v1/messages")
        response = httpx.Response(429, request=request, headers={"retry-after": "0"})
        return anthropic.RateLimitError("rate limited", response=response, body=None)
    except Exception:  # pragma: no cover - anthropic is an optional dependency
        return _RateLimited("429")


RATE_LIMITED_EXC = _rate_limited_exception()


def _jobs(n: int) -> list[tuple[sm.Turn, FakeModel]]:
    """A mix: every other turn has a tool round, every fifth a rate limit."""
    jobs = []
    for i in range(n):
        turn = sm.Session(seed=i, clock=time.monotonic).new_turn()
        jobs.append((turn, FakeModel(tools=i % 2 == 1, flaky=i % 5 == 0)))
    return jobs


def _path_jobs(n: int, tools: bool, flaky: bool) -> list[tuple[sm.Turn, FakeModel]]:
    """``n`` turns that all take one path."""
    return [
        (sm.Session(seed=i, clock=time.monotonic).new_turn(), FakeModel(tools=tools, flaky=flaky))
        for i in range(n)
    ]


async def _gather(jobs: list[tuple[sm.Turn, FakeModel]]) -> list[Any]:
    context, tools = FakeContext(), FakeTools()
    return await asyncio.gather(
        *(
            sm.arun_turn(turn, model=model, tools=tools, context=context, sleep=_noop_sleep)
            for turn, model in jobs
        )
    )


def _by_hand(jobs: list[tuple[sm.Turn, FakeModel]]) -> None:
    """The same paths through ``turn.send``, events prebuilt, no asyncio."""
    failed = sm.ModelFailed(RATE_LIMITED)
    done = sm.WaitDone()
    crash = sm.ToolsDone(
        (
            sm.ToolOutcome("call-1", ok=True, content="sunny"),
            sm.ToolOutcome("call-2", ok=False, content="died", category="process_crashed"),
        )
    )
    for turn, model in jobs:
        turn.start()
        turn.send(ASSEMBLED)
        if model.flaky:
            turn.send(failed)
            turn.send(done)
        if model.tools:
            turn.send(REPLY_TOOLS)
            turn.send(crash)
        else:
            turn.send(REPLY)


class _Attempt:
    """What the hand-written loop passes its model: just an attempt number."""

    __slots__ = ("attempt",)

    def __init__(self, attempt: int) -> None:
        self.attempt = attempt


_ATTEMPTS = tuple(_Attempt(i) for i in range(8))


async def _floor_turn(model: FakeModel, tools: FakeTools, context: FakeContext) -> None:
    """The same awaits written by hand, with no engine: assemble; call the model,
    sleeping and calling again after an exception; run the reply's tool calls together
    (a TaskGroup for two or more, as the driver does)."""
    await context.assemble(None)
    attempt = 0
    while True:
        try:
            reply = await model.complete(_ATTEMPTS[attempt])
        except Exception:
            await _noop_sleep(0.0)
            attempt += 1
            continue
        break
    calls = reply.tool_calls
    if len(calls) == 1:
        await tools.invoke(calls[0])
    elif calls:
        async with asyncio.TaskGroup() as group:
            for call in calls:
                group.create_task(tools.invoke(call))


async def _floor(models: list[FakeModel]) -> None:
    context, tools = FakeContext(), FakeTools()
    await asyncio.gather(*(_floor_turn(model, tools, context) for model in models))


def _floor_ratios(n: int, repeats: int) -> dict[str, float]:
    """Per path, µs per turn through ``arun_turn`` over the hand-written loop's, the
    two run alternately (a ratio per pair of runs, the median of the ratios)."""
    out = {}
    for label, tools, flaky in (
        ("happy", False, False),
        ("tool round", True, False),
        ("rate limit", False, True),
    ):
        ratios = []
        for _ in range(repeats):
            jobs = _path_jobs(n, tools, flaky)
            gc.collect()
            t0 = time.perf_counter()
            asyncio.run(_gather(jobs))
            driver = time.perf_counter() - t0
            models = [FakeModel(tools=tools, flaky=flaky) for _ in range(n)]
            gc.collect()
            t0 = time.perf_counter()
            asyncio.run(_floor(models))
            ratios.append(driver / (time.perf_counter() - t0))
        out[label] = statistics.median(ratios)
    return out


class SyncContext:
    def assemble(self, _action: Any) -> Any:
        return ASSEMBLED


class SyncModel:
    """The blocking twin of :class:`FakeModel`."""

    def __init__(self, *, tools: bool, flaky: bool) -> None:
        self.tools = tools
        self.flaky = flaky

    def complete(self, action: Any) -> Any:
        if self.flaky and action.attempt == 0:
            raise RATE_LIMITED_EXC
        return REPLY_TOOLS if self.tools else REPLY


class SyncTools:
    def invoke(self, call: Any) -> Any:
        if call.provider == "plugin-b":
            return sm.ToolOutcome(call.id, ok=False, content="died", category="process_crashed")
        return sm.ToolOutcome(call.id, ok=True, content="sunny")


def _noop(_seconds: float) -> None:
    return None


def _plain_loop(models: list[SyncModel], tools: SyncTools, context: SyncContext) -> None:
    """The blocking floor: the same calls written by hand, with no engine: assemble;
    call the model, sleeping and calling again after an exception; run the reply's
    tool calls one after the other."""
    for model in models:
        context.assemble(None)
        attempt = 0
        while True:
            try:
                reply = model.complete(_ATTEMPTS[attempt])
            except Exception:
                _noop(0.0)
                attempt += 1
                continue
            break
        for call in reply.tool_calls:
            tools.invoke(call)


def _sync_ratios(n: int, repeats: int) -> dict[str, float]:
    """Per path, ``run_turn`` over the plain loop (the two alternately, the median of the
    per-pair ratios)."""
    out = {}
    context, tools = SyncContext(), SyncTools()
    for label, with_tools, flaky in (
        ("happy", False, False),
        ("tool round", True, False),
        ("rate limit", False, True),
    ):
        ratios = []
        for _ in range(repeats):
            turns = [sm.Session(seed=i, clock=time.monotonic).new_turn() for i in range(n)]
            models = [SyncModel(tools=with_tools, flaky=flaky) for _ in range(n)]
            gc.collect()
            t0 = time.perf_counter()
            for turn, model in zip(turns, models, strict=True):
                sm.run_turn(turn, model=model, tools=tools, context=context, sleep=_noop)
            driver = time.perf_counter() - t0
            gc.collect()
            t0 = time.perf_counter()
            _plain_loop(models, tools, context)
            ratios.append(driver / (time.perf_counter() - t0))
        out[label] = statistics.median(ratios)
    return out


def run(n: int = 10_000, repeats: int = 3) -> dict[str, Any]:
    """Events/s through ``arun_turn`` at ``n`` concurrent turns (or a skip message)."""
    try:
        asyncio.run(_gather(_jobs(1)))
    except NotImplementedError as exc:
        return {"skipped": f"sm.arun_turn is not implemented yet ({exc})"}
    rates, hand_rates, seconds = [], [], []
    events = 0
    for _ in range(repeats):
        jobs = _jobs(n)
        gc.collect()
        t0 = time.perf_counter()
        finishes = asyncio.run(_gather(jobs))
        t1 = time.perf_counter()
        events = sum(len(turn.trace) for turn, _ in jobs)
        assert len(finishes) == n
        assert all(isinstance(f, sm.Finish) for f in finishes), finishes[:3]
        assert all(f.status is sm.TurnStatus.COMPLETED for f in finishes), finishes[:3]
        rates.append(events / (t1 - t0))
        seconds.append(t1 - t0)
        jobs = _jobs(n)
        gc.collect()
        t0 = time.perf_counter()
        _by_hand(jobs)
        t1 = time.perf_counter()
        hand_rates.append(sum(len(turn.trace) for turn, _ in jobs) / (t1 - t0))
    by_path = {}
    for label, tools, flaky in (
        ("happy path (3 events)", False, False),
        ("tool round, 2 calls, 1 crash (4 events)", True, False),
        ("one rate limit, then happy (5 events)", False, True),
    ):
        jobs = _path_jobs(n, tools, flaky)
        gc.collect()
        t0 = time.perf_counter()
        asyncio.run(_gather(jobs))
        t1 = time.perf_counter()
        by_path[label] = (t1 - t0) * 1e6 / sum(len(turn.trace) for turn, _ in jobs)
    statuses: dict[str, int] = {}
    for finish in finishes:
        statuses[str(finish.status.value)] = statuses.get(str(finish.status.value), 0) + 1
    rate = statistics.median(rates)
    hand = statistics.median(hand_rates)
    return {
        "concurrent_turns": n,
        "events_per_run": events,
        "seconds_per_run": statistics.median(seconds),
        "events_per_s": rate,
        "us_per_event": 1e6 / rate,
        "by_hand_events_per_s": hand,
        "driver_overhead_x": hand / rate,
        "us_per_event_by_path": by_path,
        "over_hand_written_floor": _floor_ratios(n, repeats),
        "run_turn_over_plain_loop": _sync_ratios(n, repeats),
        "statuses": statuses,
    }
