"""``statemachine.otel`` by the OpenTelemetry GenAI semantic conventions (v1.41.0).

Live sessions on a hand-moved clock send the events a provider reports (a ``Usage``
on each); the spans and metrics are read from the SDK's in-memory exporter and reader,
and what a span had when it *started* from a span processor (the conventions want the
sampling attributes then). Attribute and metric names are checked against the
``opentelemetry-semantic-conventions`` package; captured content against the
conventions' JSON schemas (``tests/test_genai_schemas.json``, copied from the release).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.semconv._incubating.attributes import (
    error_attributes,
    gen_ai_attributes,
    http_attributes,
    openai_attributes,
    server_attributes,
)
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
from opentelemetry.trace import StatusCode

import statemachine as sm
from statemachine.io import _otel
from statemachine.io._otel import (
    DURATION_BUCKETS,
    TOKEN_BUCKETS,
    input_messages,
    output_messages,
    tool_definitions,
)
from statemachine.otel import Telemetry

from .helpers import ManualClock

SCHEMAS = json.loads((Path(__file__).parent / "test_genai_schemas.json").read_text("utf-8"))

OPENAI = {"provider_name": "openai", "server_address": "api.openai.com", "server_port": 443}
ANTHROPIC = {
    "provider_name": "anthropic",
    "server_address": "api.anthropic.com",
    "server_port": 443,
}


class _Started(SpanProcessor):
    """Keeps each span's attributes as they were when it started."""

    def __init__(self) -> None:
        self.attributes: dict[int, dict[str, Any]] = {}

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.attributes[span.context.span_id] = dict(span.attributes or {})


class Otel:
    """An SDK tracer and meter provider with in-memory export."""

    def __init__(self, *, sampler: Any = None) -> None:
        self.exporter = InMemorySpanExporter()
        self.started = _Started()
        self.tracer_provider = TracerProvider() if sampler is None else TracerProvider(sampler)
        self.tracer_provider.add_span_processor(self.started)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def telemetry(self, **options: Any) -> Telemetry:
        options.setdefault("clock_offset", 0.0)
        return Telemetry(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **options
        )

    def spans(self, prefix: str = "") -> list[ReadableSpan]:
        found = [s for s in self.exporter.get_finished_spans() if s.name.startswith(prefix)]
        return sorted(found, key=lambda s: s.start_time)

    def at_start(self, span: ReadableSpan) -> dict[str, Any]:
        return self.started.attributes[span.context.span_id]

    def metrics(self) -> dict[str, Any]:
        """metric name -> the metric (its unit, its data points)."""
        data = self.reader.get_metrics_data()
        assert data is not None
        return {
            metric.name: metric
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }


@pytest.fixture
def otel() -> Iterator[Otel]:
    setup = Otel()
    yield setup
    setup.tracer_provider.shutdown()
    setup.meter_provider.shutdown()


def attrs_of(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


REQUEST = {
    "model": "gpt-4o",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 256,
    "temperature": 0.2,
    "top_p": 0.9,
    "top_k": 40,
    "stop": "END",
    "frequency_penalty": 0.5,
    "presence_penalty": 0,
    "seed": 7,
    "n": 2,
    "response_format": {"type": "json_schema"},
    "service_tier": "flex",
}

REPLY_USAGE = sm.Usage(
    input_tokens=1200,
    output_tokens=85,
    cached_tokens=1024,
    cost_usd=0.004,
    model="gpt-4o-2024-08-06",
    response_id="chatcmpl-1",
    finish_reason="stop",
    cache_creation_tokens=64,
    reasoning_tokens=20,
    streamed=True,
    **OPENAI,  # type: ignore[arg-type]
)


def storm_turn(
    session: sm.Session,
    clock: ManualClock,
    *,
    request: Any = REQUEST,
    failures: int = 2,
    failed_usage: sm.Usage | None = None,
    reply: Any = None,
    usage: sm.Usage | None = REPLY_USAGE,
    calls: tuple[sm.ToolCall, ...] = (),
) -> sm.Action:
    """A turn of ``failures`` 429s and a reply, the clock moving 0.5 s per call."""
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request, 10))
    for _ in range(failures):
        clock.advance(0.5)
        error = sm.ModelError("rate_limited", "slow down", status=429, retry_after_seconds=1)
        wait = turn.send(sm.ModelFailed(error, usage=failed_usage))
        assert isinstance(wait, sm.Wait)
        clock.advance(wait.seconds)
        turn.send(sm.WaitDone())
    clock.advance(0.5)
    return turn.send(sm.ModelReplied(calls, reply=reply, usage=usage))


