"""Breadth-first exploration of the abstract state space, on the real engine, and the
checks over the whole graph (termination, no cycle within a turn)."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ... import ErrorCategory, ModelFailed, Session, Settings, TurnStatus
from ...core import _engine, _table
from ...core._backoff import wait_seconds
from ...core._reachable import reachable_problem
from ._abstraction import _accelerate, _clone, _key, _Node, _node, _rank
from ._events import (
    _CLOCK_ZERO,
    _END,
    _JUMP,
    _NEW_TURN,
    MAX_NODES,
    Step,
    _At,
    _Clock,
    _Ctx,
    _event,
    _steps,
    _wall_clock,
)
from ._properties import Properties
from ._report import Violation

# -- the exploration ---------------------------------------------------------------


class _Explorer(Properties):
    def __init__(self, ctx: _Ctx, rows: Sequence[_table.Row]) -> None:
        self.ctx = ctx
        self.rows = tuple(rows)
        self.row_index = {r.key: i for i, r in enumerate(rows)}
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
        self.before: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
        """The rank of the node whose steps are being fired."""

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
        steps = self.path(at.node)
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
            # a copy already known: its session and turn handle point at each other,
            # and the exploration runs with the cycle collector off (see check())
            node.session._handle = None  # noqa: SLF001
            return index, False
        index = len(self.nodes)
        self.keys[key] = index
        self.nodes.append(node)
        self.parent.append(parent)
        self.succ.append([])
        if self.ctx.saturation is None and self.ctx.dispatch is _engine.DISPATCH:
            # restore's rules must hold in every state the engine reaches (exact counters
            # only: acceleration jumps counters without the steps that would move them)
            checked = 0
            if parent is not None:
                above = self.nodes[parent[0]].ts
                if above.index == node.ts.index:  # the same turn: its path only grew
                    checked = len(above.path)
            problem = reachable_problem(node.state, self.ctx.settings, checked=checked)
            if problem is not None:
                self.violate(
                    "ER-38", f"restore would refuse a reachable state: {problem}", _At(index)
                )
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
            if state in _table.RUNNING_STATES and state not in self.illegal_checked:
                self.illegal_checked.add(state)
                self.check_illegal(index)
            self.before = _rank(ctx.settings, node)  # each step's clone starts from it
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
        if step.kind == _END:
            running = node.ts.state not in _table.TERMINAL_STATES
            node.session.end(step.variant)
            if node.state.status is None or node.state.status.value != step.variant:
                self.violate("ER-90", f"end({step.variant}) left status {node.state.status}", path)
            if running and node.ts.status is not TurnStatus.CANCELLED:
                self.violate("ER-90", "ending a session did not cancel its running turn", path)
            return self.add(node, (index, step))
        before = self.before
        start = step.kind == _table.START
        event = None if start else _event(ctx, step, node.state, node.ts, node.clock)
        try:
            action = node.turn.start() if start else node.turn.send(event)
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

    def intra_turn(self, index: int) -> list[tuple[int, Step]]:
        return [(d, s) for d, s in self.succ[index] if s.kind != _NEW_TURN]

    def check_termination(self) -> int:
        """Acyclic turn graph, every node reaches a terminal one; the longest turn."""
        n = len(self.nodes)
        intra = [self.intra_turn(i) for i in range(n)]  # read three times below
        order = _topological_order(intra)
        if len(order) < n:
            stuck = min(set(range(n)) - set(order))
            self.violate(
                "ER-29",
                f"loop: a turn can cycle forever through {self.nodes[stuck].turn.state!r}",
                _At(stuck),
            )
        # reaches a terminal without Cancelled (backwards, in reverse topological order)
        done = [self.nodes[i].turn.state in _table.TERMINAL_STATES for i in range(n)]
        changed = True
        while changed:
            changed = False
            for i in reversed(order):
                if not done[i] and any(done[d] for d, s in intra[i] if s.kind != "Cancelled"):
                    done[i] = changed = True
        dead_end = next((i for i in range(n) if not done[i] and not self.stop_at(i)), None)
        if dead_end is not None and not self.exhausted:
            self.violate(
                "ER-29",
                f"stuck: no way to a terminal state (but Cancelled) from "
                f"{self.nodes[dead_end].turn.state!r}",
                _At(dead_end),
            )
        # the longest turn: longest path from an idle node, in steps
        longest = [0] * n
        for i in reversed(order):
            longest[i] = max((1 + longest[d] for d, _ in intra[i]), default=0)
        idle = [longest[i] for i in range(n) if self.nodes[i].turn.state == _table.IDLE]
        return max(idle, default=0)


def _topological_order(successors: Sequence[Sequence[tuple[int, Step]]]) -> list[int]:
    """Kahn's algorithm: the nodes in an order where every edge goes forward; those on
    or behind a cycle are missing from it."""
    indegree = [0] * len(successors)
    for edges in successors:
        for d, _ in edges:
            indegree[d] += 1
    order = [i for i, count in enumerate(indegree) if count == 0]
    for i in order:  # grows while it is read
        for d, _ in successors[i]:
            indegree[d] -= 1
            if indegree[d] == 0:
                order.append(d)
    return order


def _required(settings: Settings) -> tuple[frozenset[str], frozenset[str]]:
    """The states and statuses these settings must let a session reach: the ends of
    the rows :func:`row_reason` finds no reason against (``idle`` always)."""
    states = {_table.IDLE}
    statuses: set[str] = set()
    for row in _table.ROWS:
        if row_reason(settings, row) is not None:
            continue
        states.add(row.dest)
        status = row.status or ("completed" if row.effect == "complete" else None)
        if status is not None:
            statuses.add(status)
    return frozenset(states), frozenset(statuses)


# -- why a row may not be reached ------------------------------------------------------

_ANY_TURN_GUARDS = frozenset(
    {("partial",), ("auth_error",), ("invalid_request",), ("content_filtered",), ("unknown",)}
)
"""The ``calling`` rows a final-answer turn takes as well as a regular one."""


def row_reason(settings: Settings, row: _table.Row) -> str | None:
    """Why the check may not reach ``row`` on ``settings``; ``None`` when it must.

    The reasons follow from the settings and the order of the rows (a row is tried
    only when the rows above it did not fire): no retries, no fallbacks, no
    reductions, a wall clock that every wait of some kind crosses, a ceiling that is
    spent first, a first turn that is already the final-answer turn. A reason that
    starts with "may" marks a row whose reach depends on the jitter draws or on a
    value the check's representative events do not use: it is not required, and it
    may be reached all the same. The rows of :data:`_REASONS` are read in order.
    """
    if _every_turn_reaches(row):
        return None
    first = _first_turn_is_final(settings)
    if first is not None:
        return first
    for matches, reason in _REASONS:
        if matches(row):
            return reason(settings)
    return None


def _every_turn_reaches(row: _table.Row) -> bool:
    """The start, the first assembly, a cancel before any wait, and the ``calling``
    rows a final-answer turn takes as well as a regular one."""
    if row.source in (_table.IDLE, _table.ASSEMBLING):
        return True
    if row.source != _table.CALLING:
        return False
    return (
        row.event == "Cancelled" or "final_answer" in row.guards or row.guards in _ANY_TURN_GUARDS
    )


def _reduce_reason(settings: Settings) -> str | None:
    if settings.max_context_reductions == 0:
        return "max_context_reductions = 0: a context overflow is never reduced"
    return None


def _conflict_reason(settings: Settings) -> str | None:
    if settings.max_conflict_retries == 0:
        return "max_conflict_retries = 0: a conflicting call is never re-invoked"
    return _first_wait_reason(settings)


def _fallback_reason(settings: Settings) -> str | None:
    if not settings.fallback_models:
        return "fallback_models is empty: there is no model to fall back to"
    return _NO_CEILING if settings.session_retry_ceiling == 0 else None


def _wait_reason(settings: Settings) -> str | None:
    return _retry_reason(settings) or _first_wait_reason(settings)


def _denial_reason(settings: Settings) -> str | None:
    counts = [n for n in (settings.denial_threshold, settings.denial_window_threshold) if n]
    if not counts:
        return "denial_threshold and denial_window are unset: the denial breaker is off"
    calls = max(2, settings.breaker_threshold, settings.doom_loop_threshold)
    if settings.max_turns is not None and settings.max_turns * calls < min(counts):
        return (
            f"max_turns ({settings.max_turns}) regular turns of at most {calls} calls deny "
            f"fewer than the {min(counts)} denials that trip the breaker"
        )
    return None


def _crash_reason(settings: Settings) -> str | None:
    # a provider crashes at most once per turn in a row: a round counts one death, and a
    # provider is only in a later round of its turn after a conflict, which resets it
    counts = [n for n in (settings.breaker_threshold, settings.breaker_window_threshold) if n]
    if settings.max_turns is not None and settings.max_turns < min(counts):
        return (
            f"max_turns ({settings.max_turns}) regular turns crash a provider at most "
            f"{settings.max_turns} times, fewer than the {min(counts)} that trip its breaker"
        )
    return None


_NO_CEILING = "session_retry_ceiling = 0: the session never retries, the ceiling row fires first"


def _first_turn_is_final(settings: Settings) -> str | None:
    for name in ("max_turns", "max_cost_usd", "max_wall_clock_s"):
        if getattr(settings, name) == 0:
            return f"{name} = 0: the first turn is already the final-answer turn"
    return None


def _retry_reason(settings: Settings) -> str | None:
    if settings.max_retries == 0:
        return "max_retries = 0: a call is never retried"
    if settings.session_retry_ceiling == 0:
        return _NO_CEILING
    return None


def _last_model_reason(settings: Settings) -> str | None:
    """Why the last model's first retry cannot be tried (the fallbacks spend the
    ceiling first), if so."""
    fallbacks = len(settings.fallback_models)
    if fallbacks and settings.session_retry_ceiling <= fallbacks:
        return (
            f"session_retry_ceiling ({settings.session_retry_ceiling}) is spent by the "
            f"{fallbacks} fallback(s) before the last model retries"
        )
    return None


_EXACT_WAITS = 10_000
"""Retries whose waits :func:`_waits` adds one by one; the rest are bounded."""


def _waits(settings: Settings, retries: int) -> tuple[float, float]:
    """The least and (exclusive) most seconds the first ``retries`` retries of one call
    wait, without a retry-after, over every jitter draw. Delays never shrink, so past
    :data:`_EXACT_WAITS` retries the last delay bounds the rest from below and
    ``max_delay_ms`` from above (a huge ``max_retries`` costs no time)."""
    args = (settings.base_delay_ms, settings.backoff_factor, settings.max_delay_ms)
    low = high = last = 0.0
    exact = min(retries, _EXACT_WAITS)
    for n in range(exact):
        last = wait_seconds(n, 0.0, None, *args)
        low += last
        high += wait_seconds(n, 1.0, None, *args)
    rest = retries - exact
    if rest:
        low += rest * last
        high += rest * wait_seconds(0, 1.0, None, settings.max_delay_ms, 1.0, settings.max_delay_ms)
    return low, high


def _fits(settings: Settings, what: str, low: float, high: float) -> str | None:
    """``None`` when ``low``..``high`` seconds always fit the wall clock, else why not."""
    limit = settings.max_wall_clock_s
    if limit is None or high <= limit:
        return None
    if low > limit:
        return f"{what} is at least {low:g} s, more than max_wall_clock_s ({limit:g} s)"
    return (
        f"may: {what} is {low:g} to {high:g} s by the jitter draws, max_wall_clock_s is {limit:g} s"
    )


def _first_wait_reason(settings: Settings) -> str | None:
    return _fits(settings, "the first retry's wait", *_waits(settings, 1))


def _ceiling_reason(settings: Settings) -> str | None:
    ceiling = settings.session_retry_ceiling
    if ceiling == 0:
        return None
    retries, fallbacks = settings.max_retries, len(settings.fallback_models)
    # every call of a turn (the first, and one after each reduction) may retry on
    # each model and fall back to the next
    calls = settings.max_context_reductions + 1
    per_turn = calls * ((fallbacks + 1) * retries + fallbacks)
    if per_turn == 0:
        return (
            f"max_retries = 0 and no fallback_models: the session's retries never grow "
            f"to session_retry_ceiling ({ceiling})"
        )
    if settings.max_turns is not None:
        if settings.max_turns * per_turn < ceiling:
            return (
                f"max_turns ({settings.max_turns}) regular turns use at most "
                f"{settings.max_turns * per_turn} retries, fewer than "
                f"session_retry_ceiling ({ceiling})"
            )
        return f"may: max_turns ({settings.max_turns}) bounds the turns the retries add up in"
    if fallbacks:
        return None  # a fallback takes no time: every turn adds one, the clock stays
    # a turn cancelled mid-backoff has spent a retry and none of the wait's time, so
    # the retries add up as long as one first wait fits the wall clock
    return _first_wait_reason(settings)


def _crosses_reason(settings: Settings) -> str | None:
    if settings.max_wall_clock_s is None:
        return "max_wall_clock_s is not set: no wait crosses the wall clock"
    reason = _retry_reason(settings) or _last_model_reason(settings)
    if reason is not None:
        return reason
    if _waits(settings, 1)[0] == 0:
        return (
            "may: the first retry's delay is 0 ms (base_delay_ms, max_delay_ms): only a "
            "server's retry-after makes it cross the wall clock, and the check sends "
            "none once the clock has run out"
        )
    return None


def _deferred_reason(settings: Settings) -> str | None:
    reason = _retry_reason(settings) or _last_model_reason(settings)
    if reason is not None:
        return reason
    server = settings.max_server_wait_s
    asked = _Ctx(settings, None, False).server_too_long
    limit = settings.max_wall_clock_s
    if limit is not None and limit <= server:
        return (
            f"max_wall_clock_s ({limit:g} s) <= max_server_wait_s ({server:g} s): a wait "
            "longer than max_server_wait_s always crosses the wall clock first "
            "(budget_exhausted)"
        )
    if not asked > server:
        return (
            f"may: max_server_wait_s ({server:g} s) is too large for the check's "
            "too-long retry-after to exceed it"
        )
    low, high = _waits(settings, 1)
    if limit is not None and low > limit:
        return (
            f"the first retry's wait is at least {low:g} s, more than "
            f"max_wall_clock_s ({limit:g} s)"
        )
    if limit is not None and asked > limit:
        return (
            f"may: the check's too-long retry-after ({asked:g} s) crosses max_wall_clock_s "
            f"({limit:g} s); a shorter one over max_server_wait_s would not"
        )
    return _fits(settings, "the first retry's wait", max(low, asked), max(high, asked))


def _spent_reason(settings: Settings) -> str | None:
    """The last ``[transient]`` row: the last model's retries are spent."""
    retries, fallbacks = settings.max_retries, len(settings.fallback_models)
    ceiling = settings.session_retry_ceiling
    if ceiling == 0:
        return _NO_CEILING
    if ceiling <= retries + fallbacks:
        return (
            f"session_retry_ceiling ({ceiling}) is reached before the {retries} retries"
            + (f" and {fallbacks} fallback(s)" if fallbacks else "")
            + " of a call are spent (retry_ceiling_reached instead)"
        )
    what = f"the sum of the {retries} waits of one call"
    return _fits(settings, what, *_waits(settings, retries))


