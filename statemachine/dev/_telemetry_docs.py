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

import io
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..core._trace import TraceRecord
from ..io._otel import Telemetry
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


def scenario_steps(scenario: Scenario | str) -> list[StepRecord]:
    """Every transition of a play of ``scenario`` (a built-in's name or a scenario)."""
    chosen = builtin(scenario) if isinstance(scenario, str) else scenario
    steps: list[StepRecord] = []
    run(chosen, on_step=steps.append)
    return steps


def scenario_records(steps: Iterable[StepRecord]) -> list[tuple[TraceRecord, StepRecord]]:
    """The engine's :class:`TraceRecord` of each simulator step (its ``at`` is the
    virtual clock), as the session's observer received it."""
    out = []
    for step in steps:
        record = step.record
        if record is None:  # pragma: no cover - the simulator keeps every record
            raise ValueError(f"step {step.step} of turn {step.turn} holds no trace record")
        out.append((record, step))
    return out


def scenario_telemetry(
    scenario: Scenario | str, telemetry: Telemetry, *, session_status: str | None = None
) -> list[StepRecord]:
    """Play ``scenario`` and feed ``telemetry`` each transition, then end its session
    (with the run's session status, or ``session_status``). Returns the steps."""
    chosen = builtin(scenario) if isinstance(scenario, str) else scenario
    steps: list[StepRecord] = []
    result = run(chosen, on_step=steps.append)
    for record, step in scenario_records(steps):
        telemetry.observe(record, limit=step.limit, session_status=step.session_status)
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
    "turnstate.turn.status",
    "turnstate.session.status",
)


def _scenario(name: str) -> Scenario:
    """A built-in scenario, or a scenario file relative to the repository."""
    if name.endswith(".toml"):
        from ._scenarios import load  # noqa: PLC0415

        return load(Path(__file__).resolve().parents[2] / name)
    return builtin(name)


def run_span_tree(scenario: str) -> str:
    """The span tree of a scenario's run (a built-in's name or a file of the
    repository), on the SDK's in-memory exporter."""
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415 - dev dependency
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: PLC0415
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: PLC0415
        InMemorySpanExporter,
    )

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(tracer_provider=provider, clock_offset=EPOCH, provider_name="demo")
    scenario_telemetry(_scenario(scenario), telemetry)
    provider.shutdown()
    return span_tree(exporter.get_finished_spans(), attributes=_TREE_ATTRIBUTES)


def span_tree_block() -> str:
    """The marked README block: a real run's span tree, as a text code block."""
    tree = run_span_tree(SPAN_TREE_SCENARIO)
    return (
        f"{BLOCK_START}\n"
        f"The spans of `python -m statemachine simulate {SPAN_TREE_SCENARIO}` (529s on the "
        "primary model, a fallback that answers with a tool call), through a `Telemetry` "
        "observer, times on the virtual clock:\n\n"
        f"```text\n{tree}```\n{BLOCK_END}"
    )


def scenario_trace_lines(scenario: str) -> list[str]:
    """``simulate --json``'s lines for a built-in scenario."""
    from ._simulate import result_json  # noqa: PLC0415

    chosen = builtin(scenario)
    lines: list[str] = []
    result = run(chosen, on_step=lambda s: lines.append(json.dumps(step_json(s), sort_keys=True)))
    lines.append(json.dumps(result_json(result), sort_keys=True))
    return lines


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
    }


USAGE = (
    "import statemachine as sm\n"
    "from statemachine.otel import Telemetry\n\n"
    'telemetry = Telemetry(provider_name="anthropic", session_id="chat-42")\n'
    "session = sm.Session(sm.Settings(), observers=[telemetry])\n"
    "telemetry.bind(session)  # the session's limits and status, as they happen\n"
    "# ... run the session's turns: each becomes a span tree ...\n"
    "telemetry.end()  # after the last turn (a limit ends it by itself)\n"
)
"""How a host attaches the observer (runs as written: tests/test_docs.py)."""


