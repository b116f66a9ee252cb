"""End to end: the real ``anthropic`` and ``openai`` clients, driven by ``arun_turn``,
against a loopback server (statemachine/dev/_vendor.py, the `vendor` command's)
replaying scripted responses.

Nothing is mocked between the engine and the socket: the SDKs build real HTTP
requests, the server answers with the vendors' wire formats, the SDKs raise their
own exceptions, and ``classify`` reads them. Waits go to a fake sleep that records
them; the session clock advances with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

import statemachine as sm
from statemachine.providers import (
    AnthropicModel,
    AsyncAnthropicModel,
    AsyncOpenAIModel,
    OpenAIModel,
)

from .helpers import FakeTime
from .servers.fake_llm import (
    ANTHROPIC,
    OPENAI,
    FakeLLM,
    anthropic_error,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_error,
    openai_stream,
)


class Context:
    """Assembles a request; a reduction halves the history (and its size)."""

    def __init__(self) -> None:
        self.size = 1000
        self.calls: list[sm.Assemble] = []

    async def assemble(self, action: sm.Assemble) -> sm.Assembled:
        self.calls.append(action)
        if action.reduce:
            self.size //= 2
        messages = [{"role": "user", "content": "x" * (self.size // 100)}]
        tools = [{"name": "lookup", "description": "d", "input_schema": {"type": "object"}}]
        return sm.Assembled({"messages": messages, "tools": tools}, size=self.size)


class Tools:
    """Answers every call; records them."""

    def __init__(self) -> None:
        self.calls: list[sm.ToolCall] = []

    async def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        self.calls.append(call)
        return sm.ToolOutcome(call.id, ok=True, content=f"{call.name} ok")


@pytest.fixture
def server() -> Iterator[FakeLLM]:
    with FakeLLM() as fake:
        yield fake


def _session(fake_time: FakeTime, **settings: Any) -> sm.Session:
    return sm.Session(sm.Settings(**settings), seed=11, clock=fake_time.clock)


def _waits(turn: sm.Turn) -> list[sm.Wait]:
    return [r.action for r in turn.trace if isinstance(r.action, sm.Wait)]


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.mark.requirement("ER-53", "ER-40", "ER-42", "ER-3", "ER-4")
def test_anthropic_sdk_end_to_end(server: FakeLLM) -> None:
    """The real AsyncAnthropic client through five turns: 429 (retry-after) and 529
    are retried after waits honouring the header, a prompt-too-long 400 reduces the
    context, 401 ends at once, a refusal ends content_filtered, then a success.
    The server sees exactly one request per engine attempt: 3 + 2 + 1 + 1 + 1 = 8."""
    server.script(
        ANTHROPIC,
        anthropic_error(429, "rate_limit_error", "Rate limited", retry_after="2"),
        anthropic_error(529, "overloaded_error", "Overloaded"),
        anthropic_message("calling", tool_uses=(("toolu_1", "lookup", {"q": "paris"}),)),
        anthropic_error(400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000"),
        anthropic_message("shorter now"),
        anthropic_error(401, "authentication_error", "invalid x-api-key"),
        anthropic_message("", stop_reason="refusal"),
        anthropic_message("all good"),
    )
    fake_time = FakeTime()
    session = _session(fake_time, model="claude-test")
    context, tools = Context(), Tools()

    async def turns() -> list[sm.Finish]:
        client = anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0)
        model = AsyncAnthropicModel(client)
        finishes = []
        async with client:
            for _ in range(5):
                turn = session.new_turn()
                finishes.append(
                    await sm.arun_turn(
                        turn, model=model, tools=tools, context=context, sleep=fake_time.sleep
                    )
                )
        return finishes

    first, second, third, fourth, fifth = _run(turns())
    assert server.count(ANTHROPIC) == 8
    assert [f.status for f in (first, second, third, fourth, fifth)] == [
        sm.TurnStatus.COMPLETED,
        sm.TurnStatus.COMPLETED,
        sm.TurnStatus.AUTH_ERROR,
        sm.TurnStatus.CONTENT_FILTERED,
        sm.TurnStatus.COMPLETED,
    ]
    # turn 1: two waits, the first at least the server's retry-after of 2 s
    assert len(fake_time.waits) == 2
    assert fake_time.waits[0] >= 2.0
    assert first.tool_results == (sm.ToolResult("toolu_1", "lookup ok"),)
    assert tools.calls == [sm.ToolCall("toolu_1", "tools", "lookup", {"q": "paris"})]
    # turn 2: a reduction, and the retried request was smaller
    assert [c.reduce for c in context.calls[1:3]] == [False, True]
    bodies = [seen.body for seen in server.requests(ANTHROPIC)]
    assert len(str(bodies[4]["messages"])) < len(str(bodies[3]["messages"]))
    assert third.error is not None and third.error.status == 401
    assert fourth.error is not None and fourth.error.code == "refusal"
    assert fifth.reply["content"][0]["text"] == "all good"
    assert all(seen.body["model"] == "claude-test" for seen in server.requests(ANTHROPIC))
    assert all(
        seen.headers.get("x-stainless-retry-count") in (None, "0")
        for seen in server.requests(ANTHROPIC)
    )


@pytest.mark.requirement("ER-53", "ER-40", "ER-41", "ER-42", "ER-4")
def test_openai_sdk_end_to_end(server: FakeLLM) -> None:
    """The real AsyncOpenAI client through six turns: 429 with retry-after-ms and 503
    are retried, a context_length_exceeded 400 reduces, 401 ends at once, a content
    filter ends content_filtered, insufficient_quota is not retried (unknown_error),
    then a success: exactly 3 + 2 + 1 + 1 + 1 + 1 = 9 requests."""
    server.script(
        OPENAI,
        openai_error(
            429, "Rate limit reached", "requests", "rate_limit_exceeded", retry_after_ms="1500"
        ),
        openai_error(503, "The server is overloaded", "server_error"),
        openai_completion(None, tool_calls=(("call_1", "lookup", {"q": "rome"}),)),
        openai_error(
            400,
            "This model's maximum context length is 8192 tokens.",
            "invalid_request_error",
            "context_length_exceeded",
        ),
        openai_completion("shorter"),
        openai_error(401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key"),
        openai_completion("", finish_reason="content_filter"),
        openai_error(
            429, "You exceeded your current quota", "insufficient_quota", "insufficient_quota"
        ),
        openai_completion("all good"),
    )
    fake_time = FakeTime()
    session = _session(fake_time, model="gpt-test")
    context, tools = Context(), Tools()

    async def turns() -> list[sm.Finish]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0)
        model = AsyncOpenAIModel(client)
        finishes = []
        async with client:
            for _ in range(6):
                turn = session.new_turn()
                finishes.append(
                    await sm.arun_turn(
                        turn, model=model, tools=tools, context=context, sleep=fake_time.sleep
                    )
                )
        return finishes

    finishes = _run(turns())
    assert server.count(OPENAI) == 9
    assert [f.status for f in finishes] == [
        sm.TurnStatus.COMPLETED,
        sm.TurnStatus.COMPLETED,
        sm.TurnStatus.AUTH_ERROR,
        sm.TurnStatus.CONTENT_FILTERED,
        sm.TurnStatus.UNKNOWN_ERROR,
        sm.TurnStatus.COMPLETED,
    ]
    assert len(fake_time.waits) == 2
    assert fake_time.waits[0] >= 1.5
    assert tools.calls == [sm.ToolCall("call_1", "tools", "lookup", {"q": "rome"})]
    quota = finishes[4].error
    assert quota is not None
    assert quota.code == "insufficient_quota"
    assert not quota.retryable
    assert finishes[3].error is not None and finishes[3].error.code == "content_filter"


@pytest.mark.requirement("ER-51", "ER-53")
def test_sdk_client_with_its_own_retries_is_refused_before_any_request(server: FakeLLM) -> None:
    """A bare SDK client left at its default max_retries (2), held by the host's own
    provider, is refused with a ConfigError naming max_retries: no request is sent,
    and the turn is left cancelled, not half-run."""

    class Glue:
        def __init__(self, client: anthropic.AsyncAnthropic) -> None:
            self.client = client

        async def complete(self, action: sm.CallModel) -> sm.ModelReplied:
            raise AssertionError("never called")

    fake_time = FakeTime()
    session = _session(fake_time)
    turn = session.new_turn()

    async def attempt() -> None:
        async with anthropic.AsyncAnthropic(base_url=server.url, api_key="test") as client:
            await sm.arun_turn(turn, model=Glue(client), tools=Tools(), context=Context())

    with pytest.raises(sm.ConfigError, match="max_retries=2"):
        _run(attempt())
    assert server.count(ANTHROPIC) == 0
    assert turn.state == "idle"


@pytest.mark.requirement("ER-51", "ER-53")
def test_ready_made_provider_disables_sdk_retries(server: FakeLLM) -> None:
    """AsyncOpenAIModel given a client with max_retries=3 uses it with retries off:
    two 429s and a success are exactly three requests, each an engine attempt."""
    server.script(
        OPENAI,
        openai_error(429, "slow", "requests", "rate_limit_exceeded"),
        openai_error(429, "slow", "requests", "rate_limit_exceeded"),
        openai_completion("ok"),
    )
    fake_time = FakeTime()
    session = _session(fake_time, model="gpt-test")
    seen_retries: list[int] = []

    async def run() -> sm.Finish:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="test", max_retries=3
        ) as client:
            model = AsyncOpenAIModel(client)
            seen_retries.append(model.client.max_retries)
            return await sm.arun_turn(
                session.new_turn(),
                model=model,
                tools=Tools(),
                context=Context(),
                sleep=fake_time.sleep,
            )

    finish = _run(run())
    assert seen_retries == [0]
    assert finish.status is sm.TurnStatus.COMPLETED
    assert server.count(OPENAI) == 3
    assert len(fake_time.waits) == 2


class StreamingAnthropic:
    """Host glue that streams with the real SDK and marks a failure after any
    delivered text as partial (the stream-safety contract)."""

    def __init__(self, client: anthropic.AsyncAnthropic) -> None:
        self.client = client
        self.delivered: list[str] = []

    async def complete(self, action: sm.CallModel) -> sm.ModelReplied | sm.ModelFailed:
        delivered_before = len(self.delivered)
        try:
            stream = await self.client.messages.create(
                model="claude-test", max_tokens=64, messages=action.request["messages"], stream=True
            )
            async for event in stream:
                if event.type == "content_block_delta":
                    self.delivered.append(event.delta.text)
        except anthropic.APIError as exc:
            partial = len(self.delivered) > delivered_before
            return sm.ModelFailed(sm.classify(exc), partial=partial)
        return sm.ModelReplied(reply="".join(self.delivered[delivered_before:]))


def _stream_start() -> tuple[str, dict[str, Any]]:
    return (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_s",
                "type": "message",
                "role": "assistant",
                "model": "claude-test",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 1, "output_tokens": 0},
            },
        },
    )


def _text_delta(text: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            },
        ),
    ]


_OVERLOADED_EVENT = (
    "error",
    {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
)


@pytest.mark.requirement("ER-44", "ER-31", "ER-53")
def test_in_stream_overloaded_error_is_retried_unless_text_was_delivered(server: FakeLLM) -> None:
    """An ``overloaded_error`` event inside an HTTP 200 stream, before any text, is
    classified overloaded and retried (turn 1: 2 requests); the same event after a
    text delta is never resent: the turn ends stream_interrupted (turn 2: 1 request)."""
    server.script(
        ANTHROPIC,
        anthropic_stream(_stream_start(), _OVERLOADED_EVENT),
        anthropic_stream(
            _stream_start(),
            *_text_delta("hello"),
            ("message_stop", {"type": "message_stop"}),
        ),
        anthropic_stream(_stream_start(), *_text_delta("half a sent"), _OVERLOADED_EVENT),
    )
    fake_time = FakeTime()
    session = _session(fake_time)

    async def two_turns() -> tuple[sm.Finish, sm.Finish]:
        async with anthropic.AsyncAnthropic(
            base_url=server.url, api_key="test", max_retries=0
        ) as client:
            model = StreamingAnthropic(client)
            one = await sm.arun_turn(
                session.new_turn(),
                model=model,
                tools=Tools(),
                context=Context(),
                sleep=fake_time.sleep,
            )
            two = await sm.arun_turn(
                session.new_turn(),
                model=model,
                tools=Tools(),
                context=Context(),
                sleep=fake_time.sleep,
            )
        return one, two

    one, two = _run(two_turns())
    assert one.status is sm.TurnStatus.COMPLETED
    assert one.reply == "hello"
    assert len(fake_time.waits) == 1
    assert two.status is sm.TurnStatus.STREAM_INTERRUPTED
    assert two.error is not None
    assert two.error.category is sm.ErrorCategory.OVERLOADED
    assert two.error.status == 200
    assert server.count(ANTHROPIC) == 3
    assert len(fake_time.waits) == 1


@pytest.mark.requirement("ER-52", "ER-53", "ER-16")
def test_sync_providers_build_requests_withhold_tools_and_report_cost(server: FakeLLM) -> None:
    """run_turn with the sync clients: AnthropicModel sends the request's messages and
    tools with the default model and max_tokens, reports cost from usage; on the
    final-answer turn (max_turns=1) the tools are stripped from the request. For
    OpenAIModel a refusal message is content_filtered, and a fallback model named
    by CallModel.model is the one sent."""
    server.script(
        ANTHROPIC,
        anthropic_message(
            "using a tool", tool_uses=(("toolu_1", "lookup", {"q": 1}),), tokens=(1000, 500)
        ),
        anthropic_message("final", tokens=(2000, 0)),
    )
    refusal = openai_completion("")
    refusal.body["choices"][0]["message"]["refusal"] = "I can't help with that."
    server.script(
        OPENAI,
        openai_error(503, "overloaded", "server_error"),
        openai_completion("from the fallback"),
        refusal,
    )
    sleeps: list[float] = []
    sess = sm.Session(sm.Settings(max_turns=1), seed=2, clock=lambda: 0.0)

    class SyncContext:
        def assemble(self, action: sm.Assemble) -> sm.Assembled:
            tools = [{"name": "lookup", "description": "d", "input_schema": {"type": "object"}}]
            messages = [{"role": "user", "content": action.instruction or "hi"}]
            return sm.Assembled({"messages": messages, "tools": tools}, size=10)

    class SyncTools:
        def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
            return sm.ToolOutcome(call.id, ok=True, content="found")

    with anthropic.Anthropic(base_url=server.url, api_key="test", max_retries=2) as client:
        model = AnthropicModel(client, model="claude-test", price_per_mtok=(3.0, 15.0))
        first = sm.run_turn(sess.new_turn(), model=model, tools=SyncTools(), context=SyncContext())
        final = sm.run_turn(sess.new_turn(), model=model, tools=SyncTools(), context=SyncContext())
    assert first.status is sm.TurnStatus.COMPLETED
    assert final.status is sm.TurnStatus.COMPLETED
    assert sess.status is sm.SessionStatus.ERROR_MAX_TURNS
    assert sess.cost_usd == pytest.approx(1000 * 3 / 1e6 + 500 * 15 / 1e6 + 2000 * 3 / 1e6)
    one, two = (seen.body for seen in server.requests(ANTHROPIC))
    assert (one["model"], one["max_tokens"], len(one["tools"])) == ("claude-test", 1024, 1)
    assert "tools" not in two
    assert two["messages"][0]["content"] == sess.current_turn.instruction  # type: ignore[union-attr]

    osess = sm.Session(
        sm.Settings(fallback_models=("gpt-backup",), max_retries=0), seed=2, clock=lambda: 0.0
    )
    with openai.OpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0) as oclient:
        omodel = OpenAIModel(oclient, model="gpt-main")
        fell_back = sm.run_turn(
            osess.new_turn(),
            model=omodel,
            tools=SyncTools(),
            context=SyncContext(),
            sleep=sleeps.append,
        )
        refused = sm.run_turn(
            osess.new_turn(), model=omodel, tools=SyncTools(), context=SyncContext()
        )
    assert fell_back.status is sm.TurnStatus.COMPLETED
    assert fell_back.model == "gpt-backup"
    assert [seen.body["model"] for seen in server.requests(OPENAI)] == [
        "gpt-main",
        "gpt-backup",
        "gpt-main",
    ]
    assert refused.status is sm.TurnStatus.CONTENT_FILTERED
    assert refused.error is not None and refused.error.message == "I can't help with that."
    assert server.count(OPENAI) == 3


@pytest.mark.requirement("ER-31", "ER-52", "ER-53", "ER-44")
def test_anthropic_streaming_provider_marks_failures_after_text_partial(server: FakeLLM) -> None:
    """AsyncAnthropicModel(on_text=...) streams with messages.stream: an overloaded
    event before any text is retried (turn 1: 2 requests, the text delivered once);
    a connection lost after a delta ends the turn stream_interrupted without a
    resend (turn 2: 1 request)."""
    server.script(
        ANTHROPIC,
        anthropic_stream(_stream_start(), _OVERLOADED_EVENT),
        anthropic_stream(
            _stream_start(),
            *_text_delta("Hello"),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 2},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ),
        anthropic_stream(_stream_start(), *_text_delta("cut off mid"), cut=True),
    )
    fake_time = FakeTime()
    session = _session(fake_time, model="claude-test")
    texts: list[str] = []

    async def on_text(text: str) -> None:
        texts.append(text)

    async def two_turns() -> tuple[sm.Finish, sm.Finish]:
        async with anthropic.AsyncAnthropic(
            base_url=server.url, api_key="test", max_retries=0
        ) as client:
            model = AsyncAnthropicModel(client, on_text=on_text)
            one = await sm.arun_turn(
                session.new_turn(),
                model=model,
                tools=Tools(),
                context=Context(),
                sleep=fake_time.sleep,
            )
            two = await sm.arun_turn(
                session.new_turn(),
                model=model,
                tools=Tools(),
                context=Context(),
                sleep=fake_time.sleep,
            )
        return one, two

    one, two = _run(two_turns())
    assert one.status is sm.TurnStatus.COMPLETED
    assert one.reply["content"][0]["text"] == "Hello"
    assert len(fake_time.waits) == 1
    assert two.status is sm.TurnStatus.STREAM_INTERRUPTED
    assert two.error is not None
    assert (two.error.category, two.error.code) == (sm.ErrorCategory.OVERLOADED, "connection_error")
    assert texts == ["Hello", "cut off mid"]
    assert server.count(ANTHROPIC) == 3


@pytest.mark.requirement("ER-31", "ER-52", "ER-53")
def test_openai_streaming_provider_accumulates_tool_calls_and_marks_cuts(server: FakeLLM) -> None:
    """AsyncOpenAIModel(on_text=...) streams chat completions: tool-call deltas are
    accumulated into ToolCalls (turn 1), a 429 before the stream is retried, and a
    connection lost after text ends the turn stream_interrupted (turn 2): 1 + 2
    requests."""
    server.script(
        OPENAI,
        openai_stream(
            {"role": "assistant", "content": "Let me look. "},
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_9",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": ""},
                    }
                ]
            },
            {"tool_calls": [{"index": 0, "function": {"arguments": '{"q": "oslo"}'}}]},
            finish_reason="tool_calls",
        ),
        openai_error(429, "slow", "requests", "rate_limit_exceeded", retry_after="1"),
        openai_stream({"role": "assistant", "content": "Half an ans"}, cut=True),
    )
    fake_time = FakeTime()
    session = _session(fake_time, model="gpt-test")
    texts: list[str] = []
    tools = Tools()

    async def two_turns() -> tuple[sm.Finish, sm.Finish]:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="test", max_retries=0
        ) as client:
            model = AsyncOpenAIModel(client, on_text=texts.append)
            one = await sm.arun_turn(
                session.new_turn(),
                model=model,
                tools=tools,
                context=Context(),
                sleep=fake_time.sleep,
            )
            two = await sm.arun_turn(
                session.new_turn(),
                model=model,
                tools=tools,
                context=Context(),
                sleep=fake_time.sleep,
            )
        return one, two

    one, two = _run(two_turns())
    assert one.status is sm.TurnStatus.COMPLETED
    assert tools.calls == [sm.ToolCall("call_9", "tools", "lookup", {"q": "oslo"})]
    assert two.status is sm.TurnStatus.STREAM_INTERRUPTED
    assert fake_time.waits[0] >= 1.0
    assert texts == ["Let me look. ", "Half an ans"]
    assert server.count(OPENAI) == 3
    assert all(seen.body.get("stream") is True for seen in server.requests(OPENAI))
