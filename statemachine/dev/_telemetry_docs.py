"""Scenario runs as telemetry, and the generated pages that show it.

:func:`scenario_telemetry` plays a scenario (built-in or loaded) through the
simulator and feeds every transition to a :class:`~statemachine.otel.Telemetry`, with
the session's limit and status as the simulator saw them; :func:`span_tree` prints
finished spans as an indented tree. :func:`documents` builds ``docs/telemetry.md``
(a real run's span tree) and ``docs/incident.md`` with ``docs/incident.svg`` (a
drawn turn); ``python -m statemachine.dev._telemetry_docs`` writes them and a test
regenerates them and compares, as for the diagrams.

The span tree needs ``opentelemetry-sdk`` (a dev dependency), imported here only.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..core._taxonomy import ErrorCategory, SessionStatus, ToolErrorCategory, TurnStatus
from ..io._otel import (
    DURATION_BUCKETS,
    SCHEMA_URL,
    SEMCONV_VERSION,
    TOKEN_BUCKETS,
    Telemetry,
    _content_attributes,
    output_messages,
)
from ._scenarios import Scenario, builtin
from ._simulate import EPOCH, StepRecord, run, step_json

SPAN_TREE_SCENARIO = "docs/telemetry-demo.toml"
"""The run whose span tree the telemetry page and the README show (a scenario file:
its model and tool calls take time)."""
BREAKER_SCENARIO = "plugin-crash-breaker"
"""The run whose session events the telemetry page shows."""
INCIDENT_SCENARIO = "rate-limit-storm"
INCIDENT_TURN = 2
"""The turn the incident page draws."""

BLOCK_START = "<!-- otel-span-tree -->"
BLOCK_END = "<!-- /otel-span-tree -->"


def _scenario(scenario: Scenario | str) -> Scenario:
    """``scenario``, a built-in's name, or a scenario file of the repository (``.toml``)."""
    if not isinstance(scenario, str):
        return scenario
    if scenario.endswith(".toml"):
        from ._scenarios import load  # noqa: PLC0415

        return load(Path(__file__).resolve().parents[2] / scenario)
    return builtin(scenario)


def _play(scenario: Scenario | str) -> tuple[list[StepRecord], Any]:
    """Every transition of a play of ``scenario``, and its result."""
    steps: list[StepRecord] = []
    result = run(_scenario(scenario), on_step=steps.append)
    return steps, result


def scenario_steps(scenario: Scenario | str) -> list[StepRecord]:
    """Every transition of a play of ``scenario`` (a built-in's name or a scenario)."""
    return _play(scenario)[0]


def scenario_telemetry(
    scenario: Scenario | str, telemetry: Telemetry, *, session_status: str | None = None
) -> list[StepRecord]:
    """Play ``scenario`` and feed ``telemetry`` each transition, then end its session
    (with the run's session status, or ``session_status``). Returns the steps."""
    steps, result = _play(scenario)
    for step in steps:
        telemetry.observe(step.record, limit=step.limit, session_status=step.session_status)
    telemetry.end(session_status or result.session_status)
    return steps


def _seconds(ns: int, origin: int) -> str:
    return f"{(ns - origin) / 1e9:7.3f}"


