"""A recorded turn drawn on the machine (``python -m statemachine trace FILE``).

The whole table is drawn faintly (every state, every (source, dest) pair of a row as a
dashed grey edge) and the transitions the trace took in bold, one edge per step,
numbered in order: ``3: ModelFailed [transient & retries_left & wait_fits] / Wait
2.000s rate_limited``. States the turn visited keep their colours (terminal states by
:data:`~statemachine.core._table.TERMINAL_KIND`), the others are greyed, and the title
names the final status. The same drawing comes as graphviz source (rendered to SVG
by ``dot``) and as a mermaid flowchart, and :func:`html_page` makes one
self-contained page of the SVG and a step list: clicking a step (or the arrow keys, or
``#step_N`` in the address) highlights its edge.

Input comes from :func:`statemachine.io._trace_file.read_trace`, which refuses any
step that is not a row of this engine's table, so nothing here can draw a row the
machine does not have.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence

import attrs

from ..core._actions import Action, Assemble, CallModel, Finish, InvokeTools, Wait
from ..core._events import Assembled, Cancelled, ModelFailed, ModelReplied, ToolsDone
from ..core._table import ROWS, RUNNING_STATES, STATES, TERMINAL_KIND
from ..core._usage import Usage
from ..io._trace_file import Trace, TracedStep, TraceFileError
from ._diagrams import KIND_COLOURS

_TAKEN = "#1565c0"
_FAINT = "#c8c8c8"
_FAINT_FILL = "#f7f7f7"


def action_text(action: Action) -> str:
    """The action of a step, in short, with what a reviewer needs (waits, statuses)."""
    if isinstance(action, Wait):
        return f"Wait {action.seconds:.3f}s {action.category.value}"
    if isinstance(action, CallModel):
        model = f" {action.model}" if action.model else ""
        return f"CallModel{model} attempt={action.attempt}"
    if isinstance(action, Finish):
        return f"Finish({action.status.value})"
    if isinstance(action, InvokeTools):
        return "InvokeTools " + ", ".join(call.name for call in action.calls)
    if isinstance(action, Assemble):
        return "Assemble(reduce)" if action.reduce else "Assemble"
    return type(action).__name__  # pragma: no cover - every action is above


@attrs.frozen
class DrawnStep:
    """One numbered step of a drawing."""

    number: int
    """From 1, in the order taken."""
    traced: TracedStep

    @property
    def label(self) -> str:
        """``n: Event [guards] / action``: the step's edge label."""
        record = self.traced.record
        guard = f" [{record.guard}]" if record.guard else ""
        return f"{self.number}: {record.event}{guard} / {action_text(record.action)}"

    @property
    def line(self) -> str:
        """The step as a line of the step list."""
        record = self.traced.record
        at = "" if record.at is None else f"t={record.at:.3f}s  "
        said = self.traced.detail or cause_text(record.caused_by)
        detail = f" ({said})" if said else ""
        return (
            f"{self.number:>3}. turn {record.turn} step {record.step}  {at}"
            f"{record.source} -> {record.dest}  {record.event}{detail}"
            f"{' [' + record.guard + ']' if record.guard else ''} / {action_text(record.action)}"
        )


def cause_text(event: object) -> str:
    """What a step's event says, in short, as the step list shows it (a trace file's
    ``caused_by``: a failure's category, HTTP status and retry-after, a reply's tool
    calls and usage, an assembled size, the tool outcomes' categories)."""
    if isinstance(event, ModelFailed):
        error = event.error
        parts = [error.category.value]
        if error.status is not None:
            parts.append(f"HTTP {error.status}")
        if error.retry_after_seconds is not None:
            parts.append(f"retry_after={error.retry_after_seconds}")
        elif error.headers is not None:
            parts += [
                f"{name}: {error.headers[name]}"
                for name in ("retry-after-ms", "retry-after")
                if name in error.headers
            ]
        if event.partial:
            parts.append("partial")
        return " ".join([*parts, *_usage_parts(event.usage, event.cost)])
    if isinstance(event, ModelReplied):
        calls = f"{len(event.tool_calls)} tool call(s)" if event.tool_calls else "no tool call"
        return " ".join([calls, *_usage_parts(event.usage, event.cost)])
    if isinstance(event, Assembled):
        return f"size={event.size}"
    if isinstance(event, ToolsDone):
        failed = [o.category.value for o in event.outcomes if not o.ok and o.category is not None]
        return f"{len(event.outcomes)} outcome(s)" + (
            f", failed: {', '.join(failed)}" if failed else ""
        )
    if isinstance(event, Cancelled) and event.reason:
        return event.reason[:80]
    return ""


def _usage_parts(usage: Usage | None, cost: float) -> list[str]:
    parts = []
    if usage is not None:
        if usage.input_tokens is not None or usage.output_tokens is not None:
            parts.append(f"tokens {usage.input_tokens}/{usage.output_tokens}")
        if usage.model is not None:
            parts.append(f"model {usage.model}")
    if cost:
        parts.append(f"${cost:g}")
    return parts


