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
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import statemachine as sm
from statemachine.mcp import MCPStartError, MCPStdioTools, redact

SERVER = str(Path(__file__).parent / "servers" / "mcp_crashy.py")
HANG_GUARD_S = 60
"""Only turns a hang into a failure: no test asserts how long anything took (the
mechanism that ended a call is read from its outcome instead)."""
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
    """The in-flight call fails as process_crashed from the death itself (no timeout is
    set at all), naming the exit code or signal and carrying the stderr the process
    wrote as it died, bounded, its API key and bearer token redacted; not the SDK's
    generic "Connection closed"."""

    async def scenario() -> tuple[sm.ToolOutcome, MCPStdioTools]:
        async with (
            asyncio.timeout(HANG_GUARD_S),
            MCPStdioTools("crashy", COMMAND, stderr_tail_bytes=1024) as tools,
        ):
            await tools.start()
            outcome = await tools.invoke(_call("c1", "die", mode=mode))
            return outcome, tools

    outcome, tools = asyncio.run(scenario())
    assert not outcome.ok
    assert outcome.category is sm.ToolErrorCategory.PROCESS_CRASHED
    assert description in outcome.content
    assert "Connection closed" not in outcome.content
    assert re.search(rf"DEATH_AT=[0-9.]+ mode={mode}", outcome.content)
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
            outcomes.append(await tools.invoke(_call("c4", "echo", text="never")))
            assert tools.starts == 2  # the fourth call spawned nothing
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

    async def scenario() -> tuple[sm.Finish, MCPStdioTools]:
        session = sm.Session(sm.Settings(tool_timeout_s=0.3), seed=5, clock=time.monotonic)
        async with asyncio.timeout(HANG_GUARD_S), MCPStdioTools("crashy", COMMAND) as tools:
            await tools.start()
            finish = await sm.arun_turn(
                session.new_turn(), model=HangModel(), tools=tools, context=Context()
            )
            return finish, tools

    finish, tools = asyncio.run(scenario())
    assert finish.status is sm.TurnStatus.COMPLETED
    (result,) = finish.tool_results
    assert result.category is sm.ToolErrorCategory.TIMEOUT
    assert tools.crashes == []  # the driver's timeout ended the call, not a death


@pytest.mark.requirement("ER-54")
def test_a_server_that_dies_while_starting_is_process_crashed() -> None:
    """A server that exits before the MCP handshake fails the call process_crashed
    with its exit code and its stderr, instead of hanging in initialize."""

    async def scenario() -> tuple[sm.ToolOutcome, MCPStdioTools]:
        # started lazily by the call (``async with`` would raise MCPStartError at entry)
        tools = MCPStdioTools("crashy", COMMAND, env={"CRASHY_DIE_ON_START": "1"}, max_restarts=0)
        try:
            return await tools.invoke(_call("s1", "echo", text="x")), tools
        finally:
            await tools.aclose()

    outcome, tools = asyncio.run(scenario())
    assert outcome.category is sm.ToolErrorCategory.PROCESS_CRASHED
    assert "exited with code 5" in outcome.content
    assert "refusing to start" in outcome.content
    assert tools.starts == 1


@pytest.mark.requirement("ER-54", "ER-48", "ER-250")
def test_a_live_server_that_never_finishes_the_handshake_is_bounded() -> None:
    """A process that stays alive but never answers the MCP handshake is stopped after
    start_timeout_s and the call fails execution_failed, promptly: it did not crash
    (nothing in crashes), but the provider could not run the call, which the crash
    breaker counts (ER-250)."""
    silent = [
        sys.executable,
        "-c",
        "import sys; print('not json-rpc', flush=True); sys.stdin.read()",
    ]

    async def scenario() -> tuple[sm.ToolOutcome, MCPStdioTools]:
        # started lazily by the call (``async with`` would raise MCPStartError at entry)
        tools = MCPStdioTools("crashy", silent, start_timeout_s=0.3, max_restarts=0)
        try:
            outcome = await tools.invoke(_call("s1", "echo", text="x"))
        finally:
            await tools.aclose()
        return outcome, tools

    outcome, tools = asyncio.run(scenario())
    assert outcome.category is sm.ToolErrorCategory.EXECUTION_FAILED
    assert "did not start within 0.3s" in outcome.content
    assert outcome.invoke_failed and outcome.crashed
    assert tools.crashes == []
    assert tools.starts == 1


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


# -- hostile peers at the edges ------------------------------------------------------