# -- chat spans ----------------------------------------------------------------------------


@pytest.mark.requirement("ER-152", "ER-153")
def test_a_chat_span_carries_what_its_event_said(otel: Otel) -> None:
    """The reply's span: the answered (dated) model, never the requested name, its id,
    finish reason, every token count, streamed, the provider and server; the request's
    parameters; each failed attempt its category and HTTP status."""
    clock = ManualClock()
    telemetry = otel.telemetry(provider_name="openai")
    session = sm.Session(sm.Settings(model="gpt-4o"), seed=1, clock=clock, observers=[telemetry])
    storm_turn(session, clock, failed_usage=sm.Usage(**OPENAI))  # type: ignore[arg-type]
    telemetry.end()
    *failed, replied = otel.spans("chat")
    assert replied.name == "chat gpt-4o"
    got = attrs_of(replied)
    assert {key: got[key] for key in got if not key.startswith("turnstate.")} == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "server.address": "api.openai.com",
        "server.port": 443,
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 1200,
        "gen_ai.usage.output_tokens": 85,
        "gen_ai.usage.cache_read.input_tokens": 1024,
        "gen_ai.usage.cache_creation.input_tokens": 64,
        "gen_ai.usage.reasoning.output_tokens": 20,
        "gen_ai.request.stream": True,
        "gen_ai.request.max_tokens": 256,
        "gen_ai.request.temperature": 0.2,
        "gen_ai.request.top_p": 0.9,
        "gen_ai.request.top_k": 40.0,
        "gen_ai.request.stop_sequences": ("END",),
        "gen_ai.request.frequency_penalty": 0.5,
        "gen_ai.request.presence_penalty": 0.0,
        "gen_ai.request.seed": 7,
        "gen_ai.request.choice.count": 2,
        "gen_ai.output.type": "json",
        "openai.request.service_tier": "flex",
    }
    assert replied.kind is trace.SpanKind.CLIENT
    assert len(failed) == 2
    for span in failed:
        got = attrs_of(span)
        assert (got["error.type"], got["http.response.status_code"]) == ("rate_limited", 429)
        assert span.status.status_code is StatusCode.ERROR
        assert "gen_ai.response.model" not in got
        assert got["server.address"] == "api.openai.com"


@pytest.mark.requirement("ER-152")
def test_parameters_of_the_wrong_kind_are_left_out(otel: Otel) -> None:
    """A request's parameters that are not of the conventions' type (a fractional token
    limit, a bool, text) are not recorded; a list request has none."""
    clock = ManualClock()
    telemetry = otel.telemetry()
    session = sm.Session(sm.Settings(), seed=1, clock=clock, observers=[telemetry])
    odd = {"messages": [], "max_tokens": 1.5, "temperature": True, "seed": "7", "n": 1}
    storm_turn(session, clock, request=odd, failures=0, usage=None)
    storm_turn(session, clock, request=["hi"], failures=0, usage=None)
    telemetry.end()
    for span in otel.spans("chat"):
        assert not [key for key in attrs_of(span) if key.startswith("gen_ai.request.")]
        assert "gen_ai.output.type" not in attrs_of(span)
        assert span.name == "chat"  # no model named anywhere: none invented


