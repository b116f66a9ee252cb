"""What crosses the engine's boundary is data (issue 24): time, usage and the host's reply
arrive with the event, the trace carries the event, and a replay is a live step.

One test (or a few) per way the boundary was thin, each failing before the change."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
import subprocess
import sys
from email.utils import formatdate
from pathlib import Path
from typing import Any

import anthropic
import attrs
import httpx
import openai
import pydantic
import pytest

import statemachine as sm
from statemachine.dev._scenarios import parse
from statemachine.dev._simulate import EPOCH, run
from statemachine.store import (
    CorruptSession,
    InMemoryStore,
    SessionNotFound,
    StaleWrite,
    Stored,
    Worker,
)

from .helpers import ManualClock

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
T0 = 2_000_000_000.0
"""A wall time far from this process's: a date read against time.time would be years off."""


def _date(unix: float) -> str:
    return formatdate(unix, usegmt=True)


# -- the host's reply object ------------------------------------------------------------


@dataclasses.dataclass
class _Dataclass:
    text: str
    parts: tuple[int, ...]


@attrs.frozen
class _Attrs:
    text: str


class _Pydantic(pydantic.BaseModel):
    text: str
    n: int


_ANTHROPIC = anthropic.types.Message.model_validate(
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5-20261001",
        "content": [{"type": "text", "text": "sunny"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 3},
    }
)
_OPENAI = openai.types.chat.ChatCompletion.model_validate(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-5-2026",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "sunny"},
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }
)
REPLIES: dict[str, tuple[Any, Any]] = {
    "anthropic.types.Message": (_ANTHROPIC, _ANTHROPIC.model_dump(mode="json")),
    "openai ChatCompletion": (_OPENAI, _OPENAI.model_dump(mode="json")),
    "a pydantic model": (_Pydantic(text="a", n=1), {"text": "a", "n": 1}),
    "a dataclass": (_Dataclass("a", (1, 2)), {"text": "a", "parts": [1, 2]}),
    "an attrs instance": (_Attrs("a"), {"text": "a"}),
    "plain data": ({"text": "a", "parts": (1, 2)}, {"text": "a", "parts": [1, 2]}),
}


class _Context:
    def assemble(self, action: sm.Assemble) -> sm.Assembled:
        return sm.Assembled({"messages": []}, 10)


class _Tools:
    def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        return sm.ToolOutcome(call.id, ok=True, content="done")


class _Replying:
    """A model provider that returns its SDK's own object as the reply."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply

    def complete(self, action: sm.CallModel) -> sm.ModelReplied:
        return sm.ModelReplied(reply=self.reply, cost=0.01)


@pytest.mark.requirement("ER-144")
@pytest.mark.parametrize("kind", sorted(REPLIES))
def test_the_hosts_reply_object_comes_back_as_itself_and_is_kept_as_json(kind: str) -> None:
    """A provider may return its SDK's object as the reply: the turn completes (before, the
    door refused it and the driver reported the billed call as unknown_error), Finish.reply
    is that very object, and the snapshot, a restore and a trace file hold its JSON form."""
    reply, data = REPLIES[kind]
    records: list[sm.TraceRecord] = []
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock(), observers=[records.append])
    turn = session.new_turn()
    finish = sm.run_turn(turn, model=_Replying(reply), tools=_Tools(), context=_Context())
    assert finish.status is sm.TurnStatus.COMPLETED
    assert finish.reply is reply
    assert session.cost_usd == 0.01
    snapshot = json.loads(json.dumps(session.snapshot(), allow_nan=False))
    assert snapshot["turn"]["reply"] == data
    restored = sm.Session.restore(snapshot, clock=ManualClock())
    assert restored.current_turn is not None and restored.current_turn.finish is not None
    assert restored.current_turn.finish.reply == data
    assert restored.snapshot() == session.snapshot()
    line = json.dumps(sm.TraceWriter.__module__ and _record_json(records[2]), allow_nan=False)
    assert json.loads(line)["caused_by"]["reply"] == data


def _record_json(record: sm.TraceRecord) -> dict[str, Any]:
    from statemachine.io._trace_file import record_json

    return record_json(record)


@pytest.mark.requirement("ER-144")
def test_a_worker_journals_the_replys_json_form() -> None:
    """Through a store, the reply object's JSON form is what the journal keeps: another
    worker replays it and ends the turn with that form as its reply."""
    store = InMemoryStore()
    a = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    r = a.create("s", sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0))
    r = a.advance("s", None, expected_version=r.version)
    r = a.advance("s", sm.Assembled("q", 1), expected_version=r.version)
    r = a.advance("s", sm.ModelReplied(reply=_ANTHROPIC), expected_version=r.version)
    assert isinstance(r.action, sm.Finish) and r.action.reply is _ANTHROPIC
    other = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0, remember=0)
    loaded = other.load("s")
    assert isinstance(loaded.action, sm.Finish)
    assert loaded.action.reply == _ANTHROPIC.model_dump(mode="json")
    assert loaded.session.snapshot() == r.session.snapshot()


class _Unsavable:
    pass


class _Broken:
    """A provider whose reply object has no JSON form: the host's bug."""

    def complete(self, action: sm.CallModel) -> sm.ModelReplied:
        return sm.ModelReplied(reply=_Unsavable())


class _AsyncBroken:
    async def complete(self, action: sm.CallModel) -> sm.ModelReplied:
        return sm.ModelReplied(tool_calls=[sm.ToolCall("", "fs", "ls")])


class _AsyncContext:
    async def assemble(self, action: sm.Assemble) -> sm.Assembled:
        return sm.Assembled("q", 1)


class _AsyncTools:
    async def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        return sm.ToolOutcome(call.id, ok=True)


