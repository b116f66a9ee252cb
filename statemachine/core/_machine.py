"""The ``transitions`` machine built from the table, and the table read back from it.

``transitions`` validates the states and rows, and the diagrams are drawn from it; the
engine runs on ``_engine.Dispatch``, built from the same ``ROWS`` (a ``transitions``
trigger costs ~7.5 µs and ~3 KB per turn, a dict lookup ~0.1 µs). :data:`COMPILED` is
the table read back *from the machine*: ``tests/test_table.py`` proves the machine,
``COMPILED`` and the dispatch pick the same row on every (state, event, guard
valuation), and ``specs/table.md`` is written from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from transitions import Machine

from ._table import IDLE, ROWS, STATES, TERMINAL_STATES, Row


def effect_tag(row: Row) -> str:
    """The ``after`` callback name a row carries: its effect, and status if any."""
    return f"{row.effect}:{row.status}" if row.status else row.effect


def build_machine(
    machine_class: type[Machine] = Machine, *, rows: Sequence[Row] = ROWS, **options: Any
) -> Machine:
    """A fresh machine of ``machine_class`` (``GraphMachine`` for diagrams), no model,
    from ``rows`` (the table; the model check passes mutated tables)."""
    states = [{"name": name, "final": name in TERMINAL_STATES} for name in STATES]
    machine = machine_class(
        model=None,
        states=states,
        initial=IDLE,
        auto_transitions=False,
        ignore_invalid_triggers=False,
        **options,
    )
    for row in rows:
        machine.add_transition(
            row.event,
            row.source,
            row.dest,
            conditions=list(row.guards),
            after=[effect_tag(row)],
        )
    return machine


CompiledRow = tuple[tuple[str, ...], str, str, str | None]
"""(guard names, dest, effect, status) of one row, as the machine holds it."""


def compile_table(machine: Machine) -> dict[tuple[str, str], tuple[CompiledRow, ...]]:
    """Read the machine back into ``(state, trigger) -> rows``, in trial order."""
    table: dict[tuple[str, str], tuple[CompiledRow, ...]] = {}
    for trigger, event in machine.events.items():
        for source, transitions in event.transitions.items():
            rows: list[CompiledRow] = []
            for transition in transitions:
                guards = []
                for condition in transition.conditions:
                    if not condition.target:
                        raise ValueError(f"{trigger} from {source}: 'unless' is not supported")
                    guards.append(cast(str, condition.func))
                (tag,) = cast(list[str], transition.after)
                effect, _, status = tag.partition(":")
                rows.append((tuple(guards), cast(str, transition.dest), effect, status or None))
            table[(source, trigger)] = tuple(rows)
    return table


MACHINE = build_machine()
COMPILED = compile_table(MACHINE)
