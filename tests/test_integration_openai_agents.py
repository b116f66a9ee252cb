"""``statemachine.integrations.openai_agents`` inside a real OpenAI Agents SDK run, with
the real ``openai`` client (Chat Completions), against the loopback vendor
(tests/servers/fake_llm.py), which counts the requests.

Waits go to a fake sleep that advances the session's clock. Outside CI a missing
openai-agents skips this module; in CI (``CI=1``) it fails.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("agents")

import openai
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.exceptions import AgentsException
from agents.models.interface import ModelProvider
from agents.retry import ModelRetrySettings

import statemachine as sm
from statemachine.integrations.openai_agents import EngineModel, EngineModelProvider, TurnFailed

from .helpers import FakeTime
from .servers.fake_llm import OPENAI, FakeLLM, openai_completion, openai_error, openai_stream

set_tracing_disabled(True)

CLIENTS: list[openai.AsyncOpenAI] = []


@pytest.fixture
def servers() -> Iterator[tuple[FakeLLM, FakeLLM]]:
    with FakeLLM() as main, FakeLLM() as backup:
        yield main, backup


def _client(server: FakeLLM) -> openai.AsyncOpenAI:
    """A client as the SDK's docs build it: the default max_retries (2)."""
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="sk-test")
    CLIENTS.append(client)
    return client


def _model(server: FakeLLM, name: str = "gpt-main") -> OpenAIChatCompletionsModel:
    return OpenAIChatCompletionsModel(name, _client(server))


def _run(coroutine: Any) -> Any:
    """Run ``coroutine``, then close the clients it used on its own loop."""

    async def closing() -> Any:
        try:
            return await coroutine
        finally:
            while CLIENTS:
                await CLIENTS.pop().close()

    return asyncio.run(closing())


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: sunny"


def _bodies(server: FakeLLM) -> list[dict[str, Any]]:
    return [seen.body for seen in server.requests(OPENAI)]


