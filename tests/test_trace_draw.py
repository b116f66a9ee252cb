"""Trace files and ``python -m statemachine trace``: a recorded turn drawn on the machine.

The TraceWriter observer's file reads back as the records the session gave; every
built-in scenario's ``simulate --json`` output reads and draws (each step a bold,
numbered edge, the whole table faint); a trace of another format version or table,
or with a row the table lacks, is refused naming its line, exit status 2, nothing
written; the ``--html`` page works in a real headless Chromium.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import statemachine as sm
from statemachine.core._actions import Finish, Wait
from statemachine.dev._cli import main
from statemachine.dev._scenarios import builtin_names
from statemachine.dev._telemetry_docs import scenario_trace_lines
from statemachine.dev._trace_draw import draw
from statemachine.io._trace_file import (
    FORMAT,
    VERSION,
    TraceFileError,
    TraceWriter,
    header,
    read_trace,
    table_digest,
)

DATA = Path(__file__).parent / "data" / "trace"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


class Clock:
    def __init__(self) -> None:
        self.now = 5.0

    def __call__(self) -> float:
        return self.now


def recorded_session(target: io.StringIO | Path) -> tuple[sm.Session, list[sm.TraceRecord]]:
    """Two turns (a wait, a tool round, a reply) with a TraceWriter and a list."""
    clock = Clock()
    seen: list[sm.TraceRecord] = []
    writer = TraceWriter(target)
    session = sm.Session(sm.Settings(), seed=2, clock=clock, observers=[writer, seen.append])
    for _ in range(2):
        turn = session.new_turn()
        turn.start()
        turn.send(sm.Assembled(request={"q": "hi"}, size=10))
        clock.now += 1.5
        wait = turn.send(sm.ModelFailed(sm.ModelError("overloaded")))
        assert isinstance(wait, Wait)
        clock.now += wait.seconds
        turn.send(sm.WaitDone())
        call = sm.ToolCall("c1", "fs", "read", {"p": 1})
        turn.send(sm.ModelReplied(tool_calls=(call,), cost=0.5))
        turn.send(sm.ToolsDone((sm.ToolOutcome("c1", ok=False, category="timeout"),)))
    writer.close()
    return session, seen


@pytest.mark.requirement("ER-130")
def test_the_writer_file_reads_back_as_the_sessions_records() -> None:
    """A header naming the format, version, engine and table, then one line per
    transition; read back, the records equal the ones the observers saw (times and
    each event's cost included)."""
    file = io.StringIO()
    _, seen = recorded_session(file)
    lines = file.getvalue().splitlines()
    first = json.loads(lines[0])
    anchor = first.pop("anchor")
    assert first == {
        "type": "header",
        "format": FORMAT,
        "version": VERSION,
        "engine": sm.__version__,
        "table": table_digest(),
    }
    assert anchor["t"] == seen[0].at
    trace = read_trace(lines, "live.jsonl")
    assert trace.engine == sm.__version__
    assert [s.record for s in trace.steps] == seen
    assert [s.record.at for s in trace.steps] == [r.at for r in seen]
    assert [s.record.cost_usd for s in trace.steps] == [r.cost_usd for r in seen]
    assert [s.line for s in trace.steps] == list(range(2, len(lines) + 1))


@pytest.mark.requirement("ER-130", "ER-245")
def test_a_cancelled_calls_cost_and_usage_read_back_from_the_trace_file() -> None:
    """A turn cancelled while its model call was in flight, charged what the vendor
    reported: the trace file keeps the cost and the usage, and reads them back."""
    file = io.StringIO()
    seen: list[sm.TraceRecord] = []
    session = sm.Session(
        sm.Settings(), seed=2, clock=Clock(), observers=[TraceWriter(file), seen.append]
    )
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={"q": "hi"}, size=10))
    turn.send(sm.Cancelled("user left", cost=0.25, usage=sm.Usage(input_tokens=10)))
    steps = read_trace(file.getvalue().splitlines(), "cancel.jsonl").steps
    assert [s.record for s in steps] == seen
    last = steps[-1].record
    assert last.event == "Cancelled" and last.cost_usd == 0.25
    assert last.usage == sm.Usage(input_tokens=10, cost_usd=0.25)


@pytest.mark.requirement("ER-130")
def test_the_writer_appends_to_a_path(tmp_path: Path) -> None:
    """Given a path, the writer opens it for appending (a header only in a new file)
    and closes it on close()."""
    path = tmp_path / "session.jsonl"
    session, seen = recorded_session(path)
    # a restarted process restores the session and appends: no second header
    data = session.snapshot()
    writer = TraceWriter(path)
    restored = sm.Session.restore(data, clock=Clock(), observers=[writer, seen.append])
    turn = restored.new_turn()
    turn.start()
    writer.close()
    text = path.read_text(encoding="utf-8")
    assert text.count('"type": "header"') == 1
    trace = read_trace(text.splitlines())
    assert [s.record for s in trace.steps] == seen
    assert trace.steps[-1].record.turn == 3