@pytest.mark.requirement("ER-144")
def test_a_value_a_model_provider_builds_wrong_is_the_hosts_bug_not_a_model_error() -> None:
    """A value refused at the door inside model.complete reaches the host as InvalidValue,
    saying which call and how to fix it, and the turn ends cancelled (before, the driver
    classified it as the model's unknown_error and failed the turn with a warning)."""
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock())
    turn = session.new_turn()
    with pytest.raises(
        sm.InvalidValue, match=r"model\.complete\(attempt=0.*_Unsavable.*fix"
    ) as got:
        sm.run_turn(turn, model=_Broken(), tools=_Tools(), context=_Context())
    assert isinstance(got.value, TypeError) and isinstance(got.value, ValueError)
    assert turn.status is sm.TurnStatus.CANCELLED
    assert "InvalidValue" in turn.trace[-1].caused_by.reason  # type: ignore[union-attr]
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock())
    turn = session.new_turn()
    with pytest.raises(sm.InvalidValue, match=r"ToolCall\.id: must be a non-empty str"):
        asyncio.run(
            sm.arun_turn(turn, model=_AsyncBroken(), tools=_AsyncTools(), context=_AsyncContext())
        )
    assert turn.status is sm.TurnStatus.CANCELLED


# -- usage -------------------------------------------------------------------------------


@pytest.mark.requirement("ER-143")
def test_a_billed_failure_charges_its_usage_and_the_trace_and_snapshot_keep_it() -> None:
    """A content-filtered reply that was billed (usage 1000/200) charges its cost toward
    max_cost_usd; the trace record and the snapshot keep the whole usage (before, the
    engine knew one float and nothing of tokens, model, response id or finish reason)."""
    usage = sm.Usage(
        input_tokens=1000,
        output_tokens=200,
        cached_tokens=400,
        cost_usd=0.006,
        model="gpt-5-2026-08",
        response_id="chatcmpl-9",
        finish_reason="content_filter",
    )
    records: list[sm.TraceRecord] = []
    session = sm.Session(
        sm.Settings(max_cost_usd=0.005), seed=1, clock=ManualClock(), observers=[records.append]
    )
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("q", 1))
    error = sm.ModelError("content_filtered", code="content_filter", status=200)
    finish = turn.send(sm.ModelFailed(error, usage=usage))
    assert finish.status is sm.TurnStatus.CONTENT_FILTERED  # type: ignore[union-attr]
    assert session.cost_usd == 0.006
    assert session.limit_reached is sm.SessionStatus.ERROR_MAX_BUDGET_USD
    assert records[-1].usage == usage and records[-1].cost_usd == 0.006
    assert turn.trace[-1].usage == usage
    restored = sm.Session.restore(json.loads(json.dumps(session.snapshot())), clock=ManualClock())
    assert restored.current_turn.trace[-1].usage == usage  # type: ignore[union-attr]
    assert restored.current_turn.trace[-1].caused_by is None  # type: ignore[union-attr]


@pytest.mark.requirement("ER-143")
def test_cost_and_usage_fill_each_other_and_never_disagree() -> None:
    """The cost given once, on the event or in its usage, is the other's too; two that
    disagree are refused at the door (nothing is charged twice or lost)."""
    assert sm.ModelReplied(usage=sm.Usage(cost_usd=0.5)).cost == 0.5
    assert sm.ModelFailed(sm.ModelError("overloaded"), cost=0.25, usage=sm.Usage(5)).usage == (
        sm.Usage(5, cost_usd=0.25)
    )
    with pytest.raises(
        sm.InvalidValue, match=r"ModelReplied\.cost: 0\.5 and usage\.cost_usd 0\.25"
    ):
        sm.ModelReplied(cost=0.5, usage=sm.Usage(cost_usd=0.25))
    with pytest.raises(sm.InvalidValue, match=r"Usage\.input_tokens: must be an int >= 0"):
        sm.Usage(input_tokens=-1)
    with pytest.raises(sm.InvalidValue, match="usage: must be a Usage"):
        sm.ModelReplied(usage={"input_tokens": 1})  # type: ignore[arg-type]


@pytest.mark.requirement("ER-143", "ER-39")
@pytest.mark.parametrize(
    ("usages", "match"),
    [
        ([[9, {"$type": "Usage"}]], r"turn\.usages\[0\]: step 9 is not a later step"),
        ([[1, {"$type": "Usage"}]], r"turn\.usages\[0\]: step 1 is no model call's outcome"),
        ([[2, {"$type": "Usage", "cost_usd": 0.5}]], r"turn\.usages\[0\]: a cost of 0\.5"),
        ([[2, {"$type": "Usage", "input_tokens": -4}]], r"turn\.usages\[0\]\[1\]"),
        ([[2, {"$type": "ToolCall", "id": "a", "provider": "p", "name": "n"}]], r"must be a Usage"),
    ],
)
def test_forged_usages_are_refused_by_restore(usages: Any, match: str) -> None:
    """A snapshot's usages belong to the model calls' outcomes, in order, with the cost
    each step charged: anything else is a SnapshotError naming the key."""
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock())
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("q", 1))
    turn.send(sm.ModelReplied(usage=sm.Usage(7, 1, cost_usd=0.25)))
    data = session.snapshot()
    assert data["turn"]["usages"] == [
        [2, {"$type": "Usage", "input_tokens": 7, "output_tokens": 1, "cost_usd": 0.25}]
    ]
    data["turn"]["usages"] = usages
    with pytest.raises(sm.SnapshotError, match=match):
        sm.Session.restore(data, clock=ManualClock())


# -- the trace carries the event -----------------------------------------------------------


