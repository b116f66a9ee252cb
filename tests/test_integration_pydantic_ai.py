"""``statemachine.integrations.pydantic_ai.EngineModel`` inside a real pydantic-ai agent,
with the real ``openai`` client, against the loopback vendor (tests/servers/fake_llm.py).

Nothing is mocked between the agent and the socket; the vendor counts the requests.
Waits go to a fake sleep that advances the session's clock. Outside CI a missing
pydantic-ai skips this module; in CI (``CI=1``) it fails.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("pydantic_ai")

import openai
from pydantic_ai import Agent
from pydantic_ai.exceptions import AgentRunError, ModelRetry
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.fallback import FallbackModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import statemachine as sm
from statemachine.integrations import TurnFailed as AnyTurnFailed
from statemachine.integrations.pydantic_ai import EngineModel, TurnFailed

from .helpers import FakeTime
from .servers.fake_llm import OPENAI, Canned, FakeLLM, openai_completion, openai_error


@pytest.fixture
def servers() -> Iterator[tuple[FakeLLM, FakeLLM]]:
    with FakeLLM() as main, FakeLLM() as backup:
        yield main, backup


CLIENTS: list[openai.AsyncOpenAI] = []


def _model(server: FakeLLM, name: str = "gpt-main") -> OpenAIChatModel:
    """The model as pydantic-ai's docs build it: the SDK's default max_retries (2)."""
    sdk = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="sk-test")
    CLIENTS.append(sdk)
    return OpenAIChatModel(name, provider=OpenAIProvider(openai_client=sdk))


def _run(coroutine: Any) -> Any:
    """Run ``coroutine``, then close the clients it used on its own loop."""

    async def closing() -> Any:
        try:
            return await coroutine
        finally:
            while CLIENTS:
                await CLIENTS.pop().close()

    return asyncio.run(closing())


def _weather_agent(model: EngineModel) -> Agent[None, str]:
    agent = Agent(model)

    @agent.tool_plain
    def weather(city: str) -> str:
        return f"{city}: sunny"

    return agent


def _bodies(server: FakeLLM) -> list[dict[str, Any]]:
    return [seen.body for seen in server.requests(OPENAI)]


@pytest.mark.requirement("ER-230")
def test_engine_owns_retries_and_waits_with_the_sdk_client_as_built(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A client with the SDK's default max_retries=2 sends each engine attempt once:
    two 429s with retry-after are two engine waits (on the injected clock), the third
    request answers; with max_retries=1 three 429s are two requests, not six."""
    main, _ = servers
    main.script(
        OPENAI,
        openai_error(429, "Rate limit reached", "requests", retry_after="2"),
        openai_error(429, "Rate limit reached", "requests", retry_after="3"),
        openai_completion("sunny"),
    )
    time = FakeTime()
    model = EngineModel(_model(main), clock=time.clock, sleep=time.sleep)
    result = _run(Agent(model).run("weather?"))
    assert result.output == "sunny"
    assert main.count(OPENAI) == 3
    assert len(time.waits) == 2 and time.waits[0] >= 2 and time.waits[1] >= 3
    session = model.session(result.run_id)
    assert session is not None and session.retries_used == 2 and session.turns == 1

    main.script(OPENAI, *[openai_error(429, "Rate limit reached", "requests")] * 6)
    strict = EngineModel(
        _model(main), settings=sm.Settings(max_retries=1), clock=time.clock, sleep=time.sleep
    )
    with pytest.raises(TurnFailed) as failed:
        _run(Agent(strict).run("again"))
    assert main.count(OPENAI) == 3 + 2
    assert failed.value.status == sm.TurnStatus.RETRIES_EXHAUSTED
    assert "retries_exhausted" in str(failed.value) and "rate_limited" in str(failed.value)


