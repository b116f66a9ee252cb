"""The drawn incident (issue 25): the timeline, the diagrams the docs show at page
width, and ``trace`` on what an incident leaves behind (a cut file, malformed fields,
unwritable outputs, forged waits), measured and run rather than eyeballed."""

from __future__ import annotations

import io
import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import statemachine as sm
from statemachine.dev._cli import _write_all, main
from statemachine.dev._diagrams import views
from statemachine.dev._scenarios import builtin, builtin_names
from statemachine.dev._simulate import result_json, run, step_json
from statemachine.dev._telemetry_docs import scenario_steps, scenario_trace_lines
from statemachine.dev._timeline import CATEGORY_COLOURS, RETRY_AFTER_SOURCES, WIDTH, build
from statemachine.dev._trace_draw import draw
from statemachine.io._trace_file import (
    Trace,
    TraceFileError,
    TraceWriter,
    load_trace,
    read_trace,
)

ROOT = Path(__file__).resolve().parent.parent
PAGE_PX = 1200
SMALLEST_PX = 9


# -- measuring an SVG ----------------------------------------------------------------

_UNITS = {"pt": 96 / 72, "px": 1.0, "": 1.0, "in": 96.0}


def _length(raw: str) -> float:
    found = re.fullmatch(r"\s*([0-9.]+)\s*([a-z]*)\s*", raw)
    assert found is not None, raw
    return float(found.group(1)) * _UNITS[found.group(2)]


def _transform_scale(raw: str | None) -> float:
    """The vertical scale a ``transform`` applies (what a font's height is scaled by)."""
    scale = 1.0
    for name, args in re.findall(r"(\w+)\s*\(([^)]*)\)", raw or ""):
        numbers = [float(n) for n in re.split(r"[\s,]+", args.strip()) if n]
        if name == "scale":
            scale *= abs(numbers[1] if len(numbers) > 1 else numbers[0])
        elif name == "matrix":
            scale *= math.hypot(numbers[2], numbers[3])
    return scale


def _font_size(element: ET.Element) -> float | None:
    if "font-size" in element.attrib:
        return _length(element.attrib["font-size"])
    style = re.search(r"font-size:\s*([0-9.]+\s*[a-z]*)", element.attrib.get("style", ""))
    return _length(style.group(1)) if style else None


def measure(svg: str) -> tuple[float, float, int]:
    """(width in px at 96 dpi, the smallest text's font size in px after the SVG's own
    scaling, the number of texts) of an SVG document."""
    root = ET.fromstring(svg)  # noqa: S314 - the SVGs this repository generates
    width = _length(root.attrib["width"])
    scale = width / float(root.attrib["viewBox"].split()[2]) if "viewBox" in root.attrib else 1.0
    smallest = math.inf
    texts = 0

    def walk(element: ET.Element, factor: float, size: float | None) -> None:
        nonlocal smallest, texts
        factor *= _transform_scale(element.attrib.get("transform"))
        size = _font_size(element) or size
        if element.tag.rsplit("}", 1)[-1] == "text" and "".join(element.itertext()).strip():
            texts += 1
            smallest = min(smallest, (size or 16.0) * factor)
        for child in element:
            walk(child, factor, size)

    walk(root, scale, None)
    return width, smallest, texts


def test_the_measure_sees_scaling() -> None:
    """The measure itself: a viewBox twice the width halves the text; pt are 4/3 px;
    a transform's scale counts."""
    plain = '<svg xmlns="http://www.w3.org/2000/svg" width="100" viewBox="0 0 100 50">'
    assert measure(plain + '<text font-size="12">a</text></svg>')[:2] == (100, 12)
    halved = '<svg xmlns="http://www.w3.org/2000/svg" width="100" viewBox="0 0 200 50">'
    assert measure(halved + '<text font-size="12">a</text></svg>')[1] == 6
    points = '<svg xmlns="http://www.w3.org/2000/svg" width="90pt" viewBox="0 0 90 50">'
    width, size, _ = measure(
        points + '<g transform="scale(0.5 0.5)"><text font-size="12">a</text></g></svg>'
    )
    assert width == 120 and size == 8


