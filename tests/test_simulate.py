"""The simulator and the scenario files: built-ins, coverage, bad files, expectations."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import statemachine as sm
from statemachine.dev._cli import main
from statemachine.dev._scenarios import (
    ORDER,
    Scenario,
    ScenarioError,
    builtin,
    builtin_names,
    load,
    parse,
)
from statemachine.dev._simulate import EPOCH, StepRecord, run

BUILTINS = builtin_names()


def _scenario(text: str, tmp_path: Path, name: str = "mine") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _trace(scenario: Scenario, seed: int | None = None) -> list[StepRecord]:
    records: list[StepRecord] = []
    run(scenario, seed=seed, on_step=records.append)
    return records


# -- the built-ins -----------------------------------------------------------------


@pytest.mark.requirement("ER-63")
@pytest.mark.parametrize("name", BUILTINS)
def test_every_builtin_runs_and_meets_its_expectations(name: str) -> None:
    """Each built-in plays through the real engine and every expectation it declares
    holds; each declares at least the final turn and session statuses."""
    scenario = builtin(name)
    result = run(scenario)
    assert result.ok, result.failures
    assert scenario.expect_turn_status is not None
    assert scenario.expect_session_status is not None
    assert result.turns
    assert scenario.description


def test_builtins_are_listed_in_their_run_order() -> None:
    """Every shipped scenario file is in ``ORDER`` (so the README's run reads in a
    deliberate order), and every name in it is shipped."""
    assert set(BUILTINS) == set(ORDER)
    assert BUILTINS == ORDER


@pytest.mark.requirement("ER-64")
def test_every_status_and_category_appears_in_a_builtin() -> None:
    """The built-ins end turns with every TurnStatus and sessions with every
    SessionStatus, and script a failure of every ErrorCategory."""
    turn_statuses: set[str] = set()
    session_statuses: set[str] = set()
    categories: set[str] = set()
    for name in BUILTINS:
        scenario = builtin(name)
        result = run(scenario)
        turn_statuses.update(t.status for t in result.turns if t.status)
        if result.session_status:
            session_statuses.add(result.session_status)
        categories.update(
            step.fields["category"]
            for turn in scenario.turns
            for step in turn.steps
            if step.event == "ModelFailed"
        )
    assert {s.value for s in sm.TurnStatus} - turn_statuses == set()
    assert {s.value for s in sm.SessionStatus} - session_statuses == set()
    assert {c.value for c in sm.ErrorCategory} - categories == set()


@pytest.mark.requirement("ER-63")
def test_the_same_seed_gives_the_same_trace_and_another_seed_other_waits() -> None:
    """Runs are deterministic; ``seed`` only changes the jitter of the waits."""
    scenario = builtin("retry-ceiling")
    first, again = _trace(scenario), _trace(scenario)
    assert first == again
    other = _trace(scenario, seed=12345)
    waits = [r.action.seconds for r in first if isinstance(r.action, sm.Wait)]
    other_waits = [r.action.seconds for r in other if isinstance(r.action, sm.Wait)]
    assert len(waits) == len(other_waits) == 20
    assert waits != other_waits
    assert [r.dest for r in first] == [r.dest for r in other]


@pytest.mark.requirement("ER-63")
def test_retry_after_in_every_form_is_honoured_on_the_virtual_clock() -> None:
    """The rate-limit storm's waits are at least what the server asked: 2 s, 3 s,
    4.5 s, and an HTTP-date 30 s after the virtual epoch, measured from then."""
    records = _trace(builtin("rate-limit-storm"))
    waits = [(r.t, r.action.seconds) for r in records if isinstance(r.action, sm.Wait)]
    assert waits[0][1] >= 2
    assert waits[1][1] >= 3
    assert waits[2][1] >= 4.5
    t, seconds = waits[3]
    assert t + seconds == pytest.approx(30.0)
    assert EPOCH == 1_767_225_600.0


def test_auto_waitdone_moves_the_clock_and_is_marked_auto() -> None:
    """After a Wait the simulator advances the virtual clock by its seconds and sends
    WaitDone itself, marked ``auto``; a scripted WaitDone adds its ``takes``."""
    scenario = parse(
        """
        [[turn]]
        steps = [
          {event = "Assembled", size = 10},
          {event = "ModelFailed", category = "overloaded", retry_after = 5},
          {event = "ModelFailed", category = "overloaded", retry_after = 7},
          {event = "WaitDone", takes = 1},
          {event = "ModelReplied"},
        ]
        """,
        "inline.toml",
        "inline",
    )
    records: list[StepRecord] = []
    result = run(scenario, on_step=records.append)
    assert result.ok
    done = [r for r in records if r.event == "WaitDone"]
    assert [r.auto for r in done] == [True, False]
    assert done[0].t == pytest.approx(5.0)
    assert done[1].t == pytest.approx(13.0)
    assert result.elapsed_s == pytest.approx(13.0)


def test_real_time_sleeps_every_wait_and_takes() -> None:
    """With ``sleep`` the simulator sleeps each wait and each step's ``takes``, and
    the trace is the same as without."""
    scenario = builtin("max-wall-clock")
    slept: list[float] = []
    result = run(scenario, sleep=slept.append)
    assert result.ok
    assert slept == [45.0, 30.0, 5.0]
    assert _trace(scenario) == _trace(scenario)


@pytest.mark.requirement("ER-250")
def test_a_scripted_tool_that_cannot_run_trips_its_breaker() -> None:
    """``invoke_failed = true`` scripts a tool that raised: two in a row open the
    provider's breaker (breaker_threshold = 2); the same outcomes without the flag are
    the tool's answers and open nothing. A successful outcome with it is refused."""
    turn = """
        [[turn]]
        repeat = 2
        steps = [
          {{event = "Assembled", size = 10}},
          {{event = "ModelReplied", tool_calls = [{{provider = "p", name = "x"}}]}},
          {{event = "ToolsDone", outcomes = [{{ok = false, category = "unknown"{flag}}}]}},
        ]
        """
    head = "[settings]\nbreaker_threshold = 2\n"
    raising = parse(head + turn.format(flag=", invoke_failed = true"), "inline.toml", "inline")
    statuses = [r.action.status for r in _trace(raising) if isinstance(r.action, sm.Finish)]
    assert statuses[-1] is sm.TurnStatus.BREAKER_OPEN
    answering = parse(head + turn.format(flag=""), "inline.toml", "inline")
    statuses = [r.action.status for r in _trace(answering) if isinstance(r.action, sm.Finish)]
    assert statuses == [sm.TurnStatus.COMPLETED] * 2
    bad = turn.format(flag="").replace(
        'ok = false, category = "unknown"', "ok = true, invoke_failed = true"
    )
    with pytest.raises(ScenarioError, match=r"outcomes\[1\]\.invoke_failed: a successful outcome"):
        parse(bad, "inline.toml", "inline")