@pytest.mark.requirement("ER-152")
def test_the_provider_and_server_are_known_when_a_span_starts(otel: Otel) -> None:
    """The first call's span starts with the provider_name given (no server yet); its
    usage teaches the observer where calls to that model go, so the next calls' spans
    (and the next turn's) start with the provider and server the usage said, which win
    over provider_name."""
    clock = ManualClock()
    telemetry = otel.telemetry(provider_name="azure.ai.openai")
    session = sm.Session(sm.Settings(model="gpt-4o"), seed=1, clock=clock, observers=[telemetry])
    storm_turn(session, clock, failures=1, failed_usage=sm.Usage(**OPENAI))  # type: ignore[arg-type]
    storm_turn(session, clock, failures=0)
    telemetry.end()
    first, second, third = otel.spans("chat")
    assert otel.at_start(third)["server.address"] == "api.openai.com"
    # the next turn's span starts with the provider the last usage named
    agents = otel.spans("invoke_agent")
    assert [otel.at_start(a)["gen_ai.provider.name"] for a in agents] == [
        "azure.ai.openai",
        "openai",
    ]
    assert otel.at_start(first)["gen_ai.provider.name"] == "azure.ai.openai"
    assert "server.address" not in otel.at_start(first)
    assert attrs_of(first)["gen_ai.provider.name"] == "openai"  # the usage said
    start = otel.at_start(second)
    assert (start["gen_ai.provider.name"], start["server.address"], start["server.port"]) == (
        "openai",
        "api.openai.com",
        443,
    )
    assert otel.at_start(second)["gen_ai.request.model"] == "gpt-4o"


@pytest.mark.requirement("ER-152", "ER-127")
def test_every_conventions_name_emitted_is_a_known_one(otel: Otel) -> None:
    """Every gen_ai.*, server.*, error.*, http.* and openai.* attribute of a run with
    content captured is one the semantic-conventions package defines; every other is
    under turnstate.*."""
    known = {
        value
        for module in (
            gen_ai_attributes,
            server_attributes,
            error_attributes,
            http_attributes,
            openai_attributes,
        )
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str)
    }
    clock = ManualClock()
    telemetry = otel.telemetry(capture_content=True)
    session = sm.Session(
        sm.Settings(model="gpt-4o"), seed=1, clock=clock, observers=[telemetry], session_id="c"
    )
    telemetry.bind(session)
    reply = {"object": "chat.completion", "service_tier": "default", "system_fingerprint": "fp"}
    calls = (sm.ToolCall("c1", "fs", "read_file", '{"path": "a"}'),)
    storm_turn(session, clock, failed_usage=sm.Usage(**OPENAI), reply=reply, calls=calls)  # type: ignore[arg-type]
    session.current_turn.send(sm.ToolsDone((sm.ToolOutcome("c1", ok=True, content="x"),)))  # type: ignore[union-attr]
    session.end("completed")
    telemetry.end()
    seen = {key for span in otel.spans() for key in attrs_of(span)}
    assert "openai.response.system_fingerprint" in seen
    assert "gen_ai.tool.call.result" in seen
    for key in seen:
        assert key in known or key.startswith("turnstate."), key


# -- the session, the turn, the conversation ------------------------------------------------


@pytest.mark.requirement("ER-154")
def test_the_session_id_is_the_conversation_id_of_every_span(otel: Otel) -> None:
    """Bound to Session(session_id="chat-7"), every span carries
    gen_ai.conversation.id = chat-7 with no argument to Telemetry; a session_id given to
    Telemetry wins; an unbound observer of an unnamed session names none."""
    runs = {"bound": "chat-7", "explicit": "conv-1", "unbound": None}
    for how, expected in runs.items():
        otel.exporter.clear()
        clock = ManualClock()
        telemetry = otel.telemetry(session_id="conv-1" if how == "explicit" else None)
        session = sm.Session(
            sm.Settings(),
            seed=1,
            clock=clock,
            observers=[telemetry],
            session_id=None if how == "unbound" else "chat-7",
        )
        if how != "unbound":
            telemetry.bind(session)
        storm_turn(session, clock, failures=1)
        telemetry.end()
        spans = otel.spans()
        assert len(spans) == 4
        for span in spans:
            assert attrs_of(span).get("gen_ai.conversation.id") == expected, (how, span.name)


