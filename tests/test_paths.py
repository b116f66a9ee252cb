"""Tests from the graph: the shortest event path to every row of the table.

The model check's breadth-first search records, for every row it fires, the first
(hence shortest) path of representative events that fires it. Each path is
replayed here on a fresh real ``Session`` and must end with that very row, so every
edge of the table is exercised at least once (as XState's model-based testing
does); the coverage is reported and must be complete.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from statemachine import Settings
from statemachine.core._table import ROWS
from statemachine.dev.check import CheckReport, check, replay

EVERYTHING = Settings.from_toml(
    Path(__file__).resolve().parent.parent / "specs" / "check-settings" / "everything.toml"
)


@pytest.fixture(scope="module")
def report() -> CheckReport:
    """The exact model check of the settings that turn every feature on."""
    result = check(EVERYTHING, exact=True)
    assert result.ok, result.render()
    return result


def _label(index: int) -> str:
    row = ROWS[index]
    return f"{index:02d} {row.source}, {row.event} [{' & '.join(row.guards)}] -> {row.dest}"


@pytest.mark.requirement("ER-34")
def test_every_row_is_covered(report: CheckReport, capsys: pytest.CaptureFixture[str]) -> None:
    """Every row of the table has a generated path; the coverage is printed."""
    with capsys.disabled():
        print(f"\nedge coverage: {len(report.row_paths)}/{len(ROWS)} rows")
    assert set(report.row_paths) == set(range(len(ROWS)))


@pytest.mark.parametrize("index", range(len(ROWS)), ids=_label)
@pytest.mark.requirement("ER-34")
def test_shortest_path_fires_its_row_on_the_real_engine(report: CheckReport, index: int) -> None:
    """Replaying the row's shortest path on a fresh session ends with a transition
    through exactly that row (source, event, guards, destination)."""
    row = ROWS[index]
    path = report.row_paths[index]
    session = replay(EVERYTHING, path)
    turn = session.current_turn
    assert turn is not None
    last = turn.trace[-1]
    assert (last.source, last.event, last.guard, last.dest) == (
        row.source,
        row.event,
        " & ".join(row.guards),
        row.dest,
    )
    if row.status is not None:
        assert turn.status is not None
        assert turn.status.value == row.status


@pytest.mark.requirement("ER-34")
def test_paths_are_shortest_and_deterministic(report: CheckReport) -> None:
    """A breadth-first path is no longer than any other found for the same row's
    source state, and replaying it twice gives the same trace."""
    for index, path in report.row_paths.items():
        first = replay(EVERYTHING, path).current_turn
        second = replay(EVERYTHING, path).current_turn
        assert first is not None and second is not None
        assert first.trace == second.trace, _label(index)
    start = report.row_paths[0]
    assert [step.describe() for step in start] == ["start"]


@pytest.mark.requirement("ER-34")
def test_defaults_leave_only_settings_dependent_rows_uncovered() -> None:
    """On the defaults, the rows left uncovered need a fallback model or a wall
    clock bound, which the defaults do not set."""
    result = check(Settings(max_retries=2, session_retry_ceiling=5), exact=True)
    uncovered = {(r.source, r.event, r.guards) for r in result.uncovered_rows}
    assert uncovered == {
        ("calling", "ModelFailed", ("transient", "fallback_left")),
        ("calling", "ModelFailed", ("transient", "retries_left", "wait_crosses_wall_clock")),
    }
