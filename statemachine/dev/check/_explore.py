"""Breadth-first exploration of the abstract state space, on the real engine, and the
checks over the whole graph (termination, no cycle within a turn)."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence
from typing import Any

from ...core._events import (
    ModelFailed,
)
from ...core._session import Session
from ...core._settings import Settings
from ...core._table import (
    BACKING_OFF,
    IDLE,
    REDUCING_CONTEXT,
    RUNNING_STATES,
    START,
    STATES,
    TERMINAL_STATES,
    Row,
)
from ...core._taxonomy import ErrorCategory, TurnStatus
from ._abstraction import _accelerate, _clone, _key, _Node, _node, _rank

# -- the exploration ---------------------------------------------------------------
from ._events import (
    _CLOCK_ZERO,
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


class _Explorer(Properties):
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