@pytest.mark.requirement("ER-154")
def test_the_workflow_and_agent_spans(otel: Otel) -> None:
    """The session is the conventions' workflow span; the turn's invoke_agent span has
    the provider, its first call's requested model, the sums of its calls' tokens (a
    billed failure's included) and its last reply's answered model and finish reason."""
    clock = ManualClock()
    telemetry = otel.telemetry(agent_name="helper")
    session = sm.Session(sm.Settings(model="gpt-4o"), seed=1, clock=clock, observers=[telemetry])
    billed = sm.Usage(input_tokens=1000, output_tokens=3, **OPENAI)  # type: ignore[arg-type]
    storm_turn(session, clock, failures=1, failed_usage=billed)
    telemetry.end()
    (workflow,) = otel.spans("invoke_workflow")
    assert workflow.name == "invoke_workflow helper"
    assert attrs_of(workflow)["gen_ai.operation.name"] == "invoke_workflow"
    assert attrs_of(workflow)["gen_ai.workflow.name"] == "helper"
    (agent,) = otel.spans("invoke_agent")
    assert agent.name == "invoke_agent helper"
    assert agent.parent is not None and agent.parent.span_id == workflow.context.span_id
    got = attrs_of(agent)
    assert {key: got[key] for key in got if key.startswith("gen_ai.")} == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "helper",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 2200,
        "gen_ai.usage.output_tokens": 88,
        "gen_ai.usage.cache_read.input_tokens": 1024,
        "gen_ai.usage.cache_creation.input_tokens": 64,
        "gen_ai.usage.reasoning.output_tokens": 20,
    }


# -- metrics -------------------------------------------------------------------------------


@pytest.mark.requirement("ER-155")
def test_the_client_metrics_by_the_conventions(otel: Otel) -> None:
    """gen_ai.client.operation.duration per attempt and gen_ai.client.token.usage per
    count, with the advised buckets, the conventions' units and attributes (a failed
    attempt's error.type; no model name invented for a call that named none); the
    cost counter in {USD}."""
    clock = ManualClock()
    telemetry = otel.telemetry()
    session = sm.Session(sm.Settings(model="gpt-4o"), seed=1, clock=clock, observers=[telemetry])
    storm_turn(session, clock, failures=1, failed_usage=sm.Usage(**OPENAI))  # type: ignore[arg-type]
    unnamed = sm.Session(sm.Settings(), seed=1, clock=clock, observers=[otel.telemetry()])
    storm_turn(
        unnamed, clock, request=["hi"], failures=0, usage=sm.Usage(input_tokens=5, output_tokens=1)
    )
    telemetry.end()
    found = otel.metrics()
    duration = found[gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION]
    tokens = found[gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE]
    assert (duration.unit, tokens.unit) == ("s", "{token}")
    assert found["turnstate.cost"].unit == "{USD}"
    points = {frozenset(p.attributes.items()): p for p in duration.data.data_points}
    openai = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
        "server.address": "api.openai.com",
        "server.port": 443,
    }
    failed = points[frozenset({**openai, "error.type": "rate_limited"}.items())]
    replied = points[frozenset({**openai, "gen_ai.response.model": "gpt-4o-2024-08-06"}.items())]
    bare = points[frozenset({"gen_ai.operation.name": "chat"}.items())]
    assert (failed.count, replied.count, bare.count) == (1, 1, 1)
    assert replied.sum == pytest.approx(0.5)
    for point in points.values():
        assert tuple(point.explicit_bounds) == DURATION_BUCKETS
    counted = {
        (dict(p.attributes).get("gen_ai.request.model"), dict(p.attributes)["gen_ai.token.type"]): (
            p.sum,
            tuple(p.explicit_bounds),
        )
        for p in tokens.data.data_points
    }
    assert counted == {
        ("gpt-4o", "input"): (1200, TOKEN_BUCKETS),
        ("gpt-4o", "output"): (85, TOKEN_BUCKETS),
        (None, "input"): (5, TOKEN_BUCKETS),
        (None, "output"): (1, TOKEN_BUCKETS),
    }
    for metric in found.values():
        for point in metric.data.data_points:
            assert "default" not in dict(point.attributes).values()


# -- content ------------------------------------------------------------------------------

OPENAI_CHAT = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "name": "ann",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "look", "arguments": '{"at": "a.png"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a cat"},
    ],
    "tools": [{"type": "function", "function": {"name": "look", "parameters": {}}}],
}
OPENAI_CHAT_MESSAGES = [
    {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
    {
        "role": "user",
        "parts": [
            {"type": "text", "content": "What is this?"},
            {"type": "uri", "modality": "image", "uri": "https://x.test/a.png"},
            {"type": "blob", "modality": "audio", "content": "UklG", "mime_type": "audio/wav"},
        ],
        "name": "ann",
    },
    {
        "role": "assistant",
        "parts": [
            {"type": "tool_call", "id": "call_1", "name": "look", "arguments": {"at": "a.png"}}
        ],
    },
    {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "call_1", "response": "a cat"}],
    },
]