@pytest.mark.requirement("ER-131")
@pytest.mark.parametrize("name", builtin_names())
def test_every_scenario_reads_and_draws(name: str) -> None:
    """simulate --json output reads (no header: its rows are checked one by one) and
    draws: each step one bold edge with its number, the waits with their seconds,
    the statuses in the title, every (source, dest) of the table drawn."""
    lines = scenario_trace_lines(name)
    trace = read_trace(lines, f"{name}.jsonl")
    assert trace.engine is None
    drawing = draw(trace)
    steps = [json.loads(line) for line in lines if '"type": "step"' in line]
    assert len(drawing.steps) == len(steps)
    several = len({raw["turn"] for raw in steps}) > 1
    for number, (drawn, raw) in enumerate(zip(drawing.steps, steps, strict=True), start=1):
        # named as simulate numbers it: from 1 in its turn, after its turn if several
        name = f"{raw['step'] + 1}"
        assert drawn.name == (f"{raw['turn']}.{name}" if several else name)
        assert drawn.line.startswith(f"turn {raw['turn']} step {name}  t={raw['t']:.3f}s  ")
        assert drawn.number == number
        assert f'<TD ALIGN="LEFT">{drawn.name}</TD><TD ALIGN="LEFT">{raw["event"]}' in drawing.dot
        assert f'class="chip s{number}" data-step="{number}"' in drawing.timeline
        assert f'font-size="11">{drawn.name} {raw["next"]}</text>' in drawing.timeline
        assert drawn.label.startswith(f"{drawn.name}: {raw['event']}")
        action = drawn.traced.record.action
        if isinstance(action, Wait):
            assert f"Wait {action.seconds:.3f}s {action.category.value}" in drawn.label
    pairs = {(raw["state"], raw["next"]) for raw in steps}
    assert drawing.dot.count("penwidth=2.2") == len(pairs)
    for source, dest in pairs:
        assert f'id="pair_{source}__{dest}"' in drawing.dot
    assert drawing.mermaid.count(" ==>|") == len(steps)
    statuses = [
        s.traced.record.action.status.value
        for s in drawing.steps
        if isinstance(s.traced.record.action, Finish)
    ]
    assert ", ".join(statuses) in drawing.title


@pytest.mark.requirement("ER-131")
def test_one_numbering_and_the_sessions_time_in_simulate_the_list_and_the_drawings() -> None:
    """A step has one name everywhere: simulate's table, the step list, the edge labels
    and the path strip count from 1 in its turn (``2.3`` where several turns are
    drawn); times are seconds from the session's first recorded step, not the host's
    raw clock (a TraceWriter file whose clock read 5 s at the start)."""
    file = io.StringIO()
    _, seen = recorded_session(file)
    trace = read_trace(file.getvalue().splitlines())
    both = draw(trace)
    assert [s.name for s in both.steps] == [f"{r.turn}.{r.step + 1}" for r in seen]
    assert both.steps[0].line.startswith("turn 1 step 1  t=0.000s  idle -> assembling")
    second = draw(trace, turn=2)
    start = next(r for r in seen if r.turn == 2)
    assert second.steps[0].line.startswith(f"turn 2 step 1  t={start.at - 5.0:.3f}s  ")
    assert second.steps[2].label.startswith("3: ModelFailed")
    assert 'font-size="11">3 backing_off</text>' in second.timeline
    assert "t = 0 at the session&#x27;s first recorded step" in second.timeline
    code, out, _ = run("simulate", "rate-limit-storm")
    assert code == 0
    assert re.search(r"^ +1 +0\.000  idle -> assembling ", out, re.MULTILINE)
    assert not re.search(r"^ +0 +\d+\.\d{3}  ", out, re.MULTILINE)


@pytest.mark.requirement("ER-131")
def test_the_command_writes_svg_mermaid_and_dot(tmp_path: Path) -> None:
    """``trace FILE --turn N`` writes NAME.dot, NAME.svg (its edges carry the step
    ids) and NAME.mmd, and prints the title with the turn's status."""
    source = tmp_path / "storm.jsonl"
    source.write_text("\n".join(scenario_trace_lines("rate-limit-storm")) + "\n")
    code, out, err = run("trace", str(source), "--turn", "2", "--out", str(tmp_path / "o"))
    assert code == 0, err
    assert "turn 2: retries_exhausted (13 steps" in out
    svg = (tmp_path / "o" / "storm.svg").read_text()
    assert len(re.findall(r'<g id="pair_\w+" class="edge">', svg)) == 5
    assert "failed: Finish(retries_exhausted)" in svg
    timeline = (tmp_path / "o" / "storm-timeline.svg").read_text()
    assert timeline.count('class="bar ') == 6 + 5  # six attempts, five waits
    mermaid = (tmp_path / "o" / "storm.mmd").read_text()
    assert mermaid.startswith("---\ntitle:") and "flowchart LR" in mermaid
    assert (tmp_path / "o" / "storm.dot").read_text().startswith("digraph trace {")