def test_outcomes_without_call_ids_go_to_the_invoked_calls_in_order() -> None:
    """ToolsDone outcomes without ``call_id`` are matched to InvokeTools' calls in
    order; the reply's calls get ids ``c<turn>.<n>``."""
    scenario = parse(
        """
        [[turn]]
        steps = [
          {event = "Assembled", size = 10},
          {event = "ModelReplied", tool_calls = [{provider = "a", name = "x"}, {provider = "b", name = "y"}]},
          {event = "ToolsDone", outcomes = [{ok = true}, {ok = false, category = "timeout"}]},
        ]
        """,
        "inline.toml",
        "inline",
    )
    records = _trace(scenario)
    finish = records[-1].action
    assert isinstance(finish, sm.Finish)
    assert [(r.call_id, r.is_error) for r in finish.tool_results] == [
        ("c1.1", False),
        ("c1.2", True),
    ]


# -- bad scenario files ----------------------------------------------------------------


BAD_FILES = [
    pytest.param(
        'description = "x"\n[[turn]]\nsteps = [\n  {event = "Assembled" size = 1},\n]\n',
        4,
        "invalid TOML",
        id="toml-syntax",
    ),
    pytest.param(
        '[[turn]]\nsteps = [\n  {event = "Assembled", size = 1},\n  {event = "ModelFaild"},\n]\n',
        4,
        "turn[1].steps[2].event: unknown event 'ModelFaild'",
        id="unknown-event",
    ),
    pytest.param(
        '[[turn]]\nsteps = [{event = "Assembled", size = 1}]\n[[turn]]\nsteps = [\n'
        '  {event = "Assembled", size = "big"},\n]\n',
        5,
        "turn[2].steps[1].size: must be an integer >= 0, got a string 'big'",
        id="wrong-type",
    ),
    pytest.param(
        '[settings]\nmax_turns = 3\nmax_turn = 4\n[[turn]]\nsteps = [{event = "WaitDone"}]\n',
        3,
        "settings.max_turn: unknown setting",
        id="unknown-setting",
    ),
    pytest.param(
        '[settings]\nbackoff_factor = 0.5\n[[turn]]\nsteps = [{event = "WaitDone"}]\n',
        2,
        "settings.backoff_factor: must be a finite number >= 1",
        id="invalid-setting",
    ),
    pytest.param(
        'seed = 1\nexpect_turn_statu = "completed"\n[[turn]]\nsteps = [{event = "WaitDone"}]\n',
        2,
        "expect_turn_statu: unknown key",
        id="unknown-top-key",
    ),
    pytest.param(
        '[[turn]]\nsteps = [\n  {event = "ModelFailed", category = "rate_limited", retry = 2},\n]\n',
        3,
        "turn[1].steps[1].retry: unknown key",
        id="unknown-step-key",
    ),
    pytest.param(
        '[[turn]]\nsteps = [\n  {event = "ModelFailed", category = "slow"},\n]\n',
        3,
        "turn[1].steps[1].category: must be one of rate_limited",
        id="unknown-category",
    ),
    pytest.param(
        '[[turn]]\nsteps = [\n  {event = "Assembled"},\n]\n',
        3,
        "turn[1].steps[1]: needs 'size'",
        id="missing-field",
    ),
    pytest.param(
        'description = "no turns"\n',
        1,
        "turn: the scenario has no [[turn]] table",
        id="no-turns",
    ),
    pytest.param(
        '[[turn]]\nexpect_status = "done"\nsteps = [{event = "WaitDone"}]\n',
        2,
        ("turn[1].expect_status: must be one of completed", "got a string 'done'"),
        id="bad-expected-status",
    ),
    pytest.param(
        '[[turn]]\nsteps = [{event = "WaitDone"}]\n[[turn]]\nexpect_status = "completed"\n'
        'expect_fallback = 1\nsteps = [{event = "WaitDone"}]\n',
        5,
        "turn[2].expect_fallback: unknown key (known: steps, repeat",
        id="unknown-turn-key-on-its-line",
    ),
    pytest.param(
        '[[turn]]\nexpect_status = "completed"\nrepeat = "twice"\nsteps = [{event = "WaitDone"}]\n',
        3,
        "turn[1].repeat: must be an integer from 1 to 10000, got a string 'twice'",
        id="turn-repeat-on-its-line",
    ),
    pytest.param(
        '[[turn]]\nsteps = [\n  {event = "Assembled", size = 1},\n'
        '  {event = "ModelFailed", category = "overloaded", repeat = 100000000},\n]\n',
        4,
        "turn[1].steps[2].repeat: must be an integer from 1 to 10000, got an integer 100000000",
        id="absurd-step-repeat",
    ),
    pytest.param(
        '[[turn]]\nexpect_status = "completed"\nrepeat = 1000000000\n'
        'steps = [{event = "Assembled", size = 1}, {event = "ModelReplied"}]\n',
        3,
        "turn[1].repeat: must be an integer from 1 to 10000, got an integer 1000000000",
        id="absurd-turn-repeat",
    ),
    pytest.param(
        '[[turn]]\nsteps = [{event = "Assembled", size = 1}, {event = "ModelReplied"}]\n'
        "[[turn]]\nrepeat = 10000\nsteps = [\n"
        '  {event = "Assembled", size = 1},\n'
        '  {event = "ModelFailed", category = "overloaded", repeat = 10000},\n]\n',
        4,
        "turn[2]: the scenario scripts more than 1000000 events up to here",
        id="too-many-events",
    ),
]


