"""The states the engine can reach: what the declaration cannot say field by field.

Each field of a :class:`SessionState` is checked by its kind when it is decoded; the
rules here relate fields to each other and to the settings. :func:`reachable_problem`
returns the first rule a state breaks (naming the key), or ``None``. ``restore`` and
``Session.from_state`` run it on every state they take in, and the model check runs it
on every state it reaches, so a rule that refused a reachable state would fail there.

The rules, in the order they are checked:

* the session: a status is the limit that fired; a limit names a bound that is set and
  reached (turns, spend), a tripped provider (breaker) or a run of identical calls
  (doom loop); a tripped provider or a doom run at the threshold implies a limit; crash
  counts are above zero and below the threshold unless tripped; retries within the
  ceiling, jitter draws within the retries; the doom run has its fingerprint; at most
  ``max_turns`` + 1 turns; before the first turn every counter is zero.
* the turn: the session's latest; final-answer exactly when it has the instruction, and
  only once a limit fired; a non-final turn that is still running while a limit has
  fired can only be in ``invoking_tools`` with the doom loop just detected; an idle turn
  holds nothing but its defaults; counters and the model index within their settings;
  one fallback per move down the chain.
* the path: a walk of the table from ``idle`` to the turn's state; at every step the
  counters move exactly as the row's effect moves them; every action is the one its
  effect emits (its type, status, attempt, model, request, reduce and withhold flags);
  a wait within what the settings can ask for; the final-answer turn never invokes
  tools; the calls in flight are those of the last ``InvokeTools``, with distinct ids.
"""

from __future__ import annotations

import math
from itertools import pairwise

import attrs

from ._actions import Action, Assemble, CallModel, Finish, InvokeTools, Wait
from ._exceptions import SnapshotError
from ._settings import Settings
from ._state import TRACED, RowInfo, SessionState, Step, TurnState, traced_counters
from ._table import BACKING_OFF_TOOLS, IDLE, INVOKING_TOOLS, ROWS, TERMINAL_STATES
from ._taxonomy import END_STATUSES, LIMIT_STATUSES, SessionStatus, ToolErrorCategory

_RUNNING_TOOLS = (INVOKING_TOOLS, BACKING_OFF_TOOLS)
_SPEND_EPSILON = 1e-9

ACTION_OF_EFFECT: dict[str, type] = {
    "assemble": Assemble,
    "reduce": Assemble,
    "call_model": CallModel,
    "retry": CallModel,
    "fall_back": CallModel,
    "wait": Wait,
    "invoke_tools": InvokeTools,
    "tool_wait": Wait,
    "reinvoke": InvokeTools,
    "complete": Finish,
    "finish_tools": Finish,
    "finish": Finish,
    "cancel": Finish,
}
"""The action type each effect emits."""

_STATUS_OF_ROW: dict[RowInfo, str] = {
    r.info: r.status or "completed"
    for r in ROWS
    if r.effect in ("complete", "finish_tools", "finish", "cancel")
}
"""The status a finishing row's ``Finish`` carries (``complete`` rows: completed)."""

_BOUND_OF_LIMIT: dict[SessionStatus, str] = {
    SessionStatus.ERROR_MAX_TURNS: "max_turns",
    SessionStatus.ERROR_MAX_BUDGET_USD: "max_cost_usd",
    SessionStatus.ERROR_MAX_WALL_CLOCK: "max_wall_clock_s",
}

_TRACE_INDEX = {name: i for i, (_, name, _) in enumerate(TRACED)}
_ATTEMPT, _REDUCTIONS, _RETRIES = (
    _TRACE_INDEX["attempt"],
    _TRACE_INDEX["reductions"],
    _TRACE_INDEX["retries"],
)

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

_IDLE_FIELDS = tuple(
    (f.name, f.default)
    for f in attrs.fields(TurnState)
    if f.name not in ("index", "final_answer", "instruction", "state")
)
"""What an idle (never started) turn holds: its declared defaults."""


def reachable_problem(state: SessionState, settings: Settings, *, checked: int = 0) -> str | None:
    """Why the engine could never be in ``state`` under ``settings`` (naming the key),
    or ``None``.

    ``checked``: how many of the current turn's first steps are known to pass their own
    checks (the model checker steps from a state that passed; the path only grows): the
    steps from there on are checked one by one, the whole state as always.
    """
    problem = _session_problem(state, settings)
    if problem is not None or state.turn is None:
        return problem
    turn = state.turn
    return _turn_problem(turn, state, settings) or _path_problem(turn, state, settings, checked)


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