def span_tree(spans: Sequence[Any], *, attributes: Iterable[str] = ()) -> str:
    """Finished SDK spans as an indented tree, children in start order: name, start
    and end (seconds from the root's start), ``error.type`` and the chosen
    ``attributes``, and each span's events under it."""
    shown = ("error.type", *attributes)
    by_parent: dict[int | None, list[Any]] = {}
    ids = {span.context.span_id for span in spans}
    order = {span.context.span_id: i for i, span in enumerate(spans)}
    for span in spans:
        parent = span.parent.span_id if span.parent is not None else None
        by_parent.setdefault(parent if parent in ids else None, []).append(span)

    def key(span: Any) -> tuple[int, int, int]:  # ties: the trace step that began them
        step = (span.attributes or {}).get("turnstate.step", -1)
        return (span.start_time, step, order[span.context.span_id])

    for children in by_parent.values():
        children.sort(key=key)
    roots = by_parent.get(None, [])
    origin = min((s.start_time for s in roots), default=0)
    lines: list[str] = []

    def walk(span: Any, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        attrs = span.attributes or {}
        notes = [f"{key}={attrs[key]}" for key in shown if key in attrs]
        when = f"[{_seconds(span.start_time, origin)} → {_seconds(span.end_time, origin)} s]"
        lines.append(f"{prefix}{branch}{span.name}  {when}  {' '.join(notes)}".rstrip())
        inner = prefix + ("" if top else ("   " if last else "│  "))
        children = by_parent.get(span.context.span_id, [])
        for event in span.events:
            bar = "│  " if children else "   "
            event_attrs = " ".join(f"{k}={_short(v)}" for k, v in (event.attributes or {}).items())
            lines.append(
                f"{inner}{bar}· {_seconds(event.timestamp, origin).strip()} s "
                f"{event.name} {event_attrs}".rstrip()
            )
        for i, child in enumerate(children):
            walk(child, inner, i == len(children) - 1, False)

    for root in roots:
        walk(root, "", True, True)
    return "\n".join(lines) + "\n"


def _short(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, tuple | list):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


_TREE_ATTRIBUTES = (
    "turnstate.turn.index",
    "gen_ai.request.model",
    "http.response.status_code",
    "turnstate.turn.status",
    "turnstate.session.status",
)


def _in_memory() -> tuple[Any, Any]:
    """An SDK tracer provider exporting to memory, and its exporter."""
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415 - dev dependency
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: PLC0415
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: PLC0415
        InMemorySpanExporter,
    )

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def run_span_tree(scenario: str | Scenario) -> str:
    """The span tree of a scenario's run (a scenario, a built-in's name or a file of
    the repository), on the SDK's in-memory exporter: what ``simulate --spans`` prints."""
    provider, exporter = _in_memory()
    telemetry = Telemetry(tracer_provider=provider, clock_offset=EPOCH, provider_name="demo")
    scenario_telemetry(scenario, telemetry)
    provider.shutdown()
    return span_tree(exporter.get_finished_spans(), attributes=_TREE_ATTRIBUTES)


DEMO_REQUEST = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "You answer in one line."},
        {"role": "user", "content": "What is in notes.md?"},
    ],
    "max_tokens": 256,
    "temperature": 0.2,
}
"""The request of the provider demo (an OpenAI chat completion's create arguments)."""


def _provider_events() -> list[Any]:
    """The events an ``OpenAIModel`` reports for a 429 and then a reply (what
    tests/test_otel_provider.py gets from the real SDK against a loopback server)."""
    import statemachine as sm  # noqa: PLC0415

    where = {"provider_name": "openai", "server_address": "api.openai.com", "server_port": 443}
    reply = {
        "object": "chat.completion",
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "model": "gpt-4o-2024-08-06",
        "system_fingerprint": "fp_f33640a400",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "A shopping list."},
                "finish_reason": "stop",
            }
        ],
    }
    usage = sm.Usage(
        input_tokens=1200,
        output_tokens=85,
        cached_tokens=1024,
        model="gpt-4o-2024-08-06",
        response_id="chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        finish_reason="stop",
        **where,  # type: ignore[arg-type]
    )
    rate_limited = sm.ModelError("rate_limited", "Rate limit reached", status=429)
    return [
        sm.ModelFailed(rate_limited, usage=sm.Usage(**where)),  # type: ignore[arg-type]
        sm.ModelReplied(cost=0.00428, reply=reply, usage=usage),
    ]