def test_several_scenarios_need_a_choice(tmp_path: Path) -> None:
    """A file of several scenarios draws one chosen with --scenario."""
    source = tmp_path / "two.jsonl"
    lines = scenario_trace_lines("invalid-request") + scenario_trace_lines("content-filtered")
    source.write_text("\n".join(lines) + "\n")
    code, _, err = run("trace", str(source), "--out", str(tmp_path / "o"), "--no-svg")
    assert code == 2
    assert "holds 2 scenarios (invalid-request, content-filtered): choose one" in err
    code, out, _ = run(
        "trace",
        str(source),
        "--scenario",
        "content-filtered",
        "--out",
        str(tmp_path / "o"),
        "--no-svg",
    )
    assert code == 0
    assert "content-filtered: turn 1: content_filtered" in out


def _writer_lines() -> list[str]:
    file = io.StringIO()
    recorded_session(file)
    return file.getvalue().splitlines()


def _edit(lines: list[str], index: int, **changes: object) -> list[str]:
    data = json.loads(lines[index])
    data.update(changes)
    return [*lines[:index], json.dumps(data), *lines[index + 1 :]]


def _bad_traces() -> list[tuple[str, list[str], str]]:
    lines = _writer_lines()
    old_header = {**header(), "version": 0, "engine": "0.1.0"}
    other_table = {**header(), "table": "0" * 64, "engine": "9.9.9"}
    return [
        ("not-json", [lines[0], "{not json", *lines[1:]], ":2: not JSON"),
        ("old-version", [json.dumps(old_header), *lines[1:]], ":1: trace format version 0"),
        ("other-table", [json.dumps(other_table), *lines[1:]], "whose transition table differs"),
        ("other-format", [json.dumps({**header(), "format": "x"}), *lines[1:]], "not a turnstate"),
        (
            "unknown-row",
            _edit(lines, 3, guard="transient & retries_left & wait_fits & sunny"),
            ":4: calling -ModelFailed [transient & retries_left & wait_fits & sunny]-> "
            "backing_off is not a row of this engine's transition table",
        ),
        (
            "wrong-action",
            _edit(lines, 3, action={"$type": "InvokeTools", "calls": []}),
            "emits Wait",
        ),
        ("out-of-order", [*lines[:3], *lines[4:]], ":4: turn 1 step 3 follows step 1"),
        ("bad-action", _edit(lines, 2, action={"$type": "Nope"}), "unknown value type"),
        ("missing-field", _edit(lines, 2, state=None), ":3: state: got None"),
        ("no-steps", [lines[0]], "no steps"),
        ("late-header", [lines[0], *lines[1:3], lines[0]], ":4: a header after the first line"),
        ("odd-type", [*lines, json.dumps({"type": "span"})], "unknown line type 'span'"),
        ("time-backwards", _edit(lines, 3, t=0.0), "time runs backwards"),
        ("forged-status", _forged_finish(lines), "the step says"),
    ]


def _forged_finish(lines: list[str]) -> list[str]:
    """The first Finish of the trace, its status changed to another one."""
    for index, line in enumerate(lines):
        action = json.loads(line).get("action")
        if isinstance(action, dict) and action.get("$type") == "Finish":
            forged = "auth_error" if action["status"] != "auth_error" else "completed"
            return _edit(lines, index, action={**action, "status": forged})
    raise AssertionError("the recorded session has no Finish")


@pytest.mark.requirement("ER-133")
@pytest.mark.parametrize(
    ("case", "lines", "message"), _bad_traces(), ids=[c[0] for c in _bad_traces()]
)
def test_a_trace_that_does_not_fit_is_refused(
    tmp_path: Path, case: str, lines: list[str], message: str
) -> None:
    """Refused with the file, the line and the problem; exit 2; nothing written."""
    source = tmp_path / f"{case}.jsonl"
    source.write_text("\n".join(lines) + "\n")
    out_dir = tmp_path / "out"
    code, out, err = run(
        "trace", str(source), "--out", str(out_dir), "--html", str(tmp_path / "p.html")
    )
    assert code == 2, (out, err)
    assert err.startswith(f"statemachine trace: {source}")
    assert message in err
    assert not out_dir.exists()
    assert not (tmp_path / "p.html").exists()
    with pytest.raises(TraceFileError):
        read_trace(lines)


