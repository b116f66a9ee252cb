"""``statemachine check``: an exhaustive model check of the turn engine.

The checker explores, breadth first, the *abstract* state space of a session: the
turn's state x the counters that bound it (the call's attempt, the session's
retries, the turn's reductions, the fallback model in use, the final-answer flag,
the crash count of a tool provider, the turn counter, whether the wall clock ran
out, which limit fired). It drives the **real engine**: every node holds a concrete
``Session``/``Turn`` (with an injected clock) and every edge is one representative
event sent to a clone of it -- each error category, a partial stream, usable,
too-long and garbage retry-afters, tool outcomes including ``process_crashed``,
shrinking and non-shrinking reassemblies, ``CannotShrink``, ``Cancelled``, a clock
that has run out. Then it proves, over every node and edge it found:

* **no illegal loop** (ER-29): every edge within a turn leaves the ranking function
  ``(session retries left, reductions left, fallbacks left, call retries left)``
  (lexicographic; the last counts only while a call is in flight) no greater, and
  every edge *into* a recovery state (``backing_off``, ``reducing_context``, a
  fallback ``calling``) strictly smaller; the turn graph is acyclic, and every
  reachable node reaches a terminal one without ``Cancelled``;
* **required reactions** (ER-3, 5, 6, 7, 8, 9, 10, 11, 13, 16, 18, 19, 20, 22, 23,
  24, 31, 32): each category's edges against the table of ``design/api.md``;
* **illegal events** (ER-27): every (state, event) pair with no row raises
  ``IllegalEvent`` and changes nothing;
* **reachability**: every state and every ``TurnStatus`` the settings allow.

Counters are explored exactly while the space is small (the defaults are). With
huge caps they are *accelerated*: the call's attempt, the reductions, crash counts
and the turn counter, once they have left zero and are more than ``saturation``
steps from their cap, jump to ``cap - saturation``; the session's retries collapse
their middle into one value, from which a synthetic ``jump`` step leads close to
the ceiling. Guards read a counter only as ``counter < cap``, so every guard
valuation stays reachable (``specs/invariants.md`` has the argument) and the space
stays small.

To check a mutated table, pass ``rows`` (and ``effects`` for extra effect
functions): :func:`installed` binds it into the engine for the duration.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ..core import _machine, _table
from ..core._actions import Action, Assemble, CallModel, Finish, InvokeTools, Wait
from ..core._engine import DISPATCH, Dispatch, Effect
from ..core._events import (
    Assembled,
    Cancelled,
    CannotShrink,
    ModelFailed,
    ModelReplied,
    ToolsDone,
    WaitDone,
)
from ..core._exceptions import ConfigError, IllegalEvent
from ..core._model_error import ModelError
from ..core._session import Session, Turn
from ..core._settings import Settings
from ..core._state import SessionState, TurnState, key_fields, step_after
from ..core._table import (
    BACKING_OFF,
    CALLING,
    IDLE,
    INVOKING_TOOLS,
    REDUCING_CONTEXT,
    RUNNING_STATES,
    START,
    STATES,
    TERMINAL_STATES,
    Row,
)
from ..core._taxonomy import ErrorCategory, ToolErrorCategory, TurnStatus
from ..core._tool_calls import ToolCall, ToolOutcome

RECOVERY_STATES = (BACKING_OFF, REDUCING_CONTEXT)
"""States a turn enters only to recover; with a fallback ``calling``, each entry
must consume a bounded resource."""

EXACT_BUDGET = 20_000
"""Explore counters exactly when the product of their ranges is at most this."""

DEFAULT_SATURATION = 2
"""How close to its cap an accelerated counter is explored exactly."""

MAX_NODES = 300_000
"""A hard stop: a (mutated) table whose space does not close is reported, not hung on."""

_NEW_TURN = "new_turn"
_JUMP = "jump"
"""Not an event: an accelerated counter jumps close to its cap (accelerated mode)."""
_CLOCK_ZERO = 1_000.0
_SIZE = 1_000_000
_WALL = 1_700_000_000.0


# -- representative events ---------------------------------------------------------


@attrs.frozen
class Step:
    """One representative event (or turn boundary) the checker sends.

    ``kind`` is the trigger (``start``, ``new_turn`` or an event class name) and
    ``variant`` which representative of it; :meth:`describe` reads as code.
    """

    kind: str
    variant: str = ""

    def describe(self) -> str:
        """The step as a short, readable line."""
        return f"{self.kind}({self.variant})" if self.variant else self.kind


class _Clock:
    __slots__ = ("now",)

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _wall_clock() -> float:
    return _WALL


@attrs.frozen
class _Ctx:
    """What the checker derives from the settings once."""

    settings: Settings
    saturation: int | None
    tracks_turns: bool
    last_steps: frozenset[str] = frozenset()
    """Running states all of whose rows lead to a terminal state."""
    dispatch: Dispatch = DISPATCH
    """The table the sessions run (a mutated one for the mutants)."""
    errors: dict[str, tuple[ModelError, bool, float | None]] = attrs.field(factory=dict, eq=False)
    """The representative ModelErrors, built once (they are immutable)."""

    @property
    def server_too_long(self) -> float:
        return self.settings.max_server_wait_s + 1.0


def _steps(ctx: _Ctx, session: SessionState, turn: TurnState) -> list[Step]:
    """The representative steps available at a node."""
    state = turn.state
    settings = ctx.settings
    if state in TERMINAL_STATES:
        if session.status is not None:
            return []
        return [Step(_NEW_TURN)]
    steps: list[Step] = []
    if state == IDLE:
        steps.append(Step(START))
    elif state == "assembling":
        steps += [Step("Assembled", "fresh"), Step("CannotShrink")]
    elif state == REDUCING_CONTEXT:
        steps += [
            Step("Assembled", "shrunk"),
            Step("Assembled", "same_size"),
            Step("Assembled", "same_request"),
            Step("CannotShrink"),
        ]
    elif state == CALLING:
        steps += [Step("ModelFailed", category.value) for category in ErrorCategory]
        steps += [
            Step("ModelFailed", "rate_limited:partial"),
            Step("ModelFailed", "auth_error:partial"),
            Step("ModelFailed", "rate_limited:too_long"),
            Step("ModelFailed", "overloaded:header_ms"),
            Step("ModelFailed", "rate_limited:garbage"),
            Step("ModelReplied", "none"),
            Step("ModelReplied", "p"),
            Step("ModelReplied", "pq"),
            Step("ModelReplied", "doom"),
        ]
        if settings.breaker_threshold > 1:
            steps.append(Step("ModelReplied", "p_many"))
        if settings.max_wall_clock_s is not None:
            steps += [Step("ModelFailed", "rate_limited:late"), Step("ModelReplied", "late")]
        if settings.max_cost_usd is not None:
            steps.append(Step("ModelReplied", "costly"))
    elif state == BACKING_OFF:
        steps.append(Step("WaitDone"))
    elif state == "invoking_tools":
        steps += [Step("ToolsDone", "ok"), Step("ToolsDone", "fail")]
        if any(call.provider == "p" for call in turn.calls):
            steps.append(Step("ToolsDone", "crash"))
    steps.append(Step("Cancelled", "host"))
    k = ctx.saturation
    if k is not None and session.retries == k + 1 < settings.session_retry_ceiling - k:
        steps.append(Step(_JUMP, "session_retries"))
    return steps


def _model_error(ctx: _Ctx, variant: str) -> tuple[ModelError, bool, float | None]:
    """(error, partial, the retry-after the engine must honour) for a variant."""
    cached = ctx.errors.get(variant)
    if cached is None:
        cached = ctx.errors[variant] = _new_model_error(ctx, variant)
    return cached


def _new_model_error(ctx: _Ctx, variant: str) -> tuple[ModelError, bool, float | None]:
    category, _, how = variant.partition(":")
    if how == "partial":
        return ModelError(category, "stream broke"), True, None
    if how == "too_long":
        seconds = ctx.server_too_long
        return ModelError(category, "slow down", retry_after_seconds=seconds), False, seconds
    if how == "header_ms":
        error = ModelError(category, "busy", headers={"Retry-After-Ms": "1500"})
        return error, False, 1.5
    if how == "garbage":
        error = ModelError(
            category,
            "busy",
            retry_after_seconds=math.nan,
            headers={"retry-after-ms": "-5", "Retry-After": "soon"},
        )
        return error, False, None
    return ModelError(category, f"{category} error", code=category), False, None


def _event(ctx: _Ctx, step: Step, session: SessionState, turn: TurnState, clock: _Clock) -> object:
    """Build the event of ``step`` for this node (mutating the clock if it says so)."""
    kind, variant = step.kind, step.variant
    request = f"t{turn.index}s{len(turn.actions)}"
    if kind == "Assembled":
        overflowed = turn.overflowed_size if turn.overflowed_size is not None else _SIZE
        if variant == "shrunk":
            return Assembled(request, max(overflowed - 1, 0))
        if variant == "same_size":
            return Assembled(request, overflowed)
        if variant == "same_request":
            return Assembled(turn.overflowed_request, max(overflowed - 1, 0))
        return Assembled(request, _SIZE)
    if kind == "CannotShrink":
        return CannotShrink()
    if kind == "ModelFailed":
        if variant.endswith(":late"):
            _run_out(ctx, session, clock)
        error, partial, _ = _model_error(ctx, variant)
        return ModelFailed(error, partial=partial)
    if kind == "ModelReplied":
        index = turn.index
        calls: tuple[ToolCall, ...] = ()
        cost = 0.0
        if variant == "p":
            calls = (ToolCall(f"c{index}p", "p", "read", {"turn": index}),)
        elif variant == "pq":
            calls = (
                ToolCall(f"c{index}p", "p", "read", {"turn": index}),
                ToolCall(f"c{index}q", "q", "write", {"turn": index}),
            )
        elif variant == "p_many":
            calls = tuple(
                ToolCall(f"c{index}p{i}", "p", "read", {"turn": index, "i": i})
                for i in range(_many(ctx))
            )
        elif variant == "doom":
            threshold = ctx.settings.doom_loop_threshold
            calls = tuple(
                ToolCall(f"c{index}d{i}", "q", "again", {"same": True}) for i in range(threshold)
            )
        elif variant == "costly":
            cost = float(ctx.settings.max_cost_usd or 0.0)
        elif variant == "late":
            _run_out(ctx, session, clock)
        return ModelReplied(calls, cost=cost, reply=f"reply {index}")
    if kind == "WaitDone":
        action = turn.actions[-1] if turn.actions else None
        if type(action) is Wait and math.isfinite(action.seconds):
            clock.now += action.seconds
        return WaitDone()
    if kind == "ToolsDone":
        outcomes = []
        for call in turn.calls:
            if variant == "fail":
                outcomes.append(
                    ToolOutcome(call.id, False, "it failed", ToolErrorCategory.EXECUTION_FAILED)
                )
            elif variant == "crash" and call.provider == "p":
                outcomes.append(
                    ToolOutcome(call.id, False, "plugin died", ToolErrorCategory.PROCESS_CRASHED)
                )
            else:
                outcomes.append(ToolOutcome(call.id, True, "done"))
        return ToolsDone(tuple(outcomes))
    if kind == "Cancelled":
        return Cancelled(variant)
    raise ValueError(f"step: unknown kind {kind!r}")  # pragma: no cover


def _many(ctx: _Ctx) -> int:
    """How many calls to ``p`` the ``p_many`` reply makes: enough to trip its breaker
    in one turn (accelerated: enough to leave zero, the jump does the rest)."""
    threshold = ctx.settings.breaker_threshold
    return threshold if ctx.saturation is None else min(threshold, ctx.saturation + 1)


def _run_out(ctx: _Ctx, session: SessionState, clock: _Clock) -> None:
    limit = ctx.settings.max_wall_clock_s
    if limit is not None:
        clock.now = max(clock.now, session.started + limit)


@attrs.frozen
class _At:
    """Where a finding is: a node, and the step taken from it (resolved lazily)."""

    index: int
    step: Step | None = None


# -- nodes -------------------------------------------------------------------------


@attrs.define
class _Node:
    session: Session
    turn: Turn
    state: SessionState
    """The session's declared state (the session owns it; the checker reads it)."""
    clock: _Clock
    poisoned: frozenset[Any]
    """Requests that overflowed in this turn: never to be sent again."""
    fatal: bool
    """An auth_error / invalid_request came in this turn: nothing but Finish may follow."""

    @property
    def ts(self) -> TurnState:
        """The current turn's declared state."""
        turn = self.state.turn
        if turn is None:  # pragma: no cover - every node is made after new_turn()
            raise RuntimeError("a node without a turn")
        return turn