def _session_problem(state: SessionState, settings: Settings) -> str | None:
    limit, status = state.limit, state.status
    if limit is not None and limit not in LIMIT_STATUSES:
        return f"limit: {limit.value} is not a limit's status"
    if status in LIMIT_STATUSES and status is not limit:
        return f"status: {status.value} is set but the limit that fired is {limit!s}"
    if status in END_STATUSES and state.turn is not None:
        turn_state = state.turn.state
        if state.turn.final_answer and turn_state in TERMINAL_STATES:
            return f"status: {status.value}, but the final-answer turn ended it with its limit"
        if turn_state != IDLE and turn_state not in TERMINAL_STATES:
            return f"status: {status.value}, but turn {state.turn.index} is still {turn_state}"
    budget = limit is SessionStatus.ERROR_MAX_BUDGET_USD
    if (
        limit in _BOUND_OF_LIMIT
        and getattr(settings, _BOUND_OF_LIMIT[limit]) is None
        and not (budget and state.ancestor_budget_usd is not None)
    ):
        return f"limit: {limit.value} fired but settings.{_BOUND_OF_LIMIT[limit]} is unset"
    if limit is SessionStatus.ERROR_MAX_TURNS and state.turns < settings.max_turns:  # type: ignore[operator]
        return f"limit: error_max_turns fired after {state.turns} of {settings.max_turns} turns"
    left = budget_left(state, settings)
    if budget and (left is None or left > 0):
        return f"limit: error_max_budget_usd fired at a spend of {state.cost_usd}"
    problem = _tree_problem(state) or _tools_problem(state, settings)
    if problem is not None:
        return problem
    if state.tripped and limit is None:
        return "tripped: a provider's breaker is open but no limit has fired"
    if limit is SessionStatus.ERROR_CIRCUIT_BREAKER and not state.tripped:
        return "limit: error_circuit_breaker fired but no provider is tripped"
    doom = settings.doom_loop_threshold
    if state.doom_run >= doom and limit is None:
        return f"doom_run: {state.doom_run} identical calls in a row, but no limit has fired"
    if limit is SessionStatus.ERROR_DOOM_LOOP and state.turns == 0:
        return "limit: error_doom_loop fired before any turn"
    for provider, count in (state.breakers or {}).items():
        if count <= 0:
            return f"breakers.{provider}: a crash count of {count} (zero counts are not kept)"
        if count >= settings.breaker_threshold and provider not in state.tripped:
            return f"breakers.{provider}: {count} crashes reach the threshold but it is not tripped"
    if state.retries > settings.session_retry_ceiling:
        return f"retries: {state.retries} is over session_retry_ceiling"
    if state.draws > state.retries + state.tool_retries:
        return (
            f"draws: {state.draws} jitter draws for {state.retries} retries and "
            f"{state.tool_retries} tool re-invocations"
        )
    if state.waited_s > 0 and state.draws == 0:
        return "waited_s: waits were taken, but no jitter was drawn"
    if (state.doom_last is None) != (state.doom_run == 0):
        return "doom_run: a run of identical calls needs its fingerprint, and only then"
    if settings.max_turns is not None and state.turns > settings.max_turns + 1:
        return f"turns: {state.turns} is beyond max_turns + the final-answer turn"
    if state.turn is None:
        if state.turns or limit is not None or (status is not None and status not in END_STATUSES):
            return "turn: missing, but the session has turns or a limit"
        own = state.cost_usd - sum((state.child_costs or {}).values())
        if state.retries or state.draws or own > _SPEND_EPSILON or state.waited_s:
            return "turn: missing, but the session has counted retries or spend"
        if state.tool_retries or state.denials or state.denial_log or state.crash_logs:
            return "turn: missing, but the session has counted tool outcomes"
        if state.finished_at is not None or state.idle_s or state.doom_window or state.doom_since:
            return "turn: missing, but the session has finished turns or seen tool calls"
        if state.breakers or state.tripped or state.doom_run:
            return "turn: missing, but the session has crash counts or a doom run"
        return None
    if state.turn.index != state.turns:
        return f"turn.index: {state.turn.index} is not the session's latest turn ({state.turns})"
    if status in LIMIT_STATUSES and not (
        state.turn.final_answer and state.turn.state in TERMINAL_STATES
    ):
        return "status: the session ended, but not with a finished final-answer turn"
    running = state.turn.state != IDLE and state.turn.state not in TERMINAL_STATES
    if running and state.finished_at is not None:
        return "finished_at: a turn is running, so the session is not between turns"
    return None


