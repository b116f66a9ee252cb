"""What the mutation run of ``core/_session.py`` found untested (specs/mutation.md):
the default seed, the constructor's refusals, a child's id and seed, idle time, and
which error a stale handle gets."""

from __future__ import annotations

import pytest

import statemachine as sm

from .helpers import ManualClock, fail


def _waits(session: sm.Session, n: int = 3) -> list[float]:
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={}, size=1))
    waits = []
    for _ in range(n):
        action = turn.send(fail("rate_limited"))
        assert isinstance(action, sm.Wait)
        waits.append(action.seconds)
        turn.send(sm.WaitDone())
    return waits


@pytest.mark.requirement("ER-25", "ER-146")
@pytest.mark.parametrize("drawn", [0, 12345, 2**64 - 1])
def test_the_default_seed_is_64_bits_drawn_from_the_operating_system(
    drawn: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Session()`` takes 64 random bits of ``secrets`` as its seed (documented: sessions
    made alike jitter apart), keeps them in its snapshot and jitters by them: the waits
    of ``seed=<the drawn bits>``. A seed given is taken as it is, and none is drawn."""
    asked: list[int] = []

    def randbits(bits: int) -> int:
        asked.append(bits)
        return drawn

    monkeypatch.setattr("statemachine.core._session.secrets.randbits", randbits)
    default = sm.Session(sm.Settings(), clock=ManualClock())
    assert asked == [64]
    assert default.seed == drawn and default.snapshot()["seed"] == drawn
    assert _waits(default) == _waits(sm.Session(sm.Settings(), seed=drawn, clock=ManualClock()))
    assert sm.Session(sm.Settings(), seed=0, clock=ManualClock()).seed == 0
    assert asked == [64]  # a seed given draws nothing


@pytest.mark.requirement("ER-28")
@pytest.mark.parametrize("seed", [True, 1.0, "7", b"7"])
def test_a_seed_that_is_not_an_int_is_refused(seed: object) -> None:
    with pytest.raises(sm.ConfigError, match="seed: must be an int or None"):
        sm.Session(sm.Settings(), seed=seed, clock=ManualClock())  # type: ignore[arg-type]


@pytest.mark.requirement("ER-28")
def test_settings_that_are_not_settings_are_refused() -> None:
    with pytest.raises(sm.ConfigError, match="settings: must be a Settings"):
        sm.Session({"max_retries": 2}, clock=ManualClock())  # type: ignore[arg-type]
    state = sm.Session(sm.Settings(), clock=ManualClock()).state
    with pytest.raises(sm.ConfigError, match="settings: must be a Settings"):
        sm.Session.from_state({"max_retries": 2}, state, ManualClock())  # type: ignore[arg-type]


@pytest.mark.requirement("ER-80")
def test_a_child_id_may_be_neither_its_parents_nor_a_siblings() -> None:
    """Spend is reported by id, so a child named like its parent, or like a sibling, is
    refused (each on its own); an ended session spawns nothing."""
    parent = sm.Session(sm.Settings(), seed=5, clock=ManualClock(), session_id="root")
    first = parent.spawn()
    assert first.session_id == "root.1"
    with pytest.raises(sm.ConfigError, match="'root' is taken"):
        parent.spawn(session_id="root")
    with pytest.raises(sm.ConfigError, match=r"'root\.1' is taken"):
        parent.spawn(session_id="root.1")
    assert parent.spawn(session_id="helper").session_id == "helper"
    parent.end("completed")
    with pytest.raises(sm.SessionEnded, match="it spawns no child"):
        parent.spawn()


@pytest.mark.requirement("ER-80", "ER-25")
def test_a_childs_seed_is_derived_from_its_parents_by_the_documented_formula() -> None:
    """seed(child n) = (seed * 0x9E3779B97F4A7C15 + n) mod 2**64: known answers, so the
    derivation cannot change unnoticed (a changed constant changes every child's jitter)."""
    parent = sm.Session(sm.Settings(), seed=7, clock=ManualClock())
    seeds = [parent.spawn().snapshot()["seed"] for _ in range(2)]
    assert seeds == [6018027440424182932, 6018027440424182933]
    assert parent.spawn(seed=3).snapshot()["seed"] == 3


@pytest.mark.requirement("ER-93")
def test_idle_time_counts_only_after_a_finish_and_never_backwards() -> None:
    """``idle_s`` is 0 while no turn has finished (or one runs), grows from a Finish
    until the next start, and a clock that steps back adds nothing."""
    clock = ManualClock()
    session = sm.Session(sm.Settings(), clock=clock)
    clock.advance(5.0)
    assert session.idle_s == 0.0  # nothing finished yet: thinking before turn 1 is not idle
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={}, size=1))
    clock.advance(2.0)
    assert session.idle_s == 0.0
    turn.send(sm.ModelReplied())
    clock.advance(3.0)
    assert session.idle_s == 3.0
    clock.advance(-10.0)  # a clock that steps back
    assert session.idle_s == 0.0


@pytest.mark.requirement("ER-37")
def test_a_replaced_handle_gets_illegal_event_and_after_the_end_session_ended() -> None:
    """A handle replaced by a later turn is told so (``IllegalEvent``); once the session
    has ended, the same handle is told the session ended (``SessionEnded``)."""
    session = sm.Session(sm.Settings(), clock=ManualClock())
    old = session.new_turn()
    old.start()
    old.send(sm.Cancelled())
    session.new_turn()
    with pytest.raises(sm.IllegalEvent, match="it was replaced by turn 2") as replaced:
        old.send(sm.WaitDone())
    assert not isinstance(replaced.value, sm.SessionEnded)
    session.end("cancelled")
    with pytest.raises(sm.SessionEnded, match="belongs to a session that has ended"):
        old.send(sm.WaitDone())