@pytest.mark.requirement("ER-142")
def test_a_recorded_session_replays_with_the_public_calls_alone(tmp_path: Path) -> None:
    """The records an observer (or a trace file) got are the events and their moments:
    sent again, with turn.start/send(at=..., wall=...), to a session with no clock and the
    same settings and seed, they give the same actions and state. The session saw a
    date retry-after (read against its wall clock), a billed failure, a fallback, a tool
    round and a second turn."""
    settings = sm.Settings(fallback_models=("b",), max_retries=2)
    clock = ManualClock(50.0)
    records: list[sm.TraceRecord] = []
    path = tmp_path / "trace.jsonl"
    writer = sm.TraceWriter(path)
    session = sm.Session(
        settings,
        seed=9,
        clock=clock,
        wall_clock=lambda: T0 + clock.now,
        observers=[records.append, writer],
    )
    date = sm.ModelError("rate_limited", headers={"retry-after": _date(T0 + 50 + 30)})
    script = [
        sm.Assembled({"m": [1]}, 100),
        sm.ModelFailed(date),
        sm.WaitDone(),
        sm.ModelFailed(sm.ModelError("overloaded", status=529), usage=sm.Usage(10, cost_usd=0.01)),
        sm.WaitDone(),
        sm.ModelFailed(sm.ModelError("overloaded", status=529)),
        sm.ModelReplied(
            [sm.ToolCall("c1", "fs", "ls", {"d": "/"})], usage=sm.Usage(20, 5, cost_usd=0.02)
        ),
        sm.ToolsDone([sm.ToolOutcome("c1", ok=True, content="x")]),
    ]
    for number in range(2):
        turn = session.new_turn()
        action = turn.start()
        for event in script if number == 0 else [*script[:1], sm.ModelReplied(reply={"a": 1})]:
            clock.advance(action.seconds if isinstance(action, sm.Wait) else 0.5)
            action = turn.send(event)
    writer.close()
    wait = records[2].action
    assert isinstance(wait, sm.Wait) and wait.retry_after == 29.0  # on the session's wall clock
    assert records[2].wall == T0 + 51.0

    from statemachine.io._trace_file import load_trace

    for source in (records, [step.record for step in load_trace(path).steps]):
        again = sm.Session(settings, seed=9, clock=None, wall_clock=None, started=session.started)
        replayed = []
        for record in source:
            if record.caused_by is None:  # a start
                turn = again.new_turn(at=record.at)
                replayed.append(turn.start(at=record.at))
            else:
                replayed.append(turn.send(record.caused_by, at=record.at, wall=record.wall))
        assert replayed == [r.action for r in records]
        assert again.snapshot(at=clock.now) == session.snapshot()


@pytest.mark.requirement("ER-142", "ER-120")
def test_every_failed_chat_span_carries_its_http_status_in_the_storms() -> None:
    """Telemetry reads the failure from the record's event: every failed model call of
    the built-in storms whose error had an HTTP status has it on its span, the retried
    ones and the ones that moved to a fallback included (before, 16 of 18 had none)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from statemachine.dev._telemetry_docs import scenario_telemetry
    from statemachine.otel import Telemetry

    checked = 0
    for name in ("rate-limit-storm", "overloaded-fallback"):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        steps = scenario_telemetry(name, Telemetry(tracer_provider=provider, clock_offset=EPOCH))
        statuses = [
            s.record.caused_by.error.status  # type: ignore[union-attr]
            for s in steps
            if s.event == "ModelFailed"
        ]
        failed = [
            span
            for span in exporter.get_finished_spans()
            if span.name.startswith("chat") and "error.type" in (span.attributes or {})
        ]
        assert len(failed) == len(statuses)
        for span, status in zip(failed, statuses, strict=True):
            if status is not None:
                assert span.attributes["http.response.status_code"] == status  # type: ignore[index]
                checked += 1
    assert checked >= 10


# -- one clock for one date ----------------------------------------------------------------


@pytest.mark.requirement("ER-141")
def test_an_http_date_is_read_against_the_sessions_wall_clock() -> None:
    """A response whose retry-after is a date 10 s ahead on the session's wall clock
    (no date header) is a 10 s wait, however far this process's time.time is from it
    (before, classify measured it against time.time, the engine preferred that reading,
    and the turn was deferred for years)."""
    response = httpx.Response(429, headers={"retry-after": _date(T0 + 10)}, json={"error": {}})
    error = sm.classify(response)
    assert error.retry_after_seconds is None  # left for the step's wall time
    assert sm.classify(response, wall=T0).retry_after_seconds == 10.0
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock(), wall_clock=lambda: T0)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("q", 1))
    wait = turn.send(sm.ModelFailed(error))
    assert isinstance(wait, sm.Wait) and wait.retry_after == 10.0 and wait.seconds >= 10.0
    assert turn.trace[-1].wall == T0
    with pytest.raises(ValueError, match="wall: must be a finite Unix time"):
        sm.classify(response, wall=math.nan)


@pytest.mark.requirement("ER-141")
def test_simulate_reads_a_date_on_its_virtual_wall_clock() -> None:
    """A scenario's date retry-after is measured against the simulator's virtual wall
    clock: 10 s ahead of it is a 10 s wait, on every run."""
    scenario = parse(
        f"""
