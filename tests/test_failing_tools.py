"""A tool provider whose invocations keep failing trips its crash breaker (ER-250).

A call the provider could not run (its function raised, or timed out, instead of
answering) is an ``invoke_failed`` outcome, which the crash breaker counts as it counts
``process_crashed``; an error result the tool returned as its answer is the model's to
handle and is not counted.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import statemachine as sm
from statemachine.io._trace_file import read_trace

from .helpers import ManualClock


class _Model:
    """A model that calls one tool with new arguments on every request (so the doom
    loop never fires), and answers in text once tools are withheld."""

    def __init__(self, tool: str = "lookup", provider: str = "plugin") -> None:
        self.tool, self.provider = tool, provider
        self.requests = 0

    def complete(self, action: sm.CallModel) -> sm.ModelReplied:
        self.requests += 1
        if action.withhold_tools:
            return sm.ModelReplied(reply="the final answer")
        call = sm.ToolCall(f"c{self.requests}", self.provider, self.tool, {"q": self.requests})
        return sm.ModelReplied(tool_calls=(call,))


class _AsyncModel(_Model):
    async def complete(self, action: sm.CallModel) -> sm.ModelReplied:  # type: ignore[override]
        return _Model.complete(self, action)


class _Context:
    def assemble(self, action: sm.Assemble) -> sm.Assembled:
        return sm.Assembled({"withhold_tools": action.withhold_tools}, 10)


class _AsyncContext(_Context):
    async def assemble(self, action: sm.Assemble) -> sm.Assembled:  # type: ignore[override]
        return _Context.assemble(self, action)


class _Raising:
    def __init__(self) -> None:
        self.invoked = 0

    def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        self.invoked += 1
        raise KeyError(f"no row {call.arguments['q']}")


class _AsyncRaising(_Raising):
    async def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:  # type: ignore[override]
        return _Raising.invoke(self, call)


class _Answering:
    """A tool whose answer is an error result: the model's to handle."""

    def __init__(self) -> None:
        self.invoked = 0

    def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        self.invoked += 1
        category = sm.ToolErrorCategory.EXECUTION_FAILED
        return sm.ToolOutcome(call.id, ok=False, content="no such row", category=category)


def _sleep(_seconds: float) -> None:
    raise AssertionError("no wait is due")


def _run(session: sm.Session, tools: Any, turns: int) -> list[sm.Finish]:
    model, context = _Model(), _Context()
    finishes = []
    for _ in range(turns):
        if session.status is not None:
            break
        turn = session.new_turn()
        finishes.append(sm.run_turn(turn, model=model, tools=tools, context=context, sleep=_sleep))
    return finishes


@pytest.mark.requirement("ER-250", "ER-18")
def test_a_tool_that_raises_on_every_call_trips_its_breaker_on_the_defaults() -> None:
    """With the default settings (no max_turns), a tool that raises with new arguments
    on every call is invoked breaker_threshold times; that turn ends breaker_open with
    the error results, and the next is the final-answer turn, after which the session
    ends error_circuit_breaker."""
    session = sm.Session(seed=1, clock=ManualClock())
    tools = _Raising()
    finishes = _run(session, tools, turns=12)
    threshold = sm.Settings().breaker_threshold
    assert tools.invoked == threshold
    statuses = [finish.status for finish in finishes]
    assert statuses == [sm.TurnStatus.COMPLETED] * (threshold - 1) + [
        sm.TurnStatus.BREAKER_OPEN,
        sm.TurnStatus.COMPLETED,
    ]
    tripped = finishes[threshold - 1].tool_results[0]
    assert tripped.is_error and "KeyError" in tripped.content
    assert session.tripped_providers == frozenset({"plugin"})
    assert session.status is sm.SessionStatus.ERROR_CIRCUIT_BREAKER


@pytest.mark.requirement("ER-250")
def test_the_async_driver_counts_a_raising_tool_too() -> None:
    session = sm.Session(sm.Settings(breaker_threshold=2), seed=1, clock=ManualClock())
    tools, model, context = _AsyncRaising(), _AsyncModel(), _AsyncContext()

    async def _no_wait(_seconds: float) -> None:
        raise AssertionError("no wait is due")

    async def scenario() -> list[sm.TurnStatus]:
        statuses = []
        while session.status is None:
            turn = session.new_turn()
            finish = await sm.arun_turn(
                turn, model=model, tools=tools, context=context, sleep=_no_wait
            )
            statuses.append(finish.status)
        return statuses

    statuses = asyncio.run(scenario())
    assert statuses == [
        sm.TurnStatus.COMPLETED,
        sm.TurnStatus.BREAKER_OPEN,
        sm.TurnStatus.COMPLETED,
    ]
    assert tools.invoked == 2
    assert session.status is sm.SessionStatus.ERROR_CIRCUIT_BREAKER


