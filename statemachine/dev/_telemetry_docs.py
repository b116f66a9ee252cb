"""Scenario runs as telemetry, and the generated pages that show it.

:func:`scenario_telemetry` plays a scenario (built-in or loaded) through the
simulator and feeds every transition to a :class:`~statemachine.otel.Telemetry`, with
the session's limit and status as the simulator saw them; :func:`span_tree` prints
finished spans as an indented tree. ``docs/telemetry.md`` and ``docs/incident.md`` are
written by hand; :func:`documents` fills their marked blocks (what the code computes:
a real run's span tree, the enums' values, the incident's drawing) and draws
``docs/incident.svg``. ``python -m statemachine.dev._telemetry_docs`` writes them and a
test regenerates them and compares, as for the diagrams.

The span tree needs ``opentelemetry-sdk`` (a dev dependency), imported here only.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
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

ROOT = Path(__file__).resolve().parents[2]
"""The repository: its scenario files, and the pages whose marked blocks are filled."""


def _scenario(scenario: Scenario | str) -> Scenario:
    """``scenario``, a built-in's name, or a scenario file of the repository (``.toml``)."""
    if not isinstance(scenario, str):
        return scenario
    if scenario.endswith(".toml"):
        from ._scenarios import load  # noqa: PLC0415

        return load(ROOT / scenario)
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


def provider_demo_spans() -> list[Any]:
    """The finished spans of one turn whose model calls an OpenAI provider answered: a
    429, then a reply (on a clock that moves by hand)."""
    import statemachine as sm  # noqa: PLC0415

    provider, exporter = _in_memory()
    now = [0.0]
    telemetry = Telemetry(tracer_provider=provider, clock_offset=EPOCH)
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
    """The body of the ``otel-span-tree`` block of docs/telemetry.md and the README: a
    real run's span tree, as a text code block."""
    return (
        f"\n`python -m statemachine simulate --spans {SPAN_TREE_SCENARIO}` prints the spans "
        "a `Telemetry` observer makes of that scenario (529s on the primary model, a "
        "fallback that answers with a tool call), times on the virtual clock (it needs "
        "`opentelemetry-sdk`, in the `dev` extra):\n"
        + _fenced("text", run_span_tree(SPAN_TREE_SCENARIO))
    )


def scenario_trace_lines(scenario: str) -> list[str]:
    """``simulate --json``'s lines for a built-in scenario."""
    from ._simulate import result_json  # noqa: PLC0415

    steps, result = _play(builtin(scenario))
    lines = [json.dumps(step_json(step), sort_keys=True) for step in steps]
    return [*lines, json.dumps(result_json(result), sort_keys=True)]


def _values(enum: Any, *aside: str) -> str:
    return ", ".join(f"`{member.value}`" for member in enum if member.value not in aside)


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


def _fenced(language: str, text: str) -> str:
    """``text`` as a fenced code block: the body of a marked block that holds one."""
    return f"\n```{language}\n{text}```\n"


def fill(page: str, blocks: Mapping[str, str]) -> str:
    """``page`` with the body of each marked block ``<!-- name -->...<!-- /name -->``
    that ``blocks`` names replaced by its text (every block of that name); the rest of
    the page, other marked blocks included, as it is.

    ``ValueError`` if a name has no block in ``page`` (a marker lost, or both).
    """
    marked = re.compile(rf"(<!-- ({'|'.join(map(re.escape, blocks))}) -->).*?(<!-- /\2 -->)", re.S)
    missing = set(blocks).difference(name for _, name, _ in marked.findall(page))
    if missing:
        raise ValueError(f"no marked block {', '.join(sorted(missing))}")
    return marked.sub(lambda found: found[1] + blocks[found[2]] + found[3], page)


def _telemetry_blocks() -> dict[str, str]:
    """The marked blocks of docs/telemetry.md, by name."""
    chats = [s for s in provider_demo_spans() if s.name.startswith("chat")]
    failed, replied = sorted(chats, key=lambda s: s.start_time)
    return {
        "semconv": SEMCONV_VERSION,
        "schema-url": f"`{SCHEMA_URL}`",
        "error-categories": _values(ErrorCategory),
        "tool-error-categories": _values(ToolErrorCategory),
        "turn-statuses": _values(TurnStatus, "completed"),
        "session-statuses": _values(SessionStatus, "completed", "cancelled"),
        "failed-call": _fenced("text", _attribute_lines(failed)),
        "replied-call": _fenced("text", _attribute_lines(replied)),
        "duration-buckets": ", ".join(f"{b:g}" for b in DURATION_BUCKETS),
        "token-buckets": ", ".join(f"{b:,}" for b in TOKEN_BUCKETS),
        "content-example": _fenced("text", _content_example()),
        "span-tree-scenario": f"`{SPAN_TREE_SCENARIO}`",
        "otel-span-tree": span_tree_block(),
        "breaker-scenario": f"`{BREAKER_SCENARIO}`",
        "breaker-span-tree": _fenced("text", run_span_tree(BREAKER_SCENARIO)),
    }


def documents() -> dict[str, str]:
    """Every generated file, by path relative to the repository: the hand-written
    pages (as the repository holds them) with their marked blocks filled, and the
    incident's drawings."""
    from ..io._trace_file import read_trace  # noqa: PLC0415
    from ._trace_draw import draw  # noqa: PLC0415

    trace = read_trace(scenario_trace_lines(INCIDENT_SCENARIO), f"{INCIDENT_SCENARIO}.jsonl")
    drawing = draw(trace, turn=INCIDENT_TURN)
    commands = (
        f"python -m statemachine simulate {INCIDENT_SCENARIO} --json > storm.jsonl\n"
        f"python -m statemachine trace storm.jsonl --turn {INCIDENT_TURN} --name incident "
        "--html incident.html\n"
    )
    incident = {
        "incident-scenario": f"`{INCIDENT_SCENARIO}`",
        "incident-turn": str(INCIDENT_TURN),
        "incident-commands": _fenced("sh", commands),
        "incident-steps": _fenced("text", drawing.steps_text),
        "incident-mermaid": _fenced("mermaid", drawing.mermaid),
    }
    pages = {"docs/telemetry.md": _telemetry_blocks(), "docs/incident.md": incident}
    return {
        **{
            path: fill((ROOT / path).read_text(encoding="utf-8"), blocks)
            for path, blocks in pages.items()
        },
        "docs/incident.dot": drawing.dot,
        "docs/incident-timeline.svg": drawing.timeline,
    }


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