def _telemetry_page() -> str:
    out = io.StringIO()
    out.write(
        "# Telemetry: OpenTelemetry spans and metrics\n\n"
        "<!-- generated by `python -m statemachine.dev._telemetry_docs`; "
        "tests/test_otel_docs.py checks it -->\n\n"
        "`statemachine.otel.Telemetry` is a session observer (`pip install "
        "'turnstate[otel]'`, which needs `opentelemetry-api` only). It turns the trace "
        "into spans that follow the OpenTelemetry GenAI semantic conventions, on the "
        "session's injected clock:\n\n"
        f"```python\n{USAGE}```\n\n"
        "| span | kind | attributes |\n|---|---|---|\n"
        "| `session` | internal | `gen_ai.agent.name`, `gen_ai.conversation.id`, "
        "`turnstate.session.status`; events `turnstate.breaker_open`, `turnstate.limit`, "
        "`turnstate.session_end` |\n"
        "| `invoke_agent {agent}` (one per turn) | internal | `gen_ai.operation.name="
        "invoke_agent`, `turnstate.turn.index`, `turnstate.turn.status`, `error.type` (the "
        "status, unless `completed`), `turnstate.cost_usd`; events `turnstate.wait` "
        "(seconds, `error.type`, attempt), `turnstate.fallback` (from, to, `error.type`), "
        "`turnstate.context_reduction` |\n"
        "| `chat {model}` (one per model call attempt) | client | `gen_ai.operation.name=chat`, "
        "`gen_ai.request.model`, `gen_ai.response.model`, `gen_ai.provider.name`, "
        "`turnstate.attempt`, `error.type` (the error category), "
        "`http.response.status_code`, `turnstate.retry_after_s` |\n"
        "| `execute_tool {name}` (one per tool call) | internal | "
        "`gen_ai.operation.name=execute_tool`, `gen_ai.tool.name`, `gen_ai.tool.call.id`, "
        "`gen_ai.tool.type`, `turnstate.tool.provider`, `error.type` (the tool error "
        "category) |\n\n"
        "Metrics: `turnstate.retries` (by `error.type` and `turnstate.retry.kind`: "
        "`wait`, `fallback`, `tool_wait`), `turnstate.wait.duration` (histogram, s), "
        "`turnstate.turns` (by `turnstate.turn.status`), `turnstate.sessions` (by "
        "`turnstate.session.status`), `turnstate.breaker.trips` and "
        "`turnstate.breaker.open` (by `turnstate.tool.provider`), `turnstate.cost` (USD, by "
        "`gen_ai.request.model`), `gen_ai.client.operation.duration` (s).\n\n"
        "No request, reply, tool argument, tool result or error message is recorded "
        "unless `Telemetry(capture_content=True)`.\n\n"
        f"## A real run: `{SPAN_TREE_SCENARIO}`\n\n"
    )
    out.write(span_tree_block() + "\n\n")
    out.write(
        f"## Session events: `{BREAKER_SCENARIO}`\n\n```text\n"
        + run_span_tree(BREAKER_SCENARIO)
        + "```\n"
    )
    return out.getvalue()


def _incident_page(mermaid: str, steps: str) -> str:
    return (
        f"# A drawn incident: `{INCIDENT_SCENARIO}`, turn {INCIDENT_TURN}\n\n"
        "<!-- generated by `python -m statemachine.dev._telemetry_docs`; "
        "tests/test_otel_docs.py checks it -->\n\n"
        "`python -m statemachine trace FILE` draws a recorded turn on the machine: the "
        "whole table faintly, the edges the turn took in bold, numbered in order, with "
        "the waits and the final status. FILE is what `simulate --json` prints or what a "
        "`TraceWriter` observer wrote; `--html PAGE` writes one self-contained page with "
        "the drawing and a step list to click through.\n\n"
        f"```sh\npython -m statemachine simulate {INCIDENT_SCENARIO} --json > storm.jsonl\n"
        f"python -m statemachine trace storm.jsonl --turn {INCIDENT_TURN} --name incident "
        "--html incident.html\n```\n\n"
        "writes `incident.dot`, `incident.svg` (below), `incident.mmd` (the "
        "mermaid at the end) and `incident.html`. A production host records the same "
        "lines with the `TraceWriter` observer "
        "(`sm.Session(..., observers=[sm.TraceWriter(path)])`): a header naming the "
        "format, its version, the "
        "engine version and a digest of the transition table, then one line per "
        "transition. A trace of another format version or table, or with a step that is "
        "not a row of this table, is refused with its line (exit status 2), never drawn "
        "wrong.\n\n"
        "![the incident drawn on the machine](incident.svg)\n\n"
        f"The steps:\n\n```text\n{steps}```\n\n"
        "The same drawing for GitHub's renderer:\n\n"
        f"```mermaid\n{mermaid}```\n"
    )


def write_documents(root: Path, *, check: bool = False) -> list[Path]:
    """Write every generated file under ``root`` (and ``docs/incident.svg``); with
    ``check``, write nothing and return the files that differ."""
    from ._diagrams import dot_digest, render_svg, svg_source_digest  # noqa: PLC0415

    changed: list[Path] = []
    files = documents()
    for name, text in files.items():
        path = root / name
        if check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                changed.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        changed.append(path)
    dot = files["docs/incident.dot"]
    svg = root / "docs/incident.svg"
    if check:
        if svg_source_digest(svg) != dot_digest(dot):
            changed.append(svg)
    else:
        svg.write_text(render_svg(dot, "incident"), encoding="utf-8")
        changed.append(svg)
    return changed


if __name__ == "__main__":  # pragma: no cover - a developer's command
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path()
    for written in write_documents(root):
        print(f"wrote {written}")
