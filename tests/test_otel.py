"""``statemachine.otel``: the trace as OpenTelemetry spans and metrics.

Every built-in scenario is played through a :class:`Telemetry` on the SDK's
in-memory exporter and reader, and its span tree and attributes are checked against
what the scenario scripted (the error categories it sent) and what the engine
answered (each action); a live session and a replayed trace file give the same
spans; one run exports OTLP/HTTP to a real receiver process (``oteltap``).
"""

from __future__ import annotations

import io
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import statemachine as sm
from statemachine.core._actions import CallModel, Finish, InvokeTools, Wait
from statemachine.dev._scenarios import builtin, builtin_names
from statemachine.dev._simulate import EPOCH, StepRecord
from statemachine.dev._telemetry_docs import scenario_telemetry
from statemachine.io._otel import DURATION_BUCKETS
from statemachine.io._trace_file import TraceWriter, read_trace
from statemachine.otel import Telemetry, replay

CONTENT_KEYS = {
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.definitions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
    "turnstate.error.message",
}
SESSION = "invoke_workflow turnstate"
"""The session span's name: the conventions' workflow span, named for the agent."""


class Otel:
    """An SDK tracer provider and meter provider with in-memory export."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def telemetry(self, **options: Any) -> Telemetry:
        options.setdefault("clock_offset", EPOCH)
        return Telemetry(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **options
        )

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """metric name -> [(attributes, point)]."""
        data = self.reader.get_metrics_data()
        out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        out.setdefault(metric.name, []).append((dict(point.attributes), point))
        return out

    def close(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


@pytest.fixture
def otel() -> Iterator[Otel]:
    setup = Otel()
    yield setup
    setup.close()


def ns(t: float) -> int:
    return int((t + EPOCH) * 1_000_000_000)


def scripted_failures(name: str) -> list[tuple[str, int | None]]:
    """The category and HTTP status of every ModelFailed the scenario sends, in order."""
    out = []
    for spec in builtin(name).turns:
        for _ in range(spec.repeat):
            for step in spec.steps:
                if step.event == "ModelFailed":
                    failure = (str(step.fields["category"]), step.fields.get("status"))
                    out.extend([failure] * step.repeat)
    return out


def children(spans: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    found = [
        s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id
    ]
    return sorted(
        found, key=lambda s: (s.start_time, (s.attributes or {}).get("turnstate.step", -1))
    )


def turn_steps(steps: list[StepRecord]) -> dict[int, list[StepRecord]]:
    by_turn: dict[int, list[StepRecord]] = {}
    for step in steps:
        by_turn.setdefault(step.turn, []).append(step)
    return by_turn


def check_turn(
    turn_span: ReadableSpan,
    spans: list[ReadableSpan],
    steps: list[StepRecord],
    failures: Iterator[tuple[str, int | None]],
) -> None:
    """One turn's span, its chat and tool spans and its events, against its steps."""
    attrs = turn_span.attributes or {}
    finish = steps[-1].action
    assert isinstance(finish, Finish)
    assert turn_span.name == "invoke_agent turnstate"
    assert attrs["gen_ai.operation.name"] == "invoke_agent"
    assert attrs["turnstate.turn.index"] == steps[0].turn
    assert attrs["turnstate.turn.status"] == finish.status.value
    assert turn_span.start_time == ns(steps[0].t)
    assert turn_span.end_time == ns(steps[-1].t)
    if finish.status is sm.TurnStatus.COMPLETED:
        assert "error.type" not in attrs
        assert turn_span.status.status_code is StatusCode.UNSET
    else:
        assert attrs["error.type"] == finish.status.value
        assert turn_span.status.status_code is StatusCode.ERROR

    kids = children(spans, turn_span)
    chats = [s for s in kids if s.name.startswith("chat")]
    tools = [s for s in kids if s.name.startswith("execute_tool")]
    assert len(chats) + len(tools) == len(kids)
    check_chats(chats, steps, failures)
    check_tools(tools, steps, finish)
    check_events(turn_span, steps, finish)


