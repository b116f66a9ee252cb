"""``statemachine.integrations._bridge``, the framework-free half of the integrations:
the failure it raises, the chain's names and settings, how a framework's exception is
classified, and one request's turn from assembly to the tool round that follows it.
No framework is imported."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import statemachine as sm
from statemachine.integrations import TurnFailed
from statemachine.integrations._bridge import (
    MAX_TOOL_TEXT,
    Bridge,
    classify_raised,
    model_names,
    no_outcome,
    outcome,
    settings_for,
    tool_text,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def _assembled(action: sm.Assemble) -> sm.Assembled:
    return sm.Assembled({"reduce": action.reduce}, size=10)


def test_turn_failed_names_the_status_the_error_and_when_to_come_back() -> None:
    """The message says the status and the error's category and text; a session that
    ended says so; retry_at is carried."""
    error = sm.ModelError("rate_limited", "slow down")
    finish = sm.Finish(sm.TurnStatus.RETRY_DEFERRED, error=error, retry_at=3600.0)
    failed = TurnFailed(finish.status, finish)
    assert failed.status == "retry_deferred" and failed.error is error
    assert failed.retry_at == 3600.0
    assert "retry_deferred" in str(failed) and "rate_limited: slow down" in str(failed)
    assert "3600.0" in str(failed)
    told = sm.ModelError("rate_limited", "slow down", retry_after_seconds=3600.0)
    deferred = TurnFailed(finish.status, sm.Finish(finish.status, error=told, retry_at=21735.0))
    # how long the server asked for, not only a reading of a monotonic clock
    assert "the server asked to wait 3600 s" in str(deferred)
    assert "max_server_wait_s" in str(deferred) and "21735.0" in str(deferred)
    ended = TurnFailed(sm.SessionStatus.ERROR_MAX_TURNS)
    assert ended.finish is None and ended.error is None and ended.retry_at is None
    assert "session has ended (error_max_turns)" in str(ended)
    assert isinstance(ended, RuntimeError)


def test_tool_text_is_bounded_text() -> None:
    """A result longer than MAX_TOOL_TEXT is cut to exactly that many characters, its
    end marked; a value that is not text is shown as str() would."""
    long = tool_text("x" * (MAX_TOOL_TEXT + 10))
    assert (
        len(long) == MAX_TOOL_TEXT
        and long.endswith("...")
        and long[:-3] == "x" * (MAX_TOOL_TEXT - 3)
    )
    assert tool_text("x" * MAX_TOOL_TEXT) == "x" * MAX_TOOL_TEXT
    assert tool_text({"a": 1}) == "{'a': 1}"
    assert tool_text(["é"]) == "['é']"


def test_chain_names_and_settings() -> None:
    """The chain is named once each; settings get the fallbacks after the first, and
    a different fallback_models is refused naming both."""
    assert model_names(["a", "b"], str) == ("a", "b")
    with pytest.raises(sm.ConfigError, match="two models are named 'a'"):
        model_names(["a", "b", "a"], str)
    with pytest.raises(sm.ConfigError, match="none"):
        model_names([], str)
    assert settings_for(None, ("a", "b")).fallback_models == ("b",)
    given = sm.Settings(max_retries=1, fallback_models=["b"])
    assert settings_for(given, ("a", "b")) is given
    assert settings_for(sm.Settings(max_retries=1), ("a",)).max_retries == 1
    with pytest.raises(sm.ConfigError, match=r"\['c'\] differs"):
        settings_for(sm.Settings(fallback_models=["c"]), ("a", "b"))
    with pytest.raises(sm.ConfigError, match="settings"):
        settings_for({"max_retries": 1}, ("a",))  # type: ignore[arg-type]


class _Wrapped(Exception):
    """A framework's error over an HTTP status and body (pydantic-ai's ModelHTTPError)."""

    def __init__(self, status_code: Any, body: Any) -> None:
        super().__init__("wrapped")
        self.status_code = status_code
        self.body = body


def test_a_frameworks_exception_is_classified_by_what_it_wraps() -> None:
    """The SDK exception in the cause chain wins; else the status and body; else the
    exception itself; a cycle of causes ends."""
    import httpx

    request = httpx.Request("POST", "http://127.0.0.1/v1")
    response = httpx.Response(401, request=request, json={"error": {"message": "bad key"}})

    def sdk_error() -> None:
        raise httpx.HTTPStatusError("401", request=request, response=response)

    def wrapped_sdk_error() -> None:
        try:
            sdk_error()
        except httpx.HTTPStatusError as inner:
            raise _Wrapped(500, None) from inner

    with pytest.raises(_Wrapped) as outer:
        wrapped_sdk_error()
    assert classify_raised(outer.value).category == sm.ErrorCategory.AUTH_ERROR
    quota = {"error": {"type": "insufficient_quota", "code": "insufficient_quota"}}
    assert classify_raised(_Wrapped(429, quota)).category == sm.ErrorCategory.UNKNOWN
    assert classify_raised(_Wrapped(529, None)).category == sm.ErrorCategory.OVERLOADED
    assert classify_raised(_Wrapped(True, None)).category == sm.ErrorCategory.UNKNOWN
    first, second = ValueError("a"), ValueError("b")
    first.__cause__, second.__cause__ = second, first
    assert classify_raised(first).category == sm.ErrorCategory.UNKNOWN


def test_bridge_refuses_a_session_of_another_chain_and_a_sleep_that_is_not_one() -> None:
    with pytest.raises(sm.ConfigError, match="session"):
        Bridge(settings_for(None, ("a", "b")), session=sm.Session())
    with pytest.raises(sm.ConfigError, match="session"):
        Bridge(sm.Settings(), session="s")  # type: ignore[arg-type]
    with pytest.raises(sm.ConfigError, match="sleep"):
        Bridge(sm.Settings(), sleep=3)  # type: ignore[arg-type]


def test_one_request_waits_falls_back_and_leaves_its_tools_pending() -> None:
    """A 429, the engine's wait on the injected sleep, the fallback after the retries,
    then a reply with a tool call: returned, its turn left waiting for the outcome,
    which the next request brings (a missing one is a cancelled outcome)."""
    clock = Clock()
    settings = settings_for(sm.Settings(max_retries=1), ("a", "b"))
    bridge = Bridge(settings, clock=clock, wall_clock=clock, sleep=clock.sleep)
    called: list[str | None] = []
    call_tool = sm.ToolCall("t1", "tools", "weather", {"city": "Paris"})

    async def call(action: sm.CallModel) -> Any:
        called.append(action.model)
        if action.model is None:
            return sm.ModelFailed(sm.ModelError("rate_limited")), None
        return sm.ModelReplied(tool_calls=(call_tool,)), "the reply"

    turn, value = asyncio.run(bridge.request(_assembled, call))
    assert value == "the reply" and called == [None, None, "b"]
    assert len(clock.waits) == 1
    assert bridge.pending_calls == (call_tool,) and turn.state == "invoking_tools"

    bridge.settle_tools(no_outcome)
    assert turn.done and turn.finish is not None
    (result,) = turn.finish.tool_results
    assert result.is_error and result.category == sm.ToolErrorCategory.CANCELLED
    assert bridge.pending_calls == ()


def test_a_pending_round_is_settled_when_the_next_request_opens() -> None:
    """A request that opens while the last reply's tools are pending settles them with
    no result first; the outcomes the framework brought are sent as they are."""
    bridge = Bridge(sm.Settings(), sleep=Clock().sleep)
    call_tool = sm.ToolCall("t1", "tools", "weather", {})

    async def tools(action: sm.CallModel) -> Any:
        return sm.ModelReplied(tool_calls=(call_tool,)), 1

    async def answer(action: sm.CallModel) -> Any:
        return sm.ModelReplied(), 2

    first, _ = asyncio.run(bridge.request(_assembled, tools))
    second, value = asyncio.run(bridge.request(_assembled, answer))
    assert value == 2 and first.done and second.done and bridge.pending_calls == ()
    third, _ = asyncio.run(bridge.request(_assembled, tools))
    bridge.settle_tools(lambda call: outcome(call, True, "sunny", None))
    assert third.finish is not None and third.finish.tool_results[0].content == "sunny"
    assert not third.finish.tool_results[0].is_error


def test_a_turn_the_engine_ends_raises_and_an_escape_cancels_it() -> None:
    """An auth error raises the failure type given; an exception escaping the call
    cancels the turn and propagates; a context that cannot shrink ends the turn."""

    class Mine(TurnFailed):
        pass

    bridge = Bridge(sm.Settings(), sleep=Clock().sleep, failure=Mine)

    async def auth(action: sm.CallModel) -> Any:
        return sm.ModelFailed(sm.ModelError("auth_error", "bad key")), None

    with pytest.raises(Mine) as failed:
        asyncio.run(bridge.request(_assembled, auth))
    assert failed.value.status == sm.TurnStatus.AUTH_ERROR

    async def boom(action: sm.CallModel) -> Any:
        raise KeyError("the host's bug")

    with pytest.raises(KeyError):
        asyncio.run(bridge.request(_assembled, boom))
    assert bridge.session.current_turn is not None
    assert bridge.session.current_turn.status == sm.TurnStatus.CANCELLED

    async def overflow(action: sm.CallModel) -> Any:
        return sm.ModelFailed(sm.ModelError("context_length_exceeded")), None

    def cannot(action: sm.Assemble) -> Any:
        return sm.CannotShrink() if action.reduce else _assembled(action)

    with pytest.raises(Mine) as exhausted:
        asyncio.run(bridge.request(cannot, overflow))
    assert exhausted.value.status == sm.TurnStatus.CONTEXT_EXHAUSTED


def test_a_stream_is_settled_after_its_hand_over() -> None:
    """A call that hands a stream over leaves the turn calling; its reply settles it,
    a partial failure ends it stream_interrupted, and a settled turn takes nothing."""
    bridge = Bridge(sm.Settings(), sleep=Clock().sleep)

    async def stream(action: sm.CallModel) -> Any:
        return None, "the stream"

    turn, value = asyncio.run(bridge.request(_assembled, stream))
    assert value == "the stream" and turn.state == "calling"
    bridge.settle(turn, sm.ModelReplied())
    assert turn.status == sm.TurnStatus.COMPLETED
    bridge.settle(turn, sm.ModelReplied())  # nothing to settle: no error
    turn, _ = asyncio.run(bridge.request(_assembled, stream))
    broken = sm.ModelFailed(sm.ModelError("overloaded"), partial=True)
    with pytest.raises(TurnFailed) as failed:
        bridge.settle(turn, broken)
    assert failed.value.status == sm.TurnStatus.STREAM_INTERRUPTED
    turn, _ = asyncio.run(bridge.request(_assembled, stream))
    bridge.abandon(turn, RuntimeError("the consumer stopped"))
    assert turn.status == sm.TurnStatus.CANCELLED


def test_a_request_after_the_session_ended_raises_its_status() -> None:
    """max_turns=1: the second request is the final-answer turn, the third raises."""
    bridge = Bridge(sm.Settings(max_turns=1), sleep=Clock().sleep)
    seen: list[bool] = []

    def assemble(action: sm.Assemble) -> Any:
        seen.append(action.withhold_tools)
        return _assembled(action)

    async def answer(action: sm.CallModel) -> Any:
        return sm.ModelReplied(), None

    asyncio.run(bridge.request(assemble, answer))
    asyncio.run(bridge.request(assemble, answer))
    with pytest.raises(TurnFailed) as failed:
        asyncio.run(bridge.request(assemble, answer))
    assert seen == [False, True]
    assert failed.value.status == sm.SessionStatus.ERROR_MAX_TURNS and failed.value.finish is None


def test_two_requests_at_once_on_one_session_are_refused_naming_why() -> None:
    """A session shared by two overlapping agent runs (``session=``): the second
    request while the first waits on its model raises ``TurnInProgress`` saying that
    two requests share one session, not the engine's advice to cancel a turn the
    framework user never held; the first request goes on and completes."""
    bridge = Bridge(sm.Settings(), sleep=Clock().sleep)

    async def both() -> tuple[Any, BaseException | None]:
        gate = asyncio.Event()

        async def slow(action: sm.CallModel) -> Any:
            await gate.wait()
            return sm.ModelReplied(), "first"

        first = asyncio.create_task(bridge.request(_assembled, slow))
        await asyncio.sleep(0)  # the first request is now waiting on its model
        refused: BaseException | None = None
        try:
            await bridge.request(_assembled, slow)
        except sm.TurnInProgress as exc:
            refused = exc
        gate.set()
        return await first, refused

    (turn, value), refused = asyncio.run(both())
    assert refused is not None and "another model request of this session" in str(refused)
    assert value == "first" and turn.status == sm.TurnStatus.COMPLETED
    assert bridge.session.turns == 1


def test_a_request_cancelled_while_it_waits_leaves_no_turn_running() -> None:
    """An asyncio task cancelled during the engine's wait (a 429's backoff): the
    cancellation propagates, the turn is ended cancelled, and the session's next
    request opens a new turn."""
    bridge = Bridge(sm.Settings(), sleep=asyncio.sleep)

    async def limited(action: sm.CallModel) -> Any:
        return sm.ModelFailed(sm.ModelError("rate_limited", retry_after_seconds=60.0)), None

    async def cancel_it() -> None:
        task = asyncio.create_task(bridge.request(_assembled, limited))
        for _ in range(100):  # until the engine's Wait is being slept through
            await asyncio.sleep(0)
            turn = bridge.session.current_turn
            if turn is not None and isinstance(turn.action, sm.Wait):
                break
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    turn = bridge.session.current_turn
    assert turn is not None and turn.done and turn.status == sm.TurnStatus.CANCELLED

    async def fine(action: sm.CallModel) -> Any:
        return sm.ModelReplied(), "ok"

    _, value = asyncio.run(bridge.request(_assembled, fine))
    assert value == "ok" and bridge.session.turns == 2


def test_turn_failed_survives_pickling_as_itself() -> None:
    """A process pool or a task queue pickles the failure it hands back: the copy has
    the same status, error and message (it once read its message as its status and
    said the session had ended)."""
    import pickle

    error = sm.ModelError("auth_error", "bad key")
    failed = TurnFailed(sm.TurnStatus.AUTH_ERROR, sm.Finish(sm.TurnStatus.AUTH_ERROR, error=error))
    ended = TurnFailed(sm.SessionStatus.CANCELLED)
    for original in (failed, ended):
        copy = pickle.loads(pickle.dumps(original))  # noqa: S301 - our own bytes
        assert type(copy) is TurnFailed and str(copy) == str(original)
        assert copy.status == original.status and copy.error == original.error
        assert copy.finish == original.finish


def test_the_bridges_edges_found_by_the_mutation_sample() -> None:
    """Issue 38's sample of ``_bridge.py``: a tool result of 4,000 characters is kept
    whole; a framework error carrying an HTTP status and a body (not an SDK's) is read
    as that response; a price counts the tokens that are known; a bridge's own session
    reads the wall clock (an HTTP-date retry-after is measured against it)."""
    from statemachine.integrations._bridge import token_cost

    assert MAX_TOOL_TEXT == 4000 and tool_text("x" * 4000) == "x" * 4000

    class FrameworkHTTPError(Exception):
        status_code = 429

    raised = FrameworkHTTPError("HTTP 429")
    raised.body = {"error": {"type": "rate_limit_error", "message": "slow down"}}  # type: ignore[attr-defined]
    error = classify_raised(raised)
    assert (error.category, error.status) == (sm.ErrorCategory.RATE_LIMITED, 429)
    assert token_cost((2.0, 3.0), None, 1_000_000) == 3.0
    assert token_cost((2.0, 3.0), 1_000_000, None) == 2.0
    assert Bridge(sm.Settings()).session.wall_clock is not None