@pytest.mark.requirement("ER-231")
def test_auth_error_never_falls_back_and_raises_naming_it(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A 401 on the default model: one request, none to the fallback (FallbackModel
    would answer from it), and an AgentRunError whose status is auth_error."""
    main, backup = servers
    main.script(
        OPENAI, openai_error(401, "Incorrect API key", "invalid_request_error", "invalid_api_key")
    )
    backup.script(OPENAI, openai_completion("from the fallback"))
    time = FakeTime()
    model = EngineModel(
        [_model(main), _model(backup, "gpt-backup")], clock=time.clock, sleep=time.sleep
    )
    with pytest.raises(TurnFailed) as failed:
        _run(Agent(model).run("hi"))
    error = failed.value
    assert isinstance(error, AgentRunError) and isinstance(error, AnyTurnFailed)
    assert error.status == sm.TurnStatus.AUTH_ERROR
    assert error.error is not None and error.error.category == sm.ErrorCategory.AUTH_ERROR
    assert "auth_error" in str(error)
    assert (main.count(OPENAI), backup.count(OPENAI)) == (1, 0)
    assert time.waits == []


@pytest.mark.requirement("ER-230")
def test_transient_storm_falls_back_after_the_engine_retries(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A 5xx storm spends the default model's retries (max_retries=2: three requests),
    then the fallback answers; its requests name the fallback's model."""
    main, backup = servers
    main.script(OPENAI, *[openai_error(500, "server error", "server_error")] * 5)
    backup.script(OPENAI, openai_completion("from the fallback"))
    time = FakeTime()
    model = EngineModel(
        [_model(main), _model(backup, "gpt-backup")],
        settings=sm.Settings(max_retries=2),
        clock=time.clock,
        sleep=time.sleep,
    )
    result = _run(Agent(model).run("hi"))
    assert result.output == "from the fallback"
    assert (main.count(OPENAI), backup.count(OPENAI)) == (3, 1)
    assert _bodies(backup)[0]["model"] == "gpt-backup"
    assert len(time.waits) == 2


def _tool_history() -> list[Any]:
    """Three earlier rounds, each a tool call and its result, then a text answer."""
    history: list[Any] = []
    for index in range(3):
        call = f"call_{index}"
        history += [
            ModelRequest(parts=[UserPromptPart(f"question {index}")]),
            ModelResponse(parts=[ToolCallPart("weather", {"city": f"c{index}"}, call)]),
            ModelRequest(parts=[ToolReturnPart("weather", "sunny", call)]),
            ModelResponse(parts=[TextPart(f"answer {index}")]),
        ]
    return history


def _tool_pairs_whole(body: dict[str, Any]) -> bool:
    """Every tool message answers a tool call an earlier assistant message made."""
    made: set[str] = set()
    for message in body["messages"]:
        for call in message.get("tool_calls") or ():
            made.add(call["id"])
        if message["role"] == "tool" and message["tool_call_id"] not in made:
            return False
    return True


@pytest.mark.requirement("ER-234")
def test_context_overflow_is_answered_by_a_smaller_request(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A 400 context overflow and then a 429 "must be reduced": each next request is
    strictly smaller, keeps the first prompt, never splits a tool call from its
    result; the reduction is kept for the run's next request."""
    main, _ = servers
    overflow = openai_error(
        400,
        "This model's maximum context length is 128000 tokens.",
        "invalid_request_error",
        "context_length_exceeded",
    )
    tpm = openai_error(
        429,
        "Request too large: the input or output tokens must be reduced",
        "tokens",
        "rate_limit_exceeded",
    )
    main.script(OPENAI, overflow, tpm, openai_completion("short answer"))
    time = FakeTime()
    model = EngineModel(_model(main), clock=time.clock, sleep=time.sleep)
    result = _run(Agent(model).run("question 3", message_history=_tool_history()))
    assert result.output == "short answer"
    sizes = [len(body["messages"]) for body in _bodies(main)]
    assert len(sizes) == 3 and sizes[0] > sizes[1] > sizes[2]
    for body in _bodies(main):
        assert body["messages"][0]["content"] == "question 0"
        assert body["messages"][-1]["content"] == "question 3"
        assert _tool_pairs_whole(body)
    assert time.waits == []  # a reduction is not a wait


@pytest.mark.requirement("ER-234")
def test_context_that_cannot_shrink_ends_context_exhausted(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A single prompt that overflows cannot be reduced: one request, then
    TurnFailed(context_exhausted); the same request is never resent."""
    main, _ = servers
    main.script(
        OPENAI,
        *[
            openai_error(
                400, "maximum context length", "invalid_request_error", "context_length_exceeded"
            )
        ]
        * 3,
    )
    model = EngineModel(_model(main), sleep=FakeTime().sleep)
    with pytest.raises(TurnFailed) as failed:
        _run(Agent(model).run("a huge prompt"))
    assert failed.value.status == sm.TurnStatus.CONTEXT_EXHAUSTED
    assert main.count(OPENAI) == 1


def _stream_cut_after_usage() -> Canned:
    def chunk(body: dict[str, Any]) -> str:
        return (
            "data: "
            + json.dumps(
                {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "gpt-main",
                    **body,
                }
            )
            + "\n\n"
        )

    text = chunk(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": "Hel"},
                    "finish_reason": None,
                }
            ]
        }
    )
    text += chunk(
        {
            "choices": [],
            "usage": {"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127},
        }
    )
    return Canned(200, text.encode(), content_type="text/event-stream", cut=True)


@pytest.mark.requirement("ER-232")
def test_a_stream_broken_after_the_hand_over_is_never_resent(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A 529 before the stream opens is retried; a stream that breaks after its text
    and usage were delivered is not: TurnFailed(stream_interrupted), its usage
    counted once in the session's trace, two requests in all."""
    main, _ = servers
    main.script(
        OPENAI,
        openai_error(529, "Overloaded", "overloaded_error"),
        _stream_cut_after_usage(),
        openai_completion("must not be asked for"),
    )
    time = FakeTime()
    model = EngineModel(_model(main), clock=time.clock, sleep=time.sleep)
    agent = Agent(model)
    seen: list[str] = []

    async def consume() -> None:
        async with agent.run_stream("hi") as result:
            async for text in result.stream_text(delta=True, debounce_by=None):
                seen.append(text)  # noqa: PERF401 - what arrived before the break counts

    with pytest.raises(TurnFailed) as failed:
        _run(consume())
    assert failed.value.status == sm.TurnStatus.STREAM_INTERRUPTED
    assert main.count(OPENAI) == 2 and len(time.waits) == 1
    assert "".join(seen) == "Hel"
    session = model.session(next(iter(model._runs)))
    assert session is not None and session.current_turn is not None
    used = [record.usage for record in session.current_turn.trace if record.usage is not None]
    counted = [(usage.input_tokens, usage.output_tokens) for usage in used if usage.input_tokens]
    assert counted == [(120, 7)]


@pytest.mark.requirement("ER-250")
def test_a_tool_that_raises_ends_the_run_and_a_model_retry_is_not_a_crash(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """pydantic-ai ends the run with a tool's exception (so no request follows for the
    breaker to stop, as docs/integrations.md says); a tool's ModelRetry is its answer,
    sent to the model and never counted by the crash breaker."""
    main, _ = servers
    main.script(OPENAI, openai_completion(None, tool_calls=(("c1", "lookup", {"key": "k"}),)))
    time = FakeTime()
    model = EngineModel(_model(main), settings=sm.Settings(breaker_threshold=1), sleep=time.sleep)
    agent = Agent(model)

    @agent.tool_plain
    def lookup(key: str) -> str:
        raise KeyError(key)

    with pytest.raises(KeyError):
        _run(agent.run("look k up"))
    assert len(_bodies(main)) == 1

    main.script(
        OPENAI,
        openai_completion(None, tool_calls=(("c2", "retrying", {"key": "k"}),)),
        openai_completion("no such key"),
    )
    retry_model = EngineModel(
        _model(main), settings=sm.Settings(breaker_threshold=1), sleep=time.sleep
    )
    retrying_agent = Agent(retry_model)

    @retrying_agent.tool_plain
    def retrying(key: str) -> str:
        raise ModelRetry(f"no key {key}")

    result = _run(retrying_agent.run("look k up"))
    assert result.output == "no such key"
    session = retry_model.session(result.run_id)
    assert session is not None and session.tripped_providers == frozenset()
    assert session.status is None


@pytest.mark.requirement("ER-233")
def test_doom_loop_makes_the_next_request_a_final_answer_without_tools(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """The same tool call three times (doom_loop_threshold=3): the engine sees each
    (their results come with the next request), and the fourth request is the
    final-answer turn: no tools, the engine's instruction as the last user prompt.
    The session ends error_doom_loop; a request after it raises."""
    main, _ = servers
    call = openai_completion(None, tool_calls=(("c1", "weather", {"city": "Paris"}),))
    main.script(
        OPENAI,
        call,
        openai_completion(None, tool_calls=(("c2", "weather", {"city": "Paris"}),)),
        openai_completion(None, tool_calls=(("c3", "weather", {"city": "Paris"}),)),
        openai_completion("final answer"),
    )
    time = FakeTime()
    model = EngineModel(
        _model(main),
        settings=sm.Settings(doom_loop_threshold=3),
        clock=time.clock,
        sleep=time.sleep,
    )
    agent = _weather_agent(model)
    result = _run(agent.run("weather?"))
    assert result.output == "final answer"
    bodies = _bodies(main)
    assert len(bodies) == 4
    assert all("tools" in body for body in bodies[:3]) and "tools" not in bodies[3]
    assert "final answer" in json.dumps(bodies[3]["messages"][-1])
    session = model.session(result.run_id)
    assert session is not None and session.status == sm.SessionStatus.ERROR_DOOM_LOOP
    assert session.turns == 4

    shared = EngineModel(_model(main), session=session, sleep=time.sleep)
    with pytest.raises(TurnFailed) as ended:
        _run(Agent(shared).run("more?"))
    assert ended.value.status == sm.SessionStatus.ERROR_DOOM_LOOP
    assert ended.value.finish is None and "ended" in str(ended.value)
    assert main.count(OPENAI) == 4


@pytest.mark.requirement("ER-233")
def test_session_bounds_hold_across_one_run_and_each_run_has_its_own(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """max_turns=1: the run's second request is already the final-answer turn (no
    tools); a second run of the same agent starts a session of its own."""
    main, _ = servers
    for _ in range(2):
        main.script(
            OPENAI,
            openai_completion(None, tool_calls=(("c1", "weather", {"city": "Paris"}),)),
            openai_completion("done"),
        )
    model = EngineModel(_model(main), settings=sm.Settings(max_turns=1), sleep=FakeTime().sleep)
    agent = _weather_agent(model)

    async def both() -> tuple[Any, Any]:
        return await agent.run("one"), await agent.run("two")

    first, second = _run(both())
    assert first.output == second.output == "done"
    bodies = _bodies(main)
    assert ["tools" in body for body in bodies] == [True, False, True, False]
    one, two = model.session(first.run_id), model.session(second.run_id)
    assert one is not None and two is not None and one is not two
    assert one.status == two.status == sm.SessionStatus.ERROR_MAX_TURNS


def test_content_filter_raises_naming_it(servers: tuple[FakeLLM, FakeLLM]) -> None:
    """A 200 whose finish_reason is content_filter ends the turn content_filtered."""
    main, _ = servers
    main.script(OPENAI, openai_completion(None, finish_reason="content_filter"))
    model = EngineModel(_model(main), sleep=FakeTime().sleep)
    with pytest.raises(TurnFailed) as failed:
        _run(Agent(model).run("hi"))
    assert failed.value.status == sm.TurnStatus.CONTENT_FILTERED
    assert main.count(OPENAI) == 1


def test_a_retry_after_beyond_the_server_wait_is_deferred(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """retry-after: 3600 is not slept on: TurnFailed(retry_deferred) with retry_at."""
    main, _ = servers
    main.script(OPENAI, openai_error(429, "Rate limit", "requests", retry_after="3600"))
    time = FakeTime()
    model = EngineModel(_model(main), clock=time.clock, sleep=time.sleep)
    with pytest.raises(TurnFailed) as failed:
        _run(Agent(model).run("hi"))
    assert failed.value.status == sm.TurnStatus.RETRY_DEFERRED
    assert failed.value.retry_at is not None and failed.value.retry_at >= 3600
    assert time.waits == [] and main.count(OPENAI) == 1


def test_bad_configuration_is_refused_naming_it(servers: tuple[FakeLLM, FakeLLM]) -> None:
    """Two models of one name, a fallback chain that differs from the models given,
    a session of another chain and a malformed price are refused at construction."""
    main, backup = servers
    with pytest.raises(sm.ConfigError, match="two models are named 'openai:gpt-main'"):
        EngineModel([_model(main), _model(backup)])
    with pytest.raises(sm.ConfigError, match="fallback_models"):
        EngineModel([_model(main)], settings=sm.Settings(fallback_models=["other"]))
    with pytest.raises(sm.ConfigError, match="session"):
        EngineModel([_model(main), _model(backup, "gpt-backup")], session=sm.Session())
    with pytest.raises(TypeError, match="price_per_mtok"):
        EngineModel(_model(main), price_per_mtok=(1.0, -2.0))  # type: ignore[arg-type]
    with pytest.raises(sm.ConfigError, match="models"):
        EngineModel([])
    with pytest.raises(sm.ConfigError, match=r"models: .*got 5"):
        EngineModel(5)  # type: ignore[arg-type]
    with pytest.raises(sm.ConfigError, match=r"models: .*got None"):
        EngineModel([_model(main), None])  # type: ignore[list-item]
    # the "before" of docs/integrations.md wrapped as it stands: its fallbacks would
    # hide a 401 and its clients retry unseen, so it is refused, naming the fix
    with pytest.raises(sm.ConfigError, match=r"is a FallbackModel.*EngineModel\(\[first"):
        EngineModel(FallbackModel(_model(main), _model(backup, "gpt-backup")))
    # refused when built, not at the agent run's first request
    with pytest.raises(sm.ConfigError, match="seed: must be an int"):
        EngineModel(_model(main), seed="7")  # type: ignore[arg-type]
    with pytest.raises(sm.ConfigError, match="clock"):
        EngineModel(_model(main), clock=3)  # type: ignore[arg-type]
    with pytest.raises(sm.ConfigError, match="is an EngineModel already"):
        EngineModel([EngineModel(_model(main)), _model(backup, "gpt-backup")])
    assert main.count(OPENAI) == 0


def test_price_counts_toward_the_budget(servers: tuple[FakeLLM, FakeLLM]) -> None:
    """price_per_mtok makes each reply's tokens a cost the session's budget counts."""
    main, _ = servers
    main.script(OPENAI, openai_completion("hi", tokens=(1000, 500)))
    model = EngineModel(_model(main), price_per_mtok=(2.0, 10.0), sleep=FakeTime().sleep)
    result = _run(Agent(model).run("hi"))
    session = model.session(result.run_id)
    assert session is not None
    assert session.cost_usd == pytest.approx(1000 * 2.0 / 1e6 + 500 * 10.0 / 1e6)


@pytest.mark.requirement("ER-230")
def test_an_anthropic_model_with_its_real_client_retries_only_through_the_engine(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """pydantic-ai's AnthropicModel over a real ``anthropic`` client (max_retries=2 by
    default): two 529s are two engine waits and three requests in all, not nine."""
    import anthropic
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    from .servers.fake_llm import ANTHROPIC, anthropic_error, anthropic_message

    main, _ = servers
    overloaded = anthropic_error(529, "overloaded_error", "Overloaded")
    main.script(ANTHROPIC, overloaded, overloaded, anthropic_message("bonjour"))
    client = anthropic.AsyncAnthropic(base_url=main.url, api_key="sk-ant-test")
    time = FakeTime()
    model = EngineModel(
        AnthropicModel("claude-test", provider=AnthropicProvider(anthropic_client=client)),
        clock=time.clock,
        sleep=time.sleep,
    )

    async def run() -> Any:
        try:
            return await Agent(model).run("hi")
        finally:
            await client.close()

    result = _run(run())
    assert result.output == "bonjour"
    assert main.count(ANTHROPIC) == 3 and len(time.waits) == 2
    session = model.session(result.run_id)
    assert session is not None and session.retries_used == 2


def test_the_callers_own_error_inside_a_stream_is_not_a_model_failure() -> None:
    """An exception the agent's caller raises while it holds the stream is its own: it
    propagates as it is (not TurnFailed) and the turn is cancelled, not charged as a
    broken stream; the model's next request opens a new turn."""
    from pydantic_ai.models.function import FunctionModel

    async def words(_messages: Any, _info: Any) -> Any:
        yield "one "
        yield "two"

    model = EngineModel(FunctionModel(stream_function=words), sleep=FakeTime().sleep)
    agent = Agent(model)

    async def consume() -> None:
        async with agent.run_stream("hi") as result:
            async for _ in result.stream_text(delta=True, debounce_by=None):
                raise LookupError("the caller's own bug")

    with pytest.raises(LookupError, match="own bug"):
        _run(consume())
    (run_id,) = model._runs
    session = model.session(run_id)
    assert session is not None and session.current_turn is not None
    assert session.current_turn.status == sm.TurnStatus.CANCELLED


@pytest.mark.requirement("ER-245")
def test_a_stream_abandoned_mid_way_is_charged_what_it_used_so_far() -> None:
    """The caller stops a stream it holds (its own error, a cancelled task): the turn
    is cancelled with the usage the stream reported so far, and its cost is charged
    toward the session's budget, as a reply's would be."""
    from pydantic_ai.models.function import FunctionModel

    async def words(_messages: Any, _info: Any) -> Any:
        yield "one "
        yield "two"

    model = EngineModel(
        FunctionModel(stream_function=words), price_per_mtok=(2.0, 10.0), sleep=FakeTime().sleep
    )

    async def consume() -> None:
        async with Agent(model).run_stream("hi") as result:
            async for _ in result.stream_text(delta=True, debounce_by=None):
                raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        _run(consume())
    (run_id,) = model._runs
    session = model.session(run_id)
    assert session is not None and session.current_turn is not None
    assert session.current_turn.status == sm.TurnStatus.CANCELLED
    last = session.current_turn.trace[-1]
    assert last.event == "Cancelled" and last.usage is not None
    assert last.usage.input_tokens and last.cost_usd > 0
    assert session.cost_usd == last.cost_usd == last.usage.cost_usd


def test_a_model_keeps_the_sessions_of_its_latest_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions are kept per run up to MAX_RUNS; the oldest run's is let go first."""
    from pydantic_ai.messages import ModelResponse as Response
    from pydantic_ai.models.function import FunctionModel

    from statemachine.integrations import pydantic_ai as integration

    monkeypatch.setattr(integration, "MAX_RUNS", 2)
    model = EngineModel(
        FunctionModel(lambda _messages, _info: Response(parts=[TextPart("ok")])),
        sleep=FakeTime().sleep,
    )
    agent = Agent(model)

    async def three() -> list[Any]:
        return [await agent.run(f"run {index}") for index in range(3)]

    first, second, third = _run(three())
    assert model.session(first.run_id) is None
    assert model.session(second.run_id) is not None
    assert model.session(third.run_id) is not None
    assert model.session("never seen") is None


def test_a_run_still_going_keeps_its_session_while_others_come_and_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With more runs than MAX_RUNS, one whose tool is still running is not the one let
    go: its next request continues its session (both requests counted in one)."""
    from pydantic_ai.messages import ModelResponse as Response
    from pydantic_ai.models.function import FunctionModel

    from statemachine.integrations import pydantic_ai as integration

    monkeypatch.setattr(integration, "MAX_RUNS", 2)

    def reply(messages: list[Any], _info: Any) -> Response:
        prompt = messages[0].parts[-1].content
        if prompt == "slow" and len(messages) == 1:
            return Response(parts=[ToolCallPart("hold", {}, tool_call_id="h1")])
        return Response(parts=[TextPart("ok")])

    model = EngineModel(FunctionModel(reply), sleep=FakeTime().sleep)
    agent = Agent(model)
    events: list[asyncio.Event] = []  # made on the run's own loop: started, release

    @agent.tool_plain
    async def hold() -> str:
        events[0].set()
        await events[1].wait()
        return "held"

    async def runs() -> Any:
        events[:] = [asyncio.Event(), asyncio.Event()]
        slow = asyncio.create_task(agent.run("slow"))
        await events[0].wait()  # the slow run's tool is running
        for index in range(3):
            await agent.run(f"quick {index}")
        events[1].set()
        return await slow

    result = _run(runs())
    session = model.session(result.run_id)
    assert result.output == "ok"
    assert session is not None and session.turns == 2
