"""The ready-made providers' calls as GenAI spans, end to end.

The real ``openai`` and ``anthropic`` SDK clients talk to the loopback server of
``tests/servers/fake_llm.py``, which answers two 429s and then a reply with a dated
model name and usage; the drivers run the turn (their sleep moves a manual clock), a
bound :class:`~statemachine.otel.Telemetry` on the SDK's in-memory exporter and reader
turns its trace into spans and metrics. What the spans say is what the server said.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import anthropic
import openai
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import statemachine as sm
from statemachine.otel import Telemetry
from statemachine.providers import (
    AnthropicModel,
    AsyncAnthropicModel,
    AsyncOpenAIModel,
    OpenAIModel,
)

from .helpers import ManualClock
from .servers.fake_llm import (
    ANTHROPIC,
    OPENAI,
    Canned,
    FakeLLM,
    anthropic_error,
    anthropic_message,
    openai_completion,
    openai_error,
)

DATED_OPENAI = "gpt-4o-2024-08-06"
DATED_ANTHROPIC = "claude-sonnet-4-5-20250929"
REQUEST = {"messages": [{"role": "user", "content": "What is in notes.md?"}], "max_tokens": 300}


@pytest.fixture
def server() -> Iterator[FakeLLM]:
    with FakeLLM() as fake:
        yield fake


class _Context:
    def assemble(self, action: sm.Assemble) -> sm.Assembled:
        return sm.Assembled(REQUEST, size=10)


class _Tools:
    def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        return sm.ToolOutcome(call.id, ok=True, content="ok")


class _AsyncContext:
    async def assemble(self, action: sm.Assemble) -> sm.Assembled:
        return sm.Assembled(REQUEST, size=10)


class _AsyncTools:
    async def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        return sm.ToolOutcome(call.id, ok=True, content="ok")


class Run:
    """A bound Telemetry on a session whose clock the driver's sleep moves."""

    def __init__(self, model: str | None) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.clock = ManualClock()
        self.telemetry = Telemetry(
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            clock_offset=0.0,
        )
        self.session = sm.Session(
            sm.Settings(model=model),
            seed=5,
            clock=self.clock,
            observers=[self.telemetry],
            session_id="chat-42",
        )
        self.telemetry.bind(self.session)
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.clock.advance(seconds)

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def chats(self) -> list[dict[str, Any]]:
        self.telemetry.end()
        spans: list[ReadableSpan] = sorted(
            (s for s in self.exporter.get_finished_spans() if s.name.startswith("chat")),
            key=lambda s: s.start_time,
        )
        return [{"name": s.name, **(s.attributes or {})} for s in spans]

    def metric_points(self, name: str) -> list[tuple[dict[str, Any], Any]]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            (dict(point.attributes), point)
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]


def _port(server: FakeLLM) -> int:
    port = urlsplit(server.url).port
    assert port is not None
    return port


def _dated_openai_reply() -> Canned:
    canned = openai_completion("A shopping list.", tokens=(1200, 85))
    canned.body.update(
        id="chatcmpl-B9MHD",
        model=DATED_OPENAI,
        system_fingerprint="fp_f33640a400",
        service_tier="default",
    )
    canned.body["usage"]["prompt_tokens_details"] = {"cached_tokens": 1024}
    canned.body["usage"]["completion_tokens_details"] = {"reasoning_tokens": 20}
    return canned


def _rate_limited_openai() -> Canned:
    return openai_error(429, "Rate limit reached", "requests", retry_after_ms="10")