def provider_demo_spans(*, capture_content: bool = False) -> list[Any]:
    """The finished spans of one turn whose model calls an OpenAI provider answered: a
    429, then a reply (on a clock that moves by hand)."""
    import statemachine as sm  # noqa: PLC0415

    provider, exporter = _in_memory()
    now = [0.0]
    telemetry = Telemetry(
        tracer_provider=provider, clock_offset=EPOCH, capture_content=capture_content
    )
    session = sm.Session(
        sm.Settings(model="gpt-4o"),
        seed=0,
        clock=lambda: now[0],
        observers=[telemetry],
        session_id="chat-42",
    )
    telemetry.bind(session)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(DEMO_REQUEST, 1200))
    for event in _provider_events():
        now[0] += 0.4
        action = turn.send(event)
        if isinstance(action, sm.Wait):
            now[0] += action.seconds
            turn.send(sm.WaitDone())
    session.end("completed")
    telemetry.end()
    provider.shutdown()
    return list(exporter.get_finished_spans())


def _attribute_lines(span: Any) -> str:
    """A span's attributes, one per line, sorted by name."""
    attrs = span.attributes or {}

    def shown(value: object) -> str:
        if isinstance(value, tuple | list):
            return json.dumps(list(value))
        return json.dumps(value) if isinstance(value, str) else repr(value)

    return "".join(f"{key} = {shown(attrs[key])}\n" for key in sorted(attrs))


def span_tree_block() -> str:
    """The marked README block: a real run's span tree, as a text code block."""
    tree = run_span_tree(SPAN_TREE_SCENARIO)
    return (
        f"{BLOCK_START}\n"
        f"`python -m statemachine simulate --spans {SPAN_TREE_SCENARIO}` prints the spans "
        "a `Telemetry` observer makes of that scenario (529s on the primary model, a "
        "fallback that answers with a tool call), times on the virtual clock (it needs "
        "`opentelemetry-sdk`, in the `dev` extra):\n\n"
        f"```text\n{tree}```\n{BLOCK_END}"
    )


def scenario_trace_lines(scenario: str) -> list[str]:
    """``simulate --json``'s lines for a built-in scenario."""
    from ._simulate import result_json  # noqa: PLC0415

    steps, result = _play(builtin(scenario))
    lines = [json.dumps(step_json(step), sort_keys=True) for step in steps]
    return [*lines, json.dumps(result_json(result), sort_keys=True)]


def documents() -> dict[str, str]:
    """Every generated page and artefact, by path relative to the repository."""
    from ..io._trace_file import read_trace  # noqa: PLC0415
    from ._trace_draw import draw  # noqa: PLC0415

    trace = read_trace(scenario_trace_lines(INCIDENT_SCENARIO), f"{INCIDENT_SCENARIO}.jsonl")
    drawing = draw(trace, turn=INCIDENT_TURN)
    return {
        "docs/telemetry.md": _telemetry_page(),
        "docs/incident.md": _incident_page(drawing.mermaid, drawing.steps_text),
        "docs/incident.dot": drawing.dot,
        "docs/incident-timeline.svg": drawing.timeline,
    }


USAGE = (
    "import statemachine as sm\n"
    "from statemachine.otel import Telemetry\n\n"
    "telemetry = Telemetry()\n"
    'session = sm.Session(sm.Settings(), observers=[telemetry], session_id="chat-42")\n'
    "telemetry.bind(session)  # its id, limits and status, as they happen\n"
    "# ... run the session's turns: each becomes a span tree ...\n"
    "telemetry.end()  # after the last turn (a limit ends it by itself)\n"
)
"""How a host attaches the observer (runs as written: tests/test_docs.py)."""


EXPORT_CONSOLE = (
    "from opentelemetry import trace\n"
    "from opentelemetry.sdk.trace import TracerProvider\n"
    "from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor\n\n"
    "tracer_provider = TracerProvider()\n"
    "tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))\n"
    "trace.set_tracer_provider(tracer_provider)  # before the first Telemetry is made\n"
)
"""An exporter set-up: spans printed as JSON as they end (run: tests/test_otel_docs.py)."""