description = "a date retry-after"
[[turn]]
steps = [
  {{ event = "Assembled", size = 10 }},
  {{ event = "ModelFailed", category = "rate_limited", headers = {{ retry-after = "{_date(EPOCH + 10)}" }} }},
  {{ event = "ModelReplied" }},
]
""",
        "dated.toml",
        "dated",
    )
    steps: list[Any] = []
    result = run(scenario, on_step=steps.append)
    assert result.ok, result.failures
    wait = steps[2].action
    assert isinstance(wait, sm.Wait) and wait.retry_after == 10.0


# -- clock readings are checked -------------------------------------------------------------


@pytest.mark.requirement("ER-140")
def test_a_clock_that_runs_back_stands_still_and_the_snapshot_restores() -> None:
    """A clock that steps back a second before Assembled is read as standing still: the
    turn's times never decrease, and the snapshot (elapsed_s >= 0) restores (before it
    held elapsed_s -1.0, which restore refused)."""
    clock = ManualClock(100.0)
    session = sm.Session(sm.Settings(), seed=1, clock=clock)
    turn = session.new_turn()
    turn.start()
    clock.now = 99.0
    turn.send(sm.Assembled("q", 1))
    data = session.snapshot()
    assert data["elapsed_s"] == 0.0
    assert data["turn"]["times"] == [0.0, 0.0]
    sm.Session.restore(data, clock=clock)
    assert session.elapsed_s == 0.0


@pytest.mark.requirement("ER-140")
def test_a_worker_whose_clocks_run_back_writes_records_every_worker_reads() -> None:
    """A worker on time.time-like clocks that step back (and a wall clock that steps back
    between its writes) still writes records that every worker reads and restores."""
    readings = iter([1000.0, 990.0, 980.0, 985.0, 970.0, 960.0] * 20)
    walls = iter([5000.0, 4990.0, 5010.0, 4000.0, 4100.0, 3000.0] * 20)
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=lambda: next(readings), now=lambda: next(walls))
    r = w.create("s", sm.Session(sm.Settings(), seed=1, clock=lambda: 1000.0))
    for event in (
        None,
        sm.Assembled("q", 1),
        sm.ModelFailed(sm.ModelError("overloaded")),
        sm.WaitDone(),
    ):
        r = w.advance("s", event, expected_version=r.version)
    fresh = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 0.0, remember=0).load("s")
    times = fresh.session.snapshot()["turn"]["times"]
    assert times == sorted(times) and min(times) >= 0
    assert fresh.session.snapshot()["elapsed_s"] >= 0
    sm.Session.restore(store.load("s").record["snapshot"], clock=lambda: 0.0)


@pytest.mark.requirement("ER-140")
@pytest.mark.parametrize(
    ("at", "error", "match"),
    [
        (math.nan, ValueError, "at: must be a finite number of seconds"),
        (math.inf, ValueError, "at: must be a finite number of seconds"),
        ("12", TypeError, "at: must be a number of seconds"),
        (True, TypeError, "at: must be a number of seconds"),
        (10**400, ValueError, "at: must be a finite number of seconds"),
        (1.7e308, ValueError, "too far from the session's start"),
    ],
)
def test_a_moment_that_is_not_a_time_is_refused_and_nothing_changes(
    at: Any, error: type[Exception], match: str
) -> None:
    """A step given a moment that is not a finite number of seconds (or too far from the
    session's start to measure) is refused naming ``at``, and the session is as it was."""
    session = sm.Session(sm.Settings(), seed=1, clock=None, started=-1.7e308)
    turn = session.new_turn(at=-1.7e308)
    turn.start(at=-1.7e308)
    before = session.snapshot()
    with pytest.raises(error, match=match):
        turn.send(sm.Assembled("q", 1), at=at)
    assert session.snapshot() == before
    with pytest.raises(TypeError, match=r"at: the session has no clock .* send\(\) must say"):
        turn.send(sm.Assembled("q", 1))
    with pytest.raises(ValueError, match="wall: must be a finite number"):
        turn.send(sm.Assembled("q", 1), at=0.0, wall=math.inf)
    assert session.snapshot() == before


@pytest.mark.requirement("ER-140")
def test_waits_of_1e308_keep_simulate_on_finite_times_and_its_json_is_json() -> None:
    """Two honoured retry-afters of 1e308 s stop the virtual clock at the largest float:
    the steps' times stay finite and ``simulate --json`` prints JSON (before, the clock
    reached infinity and the output held ``Infinity``)."""
    text = """
description = "waits of 1e308 s"
[settings]
max_server_wait_s = 1e308
[[turn]]
steps = [
  { event = "Assembled", size = 10 },
  { event = "ModelFailed", category = "rate_limited", retry_after = 1e308 },
  { event = "ModelFailed", category = "rate_limited", retry_after = 1e308 },
  { event = "ModelReplied" },
]
"""
    scenario = parse(text, "forever.toml", "forever")
    steps: list[Any] = []
    result = run(scenario, on_step=steps.append)
    assert result.ok, result.failures
    assert all(math.isfinite(step.t) for step in steps)
    assert math.isfinite(result.elapsed_s)
    path = ROOT / "build-forever.toml"
    try:
        path.write_text(text, encoding="utf-8")
        out = subprocess.run(
            [sys.executable, "-m", "statemachine", "simulate", "--json", str(path)],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout
    finally:
        path.unlink(missing_ok=True)

    def no_constant(name: str) -> Any:
        raise AssertionError(f"{name} in the output")

    for line in out.splitlines():
        json.loads(line, parse_constant=no_constant)


# -- what a store record says is checked ---------------------------------------------------


def _record(store: InMemoryStore) -> dict[str, Any]:
    return json.loads(store.load_payload("s")[1])


@pytest.mark.requirement("ER-145")
@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda d: d.__setitem__("session_id", "other"), "session_id: it holds session 'other'"),
        (lambda d: d.__setitem__("format", "x"), "format: 'x' is not"),
        (lambda d: d.__setitem__("claim", {"owner": 1}), "claim: must be owner/calls/until"),
        (
            lambda d: d.__setitem__("claim", {"owner": "w", "calls": ["c9"], "until": 1.0}),
            "claim: tool calls are held, but the session is not invoking tools",
        ),
    ],
)
def test_the_store_api_checks_a_record_as_a_worker_does_whatever_its_version(
    version: int, change: Any, match: str
) -> None:
    """SessionStore.load refuses what Worker.load refuses, for a record with an empty
    journal and one of an older version too (before, it returned those unchecked)."""
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    r = w.create("s", sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0))
    r = w.advance("s", None, expected_version=r.version)
    w.advance("s", sm.Assembled("q", 1), expected_version=r.version)
    data = _record(store)
    data["snapshot"] = store.load("s").record["snapshot"]  # compacted: the journal empty
    data["journal"] = []
    data["version"] = version
    if version == 1:
        for key in ("journal", "elapsed_s", "finished_s"):
            del data[key]
    store.compare_and_set("s", store.load_payload("s")[0], data)
    assert store.load("s").record["snapshot"] == data["snapshot"]  # healthy: read
    change(data)
    store.compare_and_set("s", store.load_payload("s")[0], data)
    with pytest.raises(CorruptSession, match=match):
        store.load("s")
    with pytest.raises(CorruptSession, match=match):
        Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0).load("s")


