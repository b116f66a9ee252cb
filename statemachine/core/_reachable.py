"""The states the engine can reach: what the declaration cannot say field by field.

Each field of a :class:`SessionState` is checked by its kind when it is decoded; the
rules here relate fields to each other, to the settings and to the transition table.
:func:`reachable_problem` returns the first rule a state breaks (naming the key), or
``None``; ``restore`` and ``Session.from_state`` run it on every state they take in, and
the model check on every state it reaches. The groups of rules are asked in order, each
taking the ones before as holding: the session's, the turn's, then its path, a walk of
the table from ``idle`` to the turn's state through rows this kind of turn can take,
each step leaving the counters its effect leaves, with the action it emits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import attrs

from ._actions import Assemble, CallModel, Finish, InvokeTools, Wait
from ._events import Cancelled, ModelFailed, ModelReplied
from ._exceptions import SnapshotError
from ._settings import Settings
from ._state import TRACED, RowInfo, SessionState, Step, TurnState, traced_counters
from ._table import (
    BACKING_OFF_TOOLS,
    CALLING,
    EFFECTS,
    IDLE,
    INVOKING_TOOLS,
    ROWS,
    TERMINAL_STATES,
    Row,
)
from ._taxonomy import END_STATUSES, LIMIT_STATUSES, SessionStatus, ToolErrorCategory

_ACTION_NAMED = {cls.__name__: cls for cls in (Assemble, CallModel, Finish, InvokeTools, Wait)}
ACTION_OF_EFFECT: dict[str, type] = {
    effect: _ACTION_NAMED[emits.partition("(")[0]] for effect, emits in EFFECTS.items()
}
"""The action type each effect emits, as the table's ``EFFECTS`` names it."""

COUNTER_DELTAS: dict[str, tuple[int | None, int, int]] = {
    # effect: (attempt after: None = unchanged, 0 = reset, 1 = +1; reductions +; retries +)
    "call_model": (0, 0, 0),
    "retry": (1, 0, 0),
    "wait": (None, 0, 1),
    "fall_back": (0, 0, 1),
    "reduce": (None, 1, 0),
}
"""How each effect moves the counters a step carries (for validation, and to rebuild the
counters of version-1 snapshots, which stored none: the effects move the state, and
every step records what they left)."""

_TRACE_INDEX = {name: i for i, (_, name, _) in enumerate(TRACED)}
_ATTEMPT, _REDUCTIONS, _RETRIES = (_TRACE_INDEX[n] for n in ("attempt", "reductions", "retries"))
_ROW_OF: dict[RowInfo, Row] = {row.info: row for row in reversed(ROWS)}


def _row(step: Step) -> Row:
    """The table row ``step`` took (the first with its info, as a recorded step finds it)."""
    return _ROW_OF[step[0]]


def _counters(step: Step) -> tuple[int, ...]:
    """The counters ``step`` left, in :data:`TRACED` order."""
    return step[1:]


def _preempts(earlier: Row, row: Row) -> bool:
    """Whether ``earlier``, guarded by ``final_answer``, fires in the final-answer turn
    wherever ``row`` would: the same trigger, its other guards among ``row``'s."""
    return (
        (earlier.source, earlier.event) == (row.source, row.event)
        and "final_answer" in earlier.guards
        and set(earlier.guards) - {"final_answer"} <= set(row.guards)
    )


_ROWS_TAKEN_BY: dict[bool, frozenset[RowInfo]] = {
    False: frozenset(row.info for row in ROWS if "final_answer" not in row.guards),
    True: frozenset(
        row.info for i, row in enumerate(ROWS) if not any(_preempts(e, row) for e in ROWS[:i])
    ),
}
"""The rows a turn can take, by its ``final_answer`` flag (rows are tried in order)."""