EXPORT_OTLP = (
    "from opentelemetry import metrics, trace\n"
    "from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter\n"
    "from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter\n"
    "from opentelemetry.sdk.metrics import MeterProvider\n"
    "from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader\n"
    "from opentelemetry.sdk.resources import Resource\n"
    "from opentelemetry.sdk.trace import TracerProvider\n"
    "from opentelemetry.sdk.trace.export import BatchSpanProcessor\n\n"
    "# the collector: OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318)\n"
    'resource = Resource.create({"service.name": "weather-agent"})\n'
    "tracer_provider = TracerProvider(resource=resource)\n"
    "tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))\n"
    "trace.set_tracer_provider(tracer_provider)  # before the first Telemetry is made\n"
    "reader = PeriodicExportingMetricReader(OTLPMetricExporter())\n"
    "metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[reader]))\n"
)
"""An exporter set-up: spans and metrics over OTLP/HTTP (run: tests/test_otel_docs.py)."""

EXPORT_TURN = (
    "import anthropic\n\n"
    "import statemachine as sm\n"
    "from statemachine.otel import Telemetry\n"
    "from statemachine.providers import AnthropicModel\n\n"
    'WEATHER = {"name": "get_weather", "description": "The weather in a city",\n'
    '           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}\n'
    'QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]\n\n\n'
    "class Context:\n"
    "    def assemble(self, action):\n"
    '        return sm.Assembled({"messages": QUESTION, "tools": [WEATHER]}, size=40)\n\n\n'
    "class Tools:\n"
    "    def invoke(self, call):\n"
    '        return sm.ToolOutcome(call.id, ok=True, content="Paris: sunny, 21 \u00b0C")\n\n\n'
    "telemetry = Telemetry()  # the global providers set above\n"
    'session = sm.Session(sm.Settings(), observers=[telemetry], session_id="chat-42")\n'
    "telemetry.bind(session)\n"
    "with anthropic.Anthropic(max_retries=0) as client:\n"
    '    model = AnthropicModel(client, model="claude-sonnet-4-5")  # names the chat spans\n'
    "    sm.run_turn(session.new_turn(), model=model, tools=Tools(), context=Context())\n"
    "telemetry.end()\n"
    "tracer_provider.shutdown()  # a script: export the spans still buffered before it exits\n"
)
"""The turn either set-up exports (against the loopback vendor in tests/test_otel_docs.py)."""

NOT_RUN = "<!-- not-run -->"
"""Marks a page block tests/test_docs.py only compiles: these need a vendor, and set
the process's global providers (tests/test_otel_docs.py runs them apart)."""


def _export_section() -> str:
    return (
        "## Exporting: the console, OTLP\n\n"
        "The observer uses the OpenTelemetry API only; the application chooses the SDK and "
        "the exporters (`pip install opentelemetry-sdk` for the console, and "
        "`opentelemetry-exporter-otlp-proto-http` for OTLP; the `dev` extra has both) and "
        "sets them up once, at start-up, before it makes its first `Telemetry`. Without "
        "them every span and metric is a no-op that costs one attribute read per record. "
        "Each span printed to standard output, as JSON, when it ends:\n\n"
        f"{NOT_RUN}\n```python\n{EXPORT_CONSOLE}```\n\n"
        "or spans and metrics sent to an OpenTelemetry collector (or any backend that "
        "takes OTLP over HTTP, on port 4318: Jaeger, Grafana Tempo, Phoenix...), in "
        "batches:\n\n"
        f"{NOT_RUN}\n```python\n{EXPORT_OTLP}```\n\n"
        "Then every session's `Telemetry()` records through them. One turn after either "
        "set-up: offline, it runs against the loopback vendor as the README's example does "
        "(`python -m statemachine vendor` in another shell, then `export "
        "ANTHROPIC_BASE_URL=http://127.0.0.1:8765 ANTHROPIC_API_KEY=loopback`). The model "
        "given to the provider names the chat spans (`chat claude-sonnet-4-5`): a chat "
        "span's `gen_ai.request.model` is `CallModel.model` (the settings' model, a "
        "fallback), else the request's `model`, else the `model` of the provider "
        "`run_turn` or `arun_turn` calls, which a provider of your own may have too (a "
        "non-empty `str`).\n\n"
        f"{NOT_RUN}\n```python\n{EXPORT_TURN}```\n\n"
        "The Anthropic SDK (2.x) traces its API calls itself once a tracer provider is "
        "set: an `anthropic.messages.create` span per call, in a trace of its own (the "
        "engine's chat span is not the current span while the provider runs); "
        "`anthropic.Anthropic(..., open_telemetry=False)` or "
        "`ANTHROPIC_OPEN_TELEMETRY=false` turns it off. "
        "The set-ups make global providers; to keep a session's telemetry apart, pass "
        "them instead: `Telemetry(tracer_provider=..., meter_provider=...)`. A batch "
        "exporter sends every few seconds: a service that runs on needs nothing more, a "
        "script calls `tracer_provider.shutdown()` (or `force_flush()`) before it exits, "
        "as above (the SDK does it at exit too, and for the meter provider; "
        "tests/test_otel_docs.py runs both set-ups with this turn, the OTLP one against "
        "a receiver that decodes what arrives).\n\n"
    )


