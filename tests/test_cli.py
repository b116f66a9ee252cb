"""The command line (help, exit codes, dispatch, progress) and the README's promises."""

from __future__ import annotations

import importlib.metadata
import io
import json
import re
import subprocess
import sys
import types
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import attrs
import pytest

import statemachine as sm
from statemachine import __main__ as entry
from statemachine.dev import _vendor
from statemachine.dev._cli import main
from statemachine.dev._scenarios import builtin, builtin_names, parse
from statemachine.dev._simulate import run

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {
    name: (ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8")
    for name in ("machine", "settings", "simulate")
}


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


# -- help and exit codes ----------------------------------------------------------------


@pytest.mark.requirement("ER-68")
@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--help"], ["simulate", "diagram", "check", "vendor"]),
        (
            ["simulate", "--help"],
            ["--json", "--real-time", "--seed", "--list", "--spans", "SCENARIO", "docs/simulate.md"],
        ),
        (["diagram", "--help"], ["--out", "--check", "--require-svg"]),
        (["vendor", "--help"], ["--script", "--port", "ANTHROPIC_BASE_URL", "docs/drivers.md"]),
    ],
)
def test_help_for_the_program_and_each_subcommand(
    argv: list[str], words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--help`` exits 0 and names the subcommands or the options."""
    assert main(argv) == 0
    shown = capsys.readouterr().out
    for word in words:
        assert word in shown


@pytest.mark.requirement("ER-68")
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """No subcommand, an unknown one or an unknown option: exit 2 with a usage message."""
    assert main([]) == 2
    assert main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert main(["simulate", "--seed", "x"]) == 2
    assert "invalid int value" in capsys.readouterr().err


@pytest.mark.requirement("ER-68")
def test_main_module_and_console_script_share_one_entry_point() -> None:
    """``statemachine.__main__.main`` is what the ``statemachine`` console script runs,
    and it returns the command's exit code."""
    scripts = importlib.metadata.entry_points(group="console_scripts")
    (script,) = [ep for ep in scripts if ep.name == "statemachine"]
    assert script.value == "statemachine.__main__:main"
    assert script.load() is entry.main
    assert entry.main(["simulate", "content-filtered", "--json"]) == 0


@pytest.mark.requirement("ER-68")
def test_check_is_dispatched_to_the_model_checker(monkeypatch: pytest.MonkeyPatch) -> None:
    """``check ARGS`` calls ``statemachine.dev.check.main(ARGS)`` and returns its code."""
    seen: list[list[str]] = []
    fake = types.ModuleType("statemachine.dev.check")
    fake.main = lambda argv: seen.append(list(argv)) or 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "statemachine.dev.check", fake)
    assert main(["check", "--settings", "x.toml"]) == 3
    assert seen == [["--settings", "x.toml"]]


@pytest.mark.requirement("ER-68")
def test_check_without_the_model_checker_says_so_and_exits_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """If ``statemachine.dev.check`` is not installed, ``check`` prints a clear message."""

    def missing(name: str) -> None:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    monkeypatch.setattr("statemachine.dev._cli.importlib.import_module", missing)
    code, _, err = _run("check")
    assert code == 2
    assert "model checker" in err
    assert "statemachine/dev/check/" in err


@pytest.mark.requirement("ER-63")
def test_list_names_every_builtin_with_its_description() -> None:
    """``simulate --list`` prints one line per built-in: its name and description."""
    code, out, _ = _run("simulate", "--list")
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == list(builtin_names())
    assert builtin("doom-loop").description in out


@pytest.mark.requirement("ER-63")
def test_text_trace_shows_steps_counters_and_statuses() -> None:
    """The readable trace has a row per transition with the state move, event, action,
    counters and guards, then each turn's and the session's final status."""
    code, out, _ = _run("simulate", "max-turns", "overloaded-fallback")
    assert code == 0
    assert "== max-turns: max_turns = 3, then the final-answer turn" in out
    assert "turn 4 (final-answer turn: tools withheld)" in out
    assert "=> session ended: error_max_turns" in out
    assert "=> limit reached: error_max_turns" in out
    assert re.search(r"calling -> backing_off\s+ModelFailed overloaded\s+Wait \d", out)
    assert "[transient & retries_left & wait_fits]" in out
    assert "CallModel attempt=0 model=backup" in out
    assert "2 scenario(s): all expectations held" in out


_STEP_ROW = re.compile(r"^  +\d+ +\d+\.\d{3}  ")