_CHARGING_ROWS = frozenset(
    row.info
    for row in ROWS
    if row.event in (ModelReplied.__name__, ModelFailed.__name__)
    or (row.event == Cancelled.__name__ and row.source == CALLING)
)
"""The rows whose event may charge a model call's cost and report its usage: its
outcome, or the turn abandoned while it was in flight."""
_TOOL_ROUND = (INVOKING_TOOLS, BACKING_OFF_TOOLS)
_MIDWAY = frozenset(row.source for row in ROWS) - {IDLE}
"""The states of a turn that has started and not finished: those rows leave, but idle."""
_SPEND_EPSILON = 1e-9
_BOUND_OF_LIMIT: dict[SessionStatus, str] = {
    SessionStatus.ERROR_MAX_TURNS: "max_turns",
    SessionStatus.ERROR_MAX_BUDGET_USD: "max_cost_usd",
    SessionStatus.ERROR_MAX_WALL_CLOCK: "max_wall_clock_s",
}
_NONE_BEFORE_A_TURN = (
    *("turns", "limit", "retries", "draws", "waited_s", "idle_s", "tool_retries", "denials"),
    *("denial_log", "crash_logs", "breakers", "tripped", "doom_window", "doom_since", "doom_run"),
)
"""What a session counts only once it has a turn (its ``finished_at`` and own spend too)."""
_IDLE_FIELDS = tuple(
    (f.name, f.default)
    for f in attrs.fields(TurnState)
    if f.name not in ("index", "final_answer", "instruction", "state", "made")
)
"""What an idle (never started) turn holds: its declared defaults (and when it was
made)."""


def reachable_problem(state: SessionState, settings: Settings, *, checked: int = 0) -> str | None:
    """Why the engine could never be in ``state`` under ``settings`` (naming the key),
    or ``None``.

    ``checked``: how many of the current turn's first steps are known to pass their own
    checks (the model checker steps from a state that passed; the path only grows): the
    steps from there on are checked one by one, the whole state as always.
    """
    problem = (
        _limit_problem(state, settings)
        or _tree_problem(state)
        or _denial_problem(state, settings)
        or _crash_problem(state, settings)
        or _count_problem(state, settings)
    )
    if problem is not None:
        return problem
    turn = state.turn
    if turn is None:
        return _unstarted_problem(state)
    return (
        _latest_problem(state, turn)
        or _kind_problem(turn, state.limit)
        or _turn_count_problem(turn, settings)
        or _round_problem(turn)
        or _conflict_problem(turn, settings)
        or _charge_problem(turn)
        or _path_problem(turn, state, settings, checked)
    )


def check_reachable(state: SessionState, settings: Settings) -> None:
    """Raise :class:`SnapshotError` if the engine could never be in ``state``."""
    problem = reachable_problem(state, settings)
    if problem is not None:
        raise SnapshotError(problem)


def budget_left(state: SessionState, settings: Settings) -> float | None:
    """The smallest remaining ``max_cost_usd`` on the path to the root, from the state
    as recorded (the ancestors' budget last read, less the spend since): ``None`` when
    no session on the path has a budget."""
    limit = settings.max_cost_usd
    own = None if limit is None else limit - state.cost_usd
    above = state.ancestor_budget_usd
    if above is not None:
        above -= state.cost_usd - state.ancestor_mark_usd
    if own is None or above is None:
        return own if above is None else above
    return min(own, above)


def _limit_problem(state: SessionState, settings: Settings) -> str | None:
    """The status against the limit and the turn; the limit against its bound."""
    limit, status, turn = state.limit, state.status, state.turn
    if limit is not None and limit not in LIMIT_STATUSES:
        return f"limit: {limit.value} is not a limit's status"
    if status in LIMIT_STATUSES and status is not limit:
        return f"status: {status.value} is set but the limit that fired is {limit!s}"
    if status in END_STATUSES and turn is not None:
        if turn.final_answer and turn.state in TERMINAL_STATES:
            return f"status: {status.value}, but the final-answer turn ended it with its limit"
        if turn.state in _MIDWAY:
            return f"status: {status.value}, but turn {turn.index} is still {turn.state}"
    bound = _BOUND_OF_LIMIT.get(limit) if limit is not None else None
    budget = limit is SessionStatus.ERROR_MAX_BUDGET_USD
    unset = bound is not None and getattr(settings, bound) is None
    if unset and not (budget and state.ancestor_budget_usd is not None):
        return f"limit: {limit} fired but settings.{bound} is unset"
    if limit is SessionStatus.ERROR_MAX_TURNS and state.turns < settings.max_turns:  # type: ignore[operator]
        return f"limit: error_max_turns fired after {state.turns} of {settings.max_turns} turns"
    if budget and ((left := budget_left(state, settings)) is None or left > 0):
        return f"limit: error_max_budget_usd fired at a spend of {state.cost_usd}"
    return None