def check_chats(
    chats: list[ReadableSpan], steps: list[StepRecord], failures: Iterator[tuple[str, int | None]]
) -> None:
    # one chat span per CallModel, from it to the event that answered it
    calls = [(i, s) for i, s in enumerate(steps) if isinstance(s.action, CallModel)]
    assert len(chats) == len(calls)
    for chat, (i, step) in zip(chats, calls, strict=True):
        action = step.action
        assert isinstance(action, CallModel)
        answer = steps[i + 1]
        chat_attrs = chat.attributes or {}
        assert chat.kind is SpanKind.CLIENT
        assert chat.name == (f"chat {action.model}" if action.model else "chat")
        assert chat_attrs["gen_ai.operation.name"] == "chat"
        assert chat_attrs.get("gen_ai.request.model") == action.model
        assert chat_attrs["turnstate.attempt"] == action.attempt
        assert chat_attrs["turnstate.step"] == step.step
        assert chat_attrs["gen_ai.provider.name"] == "demo"
        assert chat.start_time == ns(step.t)
        assert chat.end_time == ns(answer.t)
        if answer.event == "ModelFailed":
            category, status = next(failures)
            assert chat_attrs["error.type"] == category
            # every failed attempt, retried or not, with the status the error had
            assert chat_attrs.get("http.response.status_code") == status
            assert chat.status.status_code is StatusCode.ERROR
        elif answer.event == "Cancelled":
            assert chat_attrs["error.type"] == "cancelled"
        else:
            assert answer.event == "ModelReplied"
            assert "error.type" not in chat_attrs


def check_tools(tools: list[ReadableSpan], steps: list[StepRecord], finish: Finish) -> None:
    """One tool span per invoked call; a re-invoked call's earlier attempt conflicted."""
    invoked = [c for s in steps if isinstance(s.action, InvokeTools) for c in s.action.calls]
    assert sorted(s.attributes["gen_ai.tool.call.id"] for s in tools) == sorted(  # type: ignore[index]
        c.id for c in invoked
    )
    results = {r.call_id: r for r in finish.tool_results}
    by_call: dict[str, list[ReadableSpan]] = {}
    for span in tools:
        by_call.setdefault(str((span.attributes or {})["gen_ai.tool.call.id"]), []).append(span)
    for call_id, attempts in by_call.items():
        call = next(c for c in invoked if c.id == call_id)
        for span in attempts:
            span_attrs = span.attributes or {}
            assert span.name == f"execute_tool {call.name}"
            assert span_attrs["gen_ai.operation.name"] == "execute_tool"
            assert span_attrs["gen_ai.tool.name"] == call.name
            assert span_attrs["turnstate.tool.provider"] == call.provider
        for span in attempts[:-1]:
            assert (span.attributes or {})["error.type"] == "concurrency_conflict"
        result = results[call_id]
        last = attempts[-1].attributes or {}
        if result.is_error:
            assert last["error.type"] == (result.category.value if result.category else "unknown")
        else:
            assert "error.type" not in last


def check_events(turn_span: ReadableSpan, steps: list[StepRecord], finish: Finish) -> None:
    """Waits, fallbacks and reductions as the turn's events, in time order."""
    events = list(turn_span.events)
    assert [e.timestamp for e in events] == sorted(e.timestamp for e in events)
    waits = [s for s in steps if isinstance(s.action, Wait)]
    wait_events = [e for e in events if e.name == "turnstate.wait"]
    assert [(e.timestamp, e.attributes["turnstate.wait.seconds"]) for e in wait_events] == [  # type: ignore[index]
        (ns(s.t), s.action.seconds)
        for s in waits  # type: ignore[union-attr]
    ]
    for event, step in zip(wait_events, waits, strict=True):
        assert isinstance(step.action, Wait)
        assert event.attributes["error.type"] == step.action.category.value  # type: ignore[index]
        assert event.attributes["turnstate.attempt"] == step.action.attempt  # type: ignore[index]
    fallback_events = [e for e in events if e.name == "turnstate.fallback"]
    assert len(fallback_events) == len(finish.fallbacks)
    for event, fallback in zip(fallback_events, finish.fallbacks, strict=True):
        expected = {
            "turnstate.fallback.to_model": fallback.to_model,
            "error.type": fallback.error.category.value,
        }
        if fallback.from_model is not None:  # an unnamed model is not given a name
            expected["turnstate.fallback.from_model"] = fallback.from_model
        assert event.attributes == expected
    reductions = [s for s in steps if s.event == "ModelFailed" and s.dest == "reducing_context"]
    assert len([e for e in events if e.name == "turnstate.context_reduction"]) == len(reductions)


