"""The seeded random-walk fuzzer (``tests/fuzz.py``) on a short profile for CI.

Three seeds (two on the random settings mix, one on the defaults) share
``FUZZ_EVENTS`` events (default 45 000, about two seconds); set it higher to fuzz longer,
e.g. ``FUZZ_EVENTS=1000000 python -m pytest tests/test_fuzz.py``. The runs go on
after a violation (``keep_going``), so each test reports every kind of violation of
the property it names, each with its seed, step and replay command.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import pytest

import statemachine as sm

from . import fuzz

EVENTS = int(os.environ.get("FUZZ_EVENTS", "45000"))
PROFILE = ((1, True), (2, True), (3, False))
"""(seed, settings mix) of each run."""

PROPERTIES = {"ER-27", "ER-29", "ER-37", "ER-26", "ER-38", "ER-39"}
"""The requirements with a test of their own below; the rest share one test."""


@pytest.fixture(scope="module")
def runs() -> list[fuzz.Stats]:
    """The profile's runs, once for the module."""
    per_run = max(1, EVENTS // len(PROFILE))
    return [fuzz.run(per_run, seed, settings_mix=mix, keep_going=True) for seed, mix in PROFILE]


def findings(runs: Iterable[fuzz.Stats], *, within: set[str] | None = None) -> list[fuzz.Finding]:
    """The findings of ``runs`` that break a requirement of ``within`` (all without)."""
    return [
        finding
        for stats in runs
        for finding in stats.findings.values()
        if within is None or finding.requirement in within
    ]


def report(found: list[fuzz.Finding], runs: Iterable[fuzz.Stats]) -> str:
    """Every finding (what, where, how to replay it) and the runs' summaries."""
    lines = [finding.describe(tail=8) for finding in found]
    lines += [stats.summary() for stats in runs]
    return "\n".join(lines)


@pytest.mark.requirement("ER-27")
def test_refused_events_change_nothing(runs: list[fuzz.Stats]) -> None:
    """Every illegal event (wrong type for the state, unknown, missing or duplicate
    tool-call ids, a non-event, a second start()) raises IllegalEvent, new_turn()
    while a turn runs raises TurnInProgress (SessionEnded once the session ended),
    none of them changes anything observable, every legal event is taken, and no
    other exception type escapes the engine."""
    assert sum(stats.illegal for stats in runs) > 0
    found = findings(runs, within={"ER-27"})
    assert not found, report(found, runs)


@pytest.mark.requirement("ER-37")
def test_stale_turn_handles_change_nothing(runs: list[fuzz.Stats]) -> None:
    """A turn handle replaced by a later new_turn() (finished, or never started),
    or belonging to an ended session, raises IllegalEvent or SessionEnded on
    start() and send() -- also for the event its last action asked for -- and
    changes nothing of its session or of the current turn."""
    assert sum(stats.stale for stats in runs) > 0
    found = findings(runs, within={"ER-37"})
    assert not found, report(found, runs)


@pytest.mark.requirement("ER-29")
def test_every_turn_ends_within_a_bound(runs: list[fuzz.Stats]) -> None:
    """No turn takes more transitions than twice its longest legal path for its
    settings (and never 10 000): no unbounded loop, whatever the events."""
    assert sum(stats.events for stats in runs) >= EVENTS - len(PROFILE)
    found = findings(runs, within={"ER-29"})
    assert not found, report(found, runs)


@pytest.mark.requirement("ER-26")
def test_snapshots_round_trip(runs: list[fuzz.Stats]) -> None:
    """A snapshot taken anywhere (mid-backoff, mid-tools, between turns, before a
    turn starts) goes through JSON text and restores into a session with the same
    counters and the same snapshot, on which the walk goes on."""
    assert sum(stats.snapshots for stats in runs) > 0
    found = findings(runs, within={"ER-26"})
    assert not found, report(found, runs)


@pytest.mark.requirement("ER-38")
def test_forged_snapshots_are_refused_or_sound(runs: list[fuzz.Stats]) -> None:
    """A snapshot with 1-3 random mutations (types changed, huge, negative and
    non-finite numbers, keys deleted or added, enum names swapped, the trace cut or
    reordered, values nested 5000 deep) is refused with SnapshotError and nothing
    else, or restores into a session on which every invariant holds, that
    snapshots, restores again and can be driven on."""
    assert sum(stats.mutated for stats in runs) > 0
    found = findings(runs, within={"ER-38"})
    assert not found, report(found, runs)


@pytest.mark.requirement("ER-39", "ER-21")
def test_what_is_accepted_can_be_saved(runs: list[fuzz.Stats]) -> None:
    """A session that accepted every event so far always snapshots to JSON
    (allow_nan=False), whatever values the events carried (huge sizes and
    retry-afters, costs summing past the float range); no Wait is NaN, infinite or
    negative; a value refused when an event is built raises TypeError or
    ValueError, not another exception."""
    found = findings(runs, within={"ER-39"})
    assert not found, report(found, runs)


@pytest.mark.requirement(
    "ER-3",
    "ER-5",
    "ER-6",
    "ER-7",
    "ER-9",
    "ER-12",
    "ER-13",
    "ER-15",
    "ER-16",
    "ER-17",
    "ER-18",
    "ER-19",
    "ER-22",
)
def test_recovery_invariants_hold_on_every_step(runs: list[fuzz.Stats]) -> None:
    """On every step of every walk: waits are >= a usable retry-after, within the
    backoff envelope without one, and never cross the wall-clock bound; the caps
    hold; nothing follows auth/invalid errors but a Finish; an overflowed request is
    never resent; a fired limit gives one final-answer turn without tools, then
    SessionEnded; a breaker trips at its threshold and its provider is never invoked
    again; a doom loop fires its limit; the cost is the sum of the accepted costs;
    failed tool outcomes come back as error results."""
    found = [f for f in findings(runs) if f.requirement not in PROPERTIES]
    assert not found, report(found, runs)


def test_a_run_replays_exactly() -> None:
    """Same seed, same run: the fuzzer draws from its seeded RNGs only, so a reported
    seed (or walk seed) replays the same operations."""
    first = fuzz.run(3000, 11, settings_mix=True, keep_going=True)
    second = fuzz.run(3000, 11, settings_mix=True, keep_going=True)

    def shape(stats: fuzz.Stats) -> tuple[Any, ...]:
        return (
            stats.events,
            stats.steps,
            stats.sessions,
            stats.snapshots,
            stats.mutated,
            stats.stale,
            stats.illegal,
            sorted((k, f.walk_seed, f.walk_step) for k, f in stats.findings.items()),
        )

    assert shape(first) == shape(second)


class LyingSession:
    """A planted engine bug: a real session whose ``retries_used`` is 100 too high."""

    def __init__(self, session: sm.Session) -> None:
        self._session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    @property
    def retries_used(self) -> int:
        """The real count plus 100: beyond every ceiling of the mix."""
        return self._session.retries_used + 100


def lying_factory(settings: sm.Settings, seed: int, clock: fuzz.ManualClock) -> LyingSession:
    """Sessions with the planted bug."""
    return LyingSession(fuzz.default_factory(settings, seed, clock))


def test_a_planted_violation_is_detected_and_replays() -> None:
    """The fuzzer can fail: a session that over-reports its retries is caught at its
    first model call, reported with its walk seed, and that walk alone replays to
    the same violation at the same step, as a script that compiles."""
    stats = fuzz.run(2000, 5, settings_mix=True, session_factory=lying_factory)
    assert stats.violations == 1
    (finding,) = stats.findings.values()
    assert finding.kind == "retries-over-ceiling"
    assert finding.requirement == "ER-5"
    assert "--replay-walk" in finding.replay_command()
    again = fuzz.run(
        10**9, 0, settings_mix=True, walk_seed=finding.walk_seed, session_factory=lying_factory
    )
    (replayed,) = again.findings.values()
    assert (replayed.kind, replayed.walk_step) == (finding.kind, finding.walk_step)
    compile(finding.script(), "<replay>", "exec")


class FakeSession:
    """A fabricated session state the engine never reaches: more retries than the
    ceiling, a tripped breaker with no limit, a cost of infinity."""

    def __init__(self) -> None:
        self.settings = sm.Settings(session_retry_ceiling=2)
        self.retries_used = 3
        self.turns = 0
        self.cost_usd = 0.0
        self.status = None
        self.limit_reached = None
        self.tripped_providers: frozenset[str] = frozenset()
        self.crash_counts: dict[str, int] = {}
        self.current_turn = None


def checker(session: FakeSession) -> fuzz.Driver:
    """The fuzzer's checker on a fabricated session."""
    walk = fuzz.Walk(0, settings_mix=False, stats=fuzz.Stats(), limit=0)
    return fuzz.Driver(walk, session, fuzz.ManualClock())


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        ({}, "retries-over-ceiling"),
        ({"retries_used": 0, "tripped_providers": frozenset({"fs"})}, "breaker-limit-not-fired"),
        ({"retries_used": 0, "cost_usd": float("inf")}, "cost-not-finite"),
        ({"retries_used": 0, "turns": 4}, "unreachable-state-accepted:no-turn"),
    ],
)
def test_the_checker_flags_fabricated_states(change: dict[str, Any], kind: str) -> None:
    """The invariants are not vacuous: each fabricated state fails the check that
    names it."""
    session = FakeSession()
    for name, value in change.items():
        setattr(session, name, value)
    with pytest.raises(fuzz.Violation) as caught:
        checker(session).check_static()
    assert caught.value.kind == kind


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -1.0])
def test_the_checker_flags_bad_waits(seconds: float) -> None:
    """A NaN, infinite or negative Wait is a violation."""
    driver = checker(FakeSession())
    with pytest.raises(fuzz.Violation) as caught:
        driver.check_wait(sm.Wait(seconds, sm.ErrorCategory.RATE_LIMITED, 0))
    assert caught.value.kind == "wait-invalid"


def test_the_command_line_prints_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m tests.fuzz`` ends with the one-line summary and exits 0 or 1."""
    status = fuzz.main(["--events", "300", "--seed", "4"])
    out = capsys.readouterr().out.splitlines()
    assert status in (0, 1)
    assert out[-1].startswith("fuzz: events=")
    assert ("violations=0" in out[-1]) == (status == 0)