_ROW_CELL = re.compile(r"  +(\d+)(?: \[([^]]*)\])?$")


def _step_rows(out: str) -> list[str]:
    """The trace's transition rows, without their row column (the last: the table row's
    number, then its guards, unpadded)."""
    return [_ROW_CELL.sub("", line) for line in out.splitlines() if _STEP_ROW.match(line)]


@pytest.mark.requirement("ER-63")
def test_the_row_column_is_the_number_of_the_table_row_that_fired() -> None:
    """Each step's row column holds the number of its row in the transition table (as
    the table under the diagram numbers them), then that row's guards: the
    row of that number has the step's states, and its guards are the ones printed."""
    from statemachine.core._table import ROWS
    from statemachine.dev._diagrams import ROW_NUMBERS, row_key

    code, out, _ = _run("simulate")
    assert code == 0
    seen = set()
    for line in out.splitlines():
        if not _STEP_ROW.match(line):
            continue
        cell = _ROW_CELL.search(line)
        assert cell, line
        number = int(cell.group(1))
        row = ROWS[number - 1]
        assert ROW_NUMBERS[row_key(row)] == number
        assert f" {row.source} -> {row.dest} " in line, (number, line)
        assert (cell.group(2) or "") == row.label, (number, line)
        seen.add(number)
    assert len(seen) > 20  # the built-ins fire most of the table


@pytest.mark.requirement("ER-63")
def test_trace_columns_stay_aligned_when_cells_are_long() -> None:
    """An HTTP-date retry-after or a reply's tool calls are longer than their column:
    the cell is cut and ends in "...", so every row (and the header) keeps its
    columns; the counters always end at the same place."""
    code, out, _ = _run("simulate", "rate-limit-storm", "plugin-crash-breaker", "doom-loop")
    assert code == 0
    rows = _step_rows(out)
    assert len({len(row) for row in rows}) == 1, {len(row) for row in rows}
    header = next(line for line in out.splitlines() if line.lstrip().startswith("#"))
    assert header.index("att") + 3 == header.index("ret") - 1
    counters = header.index("red") + 3
    assert all(len(row) == counters for row in rows)
    (dated,) = [row for row in rows if "retry-after: Thu" in row]
    assert "... Wait 20.500s" in dated
    calls = [row for row in rows if "calls search-plugin" in row]
    assert calls and all("..." in row for row in calls)


@pytest.mark.requirement("ER-63")
def test_counter_columns_widen_for_large_caps(tmp_path: Path) -> None:
    """With caps of four digits the counter columns are four wide, header and rows."""
    path = tmp_path / "wide.toml"
    path.write_text(
        "[settings]\nmax_retries = 1500\nsession_retry_ceiling = 3000\n[[turn]]\nsteps = [\n"
        '  {event = "Assembled", size = 1},\n'
        '  {event = "ModelFailed", category = "overloaded", repeat = 3},\n'
        '  {event = "ModelReplied"},\n]\n',
        encoding="utf-8",
    )
    code, out, _ = _run("simulate", str(path))
    assert code == 0
    header = next(line for line in out.splitlines() if line.lstrip().startswith("#"))
    assert header.endswith(" att  ret  red  row")
    rows = _step_rows(out)
    assert len({len(row) for row in rows}) == 1
    assert all(len(row) == header.index("red") + 3 for row in rows)


@pytest.mark.requirement("ER-63")
def test_turn_summary_shows_the_turns_own_cost_and_the_sessions_apart() -> None:
    """Under each turn: that turn's cost and retries, then the session's running
    totals (it used to show the session's spend as if it were the turn's)."""
    code, out, _ = _run("simulate", "plugin-crash-breaker", "rate-limit-storm")
    assert code == 0
    assert (
        "=> turn 2: completed   (this turn: cost $0.01, 0 retries; session: cost $0.02, 0 retries)"
        in out
    )
    assert (
        "=> turn 2: retries_exhausted   (this turn: cost $0, 5 retries; "
        "session: cost $0.004, 9 retries)" in out
    )


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal_stderr() -> None:
    """Running several scenarios draws a progress bar on stderr when it is a terminal,
    and clears it; stdout never gets it, and a non-terminal stderr stays empty."""
    out, err = io.StringIO(), _Terminal()
    assert main(["simulate", "content-filtered", "unknown-error"], stdout=out, stderr=err) == 0
    assert "[" in err.getvalue()
    assert "1/2 unknown-error" in err.getvalue()
    assert err.getvalue().endswith("\r\x1b[K")
    assert "\r" not in out.getvalue()
    code, _, plain_err = _run("simulate", "content-filtered", "unknown-error")
    assert code == 0
    assert plain_err == ""