def _node(
    ctx: _Ctx, state: SessionState, clock: _Clock, poisoned: frozenset[Any], fatal: bool
) -> _Node:
    """A node over ``state`` (which the new session takes over)."""
    session = Session.from_state(
        ctx.settings, state, clock, wall_clock=_wall_clock, dispatch=ctx.dispatch
    )
    turn = session.current_turn
    if turn is None:  # pragma: no cover - every node is made after new_turn()
        raise RuntimeError("a node without a turn")
    return _Node(session, turn, state, clock, poisoned, fatal)


def _clone(ctx: _Ctx, node: _Node) -> _Node:
    return _node(ctx, node.session.state, _Clock(node.clock.now), node.poisoned, node.fatal)


def _canon(value: int, cap: int, saturation: int | None) -> int:
    if saturation is None or value <= 0 or cap - value <= saturation:
        return value
    return max(cap - saturation, value)


_TURN_KEY = key_fields(TurnState)
_SESSION_KEY = key_fields(SessionState)


def _accelerate(ctx: _Ctx, node: _Node) -> None:
    """Jump counters far from their caps to ``cap - saturation`` (no-op when exact).

    The counters are the declared fields whose key mode is ``cap:<setting>``.
    """
    k = ctx.saturation
    if k is None:
        return
    settings = ctx.settings
    state, turn = node.state, node.ts
    for target, fields in ((turn, _TURN_KEY), (state, _SESSION_KEY)):
        for name, mode in fields:
            if not mode.startswith("cap:"):
                continue
            cap = getattr(settings, mode[4:])
            if cap is None or (name == "turns" and not ctx.tracks_turns):
                continue
            value = getattr(target, name)
            if name == "retries":
                if k < value < cap - k:
                    # the middle of a huge ceiling is one class: "some retries used, many
                    # left"; the _JUMP step takes it close to the ceiling
                    setattr(target, name, k + 1)
            else:
                setattr(target, name, _canon(value, cap, k))
    if state.breakers:
        state.breakers = {
            p: _canon(n, settings.breaker_threshold, k) for p, n in state.breakers.items()
        }
    if turn.path:
        # the trace's last counters follow the state they describe
        turn.path[-1] = step_after(turn.path[-1][0], turn, state)