def _tree_problem(state: SessionState) -> str | None:
    children = state.child_costs or {}
    if children and state.session_id is None:
        return "session_id: a session with children has an id"
    if state.cost_usd + _SPEND_EPSILON * (1 + state.cost_usd) < sum(children.values()):
        return f"cost_usd: {state.cost_usd} is less than the children's spend"
    if state.parent_id is not None and state.session_id is None:
        return "session_id: a child session has an id"
    if state.parent_id is None and (
        state.ancestor_budget_usd is not None or state.ancestor_mark_usd
    ):
        return "ancestor_budget_usd: a root session has no ancestors"
    if len(children) != state.children:
        return f"children: {state.children} spawned, but {len(children)} are known"
    if state.ancestor_mark_usd > state.cost_usd:
        return "ancestor_mark_usd: beyond the session's spend"
    return None


def _tools_problem(state: SessionState, settings: Settings) -> str | None:
    limit = state.limit
    threshold = settings.denial_threshold
    window, counted = settings.denial_window, settings.denial_window_threshold
    if threshold is None and state.denials:
        return "denials: counted, but denial_threshold is unset"
    if threshold is not None and state.denials > threshold:
        return f"denials: {state.denials} is over denial_threshold"
    if len(state.denial_log) > (window or 0):
        return f"denial_log: longer than denial_window ({window})"
    tripped = (threshold is not None and state.denials >= threshold) or (
        counted is not None and state.denial_log.count("1") >= counted
    )
    if tripped and limit is None:
        return "denials: the denial breaker's count is reached, but no limit has fired"
    if limit is SessionStatus.ERROR_DENIAL_BREAKER and not tripped:
        return "limit: error_denial_breaker fired, but the denials do not reach it"
    logs = state.crash_logs or {}
    if logs and settings.breaker_window is None:
        return "crash_logs: kept, but breaker_window is unset"
    for provider, log in logs.items():
        if "1" not in log or len(log) > settings.breaker_window:  # type: ignore[operator]
            return f"crash_logs.{provider}: not a window of recent crashes"
        if (
            log.count("1") >= settings.breaker_window_threshold  # type: ignore[operator]
            and provider not in state.tripped
        ):
            return f"crash_logs.{provider}: its crashes reach the window's count, not tripped"
    if len(state.doom_window) > settings.doom_check_window:
        return "doom_window: longer than doom_check_window"
    if state.doom_since >= settings.doom_check_window:
        return "doom_since: the second-tier check is overdue"
    return None


def _turn_problem(turn: TurnState, session: SessionState, settings: Settings) -> str | None:
    if turn.final_answer != (turn.instruction is not None):
        return "turn.instruction: a final-answer turn has an instruction, and only it"
    if turn.final_answer and session.limit is None:
        return "turn.final_answer: a final-answer turn, but no limit has fired"
    running = turn.state not in TERMINAL_STATES
    if (
        running
        and session.limit is not None
        and not turn.final_answer
        and not (turn.state in _RUNNING_TOOLS and session.limit is SessionStatus.ERROR_DOOM_LOOP)
    ):
        return f"turn.state: a turn still {turn.state} after {session.limit.value} fired"
    if turn.state == IDLE:
        for name, default in _IDLE_FIELDS:
            value = getattr(turn, name)
            if value != default and not (isinstance(default, attrs.Factory) and not value):  # type: ignore[arg-type]
                return f"turn.{name}: an idle turn holds nothing yet, got {value!r:.60}"
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
    ids = [call.id for call in turn.calls]
    if len(set(ids)) != len(ids):
        return "turn.calls: two calls in flight share an id"
    return _round_problem(turn, settings)