@pytest.mark.requirement("ER-158", "ER-151", "ER-152", "ER-153", "ER-155")
def test_the_openai_provider_against_a_loopback_server(server: FakeLLM) -> None:
    """OpenAIModel through run_turn: two 429s the SDK raised, then a reply whose model is
    the dated name. Three chat spans, all with provider openai and the loopback server;
    the 429s with their status; the reply with the dated model, the tokens, the
    response id and finish reason, and the OpenAI response attributes; the duration
    and token metrics with the same names."""
    server.script(OPENAI, _rate_limited_openai(), _rate_limited_openai(), _dated_openai_reply())
    run = Run("gpt-4o")
    with openai.OpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0) as client:
        finish = sm.run_turn(
            run.session.new_turn(),
            model=OpenAIModel(client),
            tools=_Tools(),
            context=_Context(),
            sleep=run.sleep,
        )
    assert finish.status is sm.TurnStatus.COMPLETED
    assert server.count(OPENAI) == 3
    assert len(run.waits) == 2
    first, second, replied = run.chats()
    where = {
        "gen_ai.provider.name": "openai",
        "server.address": "127.0.0.1",
        "server.port": _port(server),
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.conversation.id": "chat-42",
        "gen_ai.request.max_tokens": 300,
    }
    for failed in (first, second):
        assert failed["name"] == "chat gpt-4o"
        assert {k: failed[k] for k in where} == where
        assert (failed["error.type"], failed["http.response.status_code"]) == ("rate_limited", 429)
        assert "gen_ai.response.model" not in failed
    assert {k: replied[k] for k in where} == where
    assert "error.type" not in replied
    assert {k: v for k, v in replied.items() if k.startswith(("gen_ai.re", "gen_ai.us"))} == {
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.request.max_tokens": 300,
        "gen_ai.response.model": DATED_OPENAI,
        "gen_ai.response.id": "chatcmpl-B9MHD",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 1200,
        "gen_ai.usage.output_tokens": 85,
        "gen_ai.usage.cache_read.input_tokens": 1024,
        "gen_ai.usage.reasoning.output_tokens": 20,
    }
    assert replied["openai.response.system_fingerprint"] == "fp_f33640a400"
    assert replied["openai.response.service_tier"] == "default"
    assert replied["openai.api.type"] == "chat_completions"

    durations = run.metric_points("gen_ai.client.operation.duration")
    assert {
        (a.get("error.type"), a.get("gen_ai.response.model")): p.count for a, p in durations
    } == {
        ("rate_limited", None): 2,
        (None, DATED_OPENAI): 1,
    }
    for attributes, _ in durations:
        assert attributes["gen_ai.provider.name"] == "openai"
        assert attributes["server.port"] == _port(server)
    tokens = {
        a["gen_ai.token.type"]: p.sum for a, p in run.metric_points("gen_ai.client.token.usage")
    }
    assert tokens == {"input": 1200, "output": 85}


@pytest.mark.requirement("ER-158", "ER-151", "ER-152")
def test_a_streamed_openai_reply_is_marked_streamed(server: FakeLLM) -> None:
    """AsyncOpenAIModel streaming (on_text) through arun_turn: a 429 and then a stream
    whose final chunk reports the usage: both spans carry gen_ai.request.stream, the
    reply the dated model and the streamed usage."""
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": 900, "completion_tokens": 20, "total_tokens": 920},
        },
    ]
    text = "".join(
        "data: "
        + json.dumps(
            {
                "id": "chatcmpl-s",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": DATED_OPENAI,
                **chunk,
            }
        )
        + "\n\n"
        for chunk in chunks
    )
    stream = Canned(200, (text + "data: [DONE]\n\n").encode(), content_type="text/event-stream")
    server.script(OPENAI, _rate_limited_openai(), stream)
    run = Run("gpt-4o")
    texts: list[str] = []

    async def drive() -> sm.Finish:
        async with openai.AsyncOpenAI(
            base_url=server.url + "/v1", api_key="test", max_retries=0
        ) as client:
            return await sm.arun_turn(
                run.session.new_turn(),
                model=AsyncOpenAIModel(client, on_text=texts.append),
                tools=_AsyncTools(),
                context=_AsyncContext(),
                sleep=run.asleep,
            )

    assert asyncio.run(drive()).status is sm.TurnStatus.COMPLETED
    assert texts == ["Hi"]
    failed, replied = run.chats()
    assert failed["gen_ai.request.stream"] is True
    assert failed["http.response.status_code"] == 429
    assert replied["gen_ai.request.stream"] is True
    assert (replied["gen_ai.response.model"], replied["gen_ai.usage.input_tokens"]) == (
        DATED_OPENAI,
        900,
    )


