"""A recorded turn drawn (``python -m statemachine trace FILE``): as a timeline
(:mod:`statemachine.dev._timeline`, what an incident is read from) and on the machine.

Steps are named as ``simulate`` numbers them (:func:`~statemachine.dev._timeline.step_name`)
and timed from the session's first recorded step. On the machine, every row's pair of
states is a faint dashed edge and each pair the trace took one bold edge labelled with
its steps; the table under the machine gives every step (``3 | ModelFailed [transient &
retries_left & wait_fits] | backing_off: Wait 2.000s rate_limited``). Visited states keep
their colours, the others are greyed. The drawing comes as graphviz source and as a
mermaid flowchart; :func:`html_page` puts the timeline beside a step list, linked both
ways. The input is :func:`statemachine.io._trace_file.read_trace`'s, which refuses any
step that is not a row of this engine's table.
"""

from __future__ import annotations

import html
import json
import textwrap
from collections.abc import Sequence

import attrs

from .. import Finish, TraceFileError, TraceRecord
from ..core import _table
from ..io._trace_file import Trace, TracedStep
from . import _timeline
from ._diagrams import KIND_COLOURS, html_table, state_kind
from ._simulate import action_text, event_text

_TAKEN = "#1565c0"
_FAINT = "#c8c8c8"
_FAINT_FILL = "#f7f7f7"


@attrs.frozen
class DrawnStep:
    """One step of a drawing."""

    number: int
    """Its place in the drawing, from 1, in the order taken (the page's ``#step_N``)."""
    traced: TracedStep
    name: str
    """The step as people count it (:func:`~statemachine.dev._timeline.step_name`)."""
    t: float | None = None
    """Seconds from the session's first recorded step, if the trace has the time."""

    @property
    def event(self) -> str:
        """``Event [guards]``."""
        record = self.traced.record
        return record.event + (f" [{record.guard}]" if record.guard else "")

    @property
    def action(self) -> str:
        """The action, in short (:func:`~statemachine.dev._simulate.action_text`)."""
        return action_text(self.traced.record.action)

    @property
    def label(self) -> str:
        """``name: Event [guards] / action``: the step's edge label."""
        return f"{self.name}: {self.event} / {self.action}"

    @property
    def line(self) -> str:
        """The step as a line of the step list."""
        record = self.traced.record
        at = "" if self.t is None else f"t={self.t:.3f}s  "
        said = self.traced.detail or event_text(record.caused_by)
        detail = f" ({said})" if said else ""
        guard = f" [{record.guard}]" if record.guard else ""
        return (
            f"turn {record.turn} step {record.step + 1}  {at}{record.source} -> {record.dest}  "
            f"{record.event}{detail}{guard} / {self.action}"
        )


@attrs.frozen
class Drawing:
    """A trace drawn as a timeline, and on the machine."""

    title: str
    steps: tuple[DrawnStep, ...]
    dot: str
    mermaid: str
    timeline: str = ""
    """The timeline's SVG (:mod:`statemachine.dev._timeline`)."""

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


def _visited_and_taken(steps: Sequence[DrawnStep]) -> tuple[set[str], set[tuple[str, str]]]:
    """The states the steps pass through, and the (source, dest) pairs they take."""
    pairs = {(s.traced.record.source, s.traced.record.dest) for s in steps}
    return {state for pair in pairs for state in pair}, pairs


def _names(names: Sequence[str]) -> str:
    """Step names as an edge label: a long run shortened to its first and last."""
    listed = ", ".join(names)
    return listed if len(listed) <= 16 else f"{names[0]} ... {names[-1]} ({len(names)}x)"