@pytest.mark.requirement("ER-142")
def test_the_store_package_rewires_no_engine_private() -> None:
    """The store drives sessions through their public methods only: no access to an
    engine's private attribute is suppressed anywhere in statemachine/store (there were
    14), and the package has no import cycle left between its store modules."""
    sources = {
        p.name: p.read_text(encoding="utf-8")
        for p in (ROOT / "statemachine" / "store").glob("*.py")
    }
    reached = re.compile(r"[\w)\]]\._(core|handle|turn)\b")  # session._core, turn._turn...
    assert not [name for name, text in sources.items() if "SLF001" in text or reached.search(text)]
    assert (
        "from ._journal" not in sources["_core.py"] and "from ._core" not in sources["_errors.py"]
    )


# -- what an outside review of the change found (each failed before its fix) ---------------


@pytest.mark.requirement("ER-82", "ER-70")
def test_a_shared_workers_spend_report_reads_the_session_it_stored() -> None:
    """A worker shared by two threads reads its session (for its observers and its spend
    report) before it puts it back in memory: a second thread's advance that then loses
    its compare-and-set can no longer charge the parent for spend no record holds."""
    import threading

    store = InMemoryStore()
    release, stalled = threading.Event(), threading.Event()

    def slow_observer(record: sm.TraceRecord) -> None:  # a slow telemetry exporter
        if threading.current_thread().name == "first" and not stalled.is_set():
            stalled.set()
            release.wait(10)

    a = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0, observers=[slow_observer])
    b = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0)
    root = sm.Session(sm.Settings(fallback_models=("m2",), max_retries=0), seed=1, session_id="p")
    child = root.spawn()
    a.create("p", root)
    r = a.create("p.1", child)
    r = a.advance("p.1", None, expected_version=r.version)
    v = a.advance("p.1", sm.Assembled("q", 5), expected_version=r.version).version
    billed = sm.ModelFailed(sm.ModelError("overloaded"), cost=0.1)
    first = threading.Thread(
        target=lambda: a.advance("p.1", billed, expected_version=v), name="first"
    )
    first.start()
    assert stalled.wait(10)
    b.advance("p.1", sm.Cancelled(), expected_version=v + 1)  # another worker moves first
    lost = a.advance("p.1", sm.ModelReplied(cost=0.9), expected_version=v + 1)
    release.set()
    first.join()
    assert lost.status is sm.store.AdvanceStatus.CONFLICT
    fresh = Worker(store, owner="f", clock=lambda: 0.0, now=lambda: 1.0, remember=0)
    assert fresh.load("p.1").session.cost_usd == pytest.approx(0.1)
    assert fresh.load("p").session.cost_usd == pytest.approx(0.1)


@pytest.mark.requirement("ER-70", "ER-77")
def test_a_session_that_had_a_doom_check_is_read_by_workers_without_one() -> None:
    """A host session that ran with a doom check (its state keeps a doom window), stepped
    by workers without one, is read by every other worker and by the store API (before,
    every reader expected verdicts the journal could not hold); workers with and without
    a check share a session: each step is replayed as it was taken, so every reader, with
    a check or not, reads the state the stepping worker held."""
    host = sm.Session(
        sm.Settings(doom_check_window=2), seed=1, clock=lambda: 0.0, doom_check=lambda c: False
    )
    t = host.new_turn()
    t.start()
    t.send(sm.Assembled("q", 1))
    t.send(sm.ModelReplied((sm.ToolCall("c1", "fs", "ls", {"d": 1}),)))
    t.send(sm.ToolsDone((sm.ToolOutcome("c1", True, "ok"),)))
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    r = w.create("s", host)
    r = w.advance("s", None, expected_version=r.version)
    r = w.advance("s", sm.Assembled("q", 1), expected_version=r.version)
    calls = (sm.ToolCall("c2", "fs", "ls", {"d": 2}),)
    r = w.advance("s", sm.ModelReplied(calls), expected_version=r.version)
    other = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0, remember=0)
    assert other.load("s").session.snapshot() == r.session.snapshot()
    assert store.load("s").record["snapshot"]["turn"]["state"] == "invoking_tools"