@pytest.mark.requirement("ER-158", "ER-151", "ER-152", "ER-153")
def test_the_anthropic_provider_against_a_loopback_server(server: FakeLLM) -> None:
    """AnthropicModel through run_turn: a 529, then a reply from the dated model with
    cache reads and writes: provider anthropic, the whole prompt as input tokens, the
    cache counts apart, the stop reason as the finish reason."""
    reply = anthropic_message("A shopping list.")
    reply.body.update(id="msg_01", model=DATED_ANTHROPIC)
    reply.body["usage"] = {
        "input_tokens": 100,
        "output_tokens": 40,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 200,
    }
    server.script(ANTHROPIC, anthropic_error(529, "overloaded_error", "Overloaded"), reply)
    run = Run("claude-sonnet-4-5")
    with anthropic.Anthropic(base_url=server.url, api_key="test", max_retries=0) as client:
        finish = sm.run_turn(
            run.session.new_turn(),
            model=AnthropicModel(client),
            tools=_Tools(),
            context=_Context(),
            sleep=run.sleep,
        )
    assert finish.status is sm.TurnStatus.COMPLETED
    failed, replied = run.chats()
    assert (failed["error.type"], failed["http.response.status_code"]) == ("overloaded", 529)
    for span in (failed, replied):
        assert (span["gen_ai.provider.name"], span["server.address"]) == ("anthropic", "127.0.0.1")
    assert {
        k: v for k, v in replied.items() if k.startswith(("gen_ai.response", "gen_ai.usage"))
    } == {
        "gen_ai.response.model": DATED_ANTHROPIC,
        "gen_ai.response.id": "msg_01",
        "gen_ai.response.finish_reasons": ("end_turn",),
        "gen_ai.usage.input_tokens": 1300,
        "gen_ai.usage.output_tokens": 40,
        "gen_ai.usage.cache_read.input_tokens": 1000,
        "gen_ai.usage.cache_creation.input_tokens": 200,
    }


# -- the model given to the provider ------------------------------------------------


def _anthropic_reply() -> Canned:
    reply = anthropic_message("It is sunny.")
    reply.body.update(id="msg_02", model=DATED_ANTHROPIC)
    return reply


def _openai_reply() -> Canned:
    reply = openai_completion("It is sunny.")
    reply.body.update(id="chatcmpl-C1", model=DATED_OPENAI)
    return reply


def _drive(run: Run, make: Any, server: FakeLLM, model: str) -> sm.Finish:
    """One turn of ``run`` with the provider ``make(client, model=model)``, through the
    driver of its kind, against ``server`` (the SDK its class names)."""
    name = make.__name__
    sdk: Any = openai if "OpenAI" in name else anthropic
    url = server.url + ("/v1" if sdk is openai else "")
    if not name.startswith("Async"):
        client_class = sdk.OpenAI if sdk is openai else sdk.Anthropic
        with client_class(base_url=url, api_key="test", max_retries=0) as client:
            return sm.run_turn(
                run.session.new_turn(),
                model=make(client, model=model),
                tools=_Tools(),
                context=_Context(),
                sleep=run.sleep,
            )

    async def drive() -> sm.Finish:
        async_class = sdk.AsyncOpenAI if sdk is openai else sdk.AsyncAnthropic
        async with async_class(base_url=url, api_key="test", max_retries=0) as client:
            return await sm.arun_turn(
                run.session.new_turn(),
                model=make(client, model=model),
                tools=_AsyncTools(),
                context=_AsyncContext(),
                sleep=run.asleep,
            )

    return asyncio.run(drive())


@pytest.mark.requirement("ER-251", "ER-152", "ER-155")
@pytest.mark.parametrize(
    "make", [AnthropicModel, AsyncAnthropicModel, OpenAIModel, AsyncOpenAIModel]
)
def test_a_model_given_to_the_provider_names_the_chat_spans(server: FakeLLM, make: Any) -> None:
    """The README's way: the model given to the provider (``model=``), none in the
    settings or the request. Every attempt's chat span is ``chat {model}`` with
    ``gen_ai.request.model``, the model the vendor received; the reply's says the dated
    name the server answered with as ``gen_ai.response.model``; the turn span and the
    duration metric carry the requested model too."""
    anthropic_sdk = "Anthropic" in make.__name__
    path = ANTHROPIC if anthropic_sdk else OPENAI
    model = "claude-sonnet-4-5" if anthropic_sdk else "gpt-4o"
    failure = (
        anthropic_error(529, "overloaded_error", "Overloaded")
        if anthropic_sdk
        else _rate_limited_openai()
    )
    server.script(path, failure, _anthropic_reply() if anthropic_sdk else _openai_reply())
    run = Run(None)
    finish = _drive(run, make, server, model)
    assert finish.status is sm.TurnStatus.COMPLETED
    assert [seen.body["model"] for seen in server.requests(path)] == [model, model]
    failed, replied = run.chats()
    for span in (failed, replied):
        assert span["name"] == f"chat {model}"
        assert span["gen_ai.request.model"] == model
    assert "gen_ai.response.model" not in failed
    assert replied["gen_ai.response.model"] == (DATED_ANTHROPIC if anthropic_sdk else DATED_OPENAI)
    (turn,) = [s for s in run.exporter.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert (turn.attributes or {})["gen_ai.request.model"] == model
    durations = run.metric_points("gen_ai.client.operation.duration")
    assert {a["gen_ai.request.model"] for a, _ in durations} == {model}


@pytest.mark.requirement("ER-251")
def test_the_request_and_the_action_name_the_model_before_the_provider(server: FakeLLM) -> None:
    """The span names the model the provider sends: the request's ``model`` over the
    provider's, and the settings' (``CallModel.model``) over both."""
    server.script(OPENAI, _openai_reply(), _openai_reply())
    request = {**REQUEST, "model": "gpt-4o-mini"}

    class Context:
        def assemble(self, action: sm.Assemble) -> sm.Assembled:
            return sm.Assembled(request, size=10)

    names = []
    for settings_model in (None, "gpt-4.1"):
        run = Run(settings_model)
        with openai.OpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0) as client:
            sm.run_turn(
                run.session.new_turn(),
                model=OpenAIModel(client, model="gpt-4o"),
                tools=_Tools(),
                context=Context(),
            )
        names += [chat["name"] for chat in run.chats()]
    sent = [f"chat {seen.body['model']}" for seen in server.requests(OPENAI)]
    assert names == sent == ["chat gpt-4o-mini", "chat gpt-4.1"]


