"""Diagrams of the turn machine, drawn by ``transitions`` from the machine itself.

``python -m statemachine diagram`` writes into ``diagrams/`` the whole machine
(``turn.dot``, ``turn.svg``, ``turn.mmd`` for GitHub) and one view per model error
category (``category-<name>``), its rows numbered and highlighted, the rest greyed.
Every diagram comes from :func:`statemachine.core._machine.build_machine` with a
``GraphMachine`` subclass: the states and rows the engine runs on. Edges read
``Event [guards] / Action``; terminal states are coloured by ``_table.TERMINAL_KIND``.

The output is deterministic, so a test regenerates it and compares. An SVG depends on
the graphviz version, so instead it records the SHA-256 of the ``.dot`` it was drawn
from, and the test checks that record.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs
from transitions.extensions import GraphMachine
from transitions.extensions import diagrams_graphviz as _gv
from transitions.extensions import diagrams_mermaid as _mm

from .. import ErrorCategory
from ..core import _machine, _table
from ..core._taxonomy import RETRYABLE_CATEGORIES

INSTALL_HINT = (
    "graphviz's `dot` was not found on PATH: install it (Debian/Ubuntu: "
    "`apt-get install graphviz`; macOS: `brew install graphviz`) to draw the SVGs"
)

RowKey = tuple[str, str, tuple[str, ...]]
"""(source, trigger, guards): one row of the table, as a diagram edge knows it."""

KIND_COLOURS: dict[str, tuple[str, str]] = {
    "running": ("#ffffff", "#37474f"),
    "success": ("#d8f0dc", "#2e7d32"),
    "surfaced": ("#fff1cc", "#b26a00"),
    "failed": ("#fbdada", "#c62828"),
}
"""(fill, line) colour of a state by kind; terminal kinds from ``TERMINAL_KIND``."""

KIND_MEANING: dict[str, str] = {
    "running": "running state: the turn waits for the host's next event",
    "success": "success: the turn completed (failed tool calls are error results)",
    "surfaced": "surfaced: ended on purpose, the host must show it (filter, breaker)",
    "failed": "failed: the turn ended without an answer, Finish.status says why",
}

_HIGHLIGHT = "#1565c0"
_DIM = "#b0b0b0"

_ACTIONS: dict[str, str] = {
    "assemble": "Assemble",
    "call_model": "CallModel",
    "retry": "CallModel(attempt+1)",
    "fall_back": "CallModel(next fallback)",
    "wait": "Wait",
    "reduce": "Assemble(reduce)",
    "invoke_tools": "InvokeTools",
    "tool_wait": "Wait(conflict)",
    "reinvoke": "InvokeTools(one conflicting call)",
    "complete": "Finish(completed)",
}
"""Short names of the actions the effects emit (``Finish`` rows name their status)."""

_CATEGORY_GUARD: dict[str, frozenset[ErrorCategory]] = {
    **{category.value: frozenset({category}) for category in ErrorCategory},
    "transient": RETRYABLE_CATEGORIES,
}
_CATEGORY_GUARD.pop("rate_limited")
_CATEGORY_GUARD.pop("overloaded")


def action_label(effect: str, status: str | None) -> str:
    """The short action an effect emits, as an edge shows it."""
    if status is not None:
        return f"Finish({status})"
    return _ACTIONS.get(effect, effect)


def row_key(row: _table.Row) -> RowKey:
    """The key of a table row."""
    return (row.source, row.event, row.guards)


@attrs.frozen
class View:
    """One diagram: the whole machine, or one category's path through it."""

    name: str
    """File stem: ``turn`` or ``category-<category>``."""
    title: str
    highlight: frozenset[RowKey] | None = None
    """Rows drawn in colour (others greyed; a compact view's); ``None``: every row."""
    compact: bool = False
    """Edges labelled with row numbers, the rows in a table below, drawn top to bottom:
    the view for review at page width (the others put every row on its edge)."""