# -- the timeline --------------------------------------------------------------------


def _trace(name: str) -> Trace:
    return read_trace(scenario_trace_lines(name), f"{name}.jsonl")


@pytest.mark.requirement("ER-161")
@pytest.mark.parametrize("name", builtin_names())
def test_every_scenarios_timeline_reads_at_page_width(name: str) -> None:
    """Every built-in scenario's timeline (all its turns) is at most 1,200 px wide with
    no text under 9 px, and holds a text for each step (the path strip)."""
    drawing = draw(read_trace(scenario_trace_lines(name), f"{name}.jsonl"))
    width, smallest, texts = measure(drawing.timeline)
    assert width <= PAGE_PX
    assert smallest >= SMALLEST_PX, smallest
    assert texts > len(drawing.steps)


@pytest.mark.requirement("ER-161")
def test_the_timeline_renders_at_page_width() -> None:
    """Rendered by cairosvg at 96 dpi, a storm's timeline is exactly WIDTH px wide (it
    is drawn at its own scale, never shrunk)."""
    import cairosvg

    drawing = draw(read_trace(scenario_trace_lines("rate-limit-storm"), "s.jsonl"))
    png = cairosvg.svg2png(bytestring=drawing.timeline.encode(), dpi=96)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(png[16:20], "big") == WIDTH == PAGE_PX


def _timeline(name: str, turn: int | None = None):  # type: ignore[no-untyped-def]
    trace = read_trace(scenario_trace_lines(name), f"{name}.jsonl")
    steps = [s for s in trace.steps if turn is None or s.record.turn == turn]
    return build(
        [s.record for s in steps],
        limits=[s.limit for s in steps],
        settings=trace.settings.get(name),
        anchor=steps[0].record.wall,
    )


@pytest.mark.requirement("ER-160")
def test_the_storm_shows_each_attempt_wait_and_retry_after_source() -> None:
    """The storm's first turn honours each form of retry-after: each wait is labelled
    with its seconds and its source, each failed attempt is a rate_limited bar with its
    HTTP status, the reply green, and the origin names its wall-clock time."""
    timeline = _timeline("rate-limit-storm", turn=1)
    waits = [i for i in timeline.items if i.lane == "waits"]
    records = [s.record for s in _trace("rate-limit-storm").steps if s.record.turn == 1]
    seconds = [r.action.seconds for r in records if isinstance(r.action, sm.Wait)]
    assert len(waits) == len(seconds) == 4
    for item, wait in zip(waits, seconds, strict=True):
        assert float(item.label.split(" s ", 1)[0]) == pytest.approx(wait, rel=5e-3)
    sources = [item.label.split(" s ", 1)[1] for item in waits]
    assert sorted(sources) == sorted(RETRY_AFTER_SOURCES)  # each form honoured once
    calls = [i for i in timeline.items if i.lane == "model"]
    assert [i.fill for i in calls] == [CATEGORY_COLOURS["rate_limited"]] * 4 + [
        CATEGORY_COLOURS["reply"]
    ]
    assert all("429 rate_limited" in i.label for i in calls[:4])
    drawn = draw(_trace("rate-limit-storm"), turn=1).timeline  # as the command draws it
    assert "t = 0 at the session&#x27;s first recorded step: 2026-01-01 00:00:00 UTC" in drawn
    assert [m.label for m in timeline.marks] == ["completed"]
    assert timeline.xs == tuple(sorted(timeline.xs))


@pytest.mark.requirement("ER-160")
def test_a_fallback_names_its_model_and_the_backoff_is_the_engines() -> None:
    """overloaded-fallback: the first attempt names the primary model, the first one
    on the fallback names it; waits the server did not ask for are the backoff."""
    timeline = _timeline("overloaded-fallback")
    calls = [i for i in timeline.items if i.lane == "model"]
    named = [i.label.split(":")[0] for i in calls if ":" in i.label]
    settings = builtin("overloaded-fallback").settings
    assert named == [settings.model, settings.fallback_models[0]]
    waits = [i for i in timeline.items if i.lane == "waits"]
    assert waits and all(i.label.endswith(" backoff") for i in waits)