def _round_problem(turn: TurnState, settings: Settings) -> str | None:
    # each rule on a list of the round is only looked at when the list holds something
    # (a turn between tool rounds, the common case, holds none)
    calls, outcomes, pending = turn.calls, turn.outcomes, turn.pending
    ids = {call.id for call in calls}
    if turn.in_flight and any(call not in calls for call in turn.in_flight):
        return "turn.in_flight: a call that is not one of the reply's"
    if outcomes and (
        len({o.call_id for o in outcomes}) != len(outcomes)
        or any(o.call_id not in ids for o in outcomes)
    ):
        return "turn.outcomes: not one outcome per call of the reply"
    if pending and (len(set(pending)) != len(pending) or any(i not in ids for i in pending)):
        return "turn.pending: not distinct calls of the reply"
    latest = {o.call_id: o for o in outcomes}
    conflict = ToolErrorCategory.CONCURRENCY_CONFLICT
    if pending and any(i not in latest or latest[i].category is not conflict for i in pending):
        return "turn.pending: a call waits to be re-invoked, but did not conflict"
    if turn.pending and turn.state not in _RUNNING_TOOLS:
        return f"turn.pending: calls wait to be re-invoked in state {turn.state!r}"
    if turn.state == BACKING_OFF_TOOLS and not (turn.pending and turn.conflict_attempt):
        return "turn.pending: backing off with no conflicting call to re-invoke"
    if turn.conflict_attempt > settings.max_conflict_retries:
        return f"turn.conflict_attempt: {turn.conflict_attempt} is over max_conflict_retries"
    if turn.conflict_attempt and not turn.pending:
        return "turn.conflict_attempt: counts re-invocations, but no call is pending"
    call_ids = [call.id for call in turn.calls]
    answered = sorted(latest) == sorted(call_ids)
    if turn.state == INVOKING_TOOLS:
        if not turn.pending and (turn.in_flight != turn.calls or turn.outcomes):
            return "turn.in_flight: a first tool round has every call in flight, no outcome yet"
        if turn.pending and not (
            answered
            and turn.conflict_attempt >= 1
            and [call.id for call in turn.in_flight] == [turn.pending[0]]
        ):
            return "turn.in_flight: a re-invocation is the first pending call alone"
    if turn.state == BACKING_OFF_TOOLS and not answered:
        return "turn.outcomes: backing off before every call has an outcome"
    if turn.state in TERMINAL_STATES and (turn.pending or turn.conflict_attempt):
        return "turn.pending: a finished turn re-invokes nothing"
    previous = -1
    for i, (index, cost) in enumerate(turn.costs or ()):
        if not cost > 0:
            return f"turn.costs[{i}]: an event that cost nothing is not kept"
        if index <= previous or index >= len(turn.path):
            return f"turn.costs[{i}]: step {index} is not a later step of the turn"
        if turn.path[index][0][1] not in ("ModelReplied", "ModelFailed"):
            return f"turn.costs[{i}]: step {index} is no model call's outcome"
        previous = index
    return _usage_problem(turn)


def _usage_problem(turn: TurnState) -> str | None:
    """Each usage kept belongs to a model call's outcome, in order, and the cost it
    reports is what that step charged."""
    previous = -1
    charged = dict(turn.costs or ())
    for i, (index, usage) in enumerate(turn.usages or ()):
        if index <= previous or index >= len(turn.path):
            return f"turn.usages[{i}]: step {index} is not a later step of the turn"
        if turn.path[index][0][1] not in ("ModelReplied", "ModelFailed"):
            return f"turn.usages[{i}]: step {index} is no model call's outcome"
        if usage.cost_usd is not None and usage.cost_usd != charged.get(index, 0.0):
            return f"turn.usages[{i}]: a cost of {usage.cost_usd!r} where the step charged another"
        previous = index
    return None


def _path_problem(
    turn: TurnState, session: SessionState, settings: Settings, checked: int = 0
) -> str | None:
    where = IDLE
    previous: Step | None = None
    if 0 < checked <= len(turn.path):
        previous = turn.path[checked - 1]
        where = previous[0][3]
    else:
        checked = 0
    longest_wait = max(settings.max_delay_ms / 1000.0 * 1.5, settings.max_server_wait_s)
    models = (settings.model, *settings.fallback_models)
    max_retries, max_reductions = settings.max_retries, settings.max_context_reductions
    path, actions = turn.path, turn.actions
    for i in range(checked, len(path)):
        step = path[i]
        info = step[0]
        if info[0] != where:
            return f"turn.path[{i}]: starts in {info[0]!r}, but the turn was in {where!r}"
        problem = _step_problem(i, step, previous, info[4])
        if problem is not None:
            return problem
        counters: tuple[int, ...] = step[1:]
        if counters[_ATTEMPT] > max_retries:
            return f"turn.path[{i}]: attempt {counters[_ATTEMPT]} is over max_retries"
        if counters[_REDUCTIONS] > max_reductions:
            return f"turn.path[{i}]: {counters[_REDUCTIONS]} reductions, over the cap"
        problem = _action_problem(i, actions[i], step, info, turn, models, longest_wait, settings)
        if problem is not None:
            return problem
        where = info[3]
        previous = step
    if where != turn.state:
        return f"turn.state: {turn.state!r} is not where the turn's path ends ({where!r})"
    if previous is not None:
        counters = tuple(previous[1:])
        live = traced_counters(turn, session)
        if counters != live:
            return f"turn.path: its last counters {counters} are not the turn's {live}"
    for action in reversed(actions):
        if type(action) is CallModel:
            if action.request != turn.request:
                return "turn.request: not the request of the turn's last CallModel"
            break
    if turn.state == INVOKING_TOOLS and (
        not turn.in_flight or turn.actions[-1] != InvokeTools(turn.in_flight)
    ):
        return "turn.in_flight: the calls in flight are not those of the last InvokeTools"
    costs = sum(cost for _, cost in turn.costs or ())
    if costs > session.cost_usd + _SPEND_EPSILON * (1 + costs):
        return "turn.costs: the turn spent more than the session's spend"
    return None