ANTHROPIC_MESSAGES = {
    "model": "claude-sonnet-4-5",
    "system": [{"type": "text", "text": "Be brief."}],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                },
                {"type": "document", "source": {"type": "url", "url": "https://x.test/a.pdf"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "a picture", "signature": "s"},
                {"type": "tool_use", "id": "toolu_1", "name": "look", "input": {"at": "a.png"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a cat"}],
        },
        {"role": "user", "content": [{"type": "redacted_thinking", "data": "xyz"}]},
    ],
    "tools": [{"name": "look", "description": "Look", "input_schema": {"type": "object"}}],
}
ANTHROPIC_MESSAGES_CONVERTED = [
    {
        "role": "user",
        "parts": [
            {"type": "text", "content": "What is this?"},
            {"type": "blob", "modality": "image", "content": "iVBO", "mime_type": "image/png"},
            {"type": "uri", "modality": "document", "uri": "https://x.test/a.pdf"},
        ],
    },
    {
        "role": "assistant",
        "parts": [
            {"type": "reasoning", "content": "a picture"},
            {"type": "tool_call", "id": "toolu_1", "name": "look", "arguments": {"at": "a.png"}},
        ],
    },
    {
        "role": "user",
        "parts": [{"type": "tool_call_response", "id": "toolu_1", "response": "a cat"}],
    },
    {"role": "user", "parts": [{"data": "xyz", "type": "redacted_thinking"}]},
]

OPENAI_RESPONSES = {
    "model": "gpt-4o",
    "instructions": "Be brief.",
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "What is this?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "look", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"seen": "a cat"}'},
    ],
}
OPENAI_RESPONSES_CONVERTED = [
    {"role": "user", "parts": [{"type": "text", "content": "What is this?"}]},
    {
        "role": "assistant",
        "parts": [{"type": "tool_call", "id": "call_1", "name": "look", "arguments": {}}],
    },
    {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "call_1", "response": {"seen": "a cat"}}],
    },
]


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


INPUTS = [
    pytest.param(OPENAI_CHAT, OPENAI_CHAT_MESSAGES, None, id="openai-chat"),
    pytest.param(
        ANTHROPIC_MESSAGES,
        ANTHROPIC_MESSAGES_CONVERTED,
        [{"type": "text", "content": "Be brief."}],
        id="anthropic-messages",
    ),
    pytest.param(
        OPENAI_RESPONSES,
        OPENAI_RESPONSES_CONVERTED,
        [{"type": "text", "content": "Be brief."}],
        id="openai-responses",
    ),
    pytest.param(
        "plain question",
        [{"role": "user", "parts": [{"type": "text", "content": "plain question"}]}],
        None,
        id="a-string",
    ),
    pytest.param(
        ["one", {"role": "user", "content": "two"}],
        [
            {"role": "user", "parts": [{"type": "text", "content": "one"}]},
            {"role": "user", "parts": [{"type": "text", "content": "two"}]},
        ],
        None,
        id="a-list",
    ),
    pytest.param(
        {"prompt": "complete me"},
        [{"role": "user", "parts": [{"type": "text", "content": "complete me"}]}],
        None,
        id="a-completion-prompt",
    ),
    pytest.param(
        {"query": "no messages here", "k": 3},
        [
            {
                "role": "user",
                "parts": [{"type": "text", "content": '{"query": "no messages here", "k": 3}'}],
            }
        ],
        None,
        id="another-mapping",
    ),
    pytest.param(
        [{"role": 5, "content": {"nested": [1, 2]}}, 42, {"role": "user", "content": [7, None]}],
        [
            {"role": "user", "parts": [{"type": "text", "content": '{"nested": [1, 2]}'}]},
            {"role": "user", "parts": [{"type": "text", "content": "42"}]},
            {
                "role": "user",
                "parts": [{"type": "text", "content": "7"}, {"type": "text", "content": "null"}],
            },
        ],
        None,
        id="odd-values",
    ),
]