@pytest.mark.requirement("ER-70", "ER-77")
def test_workers_with_and_without_a_doom_check_share_a_session() -> None:
    """Every reply's entry a worker with a doom check journals says so (its verdict),
    and a reader without one (the store API) replays them from the journal; an entry
    without a verdict is replayed as taken without a check, so workers with and without
    one step a session in turn and every reader holds the stepping worker's state
    (before, a worker without a check refused such a session with ConfigError)."""
    store = InMemoryStore()
    judged: list[int] = []

    def judge(window: tuple[sm.ToolCall, ...]) -> bool:
        judged.append(len(window))
        return False

    checked = Worker(store, owner="c", clock=lambda: 0.0, now=lambda: 1.0, doom_check=judge)
    fresh = sm.Session(sm.Settings(doom_check_window=2), seed=1, clock=lambda: 0.0)
    r = checked.create("s", fresh)
    for number in range(2):
        r = checked.advance("s", None, expected_version=r.version)
        r = checked.advance("s", sm.Assembled("q", 1), expected_version=r.version)
        calls = (sm.ToolCall(f"c{number}", "fs", "ls", {"d": number}),)
        r = checked.advance("s", sm.ModelReplied(calls), expected_version=r.version)
        outcome = sm.ToolOutcome(f"c{number}", True, "ok")
        r = checked.advance("s", sm.ToolsDone((outcome,)), expected_version=r.version)
    entries = json.loads(store.load_payload("s")[1])["journal"]
    replies = [e[3] for e in entries if e[0] == "e" and e[3]["$type"] == "ModelReplied"]
    assert [reply["doom_verdict"] for reply in replies] == [False, False]
    assert judged == [2]  # not asked, then asked (its window full)
    other = Worker(store, owner="d", clock=lambda: 0.0, now=lambda: 1.0)
    assert other.load("s").session.snapshot() == r.session.snapshot()
    assert store.load("s").record["snapshot"] == r.session.snapshot(at=r.session.last_at)
    # workers with and without a check step one session in turn: each reply's entry says
    # whether its worker had a check, and every reader replays it so
    fired = []

    def check(window: tuple[sm.ToolCall, ...]) -> bool:
        fired.append(len(window))
        return any(c.arguments.get("d") == 7 for c in window[-1:])

    both = Worker(store, owner="e", clock=lambda: 0.0, now=lambda: 1.0, doom_check=check)
    readers = [
        Worker(store, owner="f", clock=lambda: 0.0, now=lambda: 1.0, remember=0),
        Worker(store, owner="g", clock=lambda: 0.0, now=lambda: 1.0, remember=0, doom_check=check),
    ]
    for number, stepper in ((5, other), (6, both), (8, other), (7, both)):
        r = stepper.advance("s", None, expected_version=r.version)
        r = stepper.advance("s", sm.Assembled("q", 1), expected_version=r.version)
        calls = (sm.ToolCall(f"c{number}", "fs", "ls", {"d": number}),)
        r = stepper.advance("s", sm.ModelReplied(calls), expected_version=r.version)
        if number == 7:  # the check was asked (its window full) and fired: the limit path
            assert fired == [2] and r.session.limit_reached == sm.SessionStatus.ERROR_DOOM_LOOP
            break
        outcome = sm.ToolOutcome(f"c{number}", True, "ok")
        r = stepper.advance("s", sm.ToolsDone((outcome,)), expected_version=r.version)
        for reader in readers:
            assert reader.load("s").session.snapshot() == r.session.snapshot()
        assert store.load("s").record["snapshot"] == r.session.snapshot(at=r.session.last_at)
    asked = len(fired)
    for reader in readers:
        assert reader.load("s").session.snapshot() == r.session.snapshot()
    assert len(fired) == asked  # a replay gives the journal's verdicts: the check is not asked
    assert store.load("s").record["snapshot"] == r.session.snapshot(at=r.session.last_at)


@pytest.mark.requirement("ER-140", "ER-26")
def test_a_deferred_retry_at_is_read_on_the_restoring_clock() -> None:
    """A snapshot writes a Finish's retry_at as seconds after its moment, like every
    reading it holds: restored on another clock, or read through the store API, the
    retry is as far ahead as it was; a session handed out on a clock far behind its age
    (retry_at below 0) restores too."""
    clock = ManualClock(1000.0)
    session = sm.Session(sm.Settings(max_server_wait_s=10), seed=1, clock=clock)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("q", 1))
    finish = turn.send(sm.ModelFailed(sm.ModelError("rate_limited", retry_after_seconds=600)))
    assert isinstance(finish, sm.Finish) and finish.retry_at == 1600.0
    clock.advance(8.0)
    restored = sm.Session.restore(session.snapshot(), clock=ManualClock(50.0))
    assert restored.current_turn.finish.retry_at == 642.0  # type: ignore[union-attr]

    store = InMemoryStore()
    w = Worker(store, owner="a", clock=lambda: 100.0, now=lambda: 1000.0)
    r = w.create("s", sm.Session(sm.Settings(max_server_wait_s=10), seed=1, clock=lambda: 0.0))
    r = w.advance("s", None, expected_version=r.version)
    r = w.advance("s", sm.Assembled("q", 1), expected_version=r.version)
    r = w.advance(
        "s",
        sm.ModelFailed(sm.ModelError("rate_limited", retry_after_seconds=600)),
        expected_version=r.version,
    )
    assert r.action.retry_at == 700.0  # type: ignore[union-attr]
    snapshot = store.load("s").record["snapshot"]
    again = sm.Session.restore(snapshot, clock=lambda: 5000.0)
    assert again.current_turn.finish.retry_at == 5600.0  # type: ignore[union-attr]
    late = Worker(store, owner="b", clock=lambda: 100.0, now=lambda: 1000.0 + 86_400, remember=0)
    handed = late.load("s").session
    assert handed.current_turn.finish.retry_at == 700.0 - 86_400  # type: ignore[union-attr]
    sm.Session.restore(handed.snapshot(), clock=lambda: 100.0)


@pytest.mark.requirement("ER-140", "ER-26")
def test_a_retry_at_beyond_a_float_on_the_new_clock_is_refused() -> None:
    """A deferred retry far ahead, restored or copied onto a clock where its moment is
    no longer a float, is a SnapshotError naming the key (restore) or a ConfigError
    naming ``started`` (copy), and the source session is unchanged (before, the Finish
    held an infinite retry_at)."""
    session = sm.Session(sm.Settings(max_server_wait_s=10), seed=1, clock=lambda: 0.0)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("q", 1))
    turn.send(sm.ModelFailed(sm.ModelError("rate_limited", retry_after_seconds=1e308)))
    snapshot = session.snapshot()
    assert turn.finish.retry_at == 1e308  # type: ignore[union-attr]
    with pytest.raises(sm.SnapshotError, match=r"^turn\.actions: a Finish's retry_at"):
        sm.Session.restore(snapshot, clock=lambda: 1e308)
    with pytest.raises(sm.ConfigError, match=r"^started: "):
        session.copy(clock=None, started=1e308)
    assert session.snapshot() == snapshot
    restored = sm.Session.restore(snapshot, clock=lambda: 5.0)
    assert restored.current_turn.finish.retry_at == 1e308 + 5.0  # type: ignore[union-attr]


