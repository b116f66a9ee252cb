"""MCP stdio tool servers that crash mid-call: real subprocesses on the official SDK.

The servers are tests/servers/mcp_crashy.py (an ``MCPServer``); the provider is
``statemachine.mcp.MCPStdioTools``. A death mid-call must fail the in-flight call
promptly as ``process_crashed`` with the exit code or signal and a bounded,
redacted stderr tail, restart the server for the next call (bounded), and, when
it keeps happening, trip the engine's breaker through ``arun_turn``.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import statemachine as sm
from statemachine.mcp import MCPStdioTools, redact

SERVER = str(Path(__file__).parent / "servers" / "mcp_crashy.py")
COMMAND = [sys.executable, SERVER]


def _call(call_id: str, name: str, **arguments: Any) -> sm.ToolCall:
    return sm.ToolCall(call_id, "crashy", name, arguments)


def _others() -> list[asyncio.Task[Any]]:
    current = asyncio.current_task()
    return [t for t in asyncio.all_tasks() if t is not current and not t.done()]


@pytest.mark.requirement("ER-14", "ER-54")
@pytest.mark.parametrize(
    ("mode", "exit_code", "signal", "description"),
    [
        ("exit", 3, None, "exited with code 3"),
        ("sigkill", None, 9, "killed by signal SIGKILL (9)"),
        ("segv", None, 11, "killed by signal SIGSEGV (11)"),
    ],
)
def test_death_mid_call_fails_promptly_as_process_crashed(
    mode: str, exit_code: int | None, signal: int | None, description: str
) -> None:
    """The in-flight call fails as process_crashed within well under a second of the
    death (no timeout is set at all), naming the exit code or signal, with the
    stderr tail bounded and its API key and bearer token redacted; not the SDK's
    generic "Connection closed"."""

    async def scenario() -> tuple[sm.ToolOutcome, float, MCPStdioTools]:
        async with MCPStdioTools("crashy", COMMAND, stderr_tail_bytes=1024) as tools:
            await tools.start()
            outcome = await tools.invoke(_call("c1", "die", mode=mode))
            received = time.monotonic()
            return outcome, received, tools

    outcome, received, tools = asyncio.run(scenario())
    assert not outcome.ok
    assert outcome.category is sm.ToolErrorCategory.PROCESS_CRASHED
    assert description in outcome.content
    assert "Connection closed" not in outcome.content
    death = float(re.search(r"DEATH_AT=([0-9.]+)", outcome.content).group(1))  # type: ignore[union-attr]
    assert received - death < 1.0
    crash = tools.crashes[-1]
    assert (crash.exit_code, crash.signal) == (exit_code, signal)
    assert len(crash.stderr_tail.encode()) <= 1024
    assert "noise line 199" in crash.stderr_tail
    assert "noise line 0\n" not in crash.stderr_tail  # bounded: the head was dropped
    assert "sk-live-" not in outcome.content
    assert "eyJhbGci" not in outcome.content
    assert "[REDACTED]" in outcome.content


@pytest.mark.requirement("ER-55")
def test_crashed_server_is_restarted_within_a_bound() -> None:
    """After a crash the next call runs on a fresh server; with max_restarts=1 the
    second crash is final: the third call fails process_crashed at once, naming
    the restart limit, and no third process is spawned."""

    async def scenario() -> list[sm.ToolOutcome]:
        async with MCPStdioTools("crashy", COMMAND, max_restarts=1) as tools:
            outcomes = [await tools.invoke(_call("c1", "die", mode="exit"))]
            outcomes.append(await tools.invoke(_call("c2", "echo", text="back again")))
            outcomes.append(await tools.invoke(_call("c3", "die", mode="sigkill")))
            started = time.monotonic()
            outcomes.append(await tools.invoke(_call("c4", "echo", text="never")))
            assert time.monotonic() - started < 0.5
            assert tools.starts == 2
            assert len(tools.crashes) == 2
            return outcomes

    first, second, third, fourth = asyncio.run(scenario())
    assert first.category is sm.ToolErrorCategory.PROCESS_CRASHED
    assert second.ok
    assert second.content == {"result": "back again"}
    assert third.category is sm.ToolErrorCategory.PROCESS_CRASHED
    assert fourth.category is sm.ToolErrorCategory.PROCESS_CRASHED
    assert "restart limit reached" in fourth.content


class DyingModel:
    """A model that asks for a deadly tool call each turn (a different mode each
    time, so it is no doom loop), and answers plainly on the final-answer turn."""

    def __init__(self) -> None:
        self.modes = iter(["exit", "sigkill", "segv", "exit"])
        self.turn = 0

    async def complete(self, action: sm.CallModel) -> sm.ModelReplied:
        if action.withhold_tools:
            return sm.ModelReplied(reply="final answer")
        self.turn += 1
        return sm.ModelReplied(tool_calls=(_call(f"t{self.turn}", "die", mode=next(self.modes)),))


class Context:
    async def assemble(self, action: sm.Assemble) -> sm.Assembled:
        return sm.Assembled({"messages": []}, size=1)


@pytest.mark.requirement("ER-56", "ER-13", "ER-18", "ER-14")
def test_repeated_real_crashes_trip_the_breaker_through_the_driver() -> None:
    """Three turns whose tool call kills the real server: turns 1 and 2 complete with
    a process_crashed error result, turn 3 trips the breaker (breaker_open), the
    session takes the limit-reached path (error_circuit_breaker) and its final
    turn invokes no tool."""

    async def scenario() -> tuple[list[sm.Finish], sm.Session, MCPStdioTools]:
        session = sm.Session(sm.Settings(breaker_threshold=3), seed=3, clock=time.monotonic)
        model, context = DyingModel(), Context()
        finishes = []
        async with MCPStdioTools("crashy", COMMAND, max_restarts=5) as tools:
            for _ in range(3):
                turn = session.new_turn()
                finishes.append(await sm.arun_turn(turn, model=model, tools=tools, context=context))
            assert session.limit_reached is sm.SessionStatus.ERROR_CIRCUIT_BREAKER
            final = session.new_turn()
            finishes.append(await sm.arun_turn(final, model=model, tools=tools, context=context))
            assert tools.starts == 3
        return finishes, session, tools

    finishes, session, tools = asyncio.run(scenario())
    assert [f.status for f in finishes] == [
        sm.TurnStatus.COMPLETED,
        sm.TurnStatus.COMPLETED,
        sm.TurnStatus.BREAKER_OPEN,
        sm.TurnStatus.COMPLETED,
    ]
    for finish in finishes[:3]:
        (result,) = finish.tool_results
        assert result.is_error
        assert result.category is sm.ToolErrorCategory.PROCESS_CRASHED
    assert finishes[3].tool_results == ()
    assert finishes[3].reply == "final answer"
    assert session.status is sm.SessionStatus.ERROR_CIRCUIT_BREAKER
    assert "crashy" in session.tripped_providers
    assert len(tools.crashes) == 3


@pytest.mark.requirement("ER-54", "ER-49", "ER-14")
def test_a_death_fails_every_call_in_flight_of_a_concurrent_round() -> None:
    """Two calls of one round run concurrently on the same server; one kills it: both
    in-flight calls fail process_crashed, and the death is recorded once."""

    class TwoCalls:
        def __init__(self) -> None:
            self.calls = 0

        async def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            self.calls += 1
            if self.calls > 1:
                return sm.ModelReplied()
            return sm.ModelReplied(
                tool_calls=(_call("a", "hang"), _call("b", "die", mode="sigkill"))
            )

    async def scenario() -> tuple[sm.Finish, MCPStdioTools]:
        session = sm.Session(sm.Settings(), seed=5, clock=time.monotonic)
        async with MCPStdioTools("crashy", COMMAND) as tools:
            await tools.start()
            finish = await sm.arun_turn(
                session.new_turn(), model=TwoCalls(), tools=tools, context=Context()
            )
            return finish, tools

    finish, tools = asyncio.run(scenario())
    assert finish.status is sm.TurnStatus.COMPLETED
    assert [r.category for r in finish.tool_results] == [
        sm.ToolErrorCategory.PROCESS_CRASHED,
        sm.ToolErrorCategory.PROCESS_CRASHED,
    ]
    assert all("SIGKILL" in r.content for r in finish.tool_results)
    assert len(tools.crashes) == 1


@pytest.mark.requirement("ER-32", "ER-50")
def test_cancelling_a_turn_during_an_mcp_call_leaves_a_consistent_session() -> None:
    """Cancelling the driver's task while a real MCP call hangs: the turn finishes
    cancelled with a cancelled error result, CancelledError propagates, only the
    provider's own tasks remain (none after it closes), the server still answers,
    and the session snapshot is plain JSON."""

    class HangModel:
        async def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            return sm.ModelReplied(tool_calls=(_call("h1", "hang"),))

    async def scenario() -> tuple[sm.Turn, sm.Session, sm.ToolOutcome, list[Any]]:
        session = sm.Session(sm.Settings(), seed=5, clock=time.monotonic)
        turn = session.new_turn()
        async with MCPStdioTools("crashy", COMMAND) as tools:
            await tools.start()
            task = asyncio.create_task(
                sm.arun_turn(turn, model=HangModel(), tools=tools, context=Context())
            )
            while turn.state != "invoking_tools":
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # the tools/call request is in flight
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            echo = await tools.invoke(_call("e1", "echo", text="still here"))
        return turn, session, echo, _others()

    turn, session, echo, leftovers = asyncio.run(scenario())
    assert turn.status is sm.TurnStatus.CANCELLED
    (result,) = turn.finish.tool_results  # type: ignore[union-attr]
    assert result.category is sm.ToolErrorCategory.CANCELLED
    assert echo.ok
    assert leftovers == []
    json.dumps(session.snapshot())
    restored = sm.Session.restore(session.snapshot(), clock=time.monotonic)
    assert restored.current_turn is not None
    assert restored.current_turn.status is sm.TurnStatus.CANCELLED


@pytest.mark.requirement("ER-48")
def test_a_hanging_mcp_tool_times_out_per_settings() -> None:
    """tool_timeout_s bounds a real MCP call that never answers: the outcome is a
    timeout error result, the turn completes, the wait is bounded."""

    class HangModel:
        def __init__(self) -> None:
            self.calls = 0

        async def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            self.calls += 1
            if self.calls == 1:
                return sm.ModelReplied(tool_calls=(_call("h1", "hang"),))
            return sm.ModelReplied()

    async def scenario() -> tuple[sm.Finish, float]:
        session = sm.Session(sm.Settings(tool_timeout_s=0.3), seed=5, clock=time.monotonic)
        async with MCPStdioTools("crashy", COMMAND) as tools:
            await tools.start()
            started = time.monotonic()
            finish = await sm.arun_turn(
                session.new_turn(), model=HangModel(), tools=tools, context=Context()
            )
            return finish, time.monotonic() - started

    finish, elapsed = asyncio.run(scenario())
    assert finish.status is sm.TurnStatus.COMPLETED
    (result,) = finish.tool_results
    assert result.category is sm.ToolErrorCategory.TIMEOUT
    assert 0.3 <= elapsed < 3.0


@pytest.mark.requirement("ER-54")
def test_a_server_that_dies_while_starting_is_process_crashed() -> None:
    """A server that exits before the MCP handshake fails the call process_crashed
    with its exit code and its stderr, instead of hanging in initialize."""

    async def scenario() -> tuple[sm.ToolOutcome, MCPStdioTools]:
        async with MCPStdioTools(
            "crashy", COMMAND, env={"CRASHY_DIE_ON_START": "1"}, max_restarts=0
        ) as tools:
            return await tools.invoke(_call("s1", "echo", text="x")), tools

    outcome, tools = asyncio.run(scenario())
    assert outcome.category is sm.ToolErrorCategory.PROCESS_CRASHED
    assert "exited with code 5" in outcome.content
    assert "refusing to start" in outcome.content
    assert tools.starts == 1


@pytest.mark.requirement("ER-54", "ER-48")
def test_a_live_server_that_never_finishes_the_handshake_is_bounded() -> None:
    """A process that stays alive but never answers the MCP handshake is stopped after
    start_timeout_s and the call fails execution_failed (it did not crash: no
    breaker count, nothing in crashes), promptly."""
    silent = [
        sys.executable,
        "-c",
        "import sys; print('not json-rpc', flush=True); sys.stdin.read()",
    ]

    async def scenario() -> tuple[sm.ToolOutcome, MCPStdioTools, float]:
        started = time.monotonic()
        async with MCPStdioTools("crashy", silent, start_timeout_s=0.3, max_restarts=0) as tools:
            outcome = await tools.invoke(_call("s1", "echo", text="x"))
        return outcome, tools, time.monotonic() - started

    outcome, tools, elapsed = asyncio.run(scenario())
    assert outcome.category is sm.ToolErrorCategory.EXECUTION_FAILED
    assert "did not start within 0.3s" in outcome.content
    assert tools.crashes == []
    assert tools.starts == 1
    assert elapsed < 3.0


@pytest.mark.requirement("ER-54")
def test_calls_for_another_provider_and_bad_arguments_spawn_nothing() -> None:
    """A call addressed to another provider is not_found and non-object arguments are
    invalid_arguments; neither starts a server."""

    async def scenario() -> tuple[sm.ToolOutcome, MCPStdioTools]:
        tools = MCPStdioTools("crashy", COMMAND)
        try:
            other = await tools.invoke(sm.ToolCall("x1", "elsewhere", "echo", {"text": "x"}))
        finally:
            await tools.aclose()
        return other, tools

    other, tools = asyncio.run(scenario())
    assert other.category is sm.ToolErrorCategory.NOT_FOUND
    assert tools.starts == 0
    with pytest.raises(ValueError, match="command"):
        MCPStdioTools("crashy", [])
    with pytest.raises(ValueError, match="max_restarts"):
        MCPStdioTools("crashy", COMMAND, max_restarts=-1)


@pytest.mark.requirement("ER-54")
def test_redact_hides_credentials_and_keeps_the_rest() -> None:
    """redact() replaces API keys, bearer tokens, JWTs and key=value secrets, and
    leaves ordinary diagnostics readable."""
    text = (
        "boom at step 3; OPENAI_API_KEY=sk-proj-abcdefghijklmnop1234 "
        "Authorization: Bearer abc.def-123456789 password: hunter22 "
        "ghp_abcdefghijklmnopqrstuvwxyz0123 AKIAABCDEFGHIJKLMNOP traceback line 7"
    )
    redacted = redact(text)
    for secret in ("sk-proj", "abc.def-123456789", "hunter22", "ghp_", "AKIAABCD"):
        assert secret not in redacted
    assert "boom at step 3" in redacted
    assert "traceback line 7" in redacted


@pytest.mark.requirement("ER-57")
def test_crash_latency_benchmark_runs_and_reports_its_shape() -> None:
    """benchmarks/crash_latency.run(kills=2) kills a real server mid-call twice and
    reports median and worst latency, every outcome process_crashed with the signal
    named (timings themselves are recorded, not asserted)."""
    from benchmarks import crash_latency

    result = crash_latency.run(kills=2)
    assert result["kills"] == 2
    assert len(result["samples_ms"]) == 2
    assert 0 < result["median_ms"] <= result["worst_ms"]
    assert result["all_process_crashed"]
    assert result["signal_reported"] == 2
    with pytest.raises(ValueError, match="kills"):
        crash_latency.run(kills=0)
