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


@pytest.mark.requirement("ER-25")
def test_the_default_seed_is_zero() -> None:
    """``Session()`` draws the jitter of seed 0 (documented: the same run every time)."""
    default = sm.Session(sm.Settings(), clock=ManualClock())
    assert default.snapshot()["seed"] == 0
    assert _waits(default) == _waits(sm.Session(sm.Settings(), seed=0, clock=ManualClock()))
    assert _waits(sm.Session(sm.Settings(), clock=ManualClock())) != _waits(
        sm.Session(sm.Settings(), seed=1, clock=ManualClock())
    )


@pytest.mark.requirement("ER-28")
@pytest.mark.parametrize("seed", [True, 1.0, "7", None])
def test_a_seed_that_is_not_an_int_is_refused(seed: object) -> None:
    with pytest.raises(sm.ConfigError, match="seed: must be an int"):
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