class _OwnModel:
    """A host-written provider that names its model, as the drivers' protocol allows."""

    def __init__(self, model: object) -> None:
        self.model = model

    def complete(self, action: sm.CallModel) -> sm.ModelReplied:
        return sm.ModelReplied(reply="It is sunny.")


class _RaisingModel:
    """A provider whose ``model`` cannot be read."""

    @property
    def model(self) -> str:
        raise RuntimeError("no model configured")

    def complete(self, action: sm.CallModel) -> sm.ModelReplied:
        return sm.ModelReplied(reply="It is sunny.")


@pytest.mark.requirement("ER-251")
@pytest.mark.parametrize(
    ("provider", "model"),
    [
        (_OwnModel("local-llama"), "local-llama"),
        (_OwnModel(""), None),
        (_OwnModel(42), None),
        (_OwnModel(None), None),
        (_RaisingModel(), None),
    ],
)
def test_a_host_written_provider_names_its_model(provider: Any, model: str | None) -> None:
    """A host's own provider with a ``model`` attribute (a non-empty str) names the chat
    span; one whose ``model`` is not a name, or cannot be read, leaves it ``chat``
    without ``gen_ai.request.model``, and the turn runs the same."""
    run = Run(None)
    finish = sm.run_turn(run.session.new_turn(), model=provider, tools=_Tools(), context=_Context())
    assert finish.status is sm.TurnStatus.COMPLETED
    (chat,) = run.chats()
    assert chat["name"] == ("chat" if model is None else f"chat {model}")
    assert chat.get("gen_ai.request.model") == model


@pytest.mark.requirement("ER-251")
def test_the_provider_model_is_seen_only_while_its_driver_runs() -> None:
    """After ``run_turn`` returns, a turn the host steps by hand (sans-IO) in the same
    session names no model: the provider is the driver's, for its turn only."""
    run = Run(None)
    sm.run_turn(
        run.session.new_turn(), model=_OwnModel("local-llama"), tools=_Tools(), context=_Context()
    )
    turn = run.session.new_turn()
    turn.start()
    turn.send(sm.Assembled(REQUEST, size=10))
    turn.send(sm.ModelReplied(reply="By hand."))
    assert [chat["name"] for chat in run.chats()] == ["chat local-llama", "chat"]


class _Interrupted(_OwnModel):
    def complete(self, action: sm.CallModel) -> sm.ModelReplied:
        raise KeyboardInterrupt


@pytest.mark.requirement("ER-251")
def test_the_provider_model_is_let_go_when_the_driver_is_interrupted() -> None:
    """A driver left by an exception (the turn cancelled, the exception re-raised) lets
    its provider go too: the cancelled call's span names it, the next turn's does not."""
    run = Run(None)
    with pytest.raises(KeyboardInterrupt):
        sm.run_turn(
            run.session.new_turn(),
            model=_Interrupted("local-llama"),
            tools=_Tools(),
            context=_Context(),
        )
    turn = run.session.new_turn()
    turn.start()
    turn.send(sm.Assembled(REQUEST, size=10))
    turn.send(sm.ModelReplied(reply="By hand."))
    chats = run.chats()
    assert [(chat["name"], chat.get("error.type")) for chat in chats] == [
        ("chat local-llama", "cancelled"),
        ("chat", None),
    ]