def _field_key(value: Any, mode: str) -> Any:
    if mode == "providers":
        return tuple(call.provider for call in value)
    if type(value) is dict:
        return tuple(sorted(value.items()))
    return value


def _key(ctx: _Ctx, node: _Node) -> tuple[Any, ...]:
    """The abstract state: the declared fields the key reads (``key_fields``), the
    turn's reduced to what its future reads once that is little, plus what the checker
    itself tracks (overflowed requests, a fatal error, a clock that has run out)."""
    state, turn = node.state, node.ts
    limit = ctx.settings.max_wall_clock_s
    late = limit is not None and node.clock.now - state.started >= limit
    if turn.state in TERMINAL_STATES:
        # a finished turn's future (the next turn) depends on the session alone
        turn_part: tuple[Any, ...] = (turn.state, turn.status, turn.final_answer)
    elif turn.state in ctx.last_steps:
        # every row out of this state finishes the turn: only what its events read
        # (the calls in flight) and the session matter
        turn_part = (turn.state, turn.final_answer, _field_key(turn.calls, "providers"))
    else:
        turn_part = (
            turn.status,
            *(_field_key(getattr(turn, name), mode) for name, mode in _TURN_KEY),
            turn.request in node.poisoned if node.poisoned else False,
            node.fatal,
        )
    session_part = tuple(
        _field_key(getattr(state, name), mode)
        for name, mode in _SESSION_KEY
        if mode != "nested" and (name != "turns" or ctx.tracks_turns)
    )
    return (*turn_part, *session_part, late)