@pytest.mark.requirement("ER-250")
def test_an_error_result_the_tool_returns_is_not_counted() -> None:
    """A tool answering with an error result every time is the model's to handle: no
    breaker trips, every call is made (the host's max_turns ends the session)."""
    session = sm.Session(sm.Settings(max_turns=8), seed=1, clock=ManualClock())
    tools = _Answering()
    finishes = _run(session, tools, turns=20)
    assert tools.invoked == 8
    assert all(f.status is sm.TurnStatus.COMPLETED for f in finishes)
    assert session.tripped_providers == frozenset()
    assert session.status is sm.SessionStatus.ERROR_MAX_TURNS


@pytest.mark.requirement("ER-250")
def test_a_success_between_failures_starts_the_count_again() -> None:
    """Failed invocations count in a row per provider, as crashes do."""
    session = sm.Session(sm.Settings(breaker_threshold=2), seed=1, clock=ManualClock())
    failed = 0
    outcomes = [False, True, False, True, False, False]

    def invoke(call: sm.ToolCall) -> sm.ToolOutcome:
        nonlocal failed
        ok = outcomes[failed]
        failed += 1
        if not ok:
            raise OSError("disk gone")
        return sm.ToolOutcome(call.id, ok=True, content="row")

    class Tools:
        pass

    tools = Tools()
    tools.invoke = invoke  # type: ignore[attr-defined]
    finishes = _run(session, tools, turns=10)
    assert [f.status for f in finishes][:6] == [sm.TurnStatus.COMPLETED] * 5 + [
        sm.TurnStatus.BREAKER_OPEN
    ]


def test_an_outcome_says_whether_the_breaker_counts_it() -> None:
    category = sm.ToolErrorCategory
    assert sm.ToolOutcome("a", False, category=category.PROCESS_CRASHED).crashed
    assert sm.ToolOutcome("a", False, category=category.UNKNOWN, invoke_failed=True).crashed
    assert not sm.ToolOutcome("a", False, category=category.EXECUTION_FAILED).crashed
    assert not sm.ToolOutcome("a", True).crashed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ok": True, "invoke_failed": True}, r"^invoke_failed: a successful ToolOutcome \('a'\)"),
        ({"ok": False, "invoke_failed": 1}, r"invoke_failed"),
    ],
)
def test_a_bad_invoke_failed_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises((sm.InvalidValue, TypeError), match=message):
        sm.ToolOutcome("a", **kwargs)


@pytest.mark.requirement("ER-250")
def test_a_failed_invocation_is_kept_by_the_snapshot_and_the_trace_file(tmp_path: Path) -> None:
    """The count a failed invocation made survives a snapshot (restored, the next
    failure trips the breaker), and the flag survives the trace file."""
    path = tmp_path / "trace.jsonl"
    writer = sm.TraceWriter(path)
    settings = sm.Settings(breaker_threshold=2)
    session = sm.Session(settings, seed=1, clock=ManualClock(), observers=[writer])
    tools = _Raising()
    _run(session, tools, turns=1)
    writer.close()
    snapshot = json.loads(json.dumps(session.snapshot()))
    restored = sm.Session.restore(snapshot, clock=ManualClock())
    assert _run(restored, tools, turns=1)[0].status is sm.TurnStatus.BREAKER_OPEN
    trace = read_trace(path.read_text("utf-8").splitlines(), str(path))
    done = [s.record.caused_by for s in trace.steps if isinstance(s.record.caused_by, sm.ToolsDone)]
    assert [o.invoke_failed for o in done[0].outcomes] == [True]


@pytest.mark.requirement("ER-250")
@pytest.mark.parametrize(
    ("error", "category", "counted"),
    [
        ((-32602, "bad params"), sm.ToolErrorCategory.INVALID_ARGUMENTS, False),
        ((-32601, "no such tool"), sm.ToolErrorCategory.NOT_FOUND, False),
        ((-32603, "internal error"), sm.ToolErrorCategory.EXECUTION_FAILED, True),
        (TimeoutError(), sm.ToolErrorCategory.TIMEOUT, True),
        (OSError("pipe"), sm.ToolErrorCategory.UNKNOWN, True),
        (None, sm.ToolErrorCategory.UNKNOWN, True),
    ],
)
def test_an_mcp_call_without_a_result_is_counted_unless_the_call_itself_was_refused(
    error: Any, category: sm.ToolErrorCategory, counted: bool
) -> None:
    """A server that refuses the call (bad arguments, no such tool) tells the model what
    to fix; any other JSON-RPC error, a timeout or a lost call is an invocation that
    failed. A result flagged isError is the tool's answer."""
    pytest.importorskip("mcp")
    from mcp.shared.exceptions import MCPError

    from statemachine.io._mcp import _error_outcome, _result_outcome

    call = sm.ToolCall("c1", "srv", "lookup", {})
    exc = MCPError(*error) if isinstance(error, tuple) else error
    outcome = _error_outcome(call, exc)
    assert (outcome.ok, outcome.category, outcome.invoke_failed) == (False, category, counted)

    class Answer:
        is_error = True
        content = ()

    answered = _result_outcome(call, Answer())
    assert (answered.category, answered.crashed) == (sm.ToolErrorCategory.EXECUTION_FAILED, False)