@pytest.mark.requirement("ER-156")
@pytest.mark.parametrize(("request_", "messages", "system"), INPUTS)
def test_a_request_of_each_shape_becomes_the_conventions_messages(
    request_: Any, messages: list[Any], system: Any
) -> None:
    """OpenAI chat and responses requests, Anthropic messages, a string, a list and a
    completion prompt convert part by part; another mapping or odd values become text
    parts; every result validates against the conventions' schemas."""
    got, instructions = input_messages(request_)
    assert got == messages
    assert instructions == system
    jsonschema.validate(got, SCHEMAS["input_messages"])
    if instructions is not None:
        jsonschema.validate(instructions, SCHEMAS["system_instructions"])


@pytest.mark.requirement("ER-156")
def test_content_that_cannot_be_converted_falls_back_and_never_raises() -> None:
    """What the engine never holds but a replayed record or a host's object might (a
    value whose text raises, an SDK object whose dump raises) still gives content in
    the conventions' form: converting never raises."""
    found: dict[str, Any] = {}
    _otel._content_attributes(found, {"messages": [{"role": "user", "content": _Unprintable()}]})
    got = json.loads(found["gen_ai.input.messages"])
    jsonschema.validate(got, SCHEMAS["input_messages"])
    assert got == [{"role": "user", "parts": [{"type": "text", "content": "<_Unprintable>"}]}]

    class Broken:
        def model_dump(self, mode: str = "python") -> Any:
            raise RuntimeError("not dumpable")

        def __str__(self) -> str:
            return "a broken reply"

    # the engine refuses such a reply at its door (ModelReplied dumps it): given here
    out = output_messages(Broken(), (), "end_turn")
    jsonschema.validate(out, SCHEMAS["output_messages"])
    assert out == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "a broken reply"}],
            "finish_reason": "stop",
        }
    ]


class _SdkObject:
    """An SDK reply object the host kept as it came (it has ``model_dump``)."""

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": [{"type": "text", "text": "hello"}],
            "stop_reason": "max_tokens",
        }


OUTPUTS = [
    pytest.param(
        {
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "Looking.",
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "look", "arguments": '{"at": 1}'},
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                },
                {
                    "index": 1,
                    "message": {"role": "assistant", "content": None, "refusal": "No."},
                    "finish_reason": "content_filter",
                },
            ],
        },
        (),
        [
            {
                "role": "assistant",
                "parts": [
                    {"type": "text", "content": "Looking."},
                    {"type": "tool_call", "id": "call_1", "name": "look", "arguments": {"at": 1}},
                ],
                "finish_reason": "tool_call",
            },
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": "No."}],
                "finish_reason": "content_filter",
            },
        ],
        id="openai-choices",
    ),
    pytest.param(
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "look", "input": {"at": 1}},
            ],
            "stop_reason": "tool_use",
        },
        (),
        [
            {
                "role": "assistant",
                "parts": [
                    {"type": "text", "content": "Looking."},
                    {"type": "tool_call", "id": "toolu_1", "name": "look", "arguments": {"at": 1}},
                ],
                "finish_reason": "tool_call",
            }
        ],
        id="anthropic-message",
    ),
    pytest.param(
        "just text",
        (),
        [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": "just text"}],
                "finish_reason": "stop",
            }
        ],
        id="a-string",
    ),
    pytest.param(
        None,
        (sm.ToolCall("c1", "fs", "read_file", {"path": "a"}),),
        [
            {
                "role": "assistant",
                "parts": [
                    {
                        "type": "tool_call",
                        "id": "c1",
                        "name": "read_file",
                        "arguments": {"path": "a"},
                    }
                ],
                "finish_reason": "tool_call",
            }
        ],
        id="no-reply-a-tool-call",
    ),
    pytest.param(
        _SdkObject(),
        (),
        [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": "hello"}],
                "finish_reason": "length",
            }
        ],
        id="an-sdk-object",
    ),
]