def _rank(settings: Settings, node: _Node) -> tuple[int, int, int, int]:
    """(session retries left, reductions left, fallbacks left, call retries left)."""
    session, turn = node.state, node.ts
    in_call = turn.state in (CALLING, BACKING_OFF, INVOKING_TOOLS)
    return (
        settings.session_retry_ceiling - session.retries,
        settings.max_context_reductions - turn.reductions,
        len(settings.fallback_models) - 1 - turn.model_index,
        settings.max_retries - turn.attempt if in_call else settings.max_retries,
    )


def step_bound(settings: Settings) -> int:
    """An upper bound on the events of one turn, derived from the settings.

    start + first assembly + per assembled request (1 + reductions of them): each
    model in the chain makes up to ``max_retries`` (failure, wait-done) pairs and one
    more failure, then a reply and a tools-done; plus a reduced reassembly each.
    """
    models = 1 + len(settings.fallback_models)
    per_request = models * (2 * settings.max_retries + 1)
    reductions = settings.max_context_reductions
    return 2 + (reductions + 1) * per_request + reductions + 2


# -- the report --------------------------------------------------------------------


@attrs.frozen
class Violation:
    """One broken property, the requirement it breaks and a shortest path to it."""

    requirement: str
    message: str
    path: tuple[Step, ...]

    def describe(self) -> str:
        """The violation and its path, one line each."""
        steps = " -> ".join(step.describe() for step in self.path) or "(initial)"
        return f"[{self.requirement}] {self.message}\n    path: {steps}"


@attrs.frozen
class CheckReport:
    """What :func:`check` found. ``ok`` when ``violations`` is empty."""

    settings: Settings
    exact: bool
    states: int
    edges: int
    longest_turn: int
    step_bound: int
    seconds: float
    violations: tuple[Violation, ...]
    reached_states: frozenset[str]
    reached_statuses: frozenset[str]
    reached_session_statuses: frozenset[str]
    """The ``SessionStatus`` values (limits that ended a session) reached."""
    required_states: frozenset[str]
    required_statuses: frozenset[str]
    rows: tuple[Row, ...]
    row_paths: Mapping[int, tuple[Step, ...]]
    """For every row index the exploration fired: a shortest step path ending in it."""

    @property
    def ok(self) -> bool:
        """Whether every property holds."""
        return not self.violations

    @property
    def uncovered_rows(self) -> tuple[Row, ...]:
        """Rows no explored path fires (dead, or not allowed by these settings)."""
        return tuple(row for i, row in enumerate(self.rows) if i not in self.row_paths)

    def render(self) -> str:
        """The short human report ``statemachine check`` prints."""
        mode = "exact" if self.exact else "accelerated counters"
        lines = [
            f"statemachine check: {'OK' if self.ok else 'FAILED'} ({mode})",
            f"  states {self.states}, edges {self.edges}, "
            f"longest turn {self.longest_turn} steps (bound {self.step_bound}), "
            f"{self.seconds:.2f} s",
            f"  rows covered {len(self.row_paths)}/{len(self.rows)}, "
            f"states reached {len(self.reached_states)}/{len(STATES)}, "
            f"statuses reached {len(self.reached_statuses)}/{len(TurnStatus)}",
        ]
        for row in self.uncovered_rows:
            guards = " & ".join(row.guards)
            lines.append(f"  not reached: {row.source}, {row.event} [{guards}] -> {row.dest}")
        lines.extend("  " + violation.describe() for violation in self.violations[:20])
        if len(self.violations) > 20:
            lines.append(f"  ... and {len(self.violations) - 20} more violations")
        return "\n".join(lines)


# -- the exploration ---------------------------------------------------------------