@pytest.mark.requirement("ER-120", "ER-121", "ER-122", "ER-123", "ER-124", "ER-126")
@pytest.mark.parametrize("name", builtin_names())
def test_every_scenario_gives_the_span_tree_of_its_trace(otel: Otel, name: str) -> None:
    """A session span, a turn span per turn under it, a chat span per model call
    attempt and a tool span per tool call under their turn, on the virtual clock,
    each failure's ``error.type`` the category the scenario sent; no content."""
    steps = scenario_telemetry(name, otel.telemetry(provider_name="demo"))
    spans = otel.spans()
    (session,) = [s for s in spans if s.parent is None]
    assert session.name == SESSION
    assert (session.attributes or {})["gen_ai.operation.name"] == "invoke_workflow"
    assert (session.attributes or {})["gen_ai.workflow.name"] == "turnstate"
    assert session.start_time == ns(steps[0].t)
    turns = children(spans, session)
    by_turn = turn_steps(steps)
    assert [int((s.attributes or {})["turnstate.turn.index"]) for s in turns] == list(by_turn)
    failures = iter(scripted_failures(name))
    for turn_span, turn_steps_ in zip(turns, by_turn.values(), strict=True):
        check_turn(turn_span, spans, turn_steps_, failures)
    assert next(failures, None) is None  # every scripted failure was seen on a span
    nested = {s.context.span_id for s in [session, *turns]}
    for span in spans:
        if span is not session and span not in turns:
            assert span.parent is not None and span.parent.span_id in nested - {
                session.context.span_id
            }
    assert all(s.context.trace_id == session.context.trace_id for s in spans)

    # the session: its status, the limits that fired, the breakers that tripped
    status = next((s.session_status for s in reversed(steps) if s.session_status), None)
    result_status = builtin(name).end or status
    session_attrs = session.attributes or {}
    assert session_attrs.get("turnstate.session.status") == result_status
    limits = [e for e in session.events if e.name == "turnstate.limit"]
    fired = list(dict.fromkeys(s.limit for s in steps if s.limit))
    assert [e.attributes["turnstate.limit"] for e in limits] == fired  # type: ignore[index]
    trips = [s for s in steps if s.guard in ("trips_breaker", "trips_denial_breaker")]
    assert len([e for e in session.events if e.name == "turnstate.breaker_open"]) == len(trips)

    # no request, reply, argument, result or message without capture_content
    for span in spans:
        assert not CONTENT_KEYS & set(span.attributes or {}), span.name


@pytest.mark.requirement("ER-123")
def test_a_breaker_trip_names_the_provider_and_the_limit_follows(otel: Otel) -> None:
    """plugin-crash-breaker: the session span shows the trip with its provider, then
    the limit, and ends error_circuit_breaker."""
    scenario_telemetry("plugin-crash-breaker", otel.telemetry(provider_name="demo"))
    (session,) = [s for s in otel.spans() if s.parent is None]
    names = [(e.name, dict(e.attributes or {})) for e in session.events]
    assert names == [
        (
            "turnstate.breaker_open",
            {"turnstate.breaker": "breaker", "turnstate.tool.providers": ("search-plugin",)},
        ),
        ("turnstate.limit", {"turnstate.limit": "error_circuit_breaker"}),
        ("turnstate.session_end", {"turnstate.session.status": "error_circuit_breaker"}),
    ]
    assert session.status.status_code is StatusCode.ERROR