@pytest.mark.requirement("ER-133")
def test_a_missing_or_binary_file_is_refused(tmp_path: Path) -> None:
    code, _, err = run("trace", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o"))
    assert code == 2 and "No such file" in err
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe\x00")
    code, _, err = run("trace", str(binary), "--out", str(tmp_path / "o"))
    assert code == 2 and "not UTF-8" in err


@pytest.mark.requirement("ER-133")
def test_the_fixtures_of_older_engines_are_refused() -> None:
    """Committed traces: one of a future format version, one whose table row no
    longer exists; both refused."""
    for name, message in (
        ("format-v0.jsonl", "trace format version 0"),
        ("removed-row.jsonl", "is not a row of this engine's transition table"),
    ):
        with pytest.raises(TraceFileError, match=re.escape(message)):
            read_trace((DATA / name).read_text().splitlines(), name)


def chromium() -> str:
    """The headless browser; a failure in CI when it is missing."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed, and CI is set: the page test needs it")
    pytest.skip("chromium is not installed")


PROBE = """<script>
(function () {
  var body = document.body;
  body.setAttribute("data-first", body.getAttribute("data-active"));
  document.querySelector('button[data-step="7"]').click();
  var after = [];
  document.querySelectorAll("#timeline .active").forEach(function (e) {
    after.push(e.getAttribute("class"));
  });
  body.setAttribute("data-lit", after.join("|"));
  // a click on a bar of the timeline selects its step in the list
  var bar = document.querySelector('#timeline rect.bar[data-step="9"]');
  bar.dispatchEvent(new MouseEvent("click", {bubbles: true}));
  var smallest = 1e9;
  document.querySelectorAll("#timeline text").forEach(function (t) {
    var size = parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a;
    smallest = Math.min(smallest, size);
  });
  var svg = document.querySelector("#timeline svg").getBoundingClientRect();
  var list = document.getElementById("steps").getBoundingClientRect();
  body.setAttribute("data-smallest", smallest.toFixed(2));
  body.setAttribute("data-svg", [svg.left, svg.right, svg.top].join(","));
  body.setAttribute("data-list", [list.left, list.right, list.top].join(","));
})();
</script>
</body>"""


@pytest.mark.requirement("ER-132", "ER-162")
def test_the_page_works_in_a_headless_browser(tmp_path: Path) -> None:
    """The --html page in a real headless Chromium, 1,920 px wide: its script ran (the
    page marks itself ready), the step named in the address was the one highlighted
    first, a click on another step's button lights that step's bars and strip chip
    (and nothing else), a click on a bar of the timeline selects its step in the
    list; the timeline stands beside the step list at its own 1,200 px (no text under
    9 px as rendered); and the page loads nothing from outside."""
    browser = chromium()
    source = tmp_path / "storm.jsonl"
    source.write_text("\n".join(scenario_trace_lines("rate-limit-storm")) + "\n")
    page = tmp_path / "incident.html"
    code, _, err = run(
        "trace", str(source), "--turn", "2", "--out", str(tmp_path), "--html", str(page)
    )
    assert code == 0, err
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:|//)""", text)
    assert "<svg" in text and "<?xml" not in text
    clicked = tmp_path / "clicked.html"
    clicked.write_text(text.replace("</body>", PROBE, 1))
    done = subprocess.run(
        [
            browser,
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--disable-extensions",
            "--window-size=1920,1080",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=2000",
            "--dump-dom",
            clicked.as_uri() + "#step_5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    dom = done.stdout
    body = re.search(r"<body ([^>]*)>", dom)
    assert body is not None, done.stderr[-2000:]
    found = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))
    assert found["data-ready"] == "1"
    assert found["data-first"] == "5"
    # step 7 (ModelFailed / Wait) ends attempt 4 and starts the fourth wait: both lit,
    # with its chip on the path strip and its label
    lit = found["data-lit"].split("|")
    assert all(" s7" in f" {c}" for c in lit), lit
    assert sum(c.startswith("bar ") for c in lit) == 2
    assert any(c.startswith("chip ") for c in lit)
    # then the click on the bar of step 9 selected step 9
    assert found["data-active"] == "9"
    pressed = re.findall(r'<button type="button" data-step="(\d+)" aria-pressed="true">', dom)
    assert pressed == ["9"]
    assert float(found["data-smallest"]) >= 9
    svg_left, svg_right, svg_top = map(float, found["data-svg"].split(","))
    list_left, _, list_top = map(float, found["data-list"].split(","))
    assert svg_right - svg_left == 1200
    assert list_left >= svg_right and abs(list_top - svg_top) < 40  # beside, not below