def category_rows(category: ErrorCategory) -> frozenset[RowKey]:
    """The rows a turn can take on its way through a ``category`` model error.

    The start and the first assembly, every ``ModelFailed`` row whose category guard
    admits ``category`` (not the ``partial`` row, which ignores categories), the
    rows out of the recovery states those rows enter, and the plain reply that
    completes the turn once it has recovered.
    """
    keys: set[RowKey] = set()
    entered: set[str] = set()
    for row in _table.ROWS:
        if row.event == "ModelFailed":
            named = [_CATEGORY_GUARD[g] for g in row.guards if g in _CATEGORY_GUARD]
            if named and all(category in cats for cats in named):
                keys.add(row_key(row))
                entered.add(row.dest)
    recovers = bool(entered & set(_table.RUNNING_STATES))
    for row in _table.ROWS:
        if row.event == "Cancelled":
            continue
        if (
            (row.source, row.event) in {("idle", _table.START), ("assembling", "Assembled")}
            or (row.source in entered - {"calling"} and row.source in _table.RUNNING_STATES)
            or (recovers and row.event == "ModelReplied" and row.guards == ("no_tool_calls",))
        ):
            keys.add(row_key(row))
    return frozenset(keys)


ROW_NUMBERS: dict[RowKey, int] = {row_key(row): i for i, row in enumerate(_table.ROWS, 1)}
"""Each row's number in the compact view: its place in the table, from 1."""


def views() -> tuple[View, ...]:
    """Every diagram ``diagram`` writes: the machine at page width, the machine with
    every row on its edge, then one view per category (at page width: its rows
    numbered on their edges and listed in a table)."""
    return (
        View("turn", "turn", compact=True),
        View("turn-full", "turn: every row on its edge"),
        *(
            View(
                f"category-{c.value}",
                f"turn: the path of {c.value}",
                category_rows(c),
                compact=True,
            )
            for c in ErrorCategory
        ),
    )


# -- transitions glue -------------------------------------------------------------


def state_kind(state: str) -> str:
    """``running``, or a terminal state's kind (``TERMINAL_KIND``)."""
    return _table.TERMINAL_KIND.get(state, "running")