@pytest.mark.requirement("ER-65")
@pytest.mark.parametrize(("text", "line", "problem"), BAD_FILES)
def test_bad_scenario_files_name_file_line_and_problem(
    tmp_path: Path, text: str, line: int, problem: str | tuple[str, ...]
) -> None:
    """A bad file is refused with ``<file>:<line>: <path>: <problem>``."""
    path = _scenario(text, tmp_path)
    with pytest.raises(ScenarioError) as caught:
        load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: "), message
    for part in (problem,) if isinstance(problem, str) else problem:
        assert part in message
    assert isinstance(caught.value, sm.ConfigError)


@pytest.mark.requirement("ER-65")
def test_simulate_exits_2_on_a_bad_file_and_runs_nothing(tmp_path: Path) -> None:
    """The CLI prints the error on stderr and exits 2 before running any scenario."""
    good = _scenario('[[turn]]\nsteps = [{event = "Assembled", size = 1}]\n', tmp_path, "good")
    bad = _scenario('[[turn]]\nsteps = [\n  {event = "Nope"},\n]\n', tmp_path, "bad")
    out, err = io.StringIO(), io.StringIO()
    assert main(["simulate", str(good), str(bad)], stdout=out, stderr=err) == 2
    assert f"{bad}:3: turn[1].steps[1].event: unknown event 'Nope'" in err.getvalue()
    assert out.getvalue() == ""
    err = io.StringIO()
    assert main(["simulate", "no-such-scenario"], stdout=out, stderr=err) == 2
    assert "no such built-in scenario" in err.getvalue()
    assert main(["simulate", str(tmp_path / "missing.toml")], stdout=out, stderr=err) == 2
    assert "cannot read the scenario file" in err.getvalue()