@attrs.frozen
class Drawing:
    """A trace drawn on the machine."""

    title: str
    steps: tuple[DrawnStep, ...]
    dot: str
    mermaid: str

    @property
    def steps_text(self) -> str:
        """The step list, one line per step."""
        return "".join(step.line + "\n" for step in self.steps)


def select(trace: Trace, scenario: str | None = None, turn: int | None = None) -> list[TracedStep]:
    """The steps of ``trace`` to draw: one scenario's (required when it holds more
    than one), all its turns or only ``turn``; :class:`TraceFileError` otherwise."""
    scenarios = trace.scenarios
    if scenario is None:
        if len(scenarios) > 1:
            names = ", ".join(str(s) for s in scenarios)
            raise TraceFileError(
                f"{trace.source}: holds {len(scenarios)} scenarios ({names}): choose one"
            )
        chosen = scenarios[0]
    elif scenario not in scenarios:
        names = ", ".join(str(s) for s in scenarios)
        raise TraceFileError(f"{trace.source}: no scenario {scenario!r} (it holds {names})")
    else:
        chosen = scenario
    steps = [s for s in trace.steps if s.scenario == chosen]
    if turn is not None:
        turns = sorted({s.record.turn for s in steps})
        steps = [s for s in steps if s.record.turn == turn]
        if not steps:
            raise TraceFileError(
                f"{trace.source}: no turn {turn} (turns {', '.join(map(str, turns))})"
            )
    return steps


def _title(trace: Trace, steps: Sequence[TracedStep]) -> str:
    turns = sorted({s.record.turn for s in steps})
    scenario = steps[0].scenario
    which = f"turn {turns[0]}" if len(turns) == 1 else f"turns {turns[0]}-{turns[-1]}"
    head = f"{scenario}: {which}" if scenario else which
    ends = [s.record.action for s in steps if isinstance(s.record.action, Finish)]
    status = ", ".join(a.status.value for a in ends if isinstance(a, Finish)) or "still running"
    times = [s.record.at for s in steps if s.record.at is not None]
    span = f", {times[-1] - times[0]:.3f} s on the clock" if len(times) > 1 else ""
    session = trace.session_status.get(scenario) if len(turns) > 1 else None
    tail = f"; session {session}" if session else ""
    return f"{head}: {status} ({len(steps)} steps{span}){tail}"