def _labels(transitions: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """Edge labels (``Event [guards] / Action``) grouped by (source, dest), in table order."""
    grouped: dict[tuple[str, str], list[str]] = defaultdict(list)
    for tran in transitions:
        if not tran.get("trigger"):
            continue  # transitions' marker for nested initial states; none here
        guards = tuple(tran.get("conditions", ()))
        (tag,) = tran["after"]
        effect, _, status = tag.partition(":")
        label = tran["trigger"]
        if guards:
            label += f" [{' & '.join(guards)}]"
        label += f" / {action_label(effect, status or None)}"
        grouped[(tran["source"], tran["dest"])].append(label)
    return grouped


def _lit_states(view: View) -> set[str]:
    if view.highlight is None:
        return {*_table.RUNNING_STATES, *_table.TERMINAL_STATES}
    lit: set[str] = set()
    for row in _table.ROWS:
        if row_key(row) in view.highlight:
            lit.update((row.source, row.dest))
    return lit


class _DotGraph(_gv.Graph):
    """transitions' graphviz graph, styled by state kind and by the view."""

    def _add_nodes(self, states: list[dict[str, Any]], container: Any) -> None:
        lit = _lit_states(self.machine.view)
        container.node("__start", label="", shape="point", width="0.15")
        for state in states:
            name = state["name"]
            kind = state_kind(name)
            fill, line = KIND_COLOURS[kind]
            label = name if kind == "running" else f"{name}\\n({kind})"
            if name not in lit:
                fill, line = "#f5f5f5", _DIM
            container.node(
                name,
                label=label,
                fillcolor=fill,
                color=line,
                fontcolor=line if name not in lit else "black",
                peripheries="2" if kind != "running" else "1",
            )
        container.edge("__start", "idle")

    def _add_edges(self, transitions: list[dict[str, Any]], container: Any) -> None:
        if self.machine.view.compact:
            _add_numbered_edges(transitions, container, self.machine.view.highlight)
            return
        for (src, dst), labels in _labels(transitions).items():
            container.edge(src, dst, label="\\l".join(labels) + "\\l")


def _ranges(numbers: list[int]) -> str:
    """``[3, 4, 5, 9]`` as ``3-5, 9``."""
    parts: list[str] = []
    start = previous = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == previous + 1:
            previous = n
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if n is not None:
            start = previous = n
    return ", ".join(parts)


def _add_numbered_edges(
    transitions: list[dict[str, Any]], container: Any, highlight: frozenset[RowKey] | None
) -> None:
    """One edge per pair of states labelled with its rows' numbers; the ``Cancelled``
    rows (one from every running state) as one unlabelled dashed edge each. With a
    ``highlight``, only its rows are numbered (in blue), the other pairs dashed grey."""
    numbered: dict[tuple[str, str], list[int]] = defaultdict(list)
    cancelled: set[tuple[str, str]] = set()
    dimmed: set[tuple[str, str]] = set()
    for tran in transitions:
        if not tran.get("trigger"):
            continue
        pair = (tran["source"], tran["dest"])
        key = (tran["source"], tran["trigger"], tuple(tran.get("conditions", ())))
        if tran["trigger"] == "Cancelled":
            cancelled.add(pair)
        elif highlight is not None and key not in highlight:
            dimmed.add(pair)
        else:
            numbered[pair].append(ROW_NUMBERS[key])
    lit = {"color": _HIGHLIGHT, "fontcolor": _HIGHLIGHT, "penwidth": "1.5"}
    style = {} if highlight is None else lit
    for (src, dst), numbers in numbered.items():
        container.edge(src, dst, label=f" {_ranges(sorted(numbers))} ", fontsize="11", **style)
    for src, dst in sorted(dimmed - set(numbered) - cancelled):
        container.edge(src, dst, style="dashed", color=_DIM, arrowsize="0.6")
    for src, dst in sorted(cancelled):
        container.edge(src, dst, style="dashed", color=_DIM, arrowsize="0.6")


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def html_table(rows: Iterable[str | tuple[str, str, str]]) -> str:
    """Rows of ``#``, ``event [guards]`` and ``to: action`` under that head (a string
    among them: a group's heading), escaped, as an HTML-like graphviz label."""
    head = ("#", "event [guards]", "to: action")
    lines = ["<TR>" + "".join(f'<TD ALIGN="LEFT" BGCOLOR="#eeeeee"><B>{h}</B></TD>' for h in head)]
    for row in rows:
        if isinstance(row, str):
            lines.append(
                f'<TR><TD COLSPAN="3" ALIGN="LEFT" BGCOLOR="#f5f5f5"><B>{_html(row)}</B></TD>'
            )
        else:
            lines.append("<TR>" + "".join(f'<TD ALIGN="LEFT">{_html(c)}</TD>' for c in row))
    return (
        '<<TABLE BORDER="0" CELLBORDER="1" CELLSPACING="0" CELLPADDING="2">'
        + "</TR>".join(lines)
        + "</TR></TABLE>>"
    )


def _rows_table(highlight: frozenset[RowKey] | None = None) -> str:
    """The compact view's table: every row (or every row of ``highlight``), numbered,
    grouped by the state they leave."""
    rows: list[str | tuple[str, str, str]] = []
    source = None
    for number, row in enumerate(_table.ROWS, 1):
        if row.event == "Cancelled" or (highlight is not None and row_key(row) not in highlight):
            continue
        if row.source != source:
            source = row.source
            rows.append(f"from {source}")
        event = row.event + (f" [{row.label}]" if row.guards else "")
        rows.append(
            (str(number), event, f"{row.dest}: {action_label(row.effect, row.status or None)}")
        )
    cancels = [n for n, row in enumerate(_table.ROWS, 1) if row.event == "Cancelled"]
    if cancels and highlight is None:  # one from every running state: one line
        rows += [
            "from every running state",
            (_ranges(cancels), "Cancelled", "failed: Finish(cancelled)"),
        ]
    return html_table(rows)


def _compact_legend(title: str, highlight: frozenset[RowKey] | None = None) -> str:
    """The compact view's title and legend, as the graph's own label (centred above the
    machine, never beside it)."""
    swatches = "".join(
        f'<TD BGCOLOR="{fill}" COLOR="{line}" BORDER="{1 if kind == "running" else 2}">'
        f" {_html(KIND_MEANING[kind].split(':')[0])} </TD>"
        for kind, (fill, line) in KIND_COLOURS.items()
    )
    notes = (
        "edge labels: the numbers of the rows in the table below, tried in that order",
        "dashed grey: Cancelled / Finish(cancelled), from every running state",
    )
    if highlight is not None:
        notes = (
            "blue: the rows this category can take, numbered as in the whole table",
            "dashed grey: the machine's other rows",
        )
    rows = "".join(
        f'<TR><TD COLSPAN="4"><FONT POINT-SIZE="11">{_html(n)}</FONT></TD></TR>' for n in notes
    )
    return (
        '<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="4" CELLPADDING="2">'
        f'<TR><TD COLSPAN="4"><FONT POINT-SIZE="16">{_html(title)}</FONT></TD></TR>'
        f"<TR>{swatches}</TR>{rows}</TABLE>>"
    )


class _MermaidGraph(_mm.Graph):
    """transitions' mermaid graph, styled by state kind."""

    def _add_nodes(self, states: list[dict[str, Any]], container: list[str]) -> None:
        for state in states:
            name = state["name"]
            container.append(f'state "{name}" as {name}')
            kind = state_kind(name)
            if kind != "running":
                container.append(f"class {name} s_{kind}")

    def _add_edges(self, transitions: list[dict[str, Any]], container: list[str]) -> None:
        for (src, dst), labels in _labels(transitions).items():
            container.append(f"{src} --> {dst}: {'<br>'.join(labels)}")


class _TurnGraphMachine(GraphMachine):
    """A ``GraphMachine`` that draws with the graph classes above."""

    def __init__(self, *args: Any, view: View, **kwargs: Any) -> None:
        self.view = view
        super().__init__(*args, **kwargs)

    def _init_graphviz_engine(self, graph_engine: str) -> type:
        engines: dict[str, type] = {"graphviz": _DotGraph, "mermaid": _MermaidGraph}
        return engines[graph_engine]


class _Model:
    """The model a ``GraphMachine`` needs to hand out a graph; never driven."""


def _graph(view: View, engine: str) -> Any:
    machine: Any = _machine.build_machine(
        machine_class=_TurnGraphMachine,
        graph_engine=engine,
        show_conditions=True,
        title=view.title,
        view=view,
    )
    if engine == "mermaid":
        machine.style_attributes = {
            "node": {
                kind: {"fill": fill, "stroke": line, "color": "black"}
                for kind, (fill, line) in KIND_COLOURS.items()
                if kind != "running"
            },
            "edge": {},
            "graph": {},
        }
    else:
        machine.style_attributes = {
            "node": {
                "default": {
                    "style": "rounded,filled",
                    "shape": "rectangle",
                    "fontname": "Helvetica",
                }
            },
            "edge": {"default": {"fontname": "Helvetica", "fontsize": "10"}},
            "graph": {"default": {"fontname": "Helvetica", "labelloc": "t"}},
        }
    model: Any = _Model()
    machine.add_model(model)
    return model.get_graph(title=view.title)


def dot_source(view: View) -> str:
    """The graphviz source of ``view``, legend included."""
    graph = _graph(view, "graphviz")
    if view.compact:
        legend = _compact_legend(view.title, view.highlight)
        graph.attr(rankdir="TB", nodesep="0.25", ranksep="0.4", label=legend)
        table = _rows_table(view.highlight)
        graph.node("rows", label=table, shape="plaintext", style="", fontsize="11")
        with graph.subgraph() as ends:  # the turn's ends side by side, one rank
            ends.attr(rank="same")
            for state in _table.TERMINAL_STATES:
                ends.node(state)
        with graph.subgraph() as bottom:
            bottom.attr(rank="sink")
            bottom.node("rows")
        for state in _table.TERMINAL_STATES:
            graph.edge(state, "rows", style="invis")
        return str(graph.source)
    with graph.subgraph(name="cluster_legend") as legend:
        legend.attr(label="legend", fontname="Helvetica", color="#9e9e9e", style="dashed")
        previous = None
        for kind, (fill, line) in KIND_COLOURS.items():
            name = f"legend_{kind}"
            legend.node(
                name,
                label=KIND_MEANING[kind],
                fillcolor=fill,
                color=line,
                peripheries="1" if kind == "running" else "2",
                fontsize="10",
            )
            if previous is not None:
                legend.edge(previous, name, style="invis")
            previous = name
        lines = [
            "edges: Event [guards, all must hold] / Action, rows tried top to bottom",
            "guards:",
        ]
        lines.extend(f"  {name}: {meaning}" for name, meaning in _table.GUARDS.items())
        legend.node(
            "legend_guards",
            label="\\l".join(lines) + "\\l",
            shape="note",
            style="filled",
            fillcolor="#fafafa",
            fontsize="10",
        )
        legend.edge(previous, "legend_guards", style="invis")
    return str(graph.source)


def mermaid_source() -> str:
    """The mermaid source of the whole machine, legend included."""
    source = str(_graph(View("turn", "turn"), "mermaid").source).rstrip("\n")
    # transitions writes the title as bare front matter; mermaid reads `title:`.
    source = source.replace("---\nturn\n---", "---\ntitle: turn\n---", 1)
    legend = [
        "  note right of failed",
        *(f"    {KIND_MEANING[kind]}" for kind in ("success", "surfaced", "failed")),
        "    edges: Event [guards] / Action, one table row per line",
        "  end note",
    ]
    return source + "\n" + "\n".join(legend) + "\n"


def dot_digest(dot: str) -> str:
    """The SHA-256 (hex) an SVG records of the ``.dot`` source it was drawn from."""
    return hashlib.sha256(dot.encode()).hexdigest()


_GENERATOR = re.compile(r"<!-- Generated by graphviz version [^>]*-->\n?")
SOURCE_MARK = re.compile(r"<!-- drawn from (\S+) sha256=([0-9a-f]{64}) -->")


class DotMissing(RuntimeError):
    """graphviz's ``dot`` is not installed."""


def render_svg(dot: str, name: str) -> str:
    """``dot -Tsvg`` of ``dot``, with the graphviz version comment replaced by a record
    of the source's digest (so the file does not change with the graphviz version
    unless the layout does)."""
    exe = shutil.which("dot")
    if exe is None:
        raise DotMissing(INSTALL_HINT)
    done = subprocess.run(  # noqa: S603 - a fixed program, our own input
        [exe, "-Tsvg"], input=dot.encode(), capture_output=True, check=False, timeout=60
    )
    if done.returncode != 0:
        raise RuntimeError(f"dot failed on {name}.dot: {done.stderr.decode(errors='replace')}")
    svg = done.stdout.decode()
    mark = f"<!-- drawn from {name}.dot sha256={dot_digest(dot)} -->\n"
    svg, count = _GENERATOR.subn(mark, svg, count=1)
    if not count:
        svg = mark + svg
    return svg


@attrs.frozen
class Written:
    """What :func:`write_files` did."""

    written: tuple[Path, ...]
    """Files written (or, with ``check``, files that differ from what would be written)."""
    svg_missing: bool
    """True when ``dot`` was missing and the SVGs were not drawn."""


def sources() -> dict[str, str]:
    """Every text diagram, by file name: ``turn.mmd`` and each view's ``.dot``."""
    files = {f"{view.name}.dot": dot_source(view) for view in views()}
    files["turn.mmd"] = mermaid_source()
    return files


def write_diagrams(out: Path, *, svg: bool = True, check: bool = False) -> Written:
    """:func:`write_files` of every diagram into ``out``."""
    return write_files(out, sources(), svg=svg, check=check)


def write_files(
    out: Path, files: Mapping[str, str], *, svg: bool = True, check: bool = False
) -> Written:
    """Write ``files`` (path under ``out`` -> text; directories made as needed) and,
    unless ``svg=False``, beside each ``.dot`` the SVG drawn from it. A missing
    ``dot`` is not an error here: the text files are written and ``svg_missing``
    says the SVGs were not.

    With ``check``, write nothing and return the files whose content differs from
    what would be written (an SVG differs when it records another ``.dot``'s
    digest, or none).
    """
    changed: list[Path] = []
    for name, text in files.items():
        path = out / name
        if check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                changed.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    for name, text in files.items() if svg else ():
        if not name.endswith(".dot"):
            continue
        path = out / f"{name.removesuffix('.dot')}.svg"
        if check:
            if svg_source_digest(path) != dot_digest(text):
                changed.append(path)
            continue
        try:
            path.write_text(render_svg(text, path.stem), encoding="utf-8")
        except DotMissing:
            return Written(tuple(changed), svg_missing=True)
        changed.append(path)
    return Written(tuple(changed), svg_missing=False)


_MERMAID_BLOCK = re.compile(r"(```mermaid\n)(.*?)(```)", re.DOTALL)


def readme_with_diagram(text: str) -> str:
    """``text`` (a README) with its first mermaid block replaced by ``turn.mmd``.

    ``ValueError`` if it has no mermaid block.
    """
    if not _MERMAID_BLOCK.search(text):
        raise ValueError("no ```mermaid block to update")
    mmd = mermaid_source()
    return _MERMAID_BLOCK.sub(lambda m: m.group(1) + mmd + m.group(3), text, count=1)


def svg_source_digest(path: Path) -> str | None:
    """The ``.dot`` digest an SVG written here records, or ``None``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    found = SOURCE_MARK.search(text)
    return found.group(2) if found else None