class _Explorer:
    def __init__(self, ctx: _Ctx, rows: Sequence[Row]) -> None:
        self.ctx = ctx
        self.rows = tuple(rows)
        self.row_index = {
            (r.source, r.event, " & ".join(r.guards), r.dest): i for i, r in enumerate(rows)
        }
        self.nodes: list[_Node] = []
        self.keys: dict[tuple[Any, ...], int] = {}
        self.parent: list[tuple[int, Step] | None] = []
        self.succ: list[list[tuple[int, Step]]] = []
        self.edges = 0
        self.violations: list[Violation] = []
        self.seen_messages: set[tuple[str, str]] = set()
        self.row_paths: dict[int, tuple[Step, ...]] = {}
        self.illegal_checked: set[str] = set()
        self.exhausted = False

    def path(self, index: int) -> tuple[Step, ...]:
        steps: list[Step] = []
        link = self.parent[index]
        while link is not None:
            index, step = link
            steps.append(step)
            link = self.parent[index]
        return tuple(reversed(steps))

    def resolve(self, at: _At | None) -> tuple[Step, ...]:
        if at is None:
            return ()
        steps = self.path(at.index)
        return steps if at.step is None else (*steps, at.step)

    def violate(self, requirement: str, message: str, at: _At | None) -> None:
        # one report per (requirement, message shape): the shortest path is found first
        shape = (requirement, re.split(r"[:(\d]", message, maxsplit=1)[0])
        if shape in self.seen_messages:
            return
        self.seen_messages.add(shape)
        self.violations.append(Violation(requirement, message, self.resolve(at)))

    def add(self, node: _Node, parent: tuple[int, Step] | None) -> tuple[int, bool]:
        key = _key(self.ctx, node)
        index = self.keys.get(key)
        if index is not None:
            return index, False
        index = len(self.nodes)
        self.keys[key] = index
        self.nodes.append(node)
        self.parent.append(parent)
        self.succ.append([])
        return index, True

    def run(self) -> None:
        ctx = self.ctx
        clock = _Clock(_CLOCK_ZERO)
        first = Session(ctx.settings, seed=7, clock=clock, wall_clock=_wall_clock)
        first.new_turn()
        self.add(_node(ctx, first.state, clock, frozenset(), False), None)
        queue = deque([0])
        while queue:
            index = queue.popleft()
            if len(self.nodes) > MAX_NODES:
                self.exhausted = True
                self.violate(
                    "ER-29",
                    f"state space: more than {MAX_NODES} abstract states, the space does not close",
                    _At(index),
                )
                break
            node = self.nodes[index]
            state = node.ts.state
            if state in RUNNING_STATES and state not in self.illegal_checked:
                self.illegal_checked.add(state)
                self.check_illegal(index)
            for step in _steps(ctx, node.state, node.ts):
                result = self.fire(index, step)
                if result is None:
                    continue
                dest, fresh = result
                self.succ[index].append((dest, step))
                self.edges += 1
                if fresh and not self.stop_at(dest):
                    queue.append(dest)

    def stop_at(self, index: int) -> bool:
        """Whether to stop exploring past a node that already broke a cap (mutants)."""
        node = self.nodes[index]
        settings = self.ctx.settings
        return (
            node.state.retries > settings.session_retry_ceiling
            or node.ts.attempt > settings.max_retries
            or node.ts.reductions > settings.max_context_reductions
        )

    def fire(self, index: int, step: Step) -> tuple[int, bool] | None:
        ctx = self.ctx
        source = self.nodes[index]
        node = _clone(ctx, source)
        path = _At(index, step)
        if step.kind == _NEW_TURN:
            node.turn = node.session.new_turn()
            node.poisoned = frozenset()
            node.fatal = False
            _accelerate(ctx, node)
            return self.add(node, (index, step))
        if step.kind == _JUMP:
            node.state.retries = ctx.settings.session_retry_ceiling - (ctx.saturation or 0)
            return self.add(node, (index, step))
        before = _rank(ctx.settings, node)
        event = None if step.kind == START else _event(ctx, step, node.state, node.ts, node.clock)
        try:
            action = node.turn.start() if step.kind == START else node.turn.send(event)
        except Exception as exc:  # any escape is a finding
            self.violate(
                "ER-27",
                f"engine raised: {type(exc).__name__}: {exc} (state {source.ts.state!r}, "
                f"step {step.describe()})",
                path,
            )
            return None
        row = self.row_index.get(node.ts.path[-1][0][:4])
        if row is not None and row not in self.row_paths:
            self.row_paths[row] = self.resolve(path)
        self.check_edge(source, node, step, event, action, before, path)
        if (
            isinstance(event, ModelFailed)
            and event.error.category is ErrorCategory.CONTEXT_LENGTH_EXCEEDED
        ):
            node.poisoned = node.poisoned | {source.ts.request}
        if isinstance(event, ModelFailed) and event.error.category in (
            ErrorCategory.AUTH_ERROR,
            ErrorCategory.INVALID_REQUEST,
        ):
            node.fatal = True
        _accelerate(ctx, node)
        return self.add(node, (index, step))

    # -- per-edge properties -----------------------------------------------------

    def check_edge(
        self,
        source: _Node,
        node: _Node,
        step: Step,
        event: object,
        action: Action,
        before: tuple[int, int, int, int],
        path: _At,
    ) -> None:
        settings = self.ctx.settings
        turn, session = node.ts, node.state
        src_state, dest = source.ts.state, turn.state
        v = self.violate

        # ranking function (ER-29)
        after = _rank(settings, node)
        fell_back = src_state == CALLING and dest == CALLING
        if after > before and dest not in TERMINAL_STATES:
            v("ER-29", f"ranking grew: {before} -> {after} on {src_state} -> {dest}", path)
        if (dest in RECOVERY_STATES or fell_back) and not after < before:
            v(
                "ER-29",
                f"recovery edge consumed nothing: {src_state} -> {dest} keeps rank {after}",
                path,
            )

        # caps (ER-5)
        if turn.attempt > settings.max_retries:
            v("ER-5", f"attempt beyond max_retries: {turn.attempt}", path)
        if session.retries > settings.session_retry_ceiling:
            v("ER-5", f"session retries beyond the ceiling: {session.retries}", path)
        if turn.reductions > settings.max_context_reductions:
            v("ER-8", f"reductions beyond max_context_reductions: {turn.reductions}", path)

        # nothing but Finish after a fatal error; never resend an overflowed request
        if source.fatal and type(action) is not Finish:
            v("ER-9", f"action after auth_error/invalid_request: {action!r}", path)
        if type(action) is CallModel and action.request in source.poisoned:
            v("ER-6", f"CallModel resends a request that overflowed: {action!r}", path)

        self.check_action(source, node, action, path)
        self.check_event(source, node, step, event, action, path)

    def check_action(self, source: _Node, node: _Node, action: Action, path: _At) -> None:
        """What any action must respect: the final-answer turn, breakers, Finish."""
        turn, dest = node.ts, node.ts.state
        v = self.violate
        # the final-answer turn (ER-16) and the breakers (ER-18)
        if turn.final_answer:
            if type(action) is Wait:
                v("ER-16", "final-answer turn waits to retry", path)
            if type(action) is InvokeTools:
                v("ER-16", "final-answer turn invokes tools", path)
            if type(action) is CallModel and (action.attempt or not action.withhold_tools):
                v("ER-16", f"final-answer turn call is not one tool-less attempt: {action!r}", path)
            if type(action) is Assemble and (
                not action.withhold_tools or not action.instruction or action.reduce
            ):
                v("ER-16", f"final-answer turn assembles wrongly: {action!r}", path)
        if type(action) is InvokeTools:
            blocked = [c.provider for c in action.calls if c.provider in source.state.tripped]
            if blocked:
                v("ER-18", f"InvokeTools includes a tripped provider: {blocked}", path)

        if type(action) is Finish and action.status is not turn.status:
            v("ER-30", f"Finish status {action.status} but turn status {turn.status}", path)
        if type(action) is Finish and dest not in TERMINAL_STATES:
            v("ER-29", f"Finish emitted in running state {dest!r}", path)
        if dest in TERMINAL_STATES and type(action) is not Finish:
            v("ER-29", f"terminal state {dest!r} reached with {action!r}", path)

    def check_event(
        self,
        source: _Node,
        node: _Node,
        step: Step,
        event: object,
        action: Action,
        path: _At,
    ) -> None:
        """The required reaction to each kind of event."""
        src_state = source.ts.state
        v = self.violate
        if isinstance(event, ModelFailed):
            self.check_failure(source, node, step, event, action, path)
        elif isinstance(event, Cancelled):
            if not (type(action) is Finish and action.status is TurnStatus.CANCELLED):
                v("ER-32", f"Cancelled in {src_state!r} gave {action!r}", path)
        elif isinstance(event, ToolsDone):
            self.check_tools(source, node, event, action, path)
        elif isinstance(event, Assembled | CannotShrink) and src_state == REDUCING_CONTEXT:
            shrank = (
                isinstance(event, Assembled)
                and source.ts.overflowed_size is not None
                and event.size < source.ts.overflowed_size
                and event.request != source.ts.overflowed_request
            )
            if shrank and not (type(action) is CallModel and action.attempt == 0):
                v("ER-7", f"a shrunk reassembly is not called: {action!r}", path)
            if not shrank and not (
                type(action) is Finish and action.status is TurnStatus.CONTEXT_EXHAUSTED
            ):
                v("ER-8", f"a context that cannot shrink gave {action!r}", path)
        elif isinstance(event, WaitDone):
            prev = source.turn.action
            if not (
                type(action) is CallModel
                and action.request == source.ts.request
                and action.attempt == source.ts.attempt + 1
                and type(prev) is Wait
            ):
                v("ER-1", f"WaitDone did not resend the same request, attempt+1: {action!r}", path)

    def check_failure(
        self,
        source: _Node,
        node: _Node,
        step: Step,
        event: ModelFailed,
        action: Action,
        path: _At,
    ) -> None:
        v = self.violate
        category = event.error.category
        status = action.status if type(action) is Finish else None
        if event.partial:
            if status is not TurnStatus.STREAM_INTERRUPTED:
                v("ER-31", f"partial {category} failure gave {action!r}", path)
            return
        fixed = {
            ErrorCategory.AUTH_ERROR: ("ER-9", TurnStatus.AUTH_ERROR, "failed"),
            ErrorCategory.INVALID_REQUEST: ("ER-9", TurnStatus.INVALID_REQUEST, "failed"),
            ErrorCategory.CONTENT_FILTERED: ("ER-11", TurnStatus.CONTENT_FILTERED, "filtered"),
            ErrorCategory.UNKNOWN: ("ER-24", TurnStatus.UNKNOWN_ERROR, "failed"),
        }
        if category in fixed:
            requirement, expected, dest = fixed[category]
            if status is not expected or node.ts.state != dest:
                v(requirement, f"{category} gave {action!r} into {node.ts.state!r}", path)
            if type(action) in (CallModel, Wait):
                v("ER-10", f"{category} was retried or fell back: {action!r}", path)
            return
        if category is ErrorCategory.CONTEXT_LENGTH_EXCEEDED:
            if type(action) is Assemble:
                if not action.reduce:
                    v("ER-7", f"overflow answered by a non-reducing {action!r}", path)
            elif status is not TurnStatus.CONTEXT_EXHAUSTED:
                v("ER-6", f"overflow answered by {action!r}", path)
            return
        self.check_transient(source, step, action, path)

    def check_transient(self, source: _Node, step: Step, action: Action, path: _At) -> None:
        """A rate limit or an overload: wait, fall back, or one of the bounded ends."""
        settings = self.ctx.settings
        v = self.violate
        status = action.status if type(action) is Finish else None
        turn = source.ts
        session = source.state
        _, _, honoured = _model_error(self.ctx, step.variant)
        if type(action) is Wait:
            if turn.final_answer:
                v("ER-16", "final-answer turn retried", path)
            if turn.attempt >= settings.max_retries:
                v("ER-5", f"retry beyond max_retries at attempt {turn.attempt}", path)
            if session.retries >= settings.session_retry_ceiling:
                v("ER-5", f"retry at the session ceiling ({session.retries})", path)
            self.check_wait(action, turn.attempt, honoured, path)
            limit = settings.max_wall_clock_s
            if limit is not None and source.session.elapsed_s + action.seconds > limit:
                v("ER-19", f"a wait crossing max_wall_clock_s was taken: {action!r}", path)
            if honoured is not None and honoured > settings.max_server_wait_s:
                v("ER-20", f"a server wait beyond max_server_wait_s was taken: {action!r}", path)
        elif type(action) is CallModel:
            models = settings.fallback_models
            index = turn.model_index + 1
            if (
                turn.final_answer
                or index >= len(models)
                or action.model != models[index]
                or action.attempt != 0
                or action.request != turn.request
            ):
                v("ER-23", f"transient failure answered by {action!r}", path)
            if session.retries >= settings.session_retry_ceiling:
                v("ER-5", f"fallback at the session ceiling ({session.retries})", path)
        elif status is TurnStatus.RETRY_DEFERRED:
            if honoured is None or honoured <= settings.max_server_wait_s:
                v("ER-20", f"retry_deferred without a too-long server wait: {action!r}", path)
            elif type(action) is Finish and action.retry_at is None:
                v("ER-20", "retry_deferred without retry_at", path)
        elif status not in (
            TurnStatus.RETRIES_EXHAUSTED,
            TurnStatus.RETRY_CEILING_REACHED,
            TurnStatus.BUDGET_EXHAUSTED,
        ):
            v("ER-1", f"transient failure answered by {action!r}", path)
        elif (
            status is TurnStatus.RETRIES_EXHAUSTED
            and not turn.final_answer
            and turn.attempt < settings.max_retries
            and settings.max_wall_clock_s is None
            and honoured is None
        ):
            v("ER-5", "retries_exhausted with retries left", path)

    def check_wait(self, action: Wait, attempt: int, honoured: float | None, path: _At) -> None:
        settings = self.ctx.settings
        try:
            nominal = min(
                settings.base_delay_ms * settings.backoff_factor**attempt, settings.max_delay_ms
            )
        except OverflowError:
            nominal = settings.max_delay_ms
        low, high = 0.5 * nominal / 1000.0, 1.5 * nominal / 1000.0
        floor = honoured or 0.0
        ok = action.seconds >= floor and (
            action.seconds == floor or low - 1e-9 <= action.seconds < high + 1e-9
        )
        if not ok:
            v = "ER-3" if action.seconds < floor else "ER-22"
            self.violate(
                v,
                f"wait {action.seconds!r} s outside [{low}, {high}) / retry-after {honoured}",
                path,
            )

    def check_tools(
        self,
        source: _Node,
        node: _Node,
        event: ToolsDone,
        action: Action,
        path: _At,
    ) -> None:
        settings = self.ctx.settings
        v = self.violate
        counts = dict(source.state.breakers or {})
        trips = False
        for outcome, call in zip(event.outcomes, source.ts.calls, strict=True):
            if outcome.category is ToolErrorCategory.PROCESS_CRASHED:
                counts[call.provider] = counts.get(call.provider, 0) + 1
                trips = trips or counts[call.provider] >= settings.breaker_threshold
            else:
                counts[call.provider] = 0
        if type(action) is not Finish:
            v("ER-12", f"ToolsDone gave {action!r}", path)
            return
        expected = TurnStatus.BREAKER_OPEN if trips else TurnStatus.COMPLETED
        if action.status is not expected:
            v("ER-13", f"tool outcomes gave {action.status}, expected {expected}", path)
        if trips and not node.state.tripped:
            v("ER-13", "a breaker tripped but no provider is open", path)
        failed = {o.call_id for o in event.outcomes if not o.ok}
        flagged = {r.call_id for r in action.tool_results if r.is_error}
        if failed - flagged or len(action.tool_results) != len(source.ts.calls):
            v("ER-12", f"tool results do not mirror the outcomes: {action.tool_results!r}", path)

    def check_illegal(self, index: int) -> None:
        """Every event with no row in this state raises IllegalEvent, changes nothing."""
        source = self.nodes[index]
        state = source.ts.state
        legal = {trigger for (s, trigger, _) in self.ctx.dispatch.groups if s == state}
        samples: list[tuple[str, object]] = [
            ("Assembled", Assembled("x", 1)),
            ("CannotShrink", CannotShrink()),
            ("ModelReplied", ModelReplied()),
            ("ModelFailed", ModelFailed(ModelError("overloaded"))),
            ("WaitDone", WaitDone()),
            ("ToolsDone", ToolsDone(())),
            ("Cancelled", Cancelled()),
        ]
        for trigger, event in samples:
            if trigger in legal:
                continue
            node = _clone(self.ctx, source)
            before = (_key(self.ctx, node), len(node.ts.actions), node.turn.action)
            try:
                node.turn.send(event)
            except IllegalEvent:
                pass
            else:
                self.violate(
                    "ER-27", f"{trigger} in {state!r} did not raise IllegalEvent", _At(index)
                )
                continue
            after = (_key(self.ctx, node), len(node.ts.actions), node.turn.action)
            if after != before:
                self.violate(
                    "ER-27", f"an illegal {trigger} in {state!r} changed the turn", _At(index)
                )

    # -- global properties ---------------------------------------------------------

    def intra_turn(self, index: int) -> list[tuple[int, Step]]:
        return [(d, s) for d, s in self.succ[index] if s.kind != _NEW_TURN]

    def check_termination(self) -> int:
        """Acyclic turn graph, every node reaches a terminal one; the longest turn."""
        n = len(self.nodes)
        # Kahn's algorithm over intra-turn edges
        indegree = [0] * n
        for i in range(n):
            for d, _ in self.intra_turn(i):
                indegree[d] += 1
        order = [i for i in range(n) if indegree[i] == 0]
        head = 0
        while head < len(order):
            i = order[head]
            head += 1
            for d, _ in self.intra_turn(i):
                indegree[d] -= 1
                if indegree[d] == 0:
                    order.append(d)
        if len(order) < n:
            stuck = min(i for i in range(n) if indegree[i] > 0)
            self.violate(
                "ER-29",
                f"loop: a turn can cycle forever through {self.nodes[stuck].turn.state!r}",
                _At(stuck),
            )
        # reaches a terminal without Cancelled (backwards, in reverse topological order)
        done = [self.nodes[i].turn.state in TERMINAL_STATES for i in range(n)]
        changed = True
        while changed:
            changed = False
            for i in reversed(order):
                if not done[i] and any(
                    done[d] for d, s in self.intra_turn(i) if s.kind != "Cancelled"
                ):
                    done[i] = True
                    changed = True
        for i in range(n):
            if not done[i] and not self.exhausted and not self.stop_at(i):
                self.violate(
                    "ER-29",
                    f"stuck: no way to a terminal state (but Cancelled) from "
                    f"{self.nodes[i].turn.state!r}",
                    _At(i),
                )
                break
        # the longest turn: longest path from an idle node, in steps
        longest = [0] * n
        for i in reversed(order):
            longest[i] = max((1 + longest[d] for d, _ in self.intra_turn(i)), default=0)
        idle = [longest[i] for i in range(n) if self.nodes[i].turn.state == IDLE]
        return max(idle, default=0)