@pytest.mark.requirement("ER-63")
def test_readme_first_command_in_a_subprocess() -> None:
    """``python -m statemachine simulate`` runs every built-in, prints their traces and
    statuses and exits 0, as the README's first command promises."""
    done = subprocess.run(
        [sys.executable, "-m", "statemachine", "simulate"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in builtin_names():
        assert f"== {name}: " in done.stdout
    assert f"{len(builtin_names())} scenario(s): all expectations held" in done.stdout
    assert done.stdout.count("OK: every expectation held") == len(builtin_names())


# -- the README ---------------------------------------------------------------------------


def _blocks(language: str, text: str = README) -> list[str]:
    """The fenced blocks of ``language`` of ``text`` (the README), skipping any right
    after a ``<!-- not-run -->`` comment (for examples that need a network or an API key)."""
    pattern = re.compile(rf"(<!-- not-run -->\s*)?```{language}\n(.*?)```", re.DOTALL)
    return [match.group(2) for match in pattern.finditer(text) if not match.group(1)]


@pytest.mark.requirement("ER-69")
def test_readme_python_blocks_run() -> None:
    """Every Python block of the README runs as written (in order, sharing names)."""
    blocks = _blocks("python")
    assert blocks
    namespace: dict[str, object] = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    assert "session" in namespace


@pytest.mark.requirement("ER-69")
def test_readme_mermaid_block_is_the_generated_diagram() -> None:
    """docs/machine.md's mermaid block is ``diagrams/turn.mmd``, byte for byte."""
    (block,) = _blocks("mermaid", DOCS["machine"])
    assert block == (ROOT / "diagrams" / "turn.mmd").read_text(encoding="utf-8"), (
        "run: python -m statemachine diagram --readme docs/machine.md"
    )


@pytest.mark.requirement("ER-69")
def test_readme_set_up_commands_are_the_ones_ci_runs() -> None:
    """The README opens with its two set-up commands: the first creates and activates a
    virtual environment (the name clash cannot reach it), installs and runs simulate;
    the second is the test command, which CI runs verbatim (give or take pip's
    ``-q``), on one pytest-xdist worker per core; then the fast lane."""
    (commands,) = _blocks("sh")[:1]
    lines = [line.split("#")[0].strip() for line in commands.splitlines()]
    assert lines[0] == (
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e . "
        "&& python -m statemachine simulate"
    )
    tests = lines[1]
    assert tests.endswith("&& python -m pytest -n auto")
    assert tests.startswith("pip install -e '.[dev,")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").replace(" -q ", " ")
    assert tests in ci.splitlines()
    assert 'python -m pytest -m "not slow"' in lines


@pytest.mark.requirement("ER-69")
def test_readme_scenario_example_runs_and_builtin_table_matches() -> None:
    """docs/simulate.md's scenario example is valid and meets its expectations, and its
    table of built-ins gives each one's real turn and session statuses."""
    (example,) = [block for block in _blocks("toml", DOCS["simulate"]) if "[[turn]]" in block]
    result = run(parse(example, "docs/simulate.md", "readme"))
    assert result.ok, result.failures
    row = re.compile(r"^\| `([a-z-]+)` \| [^|]+ \| ([a-z_, ]+) \| ([a-z_]+) \|$", re.MULTILINE)
    rows = {m.group(1): (m.group(2), m.group(3)) for m in row.finditer(DOCS["simulate"])}
    assert set(rows) == set(builtin_names())
    for name, (turns, session) in rows.items():
        outcome = run(builtin(name))
        assert turns == ", ".join(str(t.status) for t in outcome.turns), name
        assert session == (outcome.session_status or "open"), name


@pytest.mark.requirement("ER-69")
def test_readme_settings_table_lists_every_field_with_its_default() -> None:
    """Each ``Settings`` field has a row in docs/settings.md with its real default."""
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| ([^|]+?) \|", DOCS["settings"], re.MULTILINE))
    defaults = sm.Settings()
    for field in attrs.fields(sm.Settings):
        assert field.name in rows, field.name
        value = getattr(defaults, field.name)
        assert rows[field.name] == ("()" if value == () else str(value)), field.name


# -- vendor ---------------------------------------------------------------------------


def _post(url: str, path: str) -> tuple[int, dict[str, Any], str | None]:
    request = urllib.request.Request(url + path, data=b"{}", method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
            return response.status, json.load(response), response.headers.get("retry-after")
    except urllib.error.HTTPError as error:
        return error.code, json.load(error), error.headers.get("retry-after")


@pytest.mark.requirement("ER-68")
def test_the_default_vendor_script_answers_each_vendor_and_starts_over() -> None:
    """The built-in script: for Anthropic a 429 with retry-after 1, a 529, a tool call
    and an answer, in the vendors' wire formats (OpenAI: 429, 503, tool call, answer);
    a used-up script starts over with repeat, and answers 418 without."""
    script = _vendor.parse_script(_vendor.DEFAULT_SCRIPT, "default")
    with _vendor.LoopbackVendor(repeat=True) as vendor:
        for path, responses in script.items():
            vendor.script(path, *responses)
        anthropic = [_post(vendor.url, _vendor.ANTHROPIC) for _ in range(5)]
        openai = [_post(vendor.url, _vendor.OPENAI) for _ in range(4)]
    assert [status for status, _, _ in anthropic] == [429, 529, 200, 200, 429]
    assert anthropic[0][1]["error"]["type"] == "rate_limit_error"
    assert anthropic[0][2] == "1"
    assert anthropic[1][1]["error"]["type"] == "overloaded_error"
    tool_use = anthropic[2][1]["content"][1]
    assert (tool_use["type"], tool_use["name"], tool_use["input"]) == (
        "tool_use",
        "get_weather",
        {"city": "Paris"},
    )
    assert anthropic[3][1]["stop_reason"] == "end_turn"
    assert [status for status, _, _ in openai] == [429, 503, 200, 200]
    (call,) = openai[2][1]["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    with _vendor.LoopbackVendor() as once:
        once.script(_vendor.ANTHROPIC, *script[_vendor.ANTHROPIC][:1])
        assert [_post(once.url, _vendor.ANTHROPIC)[0] for _ in range(2)] == [429, 418]


@pytest.mark.requirement("ER-68")
@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[[anthropic]]\nstatus = 429\nretry_after = -1\n", "anthropic[1]: retry_after: expected"),
        ("[[openai]]\ntext = 'a'\n[[openai]]\nstatuss = 500\n", "openai[2]: unknown key 'statuss'"),
        ("[[gemini]]\nstatus = 200\n", "unknown table 'gemini'"),
        ("[[anthropic]]\nstatus = 302\n", "anthropic[1]: status: expected 200 or an error"),
        ("[[anthropic]]\nstatus = 500\ntool = 'x'\n", "anthropic[1]: tool: only a reply"),
        ("[[anthropic]]\ntext = 'a'\nretry_after = 1\n", "retry_after: only an error"),
        ("[[anthropic]]\narguments = {a = 1}\n", "arguments: given without a tool"),
        ("anthropic = 3\n", "anthropic: expected an array of tables"),
        ("# nothing\n", "nothing to serve"),
        ("[[anthropic]\n", "invalid TOML"),
    ],
)
def test_a_bad_vendor_script_is_refused_naming_the_table_and_key(
    tmp_path: Path, text: str, problem: str
) -> None:
    """A script with a wrong key, value or table is refused (exit 2) naming the file,
    the table (counted from 1) and the key, and nothing is served."""
    path = tmp_path / "script.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(sm.ConfigError, match=re.escape(problem)):
        _vendor.load_script(path)
    code, out, err = _run("vendor", "--script", str(path), "--port", "0")
    assert code == 2
    assert out == ""
    assert str(path) in err
    assert problem in err


@pytest.mark.requirement("ER-68")
def test_the_vendor_command_refuses_a_port_in_use_and_a_missing_script(tmp_path: Path) -> None:
    """A port another server holds and a script file that is not there: exit 2, saying which."""
    with _vendor.LoopbackVendor() as busy:
        port = busy.url.rsplit(":", 1)[1]
        code, _, err = _run("vendor", "--port", port)
    assert code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in err
    code, _, err = _run("vendor", "--script", str(tmp_path / "missing.toml"))
    assert code == 2
    assert "missing.toml: cannot read the script" in err


@pytest.mark.requirement("ER-68")
def test_simulate_spans_without_the_opentelemetry_sdk_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``simulate --spans`` needs opentelemetry-sdk; without it: exit 2 and the install line."""
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    code, _, err = _run("simulate", "--spans", "rate-limit-storm")
    assert code == 2
    assert "opentelemetry.sdk.trace is missing" in err
    assert "pip install -e '.[otel]' opentelemetry-sdk" in err