class _RawStore:
    """A host's own store: it keeps the records a worker gives it as they are."""

    def __init__(self) -> None:
        self.records: dict[str, tuple[int, Any]] = {}

    def load(self, session_id: str) -> Any:
        if session_id not in self.records:
            raise SessionNotFound(f"no session {session_id!r}", session_id=session_id)
        version, record = self.records[session_id]
        return Stored(session_id, version, json.loads(json.dumps(record)))

    def compare_and_set(self, session_id: str, expected: int, record: Any, **_: Any) -> int:
        actual = self.records.get(session_id, (0, None))[0]
        if actual != expected:
            raise StaleWrite("stale", session_id=session_id, expected=expected, actual=actual)
        self.records[session_id] = (expected + 1, json.loads(json.dumps(record)))
        return expected + 1

    def delete(self, session_id: str) -> bool:
        return self.records.pop(session_id, None) is not None


@pytest.mark.requirement("ER-140", "ER-70")
@pytest.mark.parametrize("kind", ["ours", "the host's"])
def test_a_deferred_retry_at_the_previous_release_stored_is_read_on_the_workers_clock(
    kind: str,
) -> None:
    """The previous release's worker (clock 5000, Unix time 1000) stored a turn deferred
    60 s with its Finish's retry_at as a reading of its clock (5060, record version 2,
    snapshot version 4). A worker on the same clock reads the same retry_at, however
    long the record waited in the store, and steps on (before, it read the reading as
    seconds after the session's start: 10060)."""
    data = json.loads((DATA / "store-v2-deferred.json").read_text())
    assert (data["version"], data["snapshot"]["version"]) == (2, 4)
    store: Any = InMemoryStore() if kind == "ours" else _RawStore()
    store.compare_and_set("s", 0, data)
    for idle in (0.0, 30.0):
        clock, wall = ManualClock(5000.0 + idle), ManualClock(1000.0 + idle)
        reader = Worker(store, owner="b", clock=clock, now=wall, remember=0)
        loaded = reader.load("s")
        assert loaded.action.retry_at == 5060.0  # type: ignore[union-attr]
        assert loaded.session.current_turn.finish.retry_at == 5060.0  # type: ignore[union-attr]
    r = reader.advance("s", None, expected_version=loaded.version)
    assert isinstance(r.action, sm.Assemble) and r.session.turns == 2


@pytest.mark.requirement("ER-82")
def test_an_ended_childs_unreported_grandchild_spend_is_pulled_into_the_tree() -> None:
    """A grandchild's spend whose report a worker never made reaches the root: an ended
    child starts no turn to pull it, so the root's turn start settles it down the tree
    (before, the root's budget never saw it)."""
    store = InMemoryStore()
    a = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    root = sm.Session(sm.Settings(max_cost_usd=1.0), seed=1, clock=lambda: 0.0, session_id="r")
    child = root.spawn(sm.Settings(max_turns=1))
    grandchild = child.spawn(sm.Settings())
    for each in (root, child, grandchild):
        a.create(each.session_id, each)  # type: ignore[arg-type]

    def turn(w: Worker, sid: str, cost: float) -> Any:
        r = w.load(sid)
        r = w.advance(sid, None, expected_version=r.version)
        r = w.advance(sid, sm.Assembled("q", 1), expected_version=r.version)
        return w.advance(sid, sm.ModelReplied(cost=cost), expected_version=r.version)

    turn(a, "r.1", 0.0)
    assert turn(a, "r.1", 0.0).session.status is sm.SessionStatus.ERROR_MAX_TURNS
    dying = Worker(store, owner="dying", clock=lambda: 0.0, now=lambda: 1.0)
    dying._report_spend = lambda *_report: None  # type: ignore[method-assign]  # it dies
    turn(dying, "r.1.1", 0.9)
    turn(a, "r", 0.2)
    turn(a, "r", 0.0)
    fresh = Worker(store, owner="f", clock=lambda: 0.0, now=lambda: 1.0, remember=0)
    assert fresh.load("r.1").session.cost_usd == pytest.approx(0.9)
    assert fresh.load("r").session.cost_usd == pytest.approx(1.1)
    assert fresh.load("r").session.limit_reached is sm.SessionStatus.ERROR_MAX_BUDGET_USD


@pytest.mark.requirement("ER-82")
def test_a_turn_start_settles_only_its_own_children() -> None:
    """A record naming as its child a session of another tree (forged, or an id
    re-created) pulls nothing from it and writes nothing to it: before, the turn start
    settled the stranger's unreported spend into the stranger's record first."""
    store = InMemoryStore()
    a = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    q = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0, session_id="q")
    q1 = q.spawn(sm.Settings(max_turns=1))
    q11 = q1.spawn(sm.Settings())
    for each in (q, q1, q11):
        a.create(each.session_id, each)  # type: ignore[arg-type]

    def turn(w: Worker, sid: str, cost: float) -> Any:
        r = w.load(sid)
        r = w.advance(sid, None, expected_version=r.version)
        r = w.advance(sid, sm.Assembled("q", 1), expected_version=r.version)
        return w.advance(sid, sm.ModelReplied(cost=cost), expected_version=r.version)

    turn(a, "q.1", 0.0)
    assert turn(a, "q.1", 0.0).session.status is sm.SessionStatus.ERROR_MAX_TURNS
    dying = Worker(store, owner="dying", clock=lambda: 0.0, now=lambda: 1.0)
    dying._report_spend = lambda *_report: None  # type: ignore[method-assign]  # it dies
    turn(dying, "q.1.1", 0.9)
    snapshot = sm.Session(sm.Settings(), seed=1, session_id="r").snapshot(at=0.0)
    snapshot.update(children=1, child_costs={"q.1": 0.0})
    a.create("r", sm.Session.restore(snapshot, clock=lambda: 0.0))
    stranger = store.load("q.1").version
    turn(a, "r", 0.0)
    fresh = Worker(store, owner="f", clock=lambda: 0.0, now=lambda: 1.0, remember=0)
    assert store.load("q.1").version == stranger
    assert fresh.load("r").session.cost_usd == 0.0