def metric_sum(points: list[tuple[dict[str, Any], Any]], **attrs: Any) -> float:
    return sum(
        p.value
        for a, p in points
        if all(a.get(k.replace("__", ".")) == v for k, v in attrs.items())
    )


@pytest.mark.requirement("ER-125")
def test_metrics_count_retries_waits_turns_sessions_breakers_and_cost(otel: Otel) -> None:
    """Counters and histograms from three runs sum to what the runs did."""
    runs = {
        name: scenario_telemetry(name, otel.telemetry(provider_name="demo"))
        for name in ("rate-limit-storm", "overloaded-fallback", "plugin-crash-breaker")
    }
    metrics = otel.metrics()
    all_steps = [s for steps in runs.values() for s in steps]
    waits = [s.action for s in all_steps if isinstance(s.action, Wait)]
    retries = metrics["turnstate.retries"]
    for category in ("rate_limited", "overloaded"):
        taken = [w for w in waits if w.category.value == category]
        assert metric_sum(retries, error__type=category, turnstate__retry__kind="wait") == len(
            taken
        )
    fallbacks = [f for s in all_steps if isinstance(s.action, Finish) for f in s.action.fallbacks]
    assert metric_sum(retries, turnstate__retry__kind="fallback") == len(fallbacks) == 1
    (histogram,) = [
        p for a, p in metrics["turnstate.wait.duration"] if a == {"error.type": "overloaded"}
    ]
    over = [w.seconds for w in waits if w.category.value == "overloaded"]
    assert histogram.count == len(over)
    assert histogram.sum == pytest.approx(sum(over))
    statuses = [s.action.status.value for s in all_steps if isinstance(s.action, Finish)]
    for status in set(statuses):
        assert metric_sum(metrics["turnstate.turns"], turnstate__turn__status=status) == (
            statuses.count(status)
        )
    assert (
        metric_sum(
            metrics["turnstate.sessions"], turnstate__session__status="error_circuit_breaker"
        )
        == 1
    )
    trips = metrics["turnstate.breaker.trips"]
    assert metric_sum(trips, turnstate__tool__provider="search-plugin") == 1
    assert (
        metric_sum(metrics["turnstate.breaker.open"], turnstate__tool__provider="search-plugin")
        == 0
    )
    cost = sum(steps[-1].cost_usd for steps in runs.values())
    assert metric_sum(metrics["turnstate.cost"]) == pytest.approx(cost)
    calls = [s for s in all_steps if isinstance(s.action, CallModel)]
    durations = metrics["gen_ai.client.operation.duration"]
    assert sum(p.count for _, p in durations) == len(calls)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def live_turn(session: sm.Session, clock: Clock) -> None:
    """A turn with a 429, a wait, a tool call and a reply, the clock moving."""
    turn = session.new_turn()
    turn.start()
    clock.now += 0.5
    turn.send(sm.Assembled(request={"messages": ["secret question"]}, size=10))
    clock.now += 1.0
    wait = turn.send(sm.ModelFailed(sm.ModelError("rate_limited", status=429, message="slow down")))
    assert isinstance(wait, sm.Wait)
    clock.now += wait.seconds
    turn.send(sm.WaitDone())
    clock.now += 2.0
    call = sm.ToolCall("c1", "fs", "read_file", {"path": "secret.md"})
    turn.send(sm.ModelReplied(tool_calls=(call,), cost=0.01))
    clock.now += 0.25
    turn.send(sm.ToolsDone((sm.ToolOutcome("c1", ok=True, content="secret content"),)))