def _required(settings: Settings) -> tuple[frozenset[str], frozenset[str]]:
    """The states and statuses these settings must let a session reach."""
    retries = settings.max_retries >= 1 and settings.session_retry_ceiling >= 1
    states = set(STATES)
    if not retries:
        states.discard(BACKING_OFF)
    if settings.max_context_reductions == 0:
        states.discard(REDUCING_CONTEXT)
    statuses = {s.value for s in TurnStatus}
    if not retries:
        statuses.discard(TurnStatus.RETRY_DEFERRED.value)
    if not retries or settings.max_wall_clock_s is None:
        statuses.discard(TurnStatus.BUDGET_EXHAUSTED.value)
    grows = settings.max_retries >= 1 or bool(settings.fallback_models)
    if settings.session_retry_ceiling > 0 and (not grows or settings.max_turns is not None):
        statuses.discard(TurnStatus.RETRY_CEILING_REACHED.value)
    return frozenset(states), frozenset(statuses)


def _space(settings: Settings) -> int:
    return (
        (settings.max_retries + 1)
        * (settings.session_retry_ceiling + 1)
        * (settings.max_context_reductions + 1)
        * (len(settings.fallback_models) + 1)
        * settings.breaker_threshold
        * (settings.max_turns or 1)
    )


def check(
    settings: Settings | None = None,
    *,
    rows: Sequence[Row] | None = None,
    effects: Mapping[str, Effect] | None = None,
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
    last_steps = frozenset(
        state
        for state in RUNNING_STATES
        if all(row.dest in TERMINAL_STATES for row in table if row.source == state)
        and any(row.source == state and row.event != "Cancelled" for row in table)
    )
    dispatch = Dispatch(table, effects) if rows is not None or effects else DISPATCH
    ctx = _Ctx(settings, k, settings.max_turns is not None, last_steps, dispatch)
    started = time.perf_counter()
    explorer = _Explorer(ctx, table)
    explorer.run()
    longest = explorer.check_termination()
    reached_states = frozenset(node.ts.state for node in explorer.nodes)
    reached_statuses = frozenset(
        node.turn.status.value for node in explorer.nodes if node.turn.status is not None
    )
    reached_session = frozenset(
        node.state.status.value for node in explorer.nodes if node.state.status is not None
    )
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
        states=len(explorer.nodes),
        edges=explorer.edges,
        longest_turn=longest,
        step_bound=bound,
        seconds=time.perf_counter() - started,
        violations=tuple(explorer.violations),
        reached_states=reached_states,
        reached_statuses=reached_statuses,
        reached_session_statuses=reached_session,
        required_states=required_states,
        required_statuses=required_statuses,
        rows=table,
        row_paths=dict(explorer.row_paths),
    )


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
        elif step.kind == START:
            turn.start()
        else:
            state = session.state
            if state.turn is None:  # pragma: no cover - new_turn() came first
                raise RuntimeError("a path that sends an event before new_turn")
            turn.send(_event(ctx, step, state, state.turn, clock))
    return session