def _values(enum: Any, *aside: str) -> str:
    return ", ".join(f"`{member.value}`" for member in enum if member.value not in aside)


_SPANS = (
    "| span | kind | attributes of the conventions | `turnstate.*` attributes and events |\n"
    "|---|---|---|---|\n"
    "| `invoke_workflow {agent}` (the session) | internal | `gen_ai.operation.name`="
    "`invoke_workflow`, `gen_ai.workflow.name` (the agent's name), "
    "`gen_ai.conversation.id`, `error.type` (the session's status, unless `completed` or "
    "`cancelled`) | `turnstate.session.status`; events `turnstate.breaker_open`, "
    "`turnstate.limit`, `turnstate.session_end` |\n"
    "| `invoke_agent {agent}` (one per turn) | internal | `gen_ai.operation.name`="
    "`invoke_agent`, `gen_ai.agent.name`, `gen_ai.provider.name`, "
    "`gen_ai.conversation.id`, `gen_ai.request.model` (the turn's first call's), "
    "`gen_ai.response.model` and `gen_ai.response.finish_reasons` (its last reply's), "
    "`gen_ai.usage.*` (the sums over its calls), `error.type` (the turn's status, unless "
    "`completed`) | `turnstate.turn.index`, `turnstate.turn.status`, "
    "`turnstate.turn.final_answer`, `turnstate.cost_usd`, `turnstate.session_retries`; "
    "events `turnstate.wait` (seconds, `error.type`, attempt, "
    "`turnstate.retry_after_s`: the retry-after honoured), `turnstate.fallback` (from, "
    "to, `error.type`), `turnstate.context_reduction` |\n"
    "| `chat {model}` (one per model call attempt) | client | `gen_ai.operation.name`="
    "`chat`, `gen_ai.provider.name`, `server.address`, `server.port`, "
    "`gen_ai.request.model`, `gen_ai.conversation.id`, `gen_ai.response.model` (the name "
    "the server answered with), `gen_ai.response.id`, `gen_ai.response.finish_reasons`, "
    "`gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`, "
    "`gen_ai.usage.cache_read.input_tokens`, `gen_ai.usage.cache_creation.input_tokens`, "
    "`gen_ai.usage.reasoning.output_tokens`, `gen_ai.request.stream`, the request's "
    "`gen_ai.request.max_tokens`, `temperature`, `top_p`, `top_k`, `stop_sequences`, "
    "`frequency_penalty`, `presence_penalty`, `seed`, `choice.count` and "
    "`gen_ai.output.type`; for OpenAI `openai.api.type`, `openai.request.service_tier`, "
    "`openai.response.service_tier`, `openai.response.system_fingerprint`; "
    "`error.type` and `http.response.status_code` | `turnstate.attempt`, "
    "`turnstate.step`, `turnstate.retry_after_s`, `turnstate.cost_usd`, "
    "`turnstate.withhold_tools` |\n"
    "| `execute_tool {name}` (one per tool call) | internal | `gen_ai.operation.name`="
    "`execute_tool`, `gen_ai.tool.name`, `gen_ai.tool.call.id`, `gen_ai.tool.type`="
    "`function`, `error.type` | `turnstate.tool.provider`, `turnstate.step` |\n"
)