def _tree_problem(state: SessionState) -> str | None:
    """The session's place in its tree, and its children's spend."""
    children = state.child_costs or {}
    if children and state.session_id is None:
        return "session_id: a session with children has an id"
    if state.cost_usd + _SPEND_EPSILON * (1 + state.cost_usd) < sum(children.values()):
        return f"cost_usd: {state.cost_usd} is less than the children's spend"
    if state.parent_id is not None and state.session_id is None:
        return "session_id: a child session has an id"
    ancestors = state.ancestor_budget_usd is not None or state.ancestor_mark_usd
    if state.parent_id is None and ancestors:
        return "ancestor_budget_usd: a root session has no ancestors"
    if len(children) != state.children:
        return f"children: {state.children} spawned, but {len(children)} are known"
    if state.ancestor_mark_usd > state.cost_usd:
        return "ancestor_mark_usd: beyond the session's spend"
    return None


def _denial_problem(state: SessionState, settings: Settings) -> str | None:
    """Denials in a row and in the window, and the breaker they trip."""
    threshold, window = settings.denial_threshold, settings.denial_window
    if state.denials > (threshold or 0):
        return f"denials: {state.denials} is over denial_threshold"
    if len(state.denial_log) > (window or 0):
        return f"denial_log: longer than denial_window ({window})"
    counted = settings.denial_window_threshold
    tripped = (threshold is not None and state.denials >= threshold) or (
        counted is not None and state.denial_log.count("1") >= counted
    )
    if tripped and state.limit is None:
        return "denials: the denial breaker's count is reached, but no limit has fired"
    if state.limit is SessionStatus.ERROR_DENIAL_BREAKER and not tripped:
        return "limit: error_denial_breaker fired, but the denials do not reach it"
    return None


def _crash_problem(state: SessionState, settings: Settings) -> str | None:
    """Each provider's crash window and count, and the breakers they trip."""
    window, tripped = settings.breaker_window, state.tripped
    for provider, log in (state.crash_logs or {}).items():
        if "1" not in log or len(log) > (window or 0):
            return f"crash_logs.{provider}: not a window of recent crashes"
        if log.count("1") >= settings.breaker_window_threshold and provider not in tripped:  # type: ignore[operator]
            return f"crash_logs.{provider}: its crashes reach the window's count, not tripped"
    if tripped and state.limit is None:
        return "tripped: a provider's breaker is open but no limit has fired"
    if state.limit is SessionStatus.ERROR_CIRCUIT_BREAKER and not tripped:
        return "limit: error_circuit_breaker fired but no provider is tripped"
    for provider, count in (state.breakers or {}).items():
        if count <= 0:
            return f"breakers.{provider}: a crash count of {count} (zero counts are not kept)"
        if count >= settings.breaker_threshold and provider not in tripped:
            return f"breakers.{provider}: {count} crashes reach the threshold but it is not tripped"
    return None


def _count_problem(state: SessionState, settings: Settings) -> str | None:
    """The doom detector's run and window, retries, draws and turns."""
    if len(state.doom_window) > settings.doom_check_window:
        return "doom_window: longer than doom_check_window"
    if state.doom_since >= settings.doom_check_window:
        return "doom_since: the second-tier check is overdue"
    if state.doom_run >= settings.doom_loop_threshold and state.limit is None:
        return f"doom_run: {state.doom_run} identical calls in a row, but no limit has fired"
    if state.limit is SessionStatus.ERROR_DOOM_LOOP and state.turns == 0:
        return "limit: error_doom_loop fired before any turn"
    if (state.doom_last is None) != (state.doom_run == 0):
        return "doom_run: a run of identical calls needs its fingerprint, and only then"
    if state.retries > settings.session_retry_ceiling:
        return f"retries: {state.retries} is over session_retry_ceiling"
    if state.draws > state.retries + state.tool_retries:
        return (
            f"draws: {state.draws} jitter draws for {state.retries} retries and "
            f"{state.tool_retries} tool re-invocations"
        )
    if state.waited_s > 0 and state.draws == 0:
        return "waited_s: waits were taken, but no jitter was drawn"
    if settings.max_turns is not None and state.turns > settings.max_turns + 1:
        return f"turns: {state.turns} is beyond max_turns + the final-answer turn"
    return None


def _unstarted_problem(state: SessionState) -> str | None:
    """A session with no turn yet has counted nothing (a host may have ended it)."""
    for name in _NONE_BEFORE_A_TURN:
        if value := getattr(state, name):
            return f"turn: missing, but the session has {name} = {value!r:.60}"
    if state.finished_at is not None:
        return "turn: missing, but the session has finished_at, the end of a turn"
    if state.cost_usd - sum((state.child_costs or {}).values()) > _SPEND_EPSILON:
        return f"turn: missing, but the session has spent {state.cost_usd} on its own"
    return None