@pytest.mark.requirement("ER-230")
def test_engine_owns_retries_the_sdk_client_sends_each_attempt_once(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """With the client's default max_retries=2, a 429 with retry-after is one engine
    wait (on the injected clock) and one more request, a tool round runs, and three
    429s under max_retries=1 are two requests, not six."""
    main, _ = servers
    main.script(
        OPENAI,
        openai_error(429, "Rate limit reached", "requests", retry_after="2"),
        openai_completion(None, tool_calls=(("c1", "weather", {"city": "Paris"}),)),
        openai_completion("sunny"),
    )
    time = FakeTime()
    model = EngineModel(_model(main), clock=time.clock, sleep=time.sleep)
    result = _run(Runner.run(Agent(name="a", model=model, tools=[weather]), "weather?"))
    assert result.final_output == "sunny"
    assert main.count(OPENAI) == 3 and time.waits and time.waits[0] >= 2
    session = model.last_session
    assert session is not None and session.turns == 2 and session.retries_used == 1
    last = _bodies(main)[-1]["messages"][-1]
    assert last["role"] == "tool" and last["content"] == "Paris: sunny"

    main.script(OPENAI, *[openai_error(429, "Rate limit reached", "requests")] * 6)
    strict = EngineModel(
        _model(main), settings=sm.Settings(max_retries=1), clock=time.clock, sleep=time.sleep
    )
    with pytest.raises(TurnFailed) as failed:
        _run(Runner.run(Agent(name="b", model=strict), "again"))
    assert failed.value.status == sm.TurnStatus.RETRIES_EXHAUSTED
    assert isinstance(failed.value, AgentsException)
    assert main.count(OPENAI) == 3 + 2


@pytest.mark.requirement("ER-230")
def test_runner_retries_are_refused_before_anything_is_sent(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """ModelSettings.retry with max_retries > 0 would retry around the engine: refused
    with ConfigError naming it, and the vendor sees no request."""
    main, _ = servers
    model = EngineModel(_model(main), sleep=FakeTime().sleep)
    settings = ModelSettings(retry=ModelRetrySettings(max_retries=3))
    agent = Agent(name="a", model=model, model_settings=settings)
    with pytest.raises(sm.ConfigError, match=r"model_settings\.retry"):
        _run(Runner.run(agent, "hi"))
    assert main.count(OPENAI) == 0


@pytest.mark.requirement("ER-231")
def test_fallback_chain_the_sdk_lacks_and_auth_errors_never_fall_back(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A 529 storm spends the default model's retries, then the fallback answers; a
    400 whose body says the key is invalid is auth_error at once, fallback untouched."""
    main, backup = servers
    main.script(OPENAI, *[openai_error(529, "Overloaded", "overloaded_error")] * 3)
    backup.script(OPENAI, openai_completion("from the fallback"))
    time = FakeTime()
    model = EngineModel(
        [_model(main), _model(backup, "gpt-backup")],
        settings=sm.Settings(max_retries=2),
        clock=time.clock,
        sleep=time.sleep,
    )
    result = _run(Runner.run(Agent(name="a", model=model), "hi"))
    assert result.final_output == "from the fallback"
    assert (main.count(OPENAI), backup.count(OPENAI)) == (3, 1)
    assert _bodies(backup)[0]["model"] == "gpt-backup"

    main.script(
        OPENAI, openai_error(400, "API key not valid. Please pass a valid API key.", "invalid")
    )
    model = EngineModel(
        [_model(main), _model(backup, "gpt-backup")], clock=time.clock, sleep=time.sleep
    )
    with pytest.raises(TurnFailed) as failed:
        _run(Runner.run(Agent(name="b", model=model), "hi"))
    assert failed.value.status == sm.TurnStatus.AUTH_ERROR and "auth_error" in str(failed.value)
    assert (main.count(OPENAI), backup.count(OPENAI)) == (4, 1)


@pytest.mark.requirement("ER-232")
def test_a_stream_broken_after_its_first_event_is_never_resent(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """A 500 before the stream opens is retried; a stream cut after its text is not:
    TurnFailed(stream_interrupted), two requests in all. A whole stream passes through."""
    main, backup = servers
    main.script(
        OPENAI,
        openai_error(500, "server error", "server_error"),
        openai_stream({"role": "assistant", "content": "Hel"}, cut=True),
        openai_completion("must not be asked for"),
    )
    time = FakeTime()
    model = EngineModel(_model(main), clock=time.clock, sleep=time.sleep)
    events: list[str] = []

    async def consume() -> None:
        streamed = Runner.run_streamed(Agent(name="a", model=model), "hi")
        async for event in streamed.stream_events():
            events.append(event.type)  # noqa: PERF401 - what arrived before the break counts

    with pytest.raises(TurnFailed) as failed:
        _run(consume())
    assert failed.value.status == sm.TurnStatus.STREAM_INTERRUPTED
    assert main.count(OPENAI) == 2 and len(time.waits) == 1
    assert "raw_response_event" in events

    backup.script(OPENAI, openai_stream({"role": "assistant", "content": "Hello"}))
    model = EngineModel(_model(backup), clock=time.clock, sleep=time.sleep)

    async def whole() -> Any:
        streamed = Runner.run_streamed(Agent(name="b", model=model), "hi")
        async for _ in streamed.stream_events():
            pass
        return streamed.final_output

    assert _run(whole()) == "Hello"


@pytest.mark.requirement("ER-233")
@pytest.mark.requirement("ER-234")
def test_doom_loop_final_answer_and_reduced_input(servers: tuple[FakeLLM, FakeLLM]) -> None:
    """Three identical tool calls: the fourth call is the final-answer turn (no tools,
    the instruction last); an overflow on a history is answered by a smaller input
    that keeps the first item."""
    main, _ = servers
    main.script(
        OPENAI,
        *[
            openai_completion(None, tool_calls=((f"c{index}", "weather", {"city": "Paris"}),))
            for index in range(3)
        ],
        openai_completion("final answer"),
    )
    time = FakeTime()
    model = EngineModel(_model(main), settings=sm.Settings(doom_loop_threshold=3), sleep=time.sleep)
    result = _run(Runner.run(Agent(name="a", model=model, tools=[weather]), "weather?"))
    assert result.final_output == "final answer"
    bodies = _bodies(main)
    assert ["tools" in body for body in bodies] == [True, True, True, False]
    assert "final answer" in json.dumps(bodies[3]["messages"][-1])
    session = model.last_session
    assert session is not None and session.status == sm.SessionStatus.ERROR_DOOM_LOOP

    main.script(
        OPENAI,
        openai_error(
            400, "maximum context length", "invalid_request_error", "context_length_exceeded"
        ),
        openai_completion("short"),
    )
    items: list[Any] = []
    for index in range(4):
        items += [
            {"role": "user", "content": f"question {index}"},
            {"role": "assistant", "content": f"answer {index}"},
        ]
    items.append({"role": "user", "content": "question 4"})
    fresh = EngineModel(_model(main), sleep=time.sleep)
    result = _run(Runner.run(Agent(name="b", model=fresh), items))
    assert result.final_output == "short"
    first, second = (body["messages"] for body in _bodies(main)[4:])
    assert len(second) < len(first)
    assert second[0]["content"] == "question 0" and second[-1]["content"] == "question 4"


@function_tool
def flaky_lookup(key: str) -> str:
    """Look a key up (this one always raises)."""
    raise KeyError(key)


@pytest.mark.requirement("ER-250")
def test_a_tool_that_keeps_raising_trips_its_breaker(servers: tuple[FakeLLM, FakeLLM]) -> None:
    """A function tool that raises on every call (new arguments each time, so the doom
    loop never fires) gets the SDK's default error text as its output; the engine reads
    that as a failed invocation: breaker_threshold of them trip the breaker, and the
    next request is the final-answer turn (no tools). A tool answering with its own
    text is never counted (the doom-loop test above)."""
    main, _ = servers
    main.script(
        OPENAI,
        *[
            openai_completion(
                None, tool_calls=((f"c{index}", "flaky_lookup", {"key": f"k{index}"}),)
            )
            for index in range(2)
        ],
        openai_completion("I could not look it up"),
    )
    time = FakeTime()
    model = EngineModel(_model(main), settings=sm.Settings(breaker_threshold=2), sleep=time.sleep)
    agent = Agent(name="a", model=model, tools=[flaky_lookup])
    result = _run(Runner.run(agent, "look k up"))
    assert result.final_output == "I could not look it up"
    bodies = _bodies(main)
    assert ["tools" in body for body in bodies] == [True, True, False]
    session = model.last_session
    assert session is not None and session.status == sm.SessionStatus.ERROR_CIRCUIT_BREAKER
    assert session.tripped_providers == frozenset({"tools"})  # the function tools, as one


def test_provider_wraps_every_model_a_run_names(servers: tuple[FakeLLM, FakeLLM]) -> None:
    """EngineModelProvider: the run's model and the fallbacks come from the provider it
    wraps; one EngineModel per name; a 401 raises naming auth_error."""
    main, _ = servers

    class Provider(ModelProvider):
        def get_model(self, model_name: str | None) -> Any:
            return _model(main, model_name or "gpt-main")

    provider = EngineModelProvider(Provider(), fallbacks=["gpt-backup"], sleep=FakeTime().sleep)
    model = provider.get_model("gpt-main")
    assert model is provider.get_model("gpt-main")
    assert isinstance(model, EngineModel) and [m.model for m in model.models] == [
        "gpt-main",
        "gpt-backup",
    ]
    main.script(OPENAI, openai_error(401, "bad key", "invalid_request_error", "invalid_api_key"))
    agent = Agent(name="a", model="gpt-main")
    with pytest.raises(TurnFailed) as failed:
        _run(Runner.run(agent, "hi", run_config=RunConfig(model_provider=provider)))
    assert failed.value.status == sm.TurnStatus.AUTH_ERROR
    assert main.count(OPENAI) == 1
    with pytest.raises(sm.ConfigError, match="fallbacks"):
        EngineModelProvider(Provider(), fallbacks="gpt-backup")
    with pytest.raises(sm.ConfigError, match="provider"):
        EngineModelProvider(object())  # type: ignore[arg-type]
    with pytest.raises(sm.ConfigError, match="models"):
        EngineModel(["gpt-main"])  # type: ignore[list-item]


def test_price_counts_toward_the_budget_and_a_bad_price_is_refused(
    servers: tuple[FakeLLM, FakeLLM],
) -> None:
    """price_per_mtok makes a reply's tokens a cost the session counts; a price that
    is not two finite numbers >= 0 is refused at construction."""
    main, _ = servers
    main.script(OPENAI, openai_completion("hi", tokens=(1000, 500)))
    model = EngineModel(_model(main), price_per_mtok=(2.0, 10.0), sleep=FakeTime().sleep)
    _run(Runner.run(Agent(name="a", model=model), "hi"))
    session = model.last_session
    assert session is not None
    assert session.cost_usd == pytest.approx(1000 * 2.0 / 1e6 + 500 * 10.0 / 1e6)
    for bad in ((1.0,), [1.0, 2.0], (1.0, float("nan")), (1.0, -1.0)):
        with pytest.raises(TypeError, match="price_per_mtok"):
            EngineModel(_model(main), price_per_mtok=bad)  # type: ignore[arg-type]
    _run(asyncio.sleep(0))  # closes the clients the refused models were given


def test_models_of_the_wrong_type_are_refused_naming_them() -> None:
    """A model name (the provider's job), a number or a list holding something that is
    not a Model is refused with a ConfigError naming the value, not a TypeError from
    inside the constructor (a name was once read as its letters: "got 'g'")."""
    with pytest.raises(sm.ConfigError, match=r"models: .*got 'gpt-5'"):
        EngineModel("gpt-5")  # type: ignore[arg-type]
    with pytest.raises(sm.ConfigError, match=r"models: .*got 5"):
        EngineModel(5)  # type: ignore[arg-type]
    with pytest.raises(sm.ConfigError, match=r"models: .*got None"):
        EngineModel([None])  # type: ignore[list-item]
    inner = EngineModel(OpenAIChatCompletionsModel("gpt-main", openai.AsyncOpenAI(api_key="k")))
    with pytest.raises(sm.ConfigError, match="is an EngineModel already"):
        EngineModel(inner)


def test_a_providers_bad_engine_arguments_are_refused_at_construction() -> None:
    """A misspelt keyword or settings of the wrong type is refused when the provider
    is built, naming it, not as a TypeError at the run's first model call."""
    from agents.models.openai_provider import OpenAIProvider

    provider = OpenAIProvider(api_key="sk-test")
    with pytest.raises(sm.ConfigError, match=r"unknown keyword argument\(s\) \['setings'\]"):
        EngineModelProvider(provider, setings=sm.Settings())
    with pytest.raises(sm.ConfigError, match=r"settings: must be a statemachine\.Settings"):
        EngineModelProvider(provider, settings={"max_turns": 3})
    with pytest.raises(sm.ConfigError, match="seed: must be an int"):
        EngineModelProvider(provider, seed="7")
    with pytest.raises(sm.ConfigError, match="clock"):
        EngineModel(OpenAIChatCompletionsModel("m", openai.AsyncOpenAI(api_key="k")), clock=3)  # type: ignore[arg-type]
    built = EngineModelProvider(provider, settings=sm.Settings(max_turns=3), seed=1)
    assert built.engine == {"settings": sm.Settings(max_turns=3), "seed": 1}