_METRICS = (
    "| metric | instrument | unit | attributes | buckets |\n|---|---|---|---|---|\n"
    "| `gen_ai.client.operation.duration` (every model call attempt) | histogram | `s` | "
    "`gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`, "
    "`gen_ai.response.model`, `server.address`, `server.port`, `error.type` | "
    + ", ".join(f"{b:g}" for b in DURATION_BUCKETS)
    + " |\n"
    "| `gen_ai.client.token.usage` (every reported count) | histogram | `{token}` | the "
    "same but `error.type`, and `gen_ai.token.type` (`input`, `output`) | "
    + ", ".join(f"{b:,}" for b in TOKEN_BUCKETS)
    + " |\n"
    "| `turnstate.retries` | counter | `{retry}` | `error.type`, `turnstate.retry.kind` "
    "(`wait`, `fallback`, `tool_wait`) | |\n"
    "| `turnstate.wait.duration` | histogram | `s` | `error.type` | as the duration's |\n"
    "| `turnstate.turns` | counter | `{turn}` | `turnstate.turn.status` | |\n"
    "| `turnstate.sessions` | counter | `{session}` | `turnstate.session.status` | |\n"
    "| `turnstate.breaker.trips`, `turnstate.breaker.open` | counter, up-down counter | "
    "`{trip}`, `{breaker}` | `turnstate.tool.provider` | |\n"
    "| `turnstate.cost` | counter | `{USD}` | `gen_ai.request.model`, "
    "`gen_ai.provider.name` | |\n"
)


CONTENT_REQUEST = {
    "model": "claude-sonnet-4-5",
    "system": "You answer in one line.",
    "messages": [
        {"role": "user", "content": "What is in notes.md?"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "read_file",
                    "input": {"path": "notes.md"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "milk, eggs"}
            ],
        },
    ],
    "tools": [
        {"name": "read_file", "description": "Read a file", "input_schema": {"type": "object"}}
    ],
}
"""An Anthropic request with a system prompt and a tool round, for the content example."""


def _content_example() -> str:
    """An Anthropic request and an OpenAI reply in the conventions' form."""
    from ..core._events import ModelReplied  # noqa: PLC0415

    found: dict[str, Any] = {}
    _content_attributes(found, CONTENT_REQUEST)
    replied = next(e for e in _provider_events() if isinstance(e, ModelReplied))
    found["gen_ai.output.messages"] = json.dumps(output_messages(replied.reply, (), "stop"))
    return "".join(f"{key} = {found[key]}\n" for key in sorted(found))