def dot_source(title: str, steps: Sequence[DrawnStep]) -> str:
    """The graphviz source, drawn top to bottom at page width: the machine faint, each
    pair of states a step took one bold edge labelled with the steps' numbers, and
    every step (event, guards, state entered, action) in a table under the machine."""
    visited, _ = _visited_and_taken(steps)
    lines = [
        "digraph trace {",
        f"  graph [rankdir=TB, nodesep=0.3, ranksep=0.45, fontname=Helvetica, "
        f"fontsize=16, labelloc=t, label={_quote(chr(10).join(textwrap.wrap(title, 64)))}];",
        '  node [shape=rectangle, style="rounded,filled", fontname=Helvetica, fontsize=12];',
        "  edge [fontname=Helvetica, fontsize=11];",
        '  __start [label="", shape=point, width=0.15];',
    ]
    for state in _table.STATES:
        kind = state_kind(state)
        fill, line = KIND_COLOURS[kind]
        label = state if kind == "running" else f"{state}\n({kind})"
        periph = 1 if state in _table.RUNNING_STATES else 2
        if state in visited:
            lines.append(
                f"  {state} [label={_quote(label)}, fillcolor={_quote(fill)}, "
                f'color={_quote(line)}, penwidth=2, peripheries={periph}, id="state_{state}"];'
            )
        else:
            lines.append(
                f"  {state} [label={_quote(label)}, fillcolor={_quote(_FAINT_FILL)}, "
                f"color={_quote(_FAINT)}, fontcolor={_quote('#9e9e9e')}, peripheries={periph}];"
            )
    lines.append(f"  __start -> idle [color={_quote(_TAKEN if 'idle' in visited else _FAINT)}];")
    numbered: dict[tuple[str, str], list[str]] = {}
    for step in steps:
        record = step.traced.record
        numbered.setdefault((record.source, record.dest), []).append(step.name)
    for source, dest in dict.fromkeys((row.source, row.dest) for row in _table.ROWS):
        if (source, dest) not in numbered:
            lines.append(
                f"  {source} -> {dest} [color={_quote(_FAINT)}, style=dashed, arrowsize=0.6];"
            )
    for (source, dest), names in numbered.items():
        lines.append(
            f'  {source} -> {dest} [id="pair_{source}__{dest}", '
            f"label={_quote(' ' + _names(names) + ' ')}, color={_quote(_TAKEN)}, "
            f"fontcolor={_quote(_TAKEN)}, penwidth=2.2];"
        )
    table = html_table((s.name, s.event, f"{s.traced.record.dest}: {s.action}") for s in steps)
    lines.append(f'  steps [label={table}, shape=plaintext, style="", fontsize=11];')
    lines.append("  { rank=sink; steps; }")
    lines.extend(f"  {state} -> steps [style=invis];" for state in _table.TERMINAL_STATES)
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
    for state in _table.STATES:
        kind = state_kind(state)
        style = kind if state in visited else "faint"
        shape = f'(["{state}"])' if kind != "running" else f'("{state}")'
        lines.append(f"  {state}{shape}:::{style}")
    links: list[str] = []
    faint: list[int] = []
    for source, dest in dict.fromkeys((row.source, row.dest) for row in _table.ROWS):
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
    title = _title(trace, chosen)
    # t = 0: the session's first recorded step (in the file, drawn or not)
    ran = [s.record for s in trace.steps if s.scenario == chosen[0].scenario]
    start = next((r.at for r in ran if r.at is not None), None)
    timeline = _timeline.build(
        [s.record for s in chosen],
        details=[s.detail or event_text(s.record.caused_by) for s in chosen],
        limits=[s.limit for s in chosen],
        settings=trace.settings.get(chosen[0].scenario),
        start=start,
        anchor=_anchor(trace.anchor, ran, start),
        title=title,
    )
    steps = tuple(
        DrawnStep(i, s, name, None if s.record.at is None or start is None else s.record.at - start)
        for i, (s, name) in enumerate(zip(chosen, timeline.names, strict=True), start=1)
    )
    return Drawing(
        title, steps, dot_source(title, steps), mermaid_source(title, steps), timeline.svg
    )


def _anchor(anchor: float | None, ran: Sequence[TraceRecord], start: float | None) -> float | None:
    """The Unix time of the session clock's ``start``: from the header's anchor (the
    Unix time of the clock's 0), else from the first step that records its wall time."""
    if start is None:
        return None
    if anchor is not None:
        return anchor + start
    for record in ran:
        if record.wall is not None and record.at is not None:
            return record.wall - (record.at - start)
    return None