@pytest.mark.requirement("ER-160")
def test_crashes_breakers_limits_and_statuses_are_marked() -> None:
    """The crash breaker's turn marks the crashed provider and the trip, max-turns its
    bound with the value from the scenario's settings, every turn its status."""
    crash = _timeline("plugin-crash-breaker")
    tools = [i for i in crash.items if i.lane == "tools"]
    assert any(i.crashed for i in tools)
    assert all(p in i.label for i in tools for p in i.crashed)
    labels = [m.label for m in crash.marks]
    assert "crash breaker open" in labels and "limit: crash breaker" in labels
    assert crash.svg.count('class="crash ') == sum(len(i.crashed) for i in tools)
    turns = _timeline("max-turns")
    limit = builtin("max-turns").settings.max_turns
    assert f"limit: max_turns = {limit}" in [m.label for m in turns.marks]
    statuses = [m.label for m in turns.marks if m.kind == "end"]
    result = run(builtin("max-turns"))
    assert statuses == [t.status for t in result.turns]


# -- the diagrams the docs show ------------------------------------------------------


def _embedded() -> list[Path]:
    """The SVGs the README and docs/ embed or link, but the every-row view (the wide
    one on purpose, linked as such)."""
    found: set[Path] = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\(([^)\s]+\.svg)\)", page.read_text(encoding="utf-8")):
            found.add((page.parent / target).resolve())
    return sorted(p for p in found if p.name != "turn-full.svg")


@pytest.mark.requirement("ER-163")
def test_the_docs_diagrams_read_at_page_width() -> None:
    """Each SVG the docs show is at most 1,200 px wide at 96 dpi with labels of at
    least 9 px: the machine, every category view and the drawn incident (its timeline and
    its machine drawing)."""
    shown = _embedded()
    names = {p.name for p in shown}
    assert {"turn.svg", "incident.svg", "incident-timeline.svg"} <= names
    assert {f"{v.name}.svg" for v in views() if v.name.startswith("category-")} <= names
    for path in shown:
        width, smallest, texts = measure(path.read_text(encoding="utf-8"))
        assert width <= PAGE_PX, (path.name, width)
        assert smallest >= SMALLEST_PX, (path.name, smallest)
        assert texts > 10, path.name


@pytest.mark.requirement("ER-163")
@pytest.mark.parametrize("name", builtin_names())
def test_every_scenario_drawn_on_the_machine_reads_at_page_width(name: str) -> None:
    """The machine drawing of each scenario (all its turns), rendered by dot: at most
    1,200 px wide, no label under 9 px."""
    from tests.test_diagrams import HAS_DOT

    if not HAS_DOT:
        pytest.skip("graphviz's dot is not installed")
    from statemachine.dev._diagrams import render_svg

    drawing = draw(read_trace(scenario_trace_lines(name), f"{name}.jsonl"))
    width, smallest, _ = measure(render_svg(drawing.dot, name))
    assert width <= PAGE_PX and smallest >= SMALLEST_PX, (width, smallest)


# -- trace on what an incident leaves behind -----------------------------------------