@pytest.mark.requirement("ER-124", "ER-126")
def test_a_live_session_under_the_hosts_span_with_content_opted_in(otel: Otel) -> None:
    """A bound Telemetry on a real session: the session span is a child of the host's
    current span, times are the injected clock's, content is recorded only when the
    host opts in, and ``end`` closes the session with its status."""
    clock = Clock()
    telemetry = otel.telemetry(capture_content=True, clock_offset=0.0, session_id="chat-1")
    session = sm.Session(sm.Settings(model="m1"), seed=3, clock=clock, observers=[telemetry])
    telemetry.bind(session)
    tracer = otel.tracer_provider.get_tracer("host")
    with tracer.start_as_current_span("request") as host:
        live_turn(session, clock)
        session.end("completed")
        telemetry.end()
    spans = {s.name: s for s in otel.spans()}
    session_span = spans[SESSION]
    assert session_span.parent is not None
    assert session_span.parent.span_id == host.get_span_context().span_id
    assert (session_span.attributes or {})["gen_ai.conversation.id"] == "chat-1"
    assert (session_span.attributes or {})["turnstate.session.status"] == "completed"
    chats = [s for s in otel.spans() if s.name == "chat m1"]
    assert [(c.start_time, c.end_time) for c in chats] == [
        (int(100.5e9), int(101.5e9)),
        (chats[1].start_time, chats[1].start_time + int(2e9)),
    ]
    first = chats[0].attributes or {}
    assert first["error.type"] == "rate_limited"
    assert json.loads(str(first["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": "secret question"}]}
    ]
    tool = spans["execute_tool read_file"].attributes or {}
    assert json.loads(str(tool["gen_ai.tool.call.arguments"])) == {"path": "secret.md"}
    assert json.loads(str(tool["gen_ai.tool.call.result"])) == "secret content"
    assert spans["execute_tool read_file"].end_time - spans[
        "execute_tool read_file"
    ].start_time == int(0.25e9)


@pytest.mark.requirement("ER-121", "ER-126")
@pytest.mark.parametrize("capture", [False, True])
def test_a_failure_that_ends_the_turn_carries_its_status_and_message(
    otel: Otel, capture: bool
) -> None:
    """An auth error: the chat span has the category, the HTTP status and the
    retry-after; the vendor's message only with capture_content."""
    telemetry = otel.telemetry(capture_content=capture, clock_offset=0.0)
    session = sm.Session(sm.Settings(), seed=3, clock=Clock(), observers=[telemetry])
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={}, size=1))
    error = sm.ModelError("auth_error", "key sk-123 revoked", retry_after_seconds=3, status=401)
    turn.send(sm.ModelFailed(error))
    telemetry.end()
    (chat,) = [s for s in otel.spans() if s.name == "chat"]
    attrs = chat.attributes or {}
    assert attrs["error.type"] == "auth_error"
    assert attrs["http.response.status_code"] == 401
    assert attrs["turnstate.retry_after_s"] == 3
    assert ("turnstate.error.message" in attrs) is capture


@pytest.mark.requirement("ER-126")
def test_no_content_by_default_on_a_live_session(otel: Otel) -> None:
    """The same turn without capture_content: no content and no error message."""
    clock = Clock()
    telemetry = otel.telemetry(clock_offset=0.0)
    session = sm.Session(sm.Settings(model="m1"), seed=3, clock=clock, observers=[telemetry])
    live_turn(session, clock)
    telemetry.end()
    for span in otel.spans():
        assert not CONTENT_KEYS & set(span.attributes or {})
        for value in (span.attributes or {}).values():
            assert "secret" not in str(value)


@pytest.mark.requirement("ER-124", "ER-130")
def test_a_replayed_trace_file_gives_the_live_spans(otel: Otel) -> None:
    """The TraceWriter's file, read back and replayed, gives the spans the live
    observer gave: same names, parents, times and attributes."""
    clock = Clock()
    live = otel.telemetry(clock_offset=0.0)
    file = io.StringIO()
    session = sm.Session(
        sm.Settings(model="m1"), seed=3, clock=clock, observers=[live, TraceWriter(file)]
    )
    live_turn(session, clock)
    live.end()

    def shape(spans: list[ReadableSpan]) -> list[tuple[Any, ...]]:
        names = {s.context.span_id: s.name for s in spans}
        return sorted(
            (
                s.name,
                names.get(s.parent.span_id) if s.parent else None,
                s.start_time,
                s.end_time,
                dict(s.attributes or {}),
                [(e.name, e.timestamp, dict(e.attributes or {})) for e in s.events],
            )
            for s in spans
        )

    expected = shape(otel.spans())
    otel.exporter.clear()
    trace_file = read_trace(file.getvalue().splitlines(), "live.jsonl")
    replay([s.record for s in trace_file.steps], otel.telemetry(clock_offset=0.0))
    assert shape(otel.spans()) == expected