@pytest.mark.requirement("ER-28")
@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"clock": 5.0}, "clock: clock and wall_clock must be callables"),
        ({"wall_clock": "now"}, "clock: clock and wall_clock must be callables"),
        ({"doom_check": 3}, "doom_check: must be a callable or None"),
        ({"session_id": ""}, "session_id: must be a non-empty str or None"),
        ({"session_id": 7}, "session_id: must be a non-empty str or None"),
        ({"session_id": "a\ud800"}, "session_id: must be a non-empty str or None"),
    ],
)
def test_the_constructors_other_arguments_are_checked(options: dict, match: str) -> None:
    with pytest.raises(sm.ConfigError, match=match):
        sm.Session(sm.Settings(), **{"clock": ManualClock(), **options})


@pytest.mark.requirement("ER-28")
def test_no_settings_means_the_defaults() -> None:
    session = sm.Session(clock=ManualClock())
    assert session.settings == sm.Settings()


@pytest.mark.requirement("ER-26")
def test_from_state_checks_the_state_unless_told_not_to() -> None:
    """``from_state`` refuses a state the engine cannot reach (as restore does); the
    model checker's ``check=False`` takes it as it is."""
    state = sm.Session(sm.Settings(), clock=ManualClock()).state
    state.retries = 10**6  # over the session's ceiling: unreachable
    with pytest.raises(sm.SnapshotError, match="retries"):
        sm.Session.from_state(sm.Settings(), state, ManualClock())
    unchecked = sm.Session.from_state(sm.Settings(), state, ManualClock(), check=False)
    assert unchecked.retries_used == 10**6
    assert unchecked.current_turn is None


@pytest.mark.requirement("ER-90")
@pytest.mark.parametrize("reason", [3, "bad \ud800"])
def test_an_end_reason_must_be_text(reason: object) -> None:
    session = sm.Session(sm.Settings(), clock=ManualClock())
    with pytest.raises(ValueError, match="reason: must be valid text"):
        session.end("completed", reason=reason)  # type: ignore[arg-type]
    assert session.status is None


@pytest.mark.requirement("ER-80")
def test_a_child_takes_its_own_settings_or_else_its_parents() -> None:
    parent = sm.Session(sm.Settings(max_retries=2), clock=ManualClock())
    assert parent.spawn().settings == sm.Settings(max_retries=2)
    assert parent.spawn(sm.Settings(max_turns=4)).settings == sm.Settings(max_turns=4)


@pytest.mark.requirement("ER-81")
def test_a_child_spend_report_of_zero_counts_and_a_negative_one_is_refused() -> None:
    parent = sm.Session(sm.Settings(), clock=ManualClock(), session_id="p")
    child_id = parent.spawn().session_id
    assert child_id is not None
    parent.record_child_spend(child_id, 0)
    assert parent.child_costs == {child_id: 0.0}
    with pytest.raises(sm.ConfigError, match="total_usd: must be a finite number >= 0"):
        parent.record_child_spend(child_id, -0.5)
    parent.record_child_spend(child_id, 0.25)
    assert parent.cost_usd == 0.25
    assert parent.own_cost_usd == 0.0


@pytest.mark.requirement("ER-80")
def test_a_live_childs_snapshot_records_its_ancestors_budget_as_it_stands() -> None:
    """A child's snapshot holds the ancestors' remaining budget at the time of the
    snapshot, so a child restored elsewhere cannot outspend what its siblings left."""
    parent = sm.Session(sm.Settings(max_cost_usd=1.0), clock=ManualClock(), session_id="p")
    child = parent.spawn(sm.Settings())
    sibling = parent.spawn(sm.Settings())
    turn = sibling.new_turn()
    turn.start()
    turn.send(sm.Assembled(request={}, size=1))
    turn.send(sm.ModelReplied(cost=0.75))
    assert child.snapshot()["ancestor_budget_usd"] == pytest.approx(0.25)
    restored = sm.Session.restore(child.snapshot(), clock=ManualClock())
    assert restored.remaining_budget_usd == pytest.approx(0.25)


@pytest.mark.requirement("ER-37")
def test_a_replaced_handle_names_the_turn_that_replaced_it() -> None:
    session = sm.Session(sm.Settings(), clock=ManualClock())
    first = session.new_turn()
    first.start()
    first.send(sm.Cancelled())
    session.new_turn()
    with pytest.raises(sm.IllegalEvent, match="replaced by turn 2;"):
        first.start()


@pytest.mark.requirement("ER-10")
def test_a_turn_reports_its_action_finish_and_model_as_they_stand() -> None:
    """Before ``start()`` a turn has no action and no finish; a running turn's finish is
    ``None``; ``model`` follows the fallback chain (``None`` for the host's default,
    then each fallback by name)."""
    session = sm.Session(
        sm.Settings(fallback_models=("b", "c"), max_retries=0), clock=ManualClock()
    )
    turn = session.new_turn()
    assert turn.action is None
    assert turn.finish is None
    assert turn.model is None
    turn.start()
    assert isinstance(turn.action, sm.Assemble)
    assert turn.finish is None
    turn.send(sm.Assembled(request={}, size=1))
    turn.send(fail("overloaded"))
    assert turn.model == "b"
    turn.send(fail("overloaded"))
    assert turn.model == "c"
    done = turn.send(sm.ModelReplied())
    assert turn.finish is done
    assert isinstance(done, sm.Finish)
    primary = sm.Session(sm.Settings(model="a", fallback_models=("b",)), clock=ManualClock())
    assert primary.new_turn().model == "a"
