"""``statemachine check``: an exhaustive model check of the turn engine.

The checker explores, breadth first, the *abstract* state space of a session (the
turn's state x the counters that bound it), driving the **real engine**: every node
holds a concrete ``Session``/``Turn`` on an injected clock, every edge is one
representative event (:mod:`._events`) sent to a copy of it. Over every node and edge it
proves the properties of :mod:`._properties` and :mod:`._explore` (``specs/invariants.md``
states each, and the argument for the counters accelerated when caps are huge); every
row not fired is reported with :func:`row_reason`'s reason. A mutated table is checked
by passing ``rows`` (and ``effects``).
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ... import ConfigError, Session, Settings
from ...core import _engine, _table
from ._abstraction import step_bound
from ._events import (
    _CLOCK_ZERO,
    _END,
    _NEW_TURN,
    DEFAULT_SATURATION,
    EXACT_BUDGET,
    Step,
    _Clock,
    _Ctx,
    _event,
    _wall_clock,
)
from ._explore import _Explorer, _required, _space, row_reason
from ._report import CheckReport, Violation, render_table

__all__ = [
    "CheckReport",
    "Step",
    "Violation",
    "check",
    "main",
    "render_table",
    "replay",
    "row_reason",
    "step_bound",
]


def check(
    settings: Settings | None = None,
    *,
    rows: Sequence[_table.Row] | None = None,
    effects: Mapping[str, _engine.Effect] | None = None,
    saturation: int | None = None,
    exact: bool | None = None,
) -> CheckReport:
    """Explore the abstract state space for ``settings`` and prove the properties.

    ``rows`` (default: the engine's table) and ``effects`` check a mutated table.
    ``exact`` forces (or forbids) exact counters; by default counters are exact when
    the space is at most :data:`EXACT_BUDGET`, else accelerated with ``saturation``.
    """
    settings = settings if settings is not None else Settings()
    if exact is None:
        exact = _space(settings) <= EXACT_BUDGET
    k = None if exact else (saturation if saturation is not None else DEFAULT_SATURATION)
    if k is not None and k < 1:
        raise ConfigError(f"saturation: must be >= 1, got {k!r}")
    table = tuple(rows) if rows is not None else _table.ROWS
    dispatch = _engine.Dispatch(table, effects) if rows is not None or effects else _engine.DISPATCH
    ctx = _Ctx(settings, k, settings.max_turns is not None, _last_steps(table), dispatch)
    started = time.perf_counter()
    explorer = _Explorer(ctx, table)
    longest = _explore(explorer)
    return _report(explorer, exact, longest, time.perf_counter() - started)


def _report(explorer: _Explorer, exact: bool, longest: int, seconds: float) -> CheckReport:
    """The report of a finished exploration, once the reachability it must show and
    the bound on a turn's steps are checked."""
    settings, nodes, table = explorer.ctx.settings, explorer.nodes, explorer.rows
    reached_states = frozenset(node.ts.state for node in nodes)
    reached_statuses = frozenset(n.turn.status.value for n in nodes if n.turn.status is not None)
    required_states, required_statuses = _required(settings)
    for state in sorted(required_states - reached_states):
        explorer.violate("reachability", f"state {state!r} is never reached", None)
    for status in sorted(required_statuses - reached_statuses):
        explorer.violate("reachability", f"status {status!r} is never reached", None)
    bound = step_bound(settings)
    if exact and longest > bound:
        explorer.violate("ER-29", f"a turn of {longest} steps exceeds the bound {bound}", None)
    return CheckReport(
        settings=settings,
        exact=exact,
        states=len(nodes),
        edges=explorer.edges,
        longest_turn=longest,
        step_bound=bound,
        seconds=seconds,
        violations=tuple(explorer.violations),
        reached_states=reached_states,
        reached_statuses=reached_statuses,
        reached_session_statuses=frozenset(
            n.state.status.value for n in nodes if n.state.status is not None
        ),
        required_states=required_states,
        required_statuses=required_statuses,
        rows=table,
        row_paths=dict(explorer.row_paths),
        row_reasons={
            i: row_reason(settings, row) or _NO_REASON
            for i, row in enumerate(table)
            if i not in explorer.row_paths
        },
    )


def _last_steps(table: Sequence[_table.Row]) -> frozenset[str]:
    """The running states all of whose rows (and at least one) lead to a terminal one."""
    return frozenset(
        state
        for state in _table.RUNNING_STATES
        if all(row.dest in _table.TERMINAL_STATES for row in table if row.source == state)
        and any(row.source == state and row.event != "Cancelled" for row in table)
    )


def _explore(explorer: _Explorer) -> int:
    """Run the exploration and the termination check; the longest turn."""
    engine_log = logging.getLogger("statemachine")
    was_disabled = engine_log.disabled
    engine_log.disabled = True  # the explored failures are not incidents to log
    # The nodes are kept to the end, so the cycle collector would only scan them again
    # and again (a third of the time); the copies not kept have their one cycle broken.
    collecting = gc.isenabled()
    gc.disable()
    try:
        explorer.run()
        return explorer.check_termination()
    finally:
        engine_log.disabled = was_disabled
        if collecting:
            gc.enable()


_NO_REASON = "these settings allow it: a dead row, or an event the check's representatives lack"


def replay(settings: Settings, path: Sequence[Step]) -> Session:
    """Run ``path`` (from a :class:`CheckReport`) on a fresh session; return it.

    Exact-mode paths are real event sequences: this is how the tests re-run the
    shortest path to every row on the real engine.
    """
    ctx = _Ctx(settings, None, settings.max_turns is not None)
    clock = _Clock(_CLOCK_ZERO)
    session = Session(settings, seed=7, clock=clock, wall_clock=_wall_clock)
    turn = session.new_turn()
    for step in path:
        if step.kind == _NEW_TURN:
            turn = session.new_turn()
        elif step.kind == _END:
            session.end(step.variant)
        elif step.kind == _table.START:
            turn.start()
        else:
            state = session.state
            if state.turn is None:  # pragma: no cover - new_turn() came first
                raise RuntimeError("a path that sends an event before new_turn")
            turn.send(_event(ctx, step, state, state.turn, clock))
    return session


# -- the command -------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``statemachine check [--settings FILE]``: 0 when every property holds."""
    parser = argparse.ArgumentParser(
        prog="statemachine check",
        description="Exhaustively model-check the turn engine for the given settings.",
    )
    parser.add_argument("--settings", metavar="FILE", help="a TOML file with a [settings] table")
    parser.add_argument(
        "--saturation",
        type=int,
        default=None,
        help="accelerate counters more than this far from their caps (default: exact if small)",
    )
    parser.add_argument(
        "--table",
        metavar="FILE",
        help="write the state x event table (specs/table.md) to FILE and exit",
    )
    args = parser.parse_args(argv)
    if args.table:
        Path(args.table).write_text(render_table(), encoding="utf-8")
        print(f"statemachine check: wrote {args.table}")
        return 0
    try:
        settings = Settings.from_toml(Path(args.settings)) if args.settings else Settings()
        report = check(
            settings,
            saturation=args.saturation,
            exact=False if args.saturation is not None else None,
        )
    except ConfigError as exc:
        print(f"statemachine check: {exc}", file=sys.stderr)
        return 2
    print(report.render())
    return 0 if report.ok else 1