@pytest.mark.requirement("ER-124")
def test_an_unfinished_turn_is_ended_as_it_stands(otel: Otel) -> None:
    """A host that stops mid-call: end() closes the chat, turn and session spans at
    the last record's time, marked unfinished."""
    clock = Clock()
    telemetry = otel.telemetry(clock_offset=0.0)
    session = sm.Session(sm.Settings(), seed=1, clock=clock, observers=[telemetry])
    turn = session.new_turn()
    turn.start()
    clock.now += 1
    turn.send(sm.Assembled(request={}, size=1))
    telemetry.end()
    spans = {s.name: s for s in otel.spans()}
    assert (spans["chat"].attributes or {})["error.type"] == "unfinished"
    assert (spans["invoke_agent turnstate"].attributes or {})["error.type"] == "unfinished"
    assert spans[SESSION].end_time == int(101e9)
    telemetry.end()  # idempotent
    assert len(otel.spans()) == 3


@pytest.mark.requirement("ER-127")
def test_the_module_imports_the_api_only() -> None:
    """``statemachine.otel`` imports ``opentelemetry-api``, never the SDK."""
    code = (
        "import sys, statemachine.otel\n"
        "bad = sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.requirement("ER-127")
def test_without_an_sdk_the_observer_is_a_no_op() -> None:
    """With the API's default (no-op) providers a Telemetry costs and breaks nothing."""
    telemetry = Telemetry(tracer_provider=trace.NoOpTracerProvider())
    session = sm.Session(sm.Settings(), observers=[telemetry])
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={}, size=1))
    assert isinstance(turn.send(sm.ModelReplied()), sm.Finish)
    telemetry.end()


@pytest.mark.requirement("ER-128")
def test_no_record_is_built_without_an_observer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Zero cost when unused: a session without observers never builds a trace
    record (the engine skips it), so telemetry not attached costs nothing."""
    from statemachine.core import _engine

    def refuse(*_args: Any) -> Any:
        raise AssertionError("a trace record was built")

    monkeypatch.setattr(_engine, "trace_record", refuse)
    session = sm.Session(sm.Settings())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={}, size=1))
    turn.send(sm.ModelFailed(sm.ModelError("rate_limited")))
    turn.send(sm.WaitDone())
    assert isinstance(turn.send(sm.ModelReplied()), sm.Finish)


# -- a real OTLP/HTTP receiver process ------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Lines:
    """The lines a process prints, read from its stdout's file descriptor (never
    through a buffered reader, which would hide read lines from ``select``)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        self.fd = process.stdout.fileno()
        self.pending = b""

    def read(self, want: int, deadline: float, prefix: str = "") -> list[str]:
        """Lines starting with ``prefix`` until ``want`` of them, or the deadline."""
        lines: list[str] = []
        with selectors.DefaultSelector() as selector:
            selector.register(self.fd, selectors.EVENT_READ)
            while len(lines) < want:
                while b"\n" in self.pending and len(lines) < want:
                    line, self.pending = self.pending.split(b"\n", 1)
                    if line.decode().startswith(prefix):
                        lines.append(line.decode())
                if len(lines) >= want:
                    break
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    break
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    break
                self.pending += chunk
        return lines