def _telemetry_page() -> str:
    chats = [s for s in provider_demo_spans() if s.name.startswith("chat")]
    failed, replied = sorted(chats, key=lambda s: s.start_time)
    return (
        "# Telemetry: OpenTelemetry spans and metrics\n\n"
        "<!-- generated by `python -m statemachine.dev._telemetry_docs`; "
        "tests/test_otel_docs.py checks it -->\n\n"
        "`statemachine.otel.Telemetry` is a session observer (`pip install -e "
        "'.[otel]'` in a clone, `pip install 'turnstate[otel]'` once published; it needs "
        "`opentelemetry-api` only). It turns the trace "
        "into spans and metrics on the session's injected clock, following the "
        f"OpenTelemetry GenAI semantic conventions of release **v{SEMCONV_VERSION}** "
        "(`docs/gen-ai/gen-ai-spans.md`, `gen-ai-agent-spans.md`, `gen-ai-metrics.md` "
        "and the message JSON schemas of open-telemetry/semantic-conventions; the "
        "scope's schema URL is "
        f"`{SCHEMA_URL}`). That is the last release to carry them (v1.41.1 changed none "
        "of them): they have since moved to open-telemetry/semantic-conventions-genai, "
        "which has made no release yet.\n\n"
        f"```python\n{USAGE}```\n\n"
        "Every item comes from the data that crossed the engine's boundary: each trace "
        "record carries the event that fired it (a failure's `ModelError`: category, "
        "HTTP status, retry-after) and the call's `sm.Usage` (tokens, the model that "
        "answered, response id, finish reason, and where the call went: provider name, "
        "server address and port, streamed). The ready-made providers of "
        "`statemachine.providers` fill that usage on every event, a failure the SDK "
        "raised included; a host's own provider may fill what it knows. What a span "
        "needs when it starts (`gen_ai.provider.name`, `server.*`: the conventions ask "
        "for them at creation, for sampling) comes from the last usage of the same "
        "requested model, else from `Telemetry(provider_name=...)`. A bound session's "
        "`session_id` is `gen_ai.conversation.id` (unless `Telemetry(session_id=...)` "
        "names another).\n\n" + _export_section() + "## Spans\n\n" + _SPANS + "\n"
        "`error.type` (each span's status is ERROR when it is set): on a chat span the "
        f"model error category ({_values(ErrorCategory)}), or `cancelled`, or "
        "`unfinished` (the host stopped observing mid-call); on a tool span the tool "
        f"error category ({_values(ToolErrorCategory)}) or `unfinished`; on a turn span "
        f"its status ({_values(TurnStatus, 'completed')}) or `unfinished`; on the "
        f"session span its status ({_values(SessionStatus, 'completed', 'cancelled')}). "
        "`http.response.status_code` is on every failed attempt whose error had "
        "a status, the retried ones included.\n\n"
        "## One model call, every attribute\n\n"
        "A turn whose `OpenAIModel` got a 429 and then a reply (the events the "
        "provider reports: `tests/test_otel_provider.py` gets the same from the real "
        "SDK against a loopback server). The failed attempt:\n\n"
        f"```text\n{_attribute_lines(failed)}```\n\n"
        "and the reply, with the dated model name the server answered with:\n\n"
        f"```text\n{_attribute_lines(replied)}```\n\n"
        "## Metrics\n\n" + _METRICS + "\n"
        "`gen_ai.request.model` and `gen_ai.response.model` are left out when unknown, "
        "never invented. UCUM has no currency unit, so the cost counter's unit is the "
        "annotation `{USD}` (the conventions' form for a count of something, like "
        "`{token}`); the figure counted is US dollars.\n\n"
        "## Content, only when asked\n\n"
        "No request, reply, tool definition, tool argument or result, or error message "
        "is recorded unless `Telemetry(capture_content=True)`. Then the chat span (and "
        "the turn span, for the turn's first request and last reply) carries "
        "`gen_ai.input.messages`, `gen_ai.system_instructions`, `gen_ai.tool.definitions` "
        "(type and name) and `gen_ai.output.messages` in the conventions' structured "
        "form, as JSON text (the Python SDK has no structured span attributes yet); tool "
        "spans `gen_ai.tool.call.arguments` and, for a success, `gen_ai.tool.call.result` "
        "(JSON text that holds an object is decoded first); a failure's message is "
        "`turnstate.error.message`. OpenAI chat and responses requests, Anthropic "
        "messages and plain strings are converted part by part (text, tool calls and "
        "their results, images, audio, files, reasoning); a part of another shape is "
        "kept as a generic part, a request of another shape as one text part holding its "
        "JSON. An Anthropic request with a system prompt and a tool round, and the OpenAI "
        "reply above:\n\n"
        f"```text\n{_content_example()}```\n\n"
        "## Not emitted\n\n"
        "`gen_ai.response.time_to_first_chunk` and the streaming metrics "
        "(`gen_ai.client.operation.time_to_first_chunk`, `time_per_output_chunk`): the "
        "providers report no chunk times. `gen_ai.agent.id`, `gen_ai.agent.description`, "
        "`gen_ai.agent.version`, `gen_ai.data_source.id` and `gen_ai.tool.description`: "
        "the engine knows none of them. The opt-in event "
        "`gen_ai.client.inference.operation.details`: content goes on the spans.\n\n"
        f"## A real run: `{SPAN_TREE_SCENARIO}`\n\n"
        + span_tree_block()
        + f"\n\n## Session events: `{BREAKER_SCENARIO}`\n\n```text\n"
        + run_span_tree(BREAKER_SCENARIO)
        + "```\n"
    )