@pytest.mark.requirement("ER-82", "ER-70")
def test_a_spend_report_lost_to_rounding_leaves_the_worker_holding_what_is_stored() -> None:
    """A child's total that float rounding hides in the parent's spend is still a new
    total: it is written, so the parent the worker holds is the stored one."""
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    root = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0, session_id="r")
    child = root.spawn()
    w.create("r", root)
    w.create("r.1", child)
    for sid, cost in (("r", 1000.0), ("r.1", 1e-14)):
        r = w.load(sid)
        r = w.advance(sid, None, expected_version=r.version)
        r = w.advance(sid, sm.Assembled("q", 1), expected_version=r.version)
        w.advance(sid, sm.ModelReplied(cost=cost), expected_version=r.version)
    held = w.load("r")
    fresh = Worker(store, owner="f", clock=lambda: 0.0, now=lambda: 1.0, remember=0).load("r")
    assert fresh.version == held.version
    assert fresh.session.child_costs == held.session.child_costs == {"r.1": 1e-14}


@pytest.mark.requirement("ER-145")
def test_a_claim_and_carried_outcomes_must_answer_every_call_in_flight() -> None:
    """Of the calls in flight each is claimed or has a carried outcome, once: a claim on
    some of them only, or carried outcomes with no claim, is CorruptSession naming the
    key (before, resume then failed with IllegalEvent, or the session hung on an empty
    InvokeTools)."""
    store = InMemoryStore()
    w = Worker(store, owner="a", clock=lambda: 0.0, now=lambda: 1.0)
    r = w.create("s", sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0))
    r = w.advance("s", None, expected_version=r.version)
    r = w.advance("s", sm.Assembled("q", 1), expected_version=r.version)
    calls = (sm.ToolCall("c1", "p", "write"), sm.ToolCall("c2", "p", "write"))
    w.advance("s", sm.ModelReplied(calls), expected_version=r.version)
    healthy = json.loads(store.load_payload("s")[1])
    outcome = {"$type": "ToolOutcome", "call_id": "c1", "ok": False, "category": "cancelled"}
    forgeries = {
        "claim": lambda d: d["claim"].__setitem__("calls", ["c1"]),
        "carried": lambda d: (d.__setitem__("claim", None), d.__setitem__("carried", [outcome])),
    }
    for key, change in forgeries.items():
        data = json.loads(json.dumps(healthy))
        change(data)
        store.compare_and_set("s", store.load_payload("s")[0], data)
        reader = Worker(store, owner="b", clock=lambda: 0.0, now=lambda: 1.0, remember=0)
        with pytest.raises(CorruptSession, match=rf"record's {key}: "):
            reader.load("s")
        with pytest.raises(CorruptSession, match=rf"record's {key}: "):
            store.load("s")


@pytest.mark.requirement("ER-140", "ER-143", "ER-144")
def test_numbers_past_a_float_and_odd_reply_forms_are_refused_or_made_plain() -> None:
    """Ints too large for a float are refused naming the field (never OverflowError); a
    copy whose readings would overflow is refused; a reply whose JSON form is a dict or
    str subclass is kept as plain JSON (the snapshot restores), one whose attribute
    lookup raises is refused, and one whose form is None still comes back as itself."""
    with pytest.raises(sm.InvalidValue, match=r"Usage\.cost_usd"):
        sm.Usage(cost_usd=10**400)
    with pytest.raises(ValueError, match="wall: must be a finite Unix time"):
        sm.classify(httpx.Response(429), wall=10**400)
    session = sm.Session(sm.Settings(), seed=1, clock=None, started=0.0)
    session.new_turn(at=1e307).start(at=1e307)
    with pytest.raises(sm.ConfigError, match=r"started: .* beyond a float"):
        session.copy(started=1.79e308)

    class Ordered(pydantic.BaseModel):
        def model_dump(self, **_: Any) -> Any:  # type: ignore[override]
            from collections import OrderedDict

            return OrderedDict(a=1)

    class Lookups:
        def __getattr__(self, name: str) -> Any:
            raise KeyError(name)

    class Nothing(pydantic.BaseModel):
        def model_dump(self, **_: Any) -> Any:  # type: ignore[override]
            return None

    for reply in (Ordered(), Nothing()):
        s = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0)
        t = s.new_turn()
        t.start()
        t.send(sm.Assembled("q", 1))
        finish = t.send(sm.ModelReplied(reply=reply))
        assert finish.reply is reply  # type: ignore[union-attr]
        sm.Session.restore(json.loads(json.dumps(s.snapshot())), clock=lambda: 0.0)
    with pytest.raises(sm.InvalidValue, match=r"looking up .*Lookups\.model_dump raised KeyError"):
        sm.ModelReplied(reply=Lookups())


@pytest.mark.requirement("ER-142", "ER-130")
def test_a_production_trace_file_tells_each_steps_error(tmp_path: Path) -> None:
    """A trace file a TraceWriter wrote (no simulator detail) shows in the drawn step
    list what each step's event said: the failure's category, HTTP status and
    retry-after, the reply's usage (before, its steps carried no error category)."""
    from statemachine.dev._trace_draw import draw
    from statemachine.io._trace_file import load_trace

    path = tmp_path / "turn.jsonl"
    writer = sm.TraceWriter(path)
    session = sm.Session(sm.Settings(), seed=1, clock=ManualClock(), observers=[writer])
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("q", 900))
    turn.send(sm.ModelFailed(sm.ModelError("rate_limited", status=429, retry_after_seconds=2)))
    turn.send(sm.WaitDone())
    turn.send(sm.ModelReplied(usage=sm.Usage(900, 12, cost_usd=0.01, model="m-2026")))
    writer.close()
    lines = [step.line for step in draw(load_trace(path)).steps]
    assert "(size=900)" in lines[1]
    assert "(rate_limited retry_after=2s HTTP 429)" in lines[2]
    assert "(no tool call tokens 900/12 model m-2026 $0.01)" in lines[4]