@pytest.mark.requirement("ER-65")
def test_simulate_exits_2_on_an_absurd_repeat_without_running_it(tmp_path: Path) -> None:
    """A repeat beyond the bound is a bad file: ``simulate`` says where and exits 2 at
    once (it used to build the whole event list first, and never returned)."""
    bad = _scenario(
        '[[turn]]\nsteps = [\n  {event = "Assembled", size = 1},\n'
        '  {event = "ModelReplied", repeat = 1000000000000},\n]\n',
        tmp_path,
        "absurd",
    )
    out, err = io.StringIO(), io.StringIO()
    assert main(["simulate", str(bad)], stdout=out, stderr=err) == 2
    assert f"{bad}:4: turn[1].steps[2].repeat: must be an integer from 1 to 10000" in err.getvalue()
    assert out.getvalue() == ""


@pytest.mark.requirement("ER-65")
def test_a_scenario_path_with_a_nul_byte_is_a_scenario_error() -> None:
    """No file can have a NUL byte in its name: that is a ScenarioError naming the
    path (exit 2 in the CLI), not a ValueError from the OS layer."""
    with pytest.raises(ScenarioError, match=r"^'a\\x00b\.toml': cannot read the scenario file"):
        load(Path("a\0b.toml"))
    out, err = io.StringIO(), io.StringIO()
    assert main(["simulate", "a\0b.toml"], stdout=out, stderr=err) == 2
    assert "cannot read the scenario file" in err.getvalue()


@pytest.mark.requirement("ER-66")
def test_steps_are_streamed_and_the_left_over_ones_counted(tmp_path: Path) -> None:
    """Repeats at the bound are played one step at a time: a turn that ends early
    counts the steps left over (repeats included) without having built them."""
    path = _scenario(
        '[[turn]]\nrepeat = 2\nsteps = [\n  {event = "Assembled", size = 1},\n'
        '  {event = "ModelFailed", category = "auth_error"},\n'
        '  {event = "ModelReplied", repeat = 10000},\n  {event = "WaitDone", repeat = 10000},\n]\n',
        tmp_path,
    )
    result = run(load(path))
    assert result.failures == (
        f"{path}:6: turn[1].steps[3]: the turn had already finished (auth_error); "
        "20000 step(s) left over",
    )


# -- expectations and script errors ------------------------------------------------------