def _latest_problem(state: SessionState, turn: TurnState) -> str | None:
    """The turn is the latest; the session ends between turns."""
    if turn.index != state.turns:
        return f"turn.index: {turn.index} is not the session's latest turn ({state.turns})"
    if state.status in LIMIT_STATUSES and not (turn.final_answer and turn.state in TERMINAL_STATES):
        return "status: the session ended, but not with a finished final-answer turn"
    if turn.state in _MIDWAY and state.finished_at is not None:
        return "finished_at: a turn is running, so the session is not between turns"
    return None


def _kind_problem(turn: TurnState, limit: SessionStatus | None) -> str | None:
    """The final-answer flag against the limit; what an idle turn holds."""
    if turn.final_answer != (turn.instruction is not None):
        return "turn.instruction: a final-answer turn has an instruction, and only it"
    if turn.final_answer and limit is None:
        return "turn.final_answer: a final-answer turn, but no limit has fired"
    # a plain turn still running after a limit is a tool round that met the doom loop
    doomed = turn.state in _TOOL_ROUND and limit is SessionStatus.ERROR_DOOM_LOOP
    running = turn.state not in TERMINAL_STATES and not (turn.final_answer or doomed)
    if limit is not None and running:
        return f"turn.state: a turn still {turn.state} after {limit.value} fired"
    if turn.state == IDLE:
        for name, default in _IDLE_FIELDS:
            value = getattr(turn, name)
            if value != default and not (isinstance(default, attrs.Factory) and not value):  # type: ignore[arg-type]
                return f"turn.{name}: an idle turn holds nothing yet, got {value!r:.60}"
    return None


def _turn_count_problem(turn: TurnState, settings: Settings) -> str | None:
    """The turn's counters, and one action and one time per step, in order."""
    if turn.attempt > settings.max_retries:
        return f"turn.attempt: {turn.attempt} is over max_retries"
    if turn.reductions > settings.max_context_reductions:
        return f"turn.reductions: {turn.reductions} is over max_context_reductions"
    if not -1 <= turn.model_index < len(settings.fallback_models):
        return f"turn.model_index: {turn.model_index} is out of range"
    if len(turn.fallbacks) != turn.model_index + 1:
        return "turn.fallbacks: not one fallback per move down fallback_models"
    if turn.final_answer and (turn.attempt or turn.fallbacks):
        return "turn.attempt: the final-answer turn makes one attempt only"
    if len(turn.path) != len(turn.actions):
        return "turn.actions: not one action per transition of turn.path"
    if len(turn.times) != len(turn.path):
        return "turn.times: not one time per transition of turn.path"
    known = [t for t in turn.times if not math.isnan(t)]  # NaN: unknown (format 3)
    if any(later < earlier for earlier, later in pairwise(known)):
        return "turn.times: a transition was taken before the one it follows"
    return None


def _round_problem(turn: TurnState) -> str | None:
    """The tool round's lists hold distinct calls of the reply."""
    outcomes, pending = turn.outcomes, turn.pending
    ids = {call.id for call in turn.calls}
    if len(ids) != len(turn.calls):
        return "turn.calls: two calls in flight share an id"
    if turn.in_flight and any(call not in turn.calls for call in turn.in_flight):
        return "turn.in_flight: a call that is not one of the reply's"
    answered = {o.call_id for o in outcomes}
    if len(answered) != len(outcomes) or not answered <= ids:
        return "turn.outcomes: not one outcome per call of the reply"
    if len(set(pending)) != len(pending) or not ids.issuperset(pending):
        return "turn.pending: not distinct calls of the reply"
    conflict = ToolErrorCategory.CONCURRENCY_CONFLICT
    if not {o.call_id for o in outcomes if o.category is conflict}.issuperset(pending):
        return "turn.pending: a call waits to be re-invoked, but did not conflict"
    if pending and turn.state not in _TOOL_ROUND:
        return f"turn.pending: calls wait to be re-invoked in state {turn.state!r}"
    return None