def _quote(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _kind(state: str) -> str:
    return TERMINAL_KIND.get(state, "running")


def _visited_and_taken(steps: Sequence[DrawnStep]) -> tuple[set[str], set[tuple[str, str]]]:
    """The states the steps pass through, and the (source, dest) pairs they take."""
    pairs = {(s.traced.record.source, s.traced.record.dest) for s in steps}
    return {state for pair in pairs for state in pair}, pairs


def dot_source(title: str, steps: Sequence[DrawnStep]) -> str:
    """The graphviz source: the machine faint, the steps bold and numbered."""
    visited, taken = _visited_and_taken(steps)
    lines = [
        "digraph trace {",
        f"  graph [rankdir=LR, fontname=Helvetica, labelloc=t, label={_quote(title)}];",
        '  node [shape=rectangle, style="rounded,filled", fontname=Helvetica];',
        "  edge [fontname=Helvetica, fontsize=10];",
        '  __start [label="", shape=point, width=0.15];',
    ]
    for state in STATES:
        kind = _kind(state)
        fill, line = KIND_COLOURS[kind]
        label = state if kind == "running" else f"{state}\n({kind})"
        periph = 1 if state in RUNNING_STATES else 2
        if state in visited:
            lines.append(
                f"  {state} [label={_quote(label)}, fillcolor={_quote(fill)}, "
                f'color={_quote(line)}, penwidth=2, peripheries={periph}, id="state_{state}"];'
            )
        else:
            lines.append(
                f"  {state} [label={_quote(label)}, fillcolor={_quote(_FAINT_FILL)}, "
                f"color={_quote(_FAINT)}, fontcolor={_quote(_FAINT)}, peripheries={periph}];"
            )
    lines.append(f"  __start -> idle [color={_quote(_TAKEN if 'idle' in visited else _FAINT)}];")
    pairs = dict.fromkeys((row.source, row.dest) for row in ROWS)
    for source, dest in pairs:
        if (source, dest) not in taken:
            lines.append(
                f"  {source} -> {dest} [color={_quote(_FAINT)}, style=dashed, arrowsize=0.6];"
            )
    for step in steps:
        record = step.traced.record
        lines.append(
            f"  {record.source} -> {record.dest} [id=step_{step.number}, "
            f"label={_quote(step.label + '  ')}, color={_quote(_TAKEN)}, "
            f"fontcolor={_quote(_TAKEN)}, penwidth=2.2];"
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


def _mermaid_text(text: str) -> str:
    return text.replace("&", "#amp;").replace('"', "#quot;")


def mermaid_source(title: str, steps: Sequence[DrawnStep]) -> str:
    """The mermaid flowchart: the machine dotted, the steps bold and numbered."""
    visited, taken = _visited_and_taken(steps)
    lines = [
        "---",
        f"title: {json.dumps(title)}",
        "---",
        "flowchart LR",
        "  classDef faint fill:#f7f7f7,stroke:#c8c8c8,color:#a0a0a0",
        *(
            f"  classDef {kind} fill:{fill},stroke:{line},stroke-width:2px,color:black"
            for kind, (fill, line) in KIND_COLOURS.items()
        ),
    ]
    for state in STATES:
        kind = _kind(state)
        style = kind if state in visited else "faint"
        shape = f'(["{state}"])' if kind != "running" else f'("{state}")'
        lines.append(f"  {state}{shape}:::{style}")
    links: list[str] = []
    faint: list[int] = []
    for source, dest in dict.fromkeys((row.source, row.dest) for row in ROWS):
        if (source, dest) not in taken:
            faint.append(len(links))
            links.append(f"  {source} -.-> {dest}")
    bold: list[int] = []
    for step in steps:
        record = step.traced.record
        bold.append(len(links))
        links.append(f'  {record.source} ==>|"{_mermaid_text(step.label)}"| {record.dest}')
    lines.extend(links)
    if faint:
        lines.append(f"  linkStyle {','.join(map(str, faint))} stroke:{_FAINT},stroke-width:1px")
    if bold:
        lines.append(f"  linkStyle {','.join(map(str, bold))} stroke:{_TAKEN},stroke-width:3px")
    return "\n".join(lines) + "\n"


def draw(trace: Trace, *, scenario: str | None = None, turn: int | None = None) -> Drawing:
    """The drawing of ``trace`` (one scenario; all its turns, or ``turn``)."""
    chosen = select(trace, scenario, turn)
    steps = tuple(DrawnStep(i, s) for i, s in enumerate(chosen, start=1))
    title = _title(trace, chosen)
    return Drawing(title, steps, dot_source(title, steps), mermaid_source(title, steps))


_SVG_START = re.compile(r"^.*?(?=<svg\b)", re.DOTALL)

_STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 1.5em; color: #212121; }
h1 { font-size: 1.2em; }
#layout { display: flex; gap: 1.5em; align-items: flex-start; }
#diagram { flex: 3; overflow: auto; border: 1px solid #e0e0e0; }
#diagram svg { max-width: 100%; height: auto; }
#steps { flex: 2; list-style: none; padding: 0; margin: 0; font-size: 0.85em; }
#steps button { display: block; width: 100%; text-align: left; border: 1px solid #e0e0e0;
  background: #fff; margin: 0 0 2px; padding: 4px 6px; cursor: pointer; font: inherit; }
#steps button[aria-pressed="true"] { background: #e3f2fd; border-color: #1565c0; }
g.edge.active path { stroke: #d32f2f; stroke-width: 5; }
g.edge.active polygon { fill: #d32f2f; stroke: #d32f2f; }
g.edge.active text { fill: #d32f2f; font-weight: bold; }
"""

_SCRIPT = """
(function () {
  var buttons = Array.prototype.slice.call(document.querySelectorAll("#steps button"));
  var current = 0;
  function select(n) {
    if (n < 1 || n > buttons.length) { return; }
    buttons.forEach(function (b) { b.setAttribute("aria-pressed", "false"); });
    document.querySelectorAll("g.edge.active").forEach(function (g) {
      g.classList.remove("active");
    });
    var edge = document.getElementById("step_" + n);
    if (edge) { edge.classList.add("active"); }
    buttons[n - 1].setAttribute("aria-pressed", "true");
    current = n;
    document.body.setAttribute("data-active", String(n));
  }
  buttons.forEach(function (b) {
    b.addEventListener("click", function () { select(Number(b.getAttribute("data-step"))); });
  });
  document.addEventListener("keydown", function (e) {
    if (e.key === "ArrowDown" || e.key === "j") { select(current + 1); e.preventDefault(); }
    if (e.key === "ArrowUp" || e.key === "k") { select(current - 1); e.preventDefault(); }
  });
  var wanted = /^#step_(\\d+)$/.exec(window.location.hash);
  select(wanted ? Number(wanted[1]) : 1);
  document.body.setAttribute("data-ready", "1");
})();
"""


def html_page(drawing: Drawing, svg: str) -> str:
    """One self-contained page: the drawing's SVG inline and its clickable step list
    (no external resource: styles and script are inline)."""
    inline = _SVG_START.sub("", svg, count=1)
    items = "\n".join(
        f'<li><button type="button" data-step="{s.number}" aria-pressed="false">'
        f"{html.escape(s.line.strip())}</button></li>"
        for s in drawing.steps
    )
    title = html.escape(drawing.title)
    return (
        "<!doctype html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n<style>{_STYLE}</style>\n</head>\n"
        '<body data-ready="0">\n'
        f"<h1>{title}</h1>\n"
        '<div id="layout">\n'
        f'<div id="diagram">\n{inline}</div>\n'
        f'<ol id="steps">\n{items}\n</ol>\n'
        "</div>\n"
        f"<script>{_SCRIPT}</script>\n"
        "</body>\n</html>\n"
    )