EXPECTATION_FAILURES = [
    pytest.param(
        'expect_session_status = "error_max_turns"\n[[turn]]\nsteps = [\n'
        '  {event = "Assembled", size = 1},\n  {event = "ModelReplied"},\n]\n',
        ":1: expect_session_status: the session is open, expected error_max_turns",
        id="session-status",
    ),
    pytest.param(
        '[[turn]]\nexpect_status = "completed"\nsteps = [\n  {event = "Assembled", size = 1},\n'
        '  {event = "ModelFailed", category = "auth_error"},\n]\n',
        ":1: turn[1]: turn 1 ended auth_error, expected completed",
        id="turn-status",
    ),
    pytest.param(
        '[[turn]]\nsteps = [\n  {event = "Assembled", size = 1},\n'
        '  {event = "ModelFailed", category = "overloaded", expect_action = "Finish"},\n'
        '  {event = "ModelReplied"},\n]\n',
        ":4: turn[1].steps[2]: expected the engine to answer Finish, it answered Wait",
        id="step-action",
    ),
    pytest.param(
        '[[turn]]\nsteps = [\n  {event = "Assembled", size = 1},\n  {event = "ToolsDone", '
        "outcomes = []},\n]\n",
        ":4: turn[1].steps[2]: ToolsDone is not legal in state 'calling'",
        id="illegal-event",
    ),
    pytest.param(
        '[[turn]]\nsteps = [\n  {event = "Assembled", size = 1},\n  {event = "ModelReplied"},\n'
        '  {event = "ModelReplied"},\n]\n',
        ":5: turn[1].steps[3]: the turn had already finished (completed); 1 step(s) left over",
        id="left-over",
    ),
    pytest.param(
        '[[turn]]\nsteps = [\n  {event = "Assembled", size = 1},\n]\n',
        ":1: turn[1]: the steps ran out in state 'calling'; the engine asked for CallModel",
        id="ran-out",
    ),
    pytest.param(
        "[settings]\nmax_turns = 1\n[[turn]]\nrepeat = 3\nsteps = [\n"
        '  {event = "Assembled", size = 1},\n  {event = "ModelReplied"},\n]\n',
        ":3: turn[1]: the session has already ended (error_max_turns)",
        id="session-ended",
    ),
]


@pytest.mark.requirement("ER-66")
@pytest.mark.parametrize(("text", "failure"), EXPECTATION_FAILURES)
def test_failed_expectations_and_script_errors_are_reported(
    tmp_path: Path, text: str, failure: str
) -> None:
    """Each failed expectation or script/engine disagreement is named with the file and
    the line of the turn or step, and ``simulate`` exits 1."""
    path = _scenario(text, tmp_path)
    result = run(load(path))
    assert not result.ok
    assert any(failure in f for f in result.failures), result.failures
    assert all(f.startswith(str(path)) for f in result.failures)
    out, err = io.StringIO(), io.StringIO()
    assert main(["simulate", str(path)], stdout=out, stderr=err) == 1
    assert "FAILED" in out.getvalue()


@pytest.mark.requirement("ER-66")
def test_expect_fallbacks_and_retries_are_checked(tmp_path: Path) -> None:
    """``expect_fallbacks`` and ``expect_retries_used`` compare with what the engine did."""
    path = _scenario(
        'expect_retries_used = 0\n[settings]\nfallback_models = ["b"]\n'
        "[[turn]]\nexpect_fallbacks = 0\nsteps = [\n"
        '  {event = "Assembled", size = 1},\n'
        '  {event = "ModelFailed", category = "overloaded", repeat = 6},\n'
        '  {event = "ModelReplied"},\n]\n',
        tmp_path,
    )
    result = run(load(path))
    assert result.retries_used == 6
    assert any("fell back 1 time(s), expected 0" in f for f in result.failures)
    # Scenario-level expectations are only judged once the turns themselves agree.
    assert not any("expect_retries_used" in f for f in result.failures)


# -- JSON lines ---------------------------------------------------------------------------


@pytest.mark.requirement("ER-67")
def test_json_output_is_json_lines_with_steps_and_summaries() -> None:
    """Every output line parses as JSON; there is one summary per scenario and one step
    object per transition, with the trace's fields."""
    out, err = io.StringIO(), io.StringIO()
    names = ["rate-limit-storm", "plugin-crash-breaker"]
    assert main(["simulate", "--json", *names], stdout=out, stderr=err) == 0
    objects = [json.loads(line) for line in out.getvalue().splitlines()]
    summaries = [o for o in objects if o["type"] == "summary"]
    steps = [o for o in objects if o["type"] == "step"]
    assert [s["scenario"] for s in summaries] == names
    assert all(s["ok"] for s in summaries)
    assert summaries[1]["session_status"] == "error_circuit_breaker"
    assert len(steps) == sum(len(_trace(builtin(n))) for n in names)
    wait = next(s for s in steps if s["action"]["$type"] == "Wait")
    assert wait["guard"] == "transient & retries_left & wait_fits"
    assert wait["state"] == "calling"
    assert wait["next"] == "backing_off"
    assert {"t", "attempt", "session_retries", "reductions", "event", "detail"} <= set(wait)