@pytest.mark.requirement("ER-156")
@pytest.mark.parametrize(("reply", "calls", "expected"), OUTPUTS)
def test_a_reply_of_each_shape_becomes_the_conventions_output_messages(
    reply: Any, calls: tuple[sm.ToolCall, ...], expected: list[Any]
) -> None:
    """An OpenAI completion (one message per choice), an Anthropic message, a string, a
    reply of tool calls alone and an SDK object convert with the schema's finish
    reasons; each validates against the output messages schema."""
    event = sm.ModelReplied(calls, reply=reply)  # what the engine keeps of the reply
    got = output_messages(event.reply, event.tool_calls)
    assert got == expected
    jsonschema.validate(got, SCHEMAS["output_messages"])


@pytest.mark.requirement("ER-156")
def test_tool_definitions_are_type_and_name() -> None:
    """OpenAI chat, OpenAI responses and Anthropic tool lists give type and name only
    (the conventions advise against the large optional fields); nameless ones drop."""
    tools = [
        {"type": "function", "function": {"name": "a", "parameters": {}}},
        {"type": "function", "name": "b", "parameters": {}},
        {"name": "c", "input_schema": {}},
        {"type": "web_search_20250305", "name": "web_search"},
        {"type": "function"},
        "junk",
    ]
    got = tool_definitions(tools)
    assert got == [
        {"type": "function", "name": "a"},
        {"type": "function", "name": "b"},
        {"type": "function", "name": "c"},
        {"type": "web_search_20250305", "name": "web_search"},
    ]
    jsonschema.validate(got, SCHEMAS["tool_definitions"])
    assert tool_definitions("nope") == []


@pytest.mark.requirement("ER-156", "ER-126")
def test_captured_content_on_the_spans(otel: Otel) -> None:
    """With capture_content: the chat spans carry the structured input (and the reply's
    span its output), the turn span its first request and last reply, the tool span
    its arguments decoded from JSON text and, for a success, its result; a failed
    tool's content is its error message, not a result."""
    clock = ManualClock()
    telemetry = otel.telemetry(capture_content=True)
    session = sm.Session(sm.Settings(), seed=1, clock=clock, observers=[telemetry])
    calls = (
        sm.ToolCall("c1", "fs", "read_file", '{"path": "a.md"}'),
        sm.ToolCall("c2", "fs", "delete", {"path": "b.md"}),
    )
    storm_turn(session, clock, request=ANTHROPIC_MESSAGES, failures=1, reply="ok", calls=calls)
    turn = session.current_turn
    assert turn is not None
    turn.send(
        sm.ToolsDone(
            (
                sm.ToolOutcome("c1", ok=True, content='{"text": "milk"}'),
                sm.ToolOutcome("c2", ok=False, content="denied", category="permission_denied"),
            )
        )
    )
    telemetry.end()
    for chat in otel.spans("chat"):
        got = attrs_of(chat)
        assert json.loads(str(got["gen_ai.input.messages"])) == ANTHROPIC_MESSAGES_CONVERTED
        assert json.loads(str(got["gen_ai.system_instructions"])) == [
            {"type": "text", "content": "Be brief."}
        ]
        assert json.loads(str(got["gen_ai.tool.definitions"])) == [
            {"type": "function", "name": "look"}
        ]
    failed, replied = otel.spans("chat")
    assert "gen_ai.output.messages" not in attrs_of(failed)
    assert attrs_of(failed)["turnstate.error.message"] == "slow down"
    output = json.loads(str(attrs_of(replied)["gen_ai.output.messages"]))
    jsonschema.validate(output, SCHEMAS["output_messages"])
    assert output[0]["finish_reason"] == "stop"  # the usage said so
    (agent,) = otel.spans("invoke_agent")
    assert json.loads(str(attrs_of(agent)["gen_ai.input.messages"])) == ANTHROPIC_MESSAGES_CONVERTED
    assert json.loads(str(attrs_of(agent)["gen_ai.output.messages"])) == output
    tools = {s.name: attrs_of(s) for s in otel.spans("execute_tool")}
    read, delete = tools["execute_tool read_file"], tools["execute_tool delete"]
    assert json.loads(str(read["gen_ai.tool.call.arguments"])) == {"path": "a.md"}
    assert json.loads(str(read["gen_ai.tool.call.result"])) == {"text": "milk"}
    assert "gen_ai.tool.call.result" not in delete
    assert delete["turnstate.error.message"] == "denied"
    assert delete["error.type"] == "permission_denied"


