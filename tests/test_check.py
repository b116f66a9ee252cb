"""The exhaustive model check: ``python -m statemachine check`` on the defaults and on
the edge settings of ``specs/check-settings/``, and what its report says."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

import statemachine as sm
from statemachine import ConfigError, SessionStatus, Settings, TurnStatus
from statemachine.core._table import BACKING_OFF, CALLING, ROWS, STATES, Row
from statemachine.dev import check as _check
from statemachine.dev.check import check, main, step_bound

SETTINGS_DIR = Path(__file__).resolve().parent.parent / "specs" / "check-settings"
SETTINGS_FILES = sorted(SETTINGS_DIR.glob("*.toml"))


@pytest.fixture(scope="module")
def defaults() -> _check.CheckReport:
    """One model check of the default settings, shared by the tests below."""
    return check(Settings())


@pytest.mark.requirement(
    "ER-1",
    "ER-3",
    "ER-5",
    "ER-6",
    "ER-7",
    "ER-8",
    "ER-9",
    "ER-10",
    "ER-11",
    "ER-12",
    "ER-13",
    "ER-16",
    "ER-18",
    "ER-22",
    "ER-24",
    "ER-27",
    "ER-29",
    "ER-30",
    "ER-31",
    "ER-32",
    "ER-33",
)
def test_defaults_pass_exactly(defaults: _check.CheckReport) -> None:
    """The defaults are explored with exact counters, every property holds and no turn
    is longer than the settings' bound (the check's time is a benchmark, not a test)."""
    assert defaults.ok, defaults.render()
    assert defaults.exact
    assert defaults.states > 1000
    assert defaults.edges > defaults.states
    assert 0 < defaults.longest_turn <= defaults.step_bound == step_bound(Settings())
    assert defaults.seconds > 0


@pytest.mark.requirement("ER-33")
def test_defaults_reach_every_state_and_the_statuses_they_allow(
    defaults: _check.CheckReport,
) -> None:
    """Every state is reached on the defaults; the only status missing is the one
    that needs max_wall_clock_s (unset by default)."""
    assert defaults.reached_states == frozenset(STATES)
    missing = {s.value for s in TurnStatus} - defaults.reached_statuses
    assert missing == {"budget_exhausted"}


@pytest.mark.requirement("ER-33")
def test_report_renders_the_counts(defaults: _check.CheckReport) -> None:
    """The printed report names states, edges, the longest turn and the time."""
    text = defaults.render()
    assert text.startswith("statemachine check: OK (exact)")
    assert f"states {defaults.states}, edges {defaults.edges}" in text
    assert f"longest turn {defaults.longest_turn} steps" in text
    assert text.count(" s") >= 1


@functools.cache
def _file_report(path: Path) -> _check.CheckReport:
    """The check of an edge settings file, made once for the tests that read it."""
    return check(Settings.from_toml(path))


@pytest.mark.parametrize("path", SETTINGS_FILES, ids=[p.stem for p in SETTINGS_FILES])
@pytest.mark.requirement("ER-29", "ER-33")
def test_edge_settings_pass(path: Path) -> None:
    """The check passes on every edge settings file with an OK report; each ``not
    reached:`` row ends with the reason these settings give (none is left unexplained)."""
    report = _file_report(path)
    out = report.render()
    assert report.ok, out
    assert out.startswith("statemachine check: OK")
    assert "longest turn" in out
    for line in out.splitlines():
        if line.startswith("  not reached:"):
            _, why = line.split(" -- ", 1)
            assert why.strip(), line
            assert not why.startswith("these settings allow it"), line


@pytest.mark.requirement("ER-33")
def test_the_command_checks_a_settings_file(capsys: pytest.CaptureFixture[str]) -> None:
    """``statemachine check --settings FILE`` prints the report of that file's settings
    and exits 0 when it is OK (the files themselves are checked above)."""
    path = SETTINGS_DIR / "max-retries-0.toml"
    assert main(["--settings", str(path)]) == 0
    out = capsys.readouterr().out
    expected = _file_report(path)
    assert out.startswith("statemachine check: OK")
    assert f"states {expected.states}, edges {expected.edges}" in out


def test_edge_settings_include_the_ci_cases() -> None:
    """The edge settings CI runs include max_retries=0, breaker_threshold=1, huge caps."""
    loaded = {path.stem: Settings.from_toml(path) for path in SETTINGS_FILES}
    assert any(s.max_retries == 0 for s in loaded.values())
    assert any(s.breaker_threshold == 1 for s in loaded.values())
    assert any(s.max_retries >= 50 and s.session_retry_ceiling >= 1000 for s in loaded.values())


@pytest.mark.requirement("ER-34", "ER-15", "ER-17", "ER-19", "ER-20", "ER-23")
def test_everything_reaches_every_row_state_and_status() -> None:
    """With every feature on (fallbacks, wall clock, cost, turns), the check reaches
    every row of the table, every state, every TurnStatus, and every limit that ends a
    session (turns, cost, wall clock, breaker, doom loop)."""
    report = _file_report(SETTINGS_DIR / "everything.toml")
    assert report.ok, report.render()
    assert report.uncovered_rows == ()
    assert len(report.row_paths) == len(ROWS)
    assert report.reached_states == frozenset(STATES)
    assert report.reached_statuses == {s.value for s in TurnStatus}
    assert report.reached_session_statuses == {s.value for s in SessionStatus}


@pytest.mark.requirement("ER-33")
def test_huge_caps_are_accelerated_and_their_work_does_not_grow() -> None:
    """Huge caps switch to accelerated counters, reach every state, and explore as many
    abstract states and edges as caps twice as large: the work is bounded by the
    saturation, not by the caps (an exact exploration would grow with their product)."""
    report = check(Settings(max_retries=50, session_retry_ceiling=1000))
    assert report.ok, report.render()
    assert not report.exact
    assert report.reached_states == frozenset(STATES)
    larger = check(Settings(max_retries=100, session_retry_ceiling=2000))
    assert not larger.exact
    assert (larger.states, larger.edges) == (report.states, report.edges)


@pytest.mark.parametrize(
    "settings",
    [
        Settings(max_retries=3, session_retry_ceiling=7, max_context_reductions=3),
        Settings(
            max_retries=1,
            session_retry_ceiling=3,
            fallback_models=("a",),
            max_wall_clock_s=50,
            max_server_wait_s=10,
        ),
    ],
    ids=["caps", "fallbacks-clock"],
)
@pytest.mark.requirement("ER-33")
def test_acceleration_keeps_what_exact_reaches(settings: Settings) -> None:
    """On small settings, accelerated counters (saturation 1) reach every state,
    status and row the exact exploration reaches, and find no violation either."""
    exact = check(settings, exact=True)
    fast = check(settings, exact=False, saturation=1)
    assert exact.ok and fast.ok, exact.render() + fast.render()
    assert fast.states < exact.states
    assert fast.reached_states == exact.reached_states
    assert fast.reached_statuses == exact.reached_statuses
    assert set(fast.row_paths) == set(exact.row_paths)


def test_saturation_must_be_positive() -> None:
    """A saturation below 1 is refused with a ConfigError naming it."""
    with pytest.raises(ConfigError, match="saturation"):
        check(Settings(), exact=False, saturation=0)


def test_main_rejects_a_missing_settings_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing or invalid settings file exits 2 with the reason on stderr."""
    assert main(["--settings", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[settings]\nmax_retries = -1\n")
    assert main(["--settings", str(bad)]) == 2
    assert "max_retries" in capsys.readouterr().err


@pytest.mark.requirement("ER-33")
def test_main_exits_non_zero_on_a_violation(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """When a property breaks (here: a table whose auth_error row is gone, so auth
    errors are retried) the command prints FAILED, the path, and exits 1."""
    at = next(i for i, r in enumerate(ROWS) if r.guards == ("auth_error",))
    retry = Row(CALLING, "ModelFailed", ("auth_error", "retries_left"), BACKING_OFF, "wait")
    rows = (*ROWS[:at], retry, *ROWS[at:])
    monkeypatch.setattr(_check, "check", functools.partial(check, rows=rows))
    small = tmp_path / "small.toml"
    small.write_text("[settings]\nmax_retries = 1\nsession_retry_ceiling = 2\n")
    assert main(["--settings", str(small)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("statemachine check: FAILED")
    assert "[ER-9]" in out
    assert "path: start -> Assembled(fresh) -> ModelFailed(auth_error)" in out


def test_checking_a_mutated_table_leaves_the_engine_table_alone() -> None:
    """A mutated table runs in its own ``Dispatch``: the engine's stays the table's."""
    from statemachine.core._engine import DISPATCH

    before = DISPATCH.groups.copy()
    check(Settings(max_retries=1, session_retry_ceiling=1), rows=ROWS[:-1])
    assert DISPATCH.rows == ROWS
    assert before == DISPATCH.groups


TABLE = Path(__file__).resolve().parent.parent / "specs" / "table.md"


@pytest.mark.requirement("ER-36")
def test_table_md_is_generated_from_the_compiled_table() -> None:
    """specs/table.md is exactly what the compiled table renders to; regenerate it
    with ``python -m statemachine check --table specs/table.md`` when the table
    changes."""
    assert TABLE.read_text(encoding="utf-8") == _check.render_table(), (
        "specs/table.md drifted: run python -m statemachine check --table specs/table.md"
    )


@pytest.mark.requirement("ER-36")
def test_table_md_lists_every_row_in_trial_order() -> None:
    """Each row of the table appears in specs/table.md, in the order it is tried."""
    text = _check.render_table()
    for state in {row.source for row in ROWS}:
        section = text.split(f"### {state}\n", 1)[1].split("###", 1)[0].split("\n## ", 1)[0]
        lines = [
            line for line in section.splitlines() if line.startswith("| ") and "---" not in line
        ]
        expected = [
            (row.event, " & ".join(row.guards) or "(otherwise)", row.dest)
            for row in ROWS
            if row.source == state
        ]
        got = [tuple(cell.strip() for cell in line.split("|")[1:4]) for line in lines[1:]]
        assert sorted(got) == sorted(expected)
        for event in {e for e, _, _ in expected}:
            assert [g for g in got if g[0] == event] == [x for x in expected if x[0] == event]


def test_table_option_writes_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--table FILE`` writes the rendered table and exits 0."""
    out = tmp_path / "table.md"
    assert main(["--table", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == _check.render_table()
    assert "wrote" in capsys.readouterr().out


# -- what the settings require, and why a row is not reached ---------------------------


@pytest.mark.requirement("ER-33")
def test_a_wall_clock_below_the_server_wait_does_not_require_retry_deferred() -> None:
    """With ``max_wall_clock_s`` at or below ``max_server_wait_s`` a wait the server asks
    too much for always crosses the wall clock first (``budget_exhausted``), so
    ``retry_deferred`` is not required: the check passes and says why the row is not
    reached."""
    settings = Settings(
        max_wall_clock_s=100, max_server_wait_s=300, max_retries=2, session_retry_ceiling=4
    )
    report = check(settings)
    assert report.ok, report.render()
    assert "retry_deferred" not in report.required_statuses
    assert "budget_exhausted" in report.required_statuses
    (line,) = [x for x in report.render().splitlines() if "server_wait_too_long" in x]
    assert line.startswith("  not reached: calling, ModelFailed [transient & retries_left")
    assert "-- max_wall_clock_s (100 s) <= max_server_wait_s (300 s)" in line


def test_the_defaults_not_reached_rows_name_their_setting(defaults: _check.CheckReport) -> None:
    """On the defaults the two rows left need a fallback model or a wall clock, and the
    report says so."""
    text = defaults.render()
    assert "[transient & fallback_left] -> calling -- fallback_models is empty" in text
    assert "-> failed -- max_wall_clock_s is not set" in text


REASON_CASES = [
    {"max_wall_clock_s": 0.1},
    {"max_wall_clock_s": 0.5, "max_retries": 1, "session_retry_ceiling": 2},
    {"max_turns": 0},
    {"max_cost_usd": 0},
    {"max_wall_clock_s": 0},
    {"max_retries": 1, "session_retry_ceiling": 3, "max_turns": 1, "max_context_reductions": 0},
    {"session_retry_ceiling": 0, "fallback_models": ("a",)},
    {"max_retries": 2, "session_retry_ceiling": 2, "fallback_models": ("a",), "max_wall_clock_s": 50},
    {"max_retries": 1, "session_retry_ceiling": 1, "fallback_models": ("a",), "max_wall_clock_s": 50},
    {"max_retries": 1, "session_retry_ceiling": 3, "base_delay_ms": 0, "max_wall_clock_s": 5},
    {"max_retries": 3, "session_retry_ceiling": 6, "max_wall_clock_s": 2, "max_server_wait_s": 1},
    {"max_retries": 1, "session_retry_ceiling": 3, "max_wall_clock_s": 10.5, "max_server_wait_s": 10},
    {"max_retries": 1, "session_retry_ceiling": 3, "max_wall_clock_s": 100, "max_server_wait_s": 300},
    {"max_retries": 0, "session_retry_ceiling": 2, "max_context_reductions": 0},
    {"max_retries": 1, "session_retry_ceiling": 2, "base_delay_ms": 4000, "max_wall_clock_s": 1},
]  # fmt: skip


@pytest.mark.requirement("ER-33")
@pytest.mark.parametrize(
    "fields", REASON_CASES, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items())
)
def test_row_reasons_agree_with_the_exploration(fields: dict[str, object]) -> None:
    """On small settings (exact counters) the check passes; every row ``row_reason``
    finds no reason against is reached, and no row it says cannot be reached is (a
    reason starting "may" depends on the jitter, either way is fine)."""
    settings = Settings(**fields)
    report = check(settings, exact=True)
    assert report.ok, report.render()
    for i, row in enumerate(report.rows):
        why = _check.row_reason(settings, row)
        where = f"{row.source}, {row.event} {row.guards}: {why}"
        if why is None:
            assert i in report.row_paths, where
        elif not why.startswith("may"):
            assert i not in report.row_paths, where
            assert report.row_reasons[i] == why


def test_every_builtin_scenarios_settings_are_checked() -> None:
    """The settings every built-in scenario runs on are an edge settings file, so CI
    model-checks them (``statemachine check --settings`` on each file)."""
    from statemachine.dev._scenarios import builtin, builtin_names

    checked = [Settings.from_toml(path) for path in SETTINGS_FILES]
    for name in builtin_names():
        scenario = builtin(name)
        if scenario.settings_table:
            assert scenario.settings in checked, name


@pytest.mark.requirement("ER-38")
def test_restores_rules_from_a_known_prefix_find_what_the_full_check_finds() -> None:
    """The checker runs restore's rules on each new node from the steps its parent's
    path did not have (``checked``): on a state the engine reached, every prefix finds
    nothing; with the last step's counters made wrong, every prefix short of it finds
    the full check's problem."""
    from statemachine.core._reachable import reachable_problem
    from statemachine.core._state import make_step

    settings = Settings()
    session = sm.Session(settings, seed=1, clock=lambda: 0.0)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled({"q": 1}, 10))
    rate_limited = sm.ModelFailed(sm.ModelError("rate_limited"))
    turn.send(rate_limited)
    turn.send(sm.WaitDone())
    turn.send(rate_limited)
    state = session.state
    steps = len(state.turn.path)
    assert steps == 5
    for checked in range(steps + 1):
        assert reachable_problem(state, settings, checked=checked) is None
    path = state.turn.path
    info, *counters = path[-1]
    path[-1] = make_step(info, counters[0] + 1, *counters[1:])
    full = reachable_problem(state, settings)
    assert full is not None and full.startswith(f"turn.path[{steps - 1}]: counters")
    for checked in range(steps):
        assert reachable_problem(state, settings, checked=checked) == full