def trace(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["trace", *argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _writer_lines(**writer: object) -> list[str]:
    """A TraceWriter file of the storm's first turn, replayed from the simulator."""
    stream = io.StringIO()
    sink = TraceWriter(stream, **writer)  # type: ignore[arg-type]
    for step in scenario_steps("rate-limit-storm"):
        if step.turn == 1:
            sink(step.record)
    return stream.getvalue().splitlines(keepends=True)


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


@pytest.mark.requirement("ER-164")
def test_a_file_cut_mid_line_is_drawn_up_to_its_last_complete_line(tmp_path: Path) -> None:
    """The last line cut mid-record (mid-JSON, or mid-UTF-8 character): drawn up to
    the line before, a warning naming the dropped line; the same bytes with a newline
    after them are a malformed line, refused."""
    lines = _writer_lines(settings=builtin("rate-limit-storm").settings)
    whole = "".join(lines).encode()
    for cut in (whole[: -len(lines[-1]) // 2], whole[:-1] + "é".encode()[:1]):
        source = tmp_path / "cut.jsonl"
        source.write_bytes(cut)
        count = cut.count(b"\n")
        code, out, err = trace(str(source), "--out", str(tmp_path / "o"), "--no-svg")
        assert code == 0, err
        assert f"cut.jsonl:{count + 1}: the file ends inside this line" in err
        assert f"drawn up to line {count}" in err
        assert f"({count - 1} steps" in out  # the header is line 1
        assert load_trace(source).cut == count + 1
    source.write_bytes(whole[: -len(lines[-1]) // 2] + b"\n")
    code, _, err = trace(str(source), "--out", str(tmp_path / "p"))
    assert code == 2 and f"cut.jsonl:{len(lines)}: not JSON" in err
    assert not (tmp_path / "p").exists()


def _edit_action(lines: list[str], kind: str, **changes: object) -> list[str]:
    """The lines with the first action of type ``kind`` changed."""
    out = list(lines)
    for index, line in enumerate(lines):
        data = json.loads(line)
        if data.get("action", {}).get("$type") == kind:
            data["action"].update(changes)
            out[index] = json.dumps(data) + "\n"
            return out
    raise AssertionError(f"no {kind} action")


def _index_of(lines: list[str], kind: str) -> int:
    return next(i for i, line in enumerate(lines) if f'"$type": "{kind}"' in line) + 1


MALFORMED = [
    ("wait-seconds-text", lambda ls: _edit_action(ls, "Wait", seconds="x"), "Wait", "seconds"),
    ("calls-a-number", None, "InvokeTools", "calls"),
    ("attempt-negative", lambda ls: _edit_action(ls, "CallModel", attempt=-1), "CallModel", ""),
]


@pytest.mark.requirement("ER-165")
@pytest.mark.parametrize(
    ("case", "edit", "kind", "field"), MALFORMED, ids=[m[0] for m in MALFORMED]
)
def test_a_wrong_typed_field_is_refused_naming_its_line(
    tmp_path: Path, case: str, edit: object, kind: str, field: str
) -> None:
    """A field of the wrong type inside an action: exit 2, the file and line named,
    nothing written, no traceback."""
    if edit is None:  # a tool round: from a scenario that has one
        lines = [line + "\n" for line in scenario_trace_lines("conflict-retried")]
        lines = _edit_action(lines, "InvokeTools", calls=5)
    else:
        lines = edit(_writer_lines())  # type: ignore[operator]
    source = tmp_path / f"{case}.jsonl"
    source.write_text("".join(lines), encoding="utf-8")
    out_dir = tmp_path / "out"
    code, _, err = trace(str(source), "--out", str(out_dir), "--html", str(tmp_path / "p.html"))
    assert code == 2, err
    assert err.startswith(f"statemachine trace: {source}:{_index_of(lines, kind)}: ")
    assert f"{kind}.{field}" in err and "Traceback" not in err
    assert err.count("\n") == 1
    assert _files(tmp_path) == [source.name]


@pytest.mark.requirement("ER-165")
def test_bad_unicode_is_refused_naming_its_line(tmp_path: Path) -> None:
    """A lone surrogate in a field (valid JSON, not valid Unicode) and bytes that are
    not UTF-8 in a complete line: exit 2 naming the line, nothing written."""
    lines = _writer_lines()
    data = json.loads(lines[2])
    data["detail"] = "\ud800"
    surrogate = [*lines[:2], json.dumps(data) + "\n", *lines[3:]]
    for case, content in (
        ("surrogate", "".join(surrogate).encode()),
        ("latin1", "".join(lines[:3]).encode() + b'{"type": "step", "x": "\xe9"}\n'),
    ):
        source = tmp_path / f"{case}.jsonl"
        source.write_bytes(content)
        code, _, err = trace(str(source), "--out", str(tmp_path / "o"))
        assert code == 2, err
        assert f"{case}.jsonl:{3 if case == 'surrogate' else 4}: " in err
        assert ("lone surrogate" if case == "surrogate" else "not UTF-8") in err
        assert not (tmp_path / "o").exists()


@pytest.mark.requirement("ER-166")
def test_an_output_that_cannot_be_written_writes_nothing(tmp_path: Path) -> None:
    """--html into a missing directory, --out onto a file (or under one), a --name
    that is a path: exit 2 naming the path, and no file appears anywhere."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(_writer_lines()), encoding="utf-8")
    blocker = tmp_path / "file"
    blocker.write_text("x", encoding="utf-8")
    before = _files(tmp_path)
    cases = [
        (["--out", str(tmp_path / "o"), "--html", str(tmp_path / "no" / "p.html")], "no"),
        (["--out", str(blocker)], str(blocker)),
        (["--out", str(blocker / "deeper")], str(blocker)),
        (["--out", str(tmp_path / "o"), "--name", "../escape"], "../escape"),
        (["--out", str(tmp_path / "o"), "--html", str(tmp_path)], str(tmp_path)),
    ]
    for args, named in cases:
        code, out, err = trace(str(source), *args)
        assert code == 2, (args, err)
        assert named in err and err.count("\n") == 1, err
        assert out == ""
        assert _files(tmp_path) == before, args


@pytest.mark.requirement("ER-166")
def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    """When one output fails midway, the temporary files already written are removed,
    and so is the directory made for them; the error names the path."""
    out_dir = tmp_path / "made" / "here"
    files = {out_dir / "a.svg": "a", out_dir / "b.dot": "b", tmp_path / "gone" / "p.html": "p"}
    with pytest.raises(OSError, match="gone") as raised:
        _write_all(files, out_dir)
    assert "gone" in str(raised.value.filename)
    assert _files(tmp_path) == []
    _write_all({out_dir / "a.svg": "a"}, out_dir)
    assert _files(tmp_path) == ["made", "made/here", "made/here/a.svg"]


FORGED = [
    ("negative", {"seconds": -5}, "is not what the engine writes"),
    ("huge", {"seconds": 1e308}, "beyond what the trace's settings allow"),
    ("nan", {"seconds": {"$float": "nan"}}, "is not what the engine writes"),
    ("server-too-long", {"seconds": 301.0, "retry_after": 301.0}, "at most 300 s"),
    ("backoff-too-long", {"seconds": 100.0, "retry_after": None}, "at most 45 s"),
]


@pytest.mark.requirement("ER-167")
@pytest.mark.parametrize(("case", "changes", "message"), FORGED, ids=[f[0] for f in FORGED])
def test_a_forged_wait_is_refused(tmp_path: Path, case: str, changes: dict, message: str) -> None:
    """A Wait that is negative, not finite, or beyond what the recorded settings
    allow: exit 2 naming the line, nothing written."""
    lines = _edit_action(_writer_lines(settings=sm.Settings()), "Wait", **changes)
    source = tmp_path / f"{case}.jsonl"
    source.write_text("".join(lines), encoding="utf-8")
    code, _, err = trace(str(source), "--out", str(tmp_path / "o"))
    assert code == 2, err
    assert f"{case}.jsonl:{_index_of(lines, 'Wait')}: " in err
    assert message in err
    assert _files(tmp_path) == [source.name]


@pytest.mark.requirement("ER-165")
@pytest.mark.parametrize("scenario", [["a", "b"], {"name": "a"}, 7])
def test_a_summary_whose_scenario_is_not_text_is_refused(tmp_path: Path, scenario: object) -> None:
    """A summary naming its scenario with a list, an object or a number: exit 2 naming
    the line and the field, never a traceback."""
    lines = [*scenario_trace_lines("invalid-request")]
    summary = {**json.loads(lines[-1]), "scenario": scenario}
    source = tmp_path / "odd.jsonl"
    source.write_text("\n".join([*lines[:-1], json.dumps(summary)]) + "\n", encoding="utf-8")
    code, _, err = trace(str(source), "--out", str(tmp_path / "o"))
    assert code == 2, err
    assert f"odd.jsonl:{len(lines)}: scenario: " in err
    assert "Traceback" not in err and err.count("\n") == 1
    assert _files(tmp_path) == [source.name]


@pytest.mark.requirement("ER-167")
def test_the_wait_bound_follows_the_recorded_settings() -> None:
    """A 400 s server wait is refused against the defaults (none recorded) and read
    under settings that allow it; simulate --json's summary records its settings."""
    settings = sm.Settings(max_server_wait_s=500)
    wide = _edit_action(_writer_lines(settings=settings), "Wait", seconds=400.0, retry_after=400.0)
    assert read_trace(wide).settings[None] == settings
    bare = _edit_action(_writer_lines(), "Wait", seconds=400.0, retry_after=400.0)
    with pytest.raises(TraceFileError, match="default settings"):
        read_trace(bare)
    result = run(builtin("max-wall-clock"))
    assert result_json(result)["settings"] == builtin("max-wall-clock").settings.to_dict()


@pytest.mark.requirement("ER-168")
def test_a_production_trace_tells_what_a_simulated_one_does() -> None:
    """The simulator's records through a TraceWriter (settings given, wall clock
    injected): read back, the timeline has the same bars (categories, statuses,
    waits with their sources, models) as the simulated run's, and its origin is the
    writer's wall-clock reading."""
    name = "rate-limit-storm"
    lines = _writer_lines(settings=builtin(name).settings, wall_clock=lambda: 1.7e9)
    header = json.loads(lines[0])
    assert header["settings"] == builtin(name).settings.to_dict()
    written = read_trace(lines, "live.jsonl")
    simulated = read_trace(scenario_trace_lines(name), "sim.jsonl")
    live = draw(written)
    sim_turn = draw(simulated, turn=1)
    assert live.timeline.split("<text", 3)[3] != ""  # drawn
    both = [build([s.traced.record for s in d.steps]) for d in (live, sim_turn)]
    assert [(i.lane, i.label, i.fill) for i in both[0].items] == [
        (i.lane, i.label, i.fill) for i in both[1].items
    ]
    # the start step carries no wall time: the anchor is the writer's clock reading
    first = written.steps[0].record
    assert first.wall is None and first.at is not None
    assert written.anchor == 1.7e9 - first.at
    assert "2023-11-14 22:13:20 UTC" in live.timeline


@pytest.mark.requirement("ER-168")
def test_a_bound_writer_records_settings_anchor_limits_and_status() -> None:
    """A writer bound to a live session: the header holds its settings and the anchor
    (the injected wall clock, as the host gave no wall), each step the session's limit
    and status; the drawn timeline marks the bound with its value."""
    stream = io.StringIO()
    writer = TraceWriter(stream, wall_clock=lambda: 1_700_000_000.0)
    clock = [100.0]
    session = sm.Session(sm.Settings(max_turns=1), clock=lambda: clock[0], observers=[writer])
    writer.bind(session)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request="q", size=1))
    clock[0] += 2
    turn.send(sm.ModelReplied())
    lines = stream.getvalue().splitlines()
    header = json.loads(lines[0])
    assert header["anchor"] == {"t": 100.0, "wall": 1_700_000_000.0}
    assert header["settings"]["max_turns"] == 1
    steps = [json.loads(line) for line in lines[1:]]
    assert [s["limit"] for s in steps][-1] == "error_max_turns"
    read = read_trace(lines)
    assert read.anchor == 1_700_000_000.0 - 100.0
    drawing = draw(read)
    assert "2023-11-14 22:13:20 UTC" in drawing.timeline
    assert "limit: max_turns = 1" in drawing.timeline
    assert step_json  # the simulator's line and the writer's share their keys
    assert {"limit", "session_status"} <= set(steps[-1])