# -- the no-op path --------------------------------------------------------------------------


def _explode(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("the no-op observer built telemetry")


@pytest.mark.requirement("ER-157", "ER-127")
def test_with_nothing_recording_the_observer_stops_at_the_first_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No-op tracer and meter providers: the observer is off from the start and builds
    nothing (no turn span, no attributes); the session runs as without it."""
    telemetry = Telemetry(
        tracer_provider=trace.NoOpTracerProvider(), meter_provider=metrics.NoOpMeterProvider()
    )
    assert telemetry._off  # known when it is made: no record has to be looked at
    clock = ManualClock()
    session = sm.Session(sm.Settings(), seed=1, clock=clock, observers=[telemetry])
    telemetry.bind(session)
    monkeypatch.setattr(Telemetry, "_open_turn", _explode)
    monkeypatch.setattr(Telemetry, "_close_pending", _explode)
    monkeypatch.setattr(_otel, "_usage_attributes", _explode)
    action = storm_turn(session, clock, failed_usage=sm.Usage(**OPENAI))  # type: ignore[arg-type]
    assert isinstance(action, sm.Finish)
    assert action.status is sm.TurnStatus.COMPLETED
    telemetry.end()


@pytest.mark.requirement("ER-157")
def test_the_global_providers_unset_are_no_ops_and_set_later_record() -> None:
    """In a fresh process with no SDK configured, a Telemetry on the global providers
    stops at the first record; once the host sets an SDK tracer provider, a new
    session's Telemetry records its spans."""
    code = (
        "import statemachine as sm\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "from statemachine.otel import Telemetry\n"
        "def run():\n"
        "    t = Telemetry(clock_offset=0.0)\n"
        "    s = sm.Session(sm.Settings(), seed=1, clock=lambda: 1.0, observers=[t])\n"
        "    turn = s.new_turn(); turn.start(); turn.send(sm.Assembled('q', 1))\n"
        "    turn.send(sm.ModelReplied()); t.end()\n"
        "    return t\n"
        "assert run()._off\n"
        "exporter = InMemorySpanExporter(); provider = TracerProvider()\n"
        "provider.add_span_processor(SimpleSpanProcessor(exporter))\n"
        "trace.set_tracer_provider(provider)\n"
        "assert not run()._off\n"
        "names = sorted(s.name for s in exporter.get_finished_spans())\n"
        "assert names == ['chat', 'invoke_agent turnstate', 'invoke_workflow turnstate'], names\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.requirement("ER-157")
def test_one_signal_recording_is_enough_and_complete() -> None:
    """Spans sampled out but an SDK meter: every metric is recorded; an SDK tracer but a
    no-op meter: every span is recorded."""
    sampled_out = Otel(sampler=ALWAYS_OFF)
    clock = ManualClock()
    telemetry = sampled_out.telemetry()
    session = sm.Session(sm.Settings(model="m"), seed=1, clock=clock, observers=[telemetry])
    storm_turn(session, clock, failures=2)
    telemetry.end()
    assert sampled_out.spans() == []
    durations = sampled_out.metrics()["gen_ai.client.operation.duration"]
    assert sum(p.count for p in durations.data.data_points) == 3

    spans_only = Otel()
    telemetry = Telemetry(
        tracer_provider=spans_only.tracer_provider,
        meter_provider=metrics.NoOpMeterProvider(),
        clock_offset=0.0,
    )
    session = sm.Session(sm.Settings(model="m"), seed=1, clock=clock, observers=[telemetry])
    storm_turn(session, clock, failures=2)
    telemetry.end()
    assert [s.name for s in spans_only.spans()].count("chat m") == 3


@pytest.mark.requirement("ER-157")
def test_instruments_are_made_once_per_meter_provider(otel: Otel) -> None:
    """A hundred Telemetry of one meter provider share one set of instruments (a proxy
    meter keeps every instrument made on it: one set per session would grow forever)."""
    made = {id(otel.telemetry()._m) for _ in range(100)}
    assert len(made) == 1
    assert otel.telemetry()._m is not Otel().telemetry()._m