def _conflict_problem(turn: TurnState, settings: Settings) -> str | None:
    """The conflicting calls waiting to go again, against the turn's state."""
    pending, conflicts, state = turn.pending, turn.conflict_attempt, turn.state
    if conflicts > settings.max_conflict_retries:
        return f"turn.conflict_attempt: {conflicts} is over max_conflict_retries"
    if conflicts and not pending:
        return "turn.conflict_attempt: counts re-invocations, but no call is pending"
    if state == BACKING_OFF_TOOLS and not (pending and conflicts):
        return "turn.pending: backing off with no conflicting call to re-invoke"
    if state == BACKING_OFF_TOOLS and not _answered(turn):
        return "turn.outcomes: backing off before every call has an outcome"
    if state == INVOKING_TOOLS and not pending and (turn.in_flight != turn.calls or turn.outcomes):
        return "turn.in_flight: a first tool round has every call in flight, no outcome yet"
    alone = [call.id for call in turn.in_flight] == list(pending[:1])
    if state == INVOKING_TOOLS and pending and not (conflicts and alone and _answered(turn)):
        return "turn.in_flight: a re-invocation is the first pending call alone"
    return None


def _answered(turn: TurnState) -> bool:
    """Whether every call of the reply has an outcome."""
    return {o.call_id for o in turn.outcomes} == {call.id for call in turn.calls}


def _charge_problem(turn: TurnState) -> str | None:
    """Each cost and usage kept names a later model call's outcome (or abandonment)
    than the one before; a cost is a charge, and a usage reports what its step charged."""
    path, costs, usages = turn.path, turn.costs or (), turn.usages or ()
    for key, kept in (("costs", costs), ("usages", usages)):
        previous = -1
        for i, (index, _) in enumerate(kept):
            if index <= previous or index >= len(path):
                return f"turn.{key}[{i}]: step {index} is not a later step of the turn"
            if path[index][0] not in _CHARGING_ROWS:
                return f"turn.{key}[{i}]: step {index} is no model call's outcome"
            previous = index
    for i, (_, cost) in enumerate(costs):
        if not cost > 0:
            return f"turn.costs[{i}]: an event that cost nothing is not kept"
    charged = dict(costs)
    for i, (index, usage) in enumerate(usages):
        if usage.cost_usd is not None and usage.cost_usd != charged.get(index, 0.0):
            return f"turn.usages[{i}]: a cost of {usage.cost_usd!r} where the step charged another"
    return None


def _path_problem(
    turn: TurnState, session: SessionState, settings: Settings, checked: int
) -> str | None:
    """A walk of the table from ``idle`` (or the last step checked) to the turn's state,
    each step through a row this kind of turn can take, with the action it emits."""
    path = turn.path
    first = checked if 0 < checked <= len(path) else 0
    before = path[first - 1] if first else None
    where = IDLE if before is None else _row(before).dest
    left = None if before is None else _counters(before)
    for i in range(first, len(path)):
        step = path[i]
        row = _row(step)
        if row.source != where:
            return f"turn.path[{i}]: starts in {row.source!r}, but the turn was in {where!r}"
        counters = _counters(step)
        problem = _step_problem(i, step, row, counters, left, turn, settings)
        if problem is not None:
            return problem
        where, left = row.dest, counters
    return _end_problem(turn, session, where, left)


def _step_problem(
    i: int,
    step: Step,
    row: Row,
    counters: tuple[int, ...],
    left: tuple[int, ...] | None,
    turn: TurnState,
    settings: Settings,
) -> str | None:
    """Step ``i`` of the path, ``step`` through ``row``, leaving ``counters`` where the
    step before left ``left`` (``None``: the first step): a row this kind of turn takes,
    leaving the counters its effect leaves (the first step: from none, at the session's
    retries), the attempt within its cap (it resets), with an action of the type the
    effect emits, that fits it."""
    if step[0] not in _ROWS_TAKEN_BY[turn.final_answer]:
        on = f"{row.event} [{row.label}]" if row.label else row.event
        fires = "never fires in" if turn.final_answer else "fires only in"
        return f"turn.path[{i}]: {row.source} --{on}--> {row.dest} {fires} the final-answer turn"
    attempt, reductions, retries = COUNTER_DELTAS.get(row.effect, (None, 0, 0))
    expected = [0] * len(counters) if left is None else list(left)
    if left is None:
        expected[_RETRIES] = counters[_RETRIES] - retries
    if attempt is not None:
        expected[_ATTEMPT] = expected[_ATTEMPT] + attempt if attempt else 0
    expected[_REDUCTIONS] += reductions
    expected[_RETRIES] += retries
    if counters != tuple(expected):
        return (
            f"turn.path[{i}]: counters {counters} after {row.effect}, "
            f"where the effect leaves {tuple(expected)}"
        )
    if counters[_ATTEMPT] > settings.max_retries:
        return f"turn.path[{i}]: attempt {counters[_ATTEMPT]} is over max_retries"
    action, emits = turn.actions[i], ACTION_OF_EFFECT[row.effect]
    if type(action) is not emits:
        return f"turn.actions[{i}]: a {type(action).__name__} for effect {row.effect}"
    problem = _ACTION_RULES[emits](action, row, turn, counters[_ATTEMPT], settings)
    return None if problem is None else f"turn.actions[{i}]: {problem}"