def _step_problem(i: int, step: Step, previous: Step | None, effect: str) -> str | None:
    counters = step[1:]
    attempt, reductions, retries = COUNTER_DELTAS.get(effect, _UNMOVED)
    if previous is None:
        expected = [0, 0, counters[_RETRIES] - retries]
        if expected[_RETRIES] < 0:
            return f"turn.path[{i}]: the first step's counters {tuple(counters)} are impossible"
    else:
        expected = list(previous[1:])
    if attempt == 0:
        expected[_ATTEMPT] = 0
    elif attempt == 1:
        expected[_ATTEMPT] += 1
    expected[_REDUCTIONS] += reductions
    expected[_RETRIES] += retries
    if counters != tuple(expected):
        return (
            f"turn.path[{i}]: counters {tuple(counters)} after {effect}, "
            f"where the effect leaves {tuple(expected)}"
        )
    return None


_UNMOVED = (None, 0, 0)
"""The counter moves of an effect that moves none."""


def _action_problem(
    i: int,
    action: Action,
    step: Step,
    info: RowInfo,
    turn: TurnState,
    models: tuple[str | None, ...],
    longest_wait: float,
    settings: Settings,
) -> str | None:
    effect = info[4]
    where = f"turn.actions[{i}]"
    if type(action) is not ACTION_OF_EFFECT[effect]:
        return f"{where}: a {type(action).__name__} for effect {effect}"
    if type(action) is Finish:
        if action.status.value != _STATUS_OF_ROW[info]:
            return f"{where}: status {action.status} for a {_STATUS_OF_ROW[info]} row"
    elif type(action) is Assemble:
        if action.reduce != (effect == "reduce"):
            return f"{where}: Assemble(reduce={action.reduce}) for effect {effect}"
        final = turn.final_answer and effect == "assemble"
        if action.withhold_tools != final or action.instruction != (
            turn.instruction if final else None
        ):
            return f"{where}: the final-answer flags do not fit the turn"
    elif type(action) is CallModel:
        if action.attempt != step[1 + _ATTEMPT]:
            return (
                f"{where}: CallModel attempt {action.attempt}, the step says {step[1 + _ATTEMPT]}"
            )
        if action.withhold_tools != turn.final_answer:
            return f"{where}: CallModel withhold_tools does not fit the turn"
        if action.model not in models:
            return f"{where}: CallModel to a model the settings do not name"
    elif type(action) is Wait and effect == "tool_wait":
        if action.category is not ToolErrorCategory.CONCURRENCY_CONFLICT:
            return f"{where}: a tool round's Wait for {action.category}"
        if action.attempt >= settings.max_conflict_retries:
            return f"{where}: Wait attempt {action.attempt} beyond max_conflict_retries"
        if action.retry_after is not None:
            return f"{where}: a tool round's Wait names a server's retry-after"
        if not (math.isfinite(action.seconds) and 0 <= action.seconds <= longest_wait):
            return f"{where}: a wait of {action.seconds!r} s the settings cannot ask for"
    elif type(action) is Wait:
        if action.attempt != step[1 + _ATTEMPT]:
            return f"{where}: Wait attempt {action.attempt}, not the step's"
        if action.retry_after is not None and not action.retry_after <= action.seconds:
            return f"{where}: a wait shorter than the retry-after it honours"
        if not (math.isfinite(action.seconds) and 0 <= action.seconds <= longest_wait):
            return f"{where}: a wait of {action.seconds!r} s the settings cannot ask for"
    elif type(action) is InvokeTools and turn.final_answer:
        return f"{where}: the final-answer turn invoked tools"
    elif (
        type(action) is InvokeTools
        and effect == "reinvoke"
        and (len(action.calls) != 1 or action.calls[0] not in turn.calls)
    ):
        return f"{where}: a re-invocation is one call of the reply"
    return None