HOSTILE = str(Path(__file__).parent / "servers" / "mcp_hostile.py")


def _hostile(mode: str = "serve") -> list[str]:
    return [sys.executable, HOSTILE, mode]


def _hcall(call_id: str, name: str, **arguments: Any) -> sm.ToolCall:
    return sm.ToolCall(call_id, "hostile", name, arguments)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# (text, the secret that must vanish, what must stay readable)
SECRET_SHAPES = [
    ('{"api_key": "s3cr3t-json-1"}', "s3cr3t-json-1", '{"api_key": "[REDACTED]"}'),
    ('{"apiKey":"s3cr3t-camel","model":"m1"}', "s3cr3t-camel", '"model":"m1"'),
    ('{"access_token": "tok-9f8e7d", "expires_in": 3600}', "tok-9f8e7d", '"expires_in": 3600'),
    ('{"refresh_token": "rt-123abc"}', "rt-123abc", '"refresh_token": "[REDACTED]"'),
    ('{"client_secret": "cs-\\"quoted\\"-x"}', "quoted", '"client_secret": "[REDACTED]"'),
    ('{"password": 12345678, "user": "bob"}', "12345678", '"user": "bob"'),
    ('{\\"token\\": \\"escaped-json-tok\\"}', "escaped-json-tok", '\\"token\\": \\"[REDACTED]\\"'),
    ("{'password': 'hunter2-dict'}", "hunter2-dict", "{'password': '[REDACTED]'}"),
    ("Config(secret='py-repr-s3cret', timeout=3)", "py-repr-s3cret", "timeout=3)"),
    ("{'auth': b'bytes-s3cret'}", "bytes-s3cret", "{'auth': b'[REDACTED]'}"),
    ("password: yaml-s3cret", "yaml-s3cret", "password: [REDACTED]"),
    ("db:\n  password: two words here  # prod\n  host: db1", "two words", "  host: db1"),
    ("  - client_secret: 'yaml-quoted'", "yaml-quoted", "client_secret: '[REDACTED]'"),
    ("API_KEY=env-s3cret-1\nDEBUG=1", "env-s3cret-1", "API_KEY=[REDACTED]\nDEBUG=1"),
    ("export GITHUB_TOKEN=env-s3cret-2", "env-s3cret-2", "export GITHUB_TOKEN=[REDACTED]"),
    ('AWS_SECRET_ACCESS_KEY="wJalrXUtnFEMI/K7MDENG"', "wJalrXUtnFEMI", "AWS_SECRET_ACCESS_KEY="),
    ("retrying with passwd=pw-inline-1, attempt 2", "pw-inline-1", ", attempt 2"),
    ("spring.datasource.password=dotted-s3cret", "dotted-s3cret", "spring.datasource.password="),
    ("X-Api-Key: header-s3cret", "header-s3cret", "X-Api-Key: [REDACTED]"),
    ("Authorization: Bearer abc.def-123456789", "abc.def-123456789", "Authorization: Bearer"),
    ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz", "Authorization: Basic [REDACTED]"),
    ("sent header 'Authorization': 'Token tk-0123abcd'", "tk-0123abcd", "'Authorization': 'Token"),
    ("request failed (Bearer eyJhbGciOi.payload.sig)", "eyJhbGciOi", "request failed (Bearer"),
    ("proxy auth Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==", "QWxhZGRpbjpvcGVu", "proxy auth Basic"),
    ("cli: server --api-key cli-s3cret-1 --port 80", "cli-s3cret-1", "--port 80"),
    ("cli: server --token=cli-s3cret-2 -v", "cli-s3cret-2", "--token=[REDACTED] -v"),
    ("dsn postgres://app:pg-s3cret@db:5432/x", "pg-s3cret", "postgres://app:[REDACTED]@db:5432/x"),
    ("redis://:redis-s3cret@cache:6379/0 down", "redis-s3cret", "@cache:6379/0 down"),
    ("key sk-proj-abcdefghijklmnop1234 used", "sk-proj-abcdefghijk", "key [REDACTED] used"),
    ("anthropic sk-ant-api03-abcdefghijklmnop", "sk-ant-api03", "anthropic [REDACTED]"),
    ("gh ghp_abcdefghijklmnopqrstuvwxyz0123 ok", "ghp_abcdef", "gh [REDACTED] ok"),
    ("pat github_pat_11ABCDEFG0123456789_abcdef", "github_pat_11", "pat [REDACTED]"),
    ("slack xoxb-1234567890-abcdefghij", "xoxb-1234567890", "slack [REDACTED]"),
    ("slack xoxp-1234567890-abcdefghij", "xoxp-1234567890", "slack [REDACTED]"),
    ("aws AKIAABCDEFGHIJKLMNOP region", "AKIAABCDEFGHIJKLMNOP", "aws [REDACTED] region"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOjF9.c2lnbmF0dXJl", "eyJzdWIiOjF9", "jwt [REDACTED]"),
    ("google AIzaSyA-abcdefghijklmnopqrstuvwxyz01234", "AIzaSyA-abc", "google [REDACTED]"),
    ("stripe sk_live_abcdefghijklmnop0123", "sk_live_abc", "stripe [REDACTED]"),
    (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        "MIIEpAIBAAKCAQEA",
        "-----END RSA PRIVATE KEY-----",
    ),
]

# Ordinary diagnostics that must come through unchanged.
LEFT_ALONE = [
    "max_tokens=4096 input_tokens: 12 output_tokens=7",
    '{"max_tokens": 4096, "token_count": 12, "tokenizer": "cl100k"}',
    "author: Alice; authority=ca.example; oauth_url=https://login.example/authorize",
    '{"token_type": "bearer", "auth_method": "oauth", "key": "user_id"}',
    'Traceback (most recent call last):\n  File "server.py", line 7, in <module>',
    "KeyError: 'missing'  keyboard interrupt  monkey=patched",
    "the bearer of bad news; basic setup completed; Basic Authentication is off",
    "https://example.com:8443/path@v2 and http://host/x?y=1",
    "task-1234567890abcdef risk-assessment-report sk-learn",
    '{"password": null, "token": "", "auth": false}',
    "password is required; token expired, please log in",
    "AKIA is a prefix; ghp_ short; xoxb-short",
]


@pytest.mark.requirement("ER-54")
@pytest.mark.parametrize(("text", "secret", "kept"), SECRET_SHAPES)
def test_redact_replaces_the_value_in_every_common_shape(text: str, secret: str, kept: str) -> None:
    """Quoted, JSON, Python-dict, YAML, env, header, CLI and URL forms, Bearer/Basic
    credentials and known token shapes: the value is replaced, the key name and the
    text around it stay."""
    redacted = redact(text)
    assert secret not in redacted
    assert kept in redacted
    assert "[REDACTED]" in redacted
    assert redacted.count("\n") == text.count("\n") or "PRIVATE KEY" in text


@pytest.mark.requirement("ER-54")
@pytest.mark.parametrize("text", LEFT_ALONE)
def test_redact_leaves_ordinary_diagnostics_alone(text: str) -> None:
    """Counters named *_tokens, words like author or bearer, URLs without user info,
    empty or null secrets and prose: unchanged."""
    assert redact(text) == text


HOSTILE_UNITS = ["sk-", "eyJ-", "https://a", "a:a=", "token=)", '{"api_key": "', "Bearer a", "x "]


@pytest.fixture(scope="module")
def hostile_redactions() -> dict[str, str]:
    """Each hostile unit repeated to 50,000 characters, redacted in one child process
    (one import of the MCP module for all of them), so that a pattern that backtracks
    fails the hang guard instead of stalling the suite."""
    texts = {unit: unit * (50_000 // len(unit)) for unit in HOSTILE_UNITS}
    code = (
        "import json, sys; from statemachine.mcp import redact; "
        "print(json.dumps({k: redact(v) for k, v in json.load(sys.stdin).items()}), end='')"
    )
    child = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=True,
    )
    redacted: dict[str, str] = json.loads(child.stdout)
    return redacted


@pytest.mark.requirement("ER-54")
@pytest.mark.parametrize("unit", HOSTILE_UNITS)
def test_redact_stays_fast_on_hostile_input(unit: str, hostile_redactions: dict[str, str]) -> None:
    """50,000 characters built to make a regex backtrack are redacted (the patterns
    scan linearly) within the hang guard (what redact replaces is tested above)."""
    assert hostile_redactions[unit].strip()


@pytest.mark.requirement("ER-54")
def test_a_server_that_dies_at_start_up_raises_at_start() -> None:
    """A server that exits 3 at once: start() raises MCPStartError (a RuntimeError)
    carrying the exit code and the stderr tail, whose JSON and dict secrets are
    redacted; the async context manager entry raises the same; no process is left."""

    async def scenario() -> tuple[MCPStartError, MCPStartError, MCPStdioTools]:
        tools = MCPStdioTools("hostile", _hostile("exit3"), max_restarts=1)
        try:
            with pytest.raises(MCPStartError) as started:
                await tools.start()
        finally:
            await tools.aclose()
        entered = MCPStdioTools("hostile", _hostile("exit3"))
        with pytest.raises(MCPStartError) as entry:
            async with entered:
                pytest.fail("the body runs only with a started server")
        assert entered.pid is None
        return started.value, entry.value, tools

    error, entry_error, tools = asyncio.run(scenario())
    assert isinstance(error, RuntimeError)
    assert (error.exit_code, error.signal) == (3, None)
    assert error.server == "hostile"
    assert "exited with code 3" in str(error)
    for text in (str(error), error.stderr_tail, str(entry_error)):
        assert "startupsecret" not in text
        assert "hunter2-dict-secret" not in text
        assert '"api_key": "[REDACTED]"' in text
        assert "fatal: cannot reach the upstream service" in text
    assert entry_error.exit_code == 3
    assert tools.starts == 1
    assert len(tools.crashes) == 1


@pytest.mark.requirement("ER-54", "ER-55")
@pytest.mark.parametrize("ignore_term", [False, True])
def test_a_server_that_closes_stdout_mid_call_is_ended_and_restarted(ignore_term: bool) -> None:
    """A server that closes its stdout mid-call but keeps running is a dead server:
    the in-flight call fails process_crashed saying the transport closed, the process
    is ended (SIGTERM, or SIGKILL when it ignores SIGTERM), the next call runs on a
    fresh server, and the restart bound holds (max_restarts=1: the second close is
    final and the fourth call spawns nothing)."""

    async def scenario() -> tuple[list[sm.ToolOutcome], list[int], MCPStdioTools]:
        outcomes, pids = [], []
        env = {"HOSTILE_IGNORE_TERM": "1"} if ignore_term else {}
        async with (
            asyncio.timeout(HANG_GUARD_S),
            MCPStdioTools("hostile", _hostile(), env=env, max_restarts=1) as tools,
        ):
            for i, name in enumerate(["close_stdout", "echo", "close_stdout", "echo"]):
                if tools.pid is not None:
                    pids.append(tools.pid)
                args = {} if name == "close_stdout" else {"text": "hi"}
                outcomes.append(await tools.invoke(_hcall(f"c{i}", name, **args)))
            assert tools.starts == 2  # the fourth call spawned nothing
        return outcomes, pids, tools

    outcomes, pids, tools = asyncio.run(scenario())
    first, second, third, fourth = outcomes
    for crashed in (first, third):
        assert crashed.category is sm.ToolErrorCategory.PROCESS_CRASHED
        assert "transport closed" in crashed.content
        assert "closed stdout mid-call" in crashed.content  # the stderr tail
    expected = "SIGKILL (9)" if ignore_term else "SIGTERM (15)"
    assert expected in first.content
    assert second.ok
    assert fourth.category is sm.ToolErrorCategory.PROCESS_CRASHED
    assert "restart limit reached" in fourth.content
    assert len(tools.crashes) == 2
    assert all(crash.transport for crash in tools.crashes)
    assert len(set(pids)) == 2
    assert all(_gone(pid) for pid in pids)


@pytest.mark.requirement("ER-55")
def test_a_server_that_closes_stdout_while_idle_is_restarted_for_the_next_call() -> None:
    """A server that closes its stdout between calls and keeps running is no longer
    reported as running (pid None); the next call ends it, records the crash and
    runs on a fresh server instead of failing after a wait."""

    async def scenario() -> tuple[sm.ToolOutcome, sm.ToolOutcome, int, MCPStdioTools]:
        async with asyncio.timeout(HANG_GUARD_S), MCPStdioTools("hostile", _hostile()) as tools:
            first = await tools.invoke(_hcall("c1", "echo", text="first"))
            old_pid = tools.pid
            assert old_pid is not None
            # the test picks the moment the server closes its stdout (SIGUSR1), then
            # waits on the event the provider sets when it reads the end of stdout
            stdout_ended = tools._conn.transport_closed  # type: ignore[union-attr]
            os.kill(old_pid, signal.SIGUSR1)
            await stdout_ended.wait()
            assert tools.pid is None
            second = await tools.invoke(_hcall("c2", "echo", text="fresh"))
            assert tools.pid not in (None, old_pid)
            return first, second, old_pid, tools

    first, second, old_pid, tools = asyncio.run(scenario())
    assert first.ok
    assert second.ok
    assert second.content == {"result": "fresh"}
    assert tools.starts == 2
    (crash,) = tools.crashes
    assert crash.transport == "closed its stdout"
    assert "closing stdout while idle" in crash.stderr_tail
    assert _gone(old_pid)


def _failed_start(
    behaviour: str, *, initialize_timeout_s: float
) -> tuple[MCPStartError, MCPStdioTools]:
    """Start a hostile server that must fail to start: (the error, the closed tools)."""

    async def scenario() -> tuple[MCPStartError, MCPStdioTools]:
        tools = MCPStdioTools(
            "hostile", _hostile(behaviour), initialize_timeout_s=initialize_timeout_s
        )
        try:
            with pytest.raises(MCPStartError) as error:
                async with asyncio.timeout(HANG_GUARD_S):
                    await tools.start()
        finally:
            await tools.aclose()
        return error.value, tools

    return asyncio.run(scenario())


@pytest.mark.requirement("ER-54")
def test_a_server_that_closes_stdout_at_start_raises_at_start() -> None:
    """A server whose stdout is gone before the handshake is ended and start() raises
    MCPStartError saying the transport closed, without waiting for the handshake
    timeout."""

    error, _ = _failed_start("close-stdout", initialize_timeout_s=30)
    assert "transport closed" in str(error)
    assert "did not start within" not in str(error)  # not the handshake timeout
    assert error.signal == 15
    assert "closed stdout at start" in error.stderr_tail
    assert _gone(error.info.pid)


@pytest.mark.requirement("ER-48")
def test_the_provider_bounds_a_call_that_never_answers_with_call_timeout_s() -> None:
    """call_timeout_s=0.2 and no driver timeout: a call that never answers fails
    timeout promptly, the server is not counted as crashed and still answers."""

    async def scenario() -> tuple[sm.ToolOutcome, sm.ToolOutcome, MCPStdioTools]:
        async with (
            asyncio.timeout(HANG_GUARD_S),
            MCPStdioTools("crashy", COMMAND, call_timeout_s=0.2) as tools,
        ):
            pid = tools.pid
            outcome = await tools.invoke(_call("h1", "hang"))
            echo = await tools.invoke(_call("e1", "echo", text="still here"))
            assert tools.pid == pid
            return outcome, echo, tools

    outcome, echo, tools = asyncio.run(scenario())
    assert outcome.category is sm.ToolErrorCategory.TIMEOUT
    assert "call_timeout_s" in outcome.content
    assert echo.ok
    assert tools.crashes == []
    assert tools.starts == 1


@pytest.mark.requirement("ER-48", "ER-54")
def test_initialize_timeout_s_bounds_the_handshake_and_raises_at_start() -> None:
    """A server that never answers initialize: start() raises MCPStartError after
    initialize_timeout_s=0.2, the process is stopped and not counted as crashed."""

    error, tools = _failed_start("mute", initialize_timeout_s=0.2)
    assert "did not start within 0.2s" in str(error)
    assert "initialize_timeout_s" in str(error)
    assert tools.crashes == []
    assert _gone(error.info.pid)


@pytest.mark.requirement("ER-48")
@pytest.mark.parametrize("field", ["call_timeout_s", "initialize_timeout_s"])
@pytest.mark.parametrize("value", [0, -1, 0.0, float("nan"), float("inf"), "5", True])
def test_the_provider_timeouts_are_validated(field: str, value: Any) -> None:
    """Each timeout is a finite number of seconds > 0, or None for none; anything else
    is a ConfigError naming the field."""
    with pytest.raises(sm.ConfigError, match=field):
        MCPStdioTools("crashy", COMMAND, **{field: value})


@pytest.mark.requirement("ER-48")
def test_the_provider_timeouts_have_documented_defaults_and_accept_none() -> None:
    """Defaults: call_timeout_s 60 s, initialize_timeout_s 10 s; None turns either off."""
    tools = MCPStdioTools("crashy", COMMAND)
    assert (tools.call_timeout_s, tools.initialize_timeout_s) == (60.0, 10.0)
    off = MCPStdioTools("crashy", COMMAND, call_timeout_s=None, initialize_timeout_s=None)
    assert (off.call_timeout_s, off.initialize_timeout_s) == (None, None)
    assert MCPStdioTools("crashy", COMMAND, call_timeout_s=1).call_timeout_s == 1.0