_REASONS: tuple[tuple[Callable[[_table.Row], bool], Callable[[Settings], str | None]], ...] = (
    (
        lambda r: r.source == _table.REDUCING_CONTEXT or "reductions_left" in r.guards,
        _reduce_reason,
    ),
    (
        lambda r: r.source == _table.BACKING_OFF_TOOLS or "conflict_retry" in r.guards,
        _conflict_reason,
    ),
    (lambda r: "trips_denial_breaker" in r.guards, _denial_reason),
    (lambda r: "trips_breaker" in r.guards, _crash_reason),
    (lambda r: r.source == _table.BACKING_OFF or "wait_fits" in r.guards, _wait_reason),
    (lambda r: "fallback_left" in r.guards, _fallback_reason),
    (lambda r: "ceiling_reached" in r.guards, _ceiling_reason),
    (lambda r: "wait_crosses_wall_clock" in r.guards, _crosses_reason),
    (lambda r: "server_wait_too_long" in r.guards, _deferred_reason),
    (lambda r: r.guards == ("transient",), _spent_reason),
    (lambda r: "retries_left" in r.guards, _retry_reason),
)
"""(which rows, why they may not be reached): the first row that matches gives the
reason (``None``: the row must be reached)."""


def _space(settings: Settings) -> int:
    return (
        (settings.max_retries + 1)
        * (settings.session_retry_ceiling + 1)
        * (settings.max_context_reductions + 1)
        * (len(settings.fallback_models) + 1)
        * settings.breaker_threshold
        * (settings.max_turns or 1)
    )