def _storm_over_otlp() -> tuple[list[StepRecord], list[dict[str, Any]], list[dict[str, Any]]]:
    """rate-limit-storm's spans and metrics, exported with the OTLP/HTTP exporters to a
    separate OTLP receiver process (oteltap: a native OTLP/HTTP receiver that decodes
    the protobuf it receives and prints each span and metric as JSON): the steps, and
    the spans and metrics as the receiver decoded them."""
    try:
        import oteltap  # noqa: F401
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("oteltap is not installed, and CI is set: the OTLP test needs it")
        pytest.skip("oteltap is not installed")
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-u", "-m", "oteltap", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    output = _Lines(process)
    try:
        ready = output.read(1, time.monotonic() + 30)
        assert ready and "Listening" in ready[0], ready
        base = f"http://127.0.0.1:{port}"
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(
            SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces"))
        )
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics"), export_interval_millis=3_600_000
        )
        meter_provider = MeterProvider(metric_readers=[reader])
        telemetry = Telemetry(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            clock_offset=EPOCH,
            provider_name="anthropic",
            session_id="storm-1",
        )
        steps = scenario_telemetry("rate-limit-storm", telemetry)
        tracer_provider.shutdown()
        meter_provider.shutdown()  # exports the metrics once
        want_spans = sum(isinstance(s.action, CallModel) for s in steps) + 3  # 2 turns, session
        lines = output.read(want_spans + len(_STORM_METRICS), time.monotonic() + 30, prefix="{")
    finally:
        process.terminate()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()
    decoded = [json.loads(line) for line in lines]
    spans = [d for d in decoded if "spanId" in d]
    metrics = [d for d in decoded if "spanId" not in d]
    assert len(spans) == want_spans
    return steps, spans, metrics


_STORM_METRICS = {
    "gen_ai.client.operation.duration",
    "turnstate.retries",
    "turnstate.wait.duration",
    "turnstate.turns",
    "turnstate.cost",
}
"""The metrics a storm records (no tokens: the scenario reports none)."""


def _attrs(item: dict[str, Any]) -> dict[str, Any]:
    """OTLP JSON key-values as plain values."""
    out: dict[str, Any] = {}
    for pair in item.get("attributes", []):
        (kind, value), *_ = pair["value"].items()
        out[pair["key"]] = int(value) if kind == "intValue" else value
    return out


@pytest.mark.requirement("ER-129", "ER-153", "ER-155", "ER-158")
def test_a_storm_exported_over_otlp_arrives_with_its_genai_attributes() -> None:
    """rate-limit-storm over OTLP/HTTP to a real receiver process: the span tree arrives
    whole (names, parents, times), every one of its ten failed chat spans with
    ``error.type`` and ``http.response.status_code`` 429, the provider and the
    conversation id; the duration histogram arrives with the advised buckets, its
    unit and the provider, and the cost counter with a UCUM unit."""
    steps, spans, metrics = _storm_over_otlp()
    by_id = {s["spanId"]: s for s in spans}
    (session,) = [s for s in spans if s["name"] == SESSION]
    assert session["parentSpanId"] == ""
    assert _attrs(session)["gen_ai.operation.name"] == "invoke_workflow"
    turns = sorted(
        (s for s in spans if s["name"] == "invoke_agent turnstate"),
        key=lambda s: int(s["startTimeUnixNano"]),
    )
    assert [t["parentSpanId"] for t in turns] == [session["spanId"]] * 2
    assert [_attrs(t)["turnstate.turn.status"] for t in turns] == [
        "completed",
        "retries_exhausted",
    ]
    calls = [s for s in steps if isinstance(s.action, CallModel)]
    chats = sorted(
        (s for s in spans if s["name"] == "chat"), key=lambda s: int(s["startTimeUnixNano"])
    )
    assert [int(c["startTimeUnixNano"]) for c in chats] == [ns(s.t) for s in calls]
    assert {by_id[c["parentSpanId"]]["name"] for c in chats} == {"invoke_agent turnstate"}
    failed = [_attrs(c) for c in chats if "error.type" in _attrs(c)]
    assert len(failed) == 10 == len(scripted_failures("rate-limit-storm"))
    for attrs in failed:
        assert attrs["error.type"] == "rate_limited"
        assert attrs["http.response.status_code"] == 429
    for span in [*chats, *turns]:
        assert _attrs(span)["gen_ai.provider.name"] == "anthropic"
        assert _attrs(span)["gen_ai.conversation.id"] == "storm-1"

    by_name = {m["name"]: m for m in metrics}
    assert set(by_name) >= _STORM_METRICS
    duration = by_name["gen_ai.client.operation.duration"]
    assert duration["unit"] == "s"
    points = duration["histogram"]["dataPoints"]
    assert sum(int(p["count"]) for p in points) == len(calls)
    for point in points:
        assert [float(b) for b in point["explicitBounds"]] == list(DURATION_BUCKETS)
        assert _attrs(point)["gen_ai.provider.name"] == "anthropic"
        assert _attrs(point)["gen_ai.operation.name"] == "chat"
        assert "gen_ai.request.model" not in _attrs(point)  # the scenario names none
    errors = {_attrs(p).get("error.type"): int(p["count"]) for p in points}
    assert errors == {"rate_limited": 10, None: 1}
    assert by_name["turnstate.cost"]["unit"] == "{USD}"