def _incident_page(mermaid: str, steps: str) -> str:
    return (
        f"# A drawn incident: `{INCIDENT_SCENARIO}`, turn {INCIDENT_TURN}\n\n"
        "<!-- generated by `python -m statemachine.dev._telemetry_docs`; "
        "tests/test_otel_docs.py checks it -->\n\n"
        "`python -m statemachine trace FILE` draws a recorded turn twice. First as a "
        "timeline, what an incident is read from: the model calls coloured by outcome, "
        "each wait with its seconds and where they came from (a retry-after header, the "
        "body, or the backoff), the tool calls, the limits and the final status, on the "
        "session's clock. Then on the machine: every state, the edges the turn took in "
        "bold, one edge per pair of states labelled with the numbers of the steps that "
        "took it, and a table of the steps (event, guards, action). Steps are counted "
        "from 1 in each turn, as `simulate` prints them (`2.3`, turn 2's third step, in a "
        "drawing of several turns), and times are seconds from the session's first "
        "recorded step. FILE is what "
        "`simulate --json` prints or what a `TraceWriter` observer wrote; `--html PAGE` "
        "writes one self-contained page with the timeline beside a step list to click "
        "through.\n\n"
        f"```sh\npython -m statemachine simulate {INCIDENT_SCENARIO} --json > storm.jsonl\n"
        f"python -m statemachine trace storm.jsonl --turn {INCIDENT_TURN} --name incident "
        "--html incident.html\n```\n\n"
        "writes `incident-timeline.svg` and `incident.svg` (both below), `incident.dot`, "
        "`incident.mmd` (the mermaid at the end) and `incident.html`. A production host "
        "records the same lines with the `TraceWriter` observer "
        "(`sm.Session(..., observers=[writer])` with `writer = sm.TraceWriter(path)`, then "
        "`writer.bind(session)`, or `sm.TraceWriter(path, settings=...)`, so the file "
        "holds the settings the waits are checked against, and with `bind` the seed a "
        "replay takes): a header naming the format, "
        "its version, the engine version, a digest of the transition table and the wall "
        "time the clock started at, then one line per transition. A trace of another "
        "format version or table, or with a step that is not a row of this table, is "
        "refused with its line (exit status 2), never drawn wrong; a file cut off "
        "mid-line is drawn up to its last whole line, with a warning.\n\n"
        "![the incident as a timeline](incident-timeline.svg)\n\n"
        "![the incident drawn on the machine](incident.svg)\n\n"
        f"The steps:\n\n```text\n{steps}```\n\n"
        "The same drawing for GitHub's renderer:\n\n"
        f"```mermaid\n{mermaid}```\n"
    )


def write_documents(root: Path, *, check: bool = False) -> list[Path]:
    """Write every generated file under ``root`` (and ``docs/incident.svg``); with
    ``check``, write nothing and return the files that differ."""
    from ._diagrams import DotMissing, write_files  # noqa: PLC0415

    done = write_files(root, documents(), check=check)
    if done.svg_missing:
        raise DotMissing("docs/incident.svg needs graphviz's `dot`")
    return list(done.written)


if __name__ == "__main__":  # pragma: no cover - a developer's command
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path()
    for written in write_documents(root):
        print(f"wrote {written}")