def _end_problem(
    turn: TurnState, session: SessionState, where: str, left: tuple[int, ...] | None
) -> str | None:
    """The path ends where the turn is (``where``, its last step leaving the counters
    ``left``), with its counters, request and calls."""
    if where != turn.state:
        return f"turn.state: {turn.state!r} is not where the turn's path ends ({where!r})"
    if left is not None and left != (live := traced_counters(turn, session)):
        return f"turn.path: its last counters {left} are not the turn's {live}"
    call = next((a for a in reversed(turn.actions) if type(a) is CallModel), None)
    if call is not None and call.request != turn.request:
        return "turn.request: not the request of the turn's last CallModel"
    if turn.state == INVOKING_TOOLS and (
        not turn.in_flight or turn.actions[-1] != InvokeTools(turn.in_flight)
    ):
        return "turn.in_flight: the calls in flight are not those of the last InvokeTools"
    costs = sum(cost for _, cost in turn.costs or ())
    if costs > session.cost_usd + _SPEND_EPSILON * (1 + costs):
        return "turn.costs: the turn spent more than the session's spend"
    return None


def _finish(action: Finish, row: Row, *_: object) -> str | None:
    status = row.status or "completed"  # a ``complete`` row names none: it completes
    if action.status.value != status:
        return f"status {action.status} for a {status} row"
    return None


def _assemble(action: Assemble, row: Row, turn: TurnState, *_: object) -> str | None:
    if action.reduce != (row.effect == "reduce"):
        return f"Assemble(reduce={action.reduce}) for effect {row.effect}"
    # only the final-answer turn has an instruction, and it never reduces (its rows)
    if action.withhold_tools != turn.final_answer or action.instruction != turn.instruction:
        return "the final-answer flags do not fit the turn"
    return None


def _call(
    action: CallModel, _: Row, turn: TurnState, attempt: int, settings: Settings
) -> str | None:
    if action.attempt != attempt:
        return f"CallModel attempt {action.attempt}, the step says {attempt}"
    if action.withhold_tools != turn.final_answer:
        return "CallModel withhold_tools does not fit the turn"
    if action.model != settings.model and action.model not in settings.fallback_models:
        return "CallModel to a model the settings do not name"
    return None


def _wait(action: Wait, row: Row, _: TurnState, attempt: int, settings: Settings) -> str | None:
    if row.effect == "tool_wait":  # before a conflicting call goes again
        if action.category is not ToolErrorCategory.CONCURRENCY_CONFLICT:
            return f"a tool round's Wait for {action.category}"
        if action.attempt >= settings.max_conflict_retries:
            return f"Wait attempt {action.attempt} beyond max_conflict_retries"
        if action.retry_after is not None:
            return "a tool round's Wait names a server's retry-after"
    elif action.attempt != attempt:
        return f"Wait attempt {action.attempt}, not the step's"
    elif action.retry_after is not None and not action.retry_after <= action.seconds:
        return "a wait shorter than the retry-after it honours"
    # a backoff is at most its cap times the largest jitter; a server's, max_server_wait_s
    longest = max(settings.max_delay_ms / 1000.0 * 1.5, settings.max_server_wait_s)
    if not (math.isfinite(action.seconds) and 0 <= action.seconds <= longest):
        return f"a wait of {action.seconds!r} s the settings cannot ask for"
    return None


def _invoke(action: InvokeTools, row: Row, turn: TurnState, *_: object) -> str | None:
    if row.effect == "reinvoke" and (len(action.calls) != 1 or action.calls[0] not in turn.calls):
        return "a re-invocation is one call of the reply"
    return None


_ACTION_RULES: dict[type, Callable[[Any, Row, TurnState, int, Settings], str | None]] = {
    Finish: _finish,
    Assemble: _assemble,
    CallModel: _call,
    Wait: _wait,
    InvokeTools: _invoke,
}
"""The rules of each type of action (given its row, the turn, the step's attempt)."""