@pytest.mark.requirement("ER-121", "ER-122", "ER-153")
def test_a_retried_failure_carries_its_status_and_the_wait_its_retry_after(otel: Otel) -> None:
    """A 429 with retry-after 2 s that is retried: its chat span has the HTTP status and
    the retry-after, and the wait event the retry-after the engine honoured."""
    clock = Clock()
    telemetry = otel.telemetry(clock_offset=0.0)
    session = sm.Session(sm.Settings(), seed=3, clock=clock, observers=[telemetry])
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={}, size=1))
    error = sm.ModelError("rate_limited", retry_after_seconds=2, status=429)
    wait = turn.send(sm.ModelFailed(error))
    assert isinstance(wait, sm.Wait)
    assert wait.seconds >= 2
    telemetry.end()
    (chat,) = [s for s in otel.spans() if s.name == "chat"]
    assert (chat.attributes or {})["http.response.status_code"] == 429
    assert (chat.attributes or {})["error.type"] == "rate_limited"
    assert (chat.attributes or {})["turnstate.retry_after_s"] == 2.0
    (turn_span,) = [s for s in otel.spans() if s.name.startswith("invoke_agent")]
    (event,) = [e for e in turn_span.events if e.name == "turnstate.wait"]
    assert (event.attributes or {})["turnstate.retry_after_s"] == 2.0
    assert (event.attributes or {})["turnstate.wait.seconds"] == wait.seconds


@pytest.mark.requirement("ER-123")
def test_a_bound_session_ends_its_span_when_a_limit_ends_it(otel: Otel) -> None:
    """max_turns=1 on a bound session: the limit event at the final-answer turn's
    start, the session span ended at its Finish with error_max_turns, no end() call."""
    clock = Clock()
    telemetry = otel.telemetry(clock_offset=0.0)
    session = sm.Session(sm.Settings(max_turns=1), clock=clock, observers=[telemetry])
    telemetry.bind(session)
    for _ in range(2):
        turn = session.new_turn()
        turn.start()
        clock.now += 1
        turn.send(sm.Assembled(request={}, size=1))
        clock.now += 1
        turn.send(sm.ModelReplied())
    assert session.status is sm.SessionStatus.ERROR_MAX_TURNS
    (span,) = [s for s in otel.spans() if s.name == SESSION]
    assert span.end_time == int(clock.now * 1e9)
    assert [(e.name, e.timestamp) for e in span.events] == [
        ("turnstate.limit", int(102e9)),
        ("turnstate.session_end", int(104e9)),
    ]
    turns = [s for s in otel.spans() if s.name.startswith("invoke_agent")]
    assert [(s.attributes or {}).get("turnstate.turn.final_answer") for s in turns] == [False, True]
    assert (span.attributes or {})["turnstate.session.status"] == "error_max_turns"