_STYLE = """
body { font-family: Helvetica, Arial, sans-serif; margin: 1.5em; color: #212121; }
h1 { font-size: 1.2em; }
#layout { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
#timeline { flex: 0 0 auto; max-width: 100%; overflow-x: auto; border: 1px solid #e0e0e0; }
#timeline svg { display: block; }
#steps { flex: 1 1 380px; list-style: none; padding: 0; margin: 0; font-size: 13px;
  max-height: 92vh; overflow-y: auto; }
#steps button { display: block; width: 100%; text-align: left; border: 1px solid #e0e0e0;
  background: #fff; margin: 0 0 2px; padding: 4px 6px; cursor: pointer; font: inherit; }
#steps button[aria-pressed="true"] { background: #e3f2fd; border-color: #1565c0; }
svg .bar, svg .chip, svg text.label { cursor: pointer; }
svg .active.bar { stroke: #d32f2f; stroke-width: 3; }
svg .active.chip rect { stroke: #d32f2f; stroke-width: 3; }
svg text.active { fill: #d32f2f; font-weight: bold; }
svg line.active { stroke: #d32f2f; stroke-width: 3; }
"""

_SCRIPT = """
(function () {
  var buttons = Array.prototype.slice.call(document.querySelectorAll("#steps button"));
  var svg = document.querySelector("#timeline svg");
  var cursor = document.getElementById("cursor");
  var current = 0;
  function select(n, scroll) {
    if (n < 1 || n > buttons.length) { return; }
    buttons.forEach(function (b) { b.setAttribute("aria-pressed", "false"); });
    svg.querySelectorAll(".active").forEach(function (e) { e.classList.remove("active"); });
    svg.querySelectorAll(".s" + n).forEach(function (e) { e.classList.add("active"); });
    var chip = svg.querySelector(".chip.s" + n);
    if (chip && cursor) {
      var x = chip.getAttribute("data-x");
      cursor.setAttribute("x1", x);
      cursor.setAttribute("x2", x);
      cursor.setAttribute("visibility", "visible");
    }
    buttons[n - 1].setAttribute("aria-pressed", "true");
    if (scroll) { buttons[n - 1].scrollIntoView({block: "nearest"}); }
    current = n;
    document.body.setAttribute("data-active", String(n));
  }
  buttons.forEach(function (b) {
    b.addEventListener("click", function () { select(Number(b.getAttribute("data-step"))); });
  });
  svg.addEventListener("click", function (e) {
    var item = e.target.closest("[data-step]");
    if (item) { select(Number(item.getAttribute("data-step")), true); }
  });
  document.addEventListener("keydown", function (e) {
    if (e.key === "ArrowDown" || e.key === "j") { select(current + 1, true); e.preventDefault(); }
    if (e.key === "ArrowUp" || e.key === "k") { select(current - 1, true); e.preventDefault(); }
  });
  var wanted = /^#step_(\\d+)$/.exec(window.location.hash);
  select(wanted ? Number(wanted[1]) : 1, true);
  document.body.setAttribute("data-ready", "1");
})();
"""


def html_page(drawing: Drawing) -> str:
    """One self-contained page: the timeline (at its own width, never scaled down)
    beside the clickable step list, linked both ways: a step selected in the list
    (click, arrow keys, ``#step_N`` in the address: the list's N-th) highlights its bars, marks and
    place on the path strip, and a click on any of those selects its step. No
    external resource: styles and script are inline."""
    items = "\n".join(
        f'<li id="step_{s.number}"><button type="button" data-step="{s.number}" '
        f'aria-pressed="false">{html.escape(s.line.strip())}</button></li>'
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
        f'<div id="timeline">\n{drawing.timeline}</div>\n'
        f'<ol id="steps">\n{items}\n</ol>\n'
        "</div>\n"
        f"<script>{_SCRIPT}</script>\n"
        "</body>\n</html>\n"
    )
