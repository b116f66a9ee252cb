"""The transition table: its shape, and agreement of the hot path with ``transitions``."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from statemachine import ErrorCategory
from statemachine.core._engine import CATEGORY_GUARDS as _CATEGORY_GUARDS
from statemachine.core._engine import DISPATCH
from statemachine.core._engine import EFFECTS as EFFECT_FUNCTIONS
from statemachine.core._engine import GUARDS as GUARD_FUNCTIONS
from statemachine.core._machine import COMPILED, build_machine, effect_tag
from statemachine.core._table import (
    EFFECTS,
    GUARDS,
    ROWS,
    RUNNING_STATES,
    START,
    STATES,
    TERMINAL_STATES,
    Row,
)

_CATEGORY_OF = {
    category: {name for name, cats in _CATEGORY_GUARDS.items() if category in cats}
    for category in ErrorCategory
}


def test_every_row_names_known_states_guards_and_effects() -> None:
    """Every row refers to states, guards and effects that exist, and every guard and
    effect the table documents has an implementation."""
    for row in ROWS:
        assert row.source in STATES and row.dest in STATES, row
        assert row.effect in EFFECTS, row
        assert all(g in GUARDS for g in row.guards), row
    assert set(GUARDS) == set(GUARD_FUNCTIONS) | set(_CATEGORY_GUARDS)
    assert not set(GUARD_FUNCTIONS) & set(_CATEGORY_GUARDS)
    assert set(EFFECTS) == set(EFFECT_FUNCTIONS)


def test_terminal_states_have_no_outgoing_rows() -> None:
    """A finished turn takes no event at all."""
    assert not [row for row in ROWS if row.source in TERMINAL_STATES]


@pytest.mark.requirement("ER-29")
def test_every_row_list_ends_in_an_unguarded_or_exhaustive_row() -> None:
    """For each (state, event) some row always applies: the last row is unguarded, or
    (for ModelFailed) every category has an unguarded-but-for-category row."""
    for key, rows in COMPILED.items():
        guards = [set(r[0]) for r in rows]
        if not guards[-1]:
            continue
        assert key == ("calling", "ModelFailed"), key
        for category in ErrorCategory:
            matching = [g for g in guards if g - _CATEGORY_OF[category] == set()]
            matching = [g for g in matching if g & set(_CATEGORY_GUARDS) <= _CATEGORY_OF[category]]
            assert matching, f"no catch-all row for {category}"


def test_the_machine_disables_auto_transitions() -> None:
    """No ``to_<state>`` door skips the guards: the machine's only triggers are the
    table's events."""
    machine = build_machine()
    assert set(machine.events) == {row.event for row in ROWS}
    assert not any(name.startswith("to_") for name in machine.events)


class _Model:
    """A transitions model whose guards return a preset valuation."""

    state: str


def _machine_dest(machine: Any, model: _Model, state: str, trigger: str) -> str | None:
    machine.set_state(state, model=model)
    fired = machine.events[trigger].trigger(model)
    return model.state if fired else None


def _valuations(key: tuple[str, str]) -> list[tuple[ErrorCategory | None, dict[str, bool]]]:
    names = sorted({g for row in ROWS if (row.source, row.event) == key for g in row.guards})
    free = [n for n in names if n not in _CATEGORY_GUARDS]
    cats: list[ErrorCategory | None] = (
        list(ErrorCategory) if any(n in _CATEGORY_GUARDS for n in names) else [None]
    )
    out = []
    for category in cats:
        for bits in itertools.product((False, True), repeat=len(free)):
            valuation = dict(zip(free, bits, strict=True))
            for name in _CATEGORY_GUARDS:
                valuation[name] = category is not None and name in _CATEGORY_OF[category]
            out.append((category, valuation))
    return out


def _table_row(key: tuple[str, str], valuation: dict[str, bool]) -> Row:
    for row in ROWS:
        if (row.source, row.event) == key and all(valuation[g] for g in row.guards):
            return row
    raise AssertionError(f"no row for {key} {valuation}")


@pytest.mark.requirement("ER-29")
def test_compiled_hot_path_agrees_with_transitions_on_every_guard_valuation() -> None:
    """For every (state, event) and every valuation of the guards its rows name, the
    transitions machine, the table and the dispatch the engine runs (built from the
    rows in one step) pick the same destination and effect."""
    machine = build_machine()
    model = _Model()
    machine.add_model(model, initial="idle")
    for row in ROWS:
        setattr(model, effect_tag(row), lambda *_a, **_k: None)
    checked = 0
    for key in COMPILED:
        for category, valuation in _valuations(key):
            for name, value in valuation.items():
                setattr(model, name, value)
            expected = _table_row(key, valuation)
            assert _machine_dest(machine, model, *key) == expected.dest
            group = DISPATCH.groups[(*key, category)]
            hot = next(r for r in group.rows if all(valuation[g] for g in r.names))
            assert (hot.dest, hot.effect) == (expected.dest, EFFECT_FUNCTIONS[expected.effect])
            assert hot.info == (*key, " & ".join(expected.guards), expected.dest, expected.effect)
            assert hot.guards == tuple(GUARD_FUNCTIONS[g] for g in hot.names)
            checked += 1
    assert checked > 3000


def test_cancelled_is_legal_in_every_running_state() -> None:
    """The host can abandon a turn in any running state, and only there."""
    sources = {row.source for row in ROWS if row.event == "Cancelled"}
    assert sources == set(RUNNING_STATES)
    assert (("idle", START)) in COMPILED