# -- the table, as a document -------------------------------------------------------


def render_table() -> str:
    """``specs/table.md``: the compiled table the engine runs, as Markdown.

    Generated from ``statemachine.core._machine.COMPILED`` (which is read back from the
    ``transitions`` machine), so the document cannot disagree with the engine.
    """
    compiled = _machine.COMPILED
    triggers: list[str] = []
    for _, trigger in compiled:
        if trigger not in triggers:
            triggers.append(trigger)
    lines = [
        "# The transition table",
        "",
        "<!-- generated by `python -m statemachine check --table specs/table.md`"
        " from the compiled table; do not edit: tests/test_check.py fails on drift -->",
        "",
        "State x event -> next state(s). An empty cell is an illegal event: `IllegalEvent`,",
        "nothing changes. Terminal states take no event.",
        "",
        "| state | " + " | ".join(triggers) + " |",
        "|---|" + "---|" * len(triggers),
    ]
    for state in RUNNING_STATES:
        cells = []
        for trigger in triggers:
            rows = compiled.get((state, trigger), ())
            dests: list[str] = []
            for _, dest, _, _ in rows:
                if dest not in dests:
                    dests.append(dest)
            cells.append(", ".join(dests))
        lines.append(f"| {state} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Rows, in trial order",
        "",
        "In each state, for each event, the first row whose guards all hold fires.",
    ]
    for state in RUNNING_STATES:
        lines += [
            "",
            f"### {state}",
            "",
            "| event | guards | next state | action | status |",
            "|---|---|---|---|---|",
        ]
        for trigger in triggers:
            for guards, dest, effect, status in compiled.get((state, trigger), ()):
                action = _table.EFFECTS[effect].replace("|", "\\|")
                when = " & ".join(guards) or "(otherwise)"
                lines.append(f"| {trigger} | {when} | {dest} | {action} | {status or ''} |")
    lines += ["", "## Guards", "", "| guard | holds when |", "|---|---|"]
    lines += [f"| {name} | {text} |" for name, text in _table.GUARDS.items()]
    return "\n".join(lines) + "\n"


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
