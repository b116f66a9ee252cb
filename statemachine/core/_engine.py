"""The engine: the table's guards and effects over the declared state, and the one
object that owns a session's state.

:class:`Core` holds a session's :class:`SessionState` with what is fixed for its
life (settings, clocks, observers, the dispatch). :meth:`Core.fire` takes one event
for the current turn: it finds the rows for (state, event), derives once the *facts*
the guards of those rows read (the wait a failure would take, the breakers a tool
round would trip), picks the first row whose guards hold, runs its effect (which
updates the state and builds the action) and records the step. Guards read and
never change; facts are handed to guards and effect alike, as an argument.

The dispatch is built from ``ROWS`` in one step (:class:`Dispatch`); the
``transitions`` machine built from the same rows is the definition a test proves it
equal to, and the source of the diagrams.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ._actions import Action, Assemble, CallModel, Fallback, Finish, InvokeTools, Wait
from ._backoff import jitter, wait_seconds
from ._events import (
    Assembled,
    Cancelled,
    CannotShrink,
    ModelFailed,
    ModelReplied,
    ToolsDone,
    WaitDone,
)
from ._exceptions import IllegalEvent, SessionEnded, TurnInProgress
from ._model_error import ModelError
from ._retry_after import retry_after
from ._settings import Settings
from ._state import TRACE_FIELDS, RowInfo, SessionState, Step, TurnState, step_after
from ._table import IDLE, ROWS, START, TERMINAL_STATES, Row
from ._taxonomy import ErrorCategory, SessionStatus, ToolErrorCategory, TurnStatus
from ._tool_calls import ToolCall, ToolOutcome, ToolResult
from ._trace import TraceRecord

Observer = Callable[[TraceRecord], None]

TRIGGERS: dict[type, str] = {
    cls: cls.__name__
    for cls in (Assembled, CannotShrink, ModelReplied, ModelFailed, WaitDone, ToolsDone, Cancelled)
}
"""The trigger of each event class (its name)."""

_LARGEST = sys.float_info.max
_ASSEMBLE = Assemble(reduce=False)
_REDUCE = Assemble(reduce=True)


# -- facts: what a group of rows' guards read, derived once per event --------------


class WaitFacts:
    """What a transient failure would lead to, previewing (not consuming) the jitter.

    ``server``: the retry-after the server asked for, if usable; ``seconds``: the wait
    the engine would take; ``too_long``: the server asked for more than
    ``max_server_wait_s``; ``crosses``: the wait would cross ``max_wall_clock_s``.
    (A slotted class: built once per transient failure, on the hot path.)
    """

    __slots__ = ("crosses", "seconds", "server", "too_long")

    def __init__(self, server: float | None, seconds: float, too_long: bool, crosses: bool) -> None:
        self.server = server
        self.seconds = seconds
        self.too_long = too_long
        self.crosses = crosses


class BreakerFacts:
    """The crash counts after a tool round, and the providers it would trip."""

    __slots__ = ("by_id", "counts", "tripped")

    def __init__(
        self, counts: dict[str, int], tripped: list[str], by_id: dict[str, ToolOutcome]
    ) -> None:
        self.counts = counts
        self.tripped = tripped
        self.by_id = by_id
        """The round's outcomes by call id."""


def _wait_facts(core: Core, turn: TurnState, event: ModelFailed) -> WaitFacts:
    settings = core.settings
    state = core.state
    server = retry_after(event.error, core.wall_clock)
    seconds = wait_seconds(
        turn.attempt,
        jitter(state.seed, state.draws),
        server,
        settings.base_delay_ms,
        settings.backoff_factor,
        settings.max_delay_ms,
    )
    too_long = server is not None and server > settings.max_server_wait_s
    limit = settings.max_wall_clock_s
    crosses = limit is not None and core.elapsed_s() + seconds > limit
    return WaitFacts(server, seconds, too_long, crosses)


def _breaker_facts(core: Core, turn: TurnState, event: ToolsDone) -> BreakerFacts:
    counts = dict(core.state.breakers or {})
    by_id = {outcome.call_id: outcome for outcome in event.outcomes}
    tripped: list[str] = []
    threshold = core.settings.breaker_threshold
    for call in turn.calls:
        provider = call.provider
        if by_id[call.id].category is ToolErrorCategory.PROCESS_CRASHED:
            counts[provider] = counts.get(provider, 0) + 1
            if counts[provider] >= threshold and provider not in tripped:
                tripped.append(provider)
        else:
            counts[provider] = 0
    return BreakerFacts(counts, tripped, by_id)


Facts = Callable[["Core", TurnState, Any], Any]

FACTS_OF_GUARD: dict[str, Facts] = {
    "wait_fits": _wait_facts,
    "server_wait_too_long": _wait_facts,
    "wait_crosses_wall_clock": _wait_facts,
    "trips_breaker": _breaker_facts,
}
"""The facts each guard that needs any reads (the rows' effects read the same)."""
FACTS_OF_EFFECT: dict[str, Facts] = {"wait": _wait_facts, "finish_tools": _breaker_facts}
"""The facts each effect that needs any reads, whatever its row's guards."""


# -- guards -----------------------------------------------------------------------------

Guard = Callable[["Core", TurnState, Any, Any], bool]

CATEGORY_GUARDS: dict[str, frozenset[ErrorCategory]] = {
    "auth_error": frozenset({ErrorCategory.AUTH_ERROR}),
    "invalid_request": frozenset({ErrorCategory.INVALID_REQUEST}),
    "content_filtered": frozenset({ErrorCategory.CONTENT_FILTERED}),
    "unknown": frozenset({ErrorCategory.UNKNOWN}),
    "context_length_exceeded": frozenset({ErrorCategory.CONTEXT_LENGTH_EXCEEDED}),
    "transient": frozenset({ErrorCategory.RATE_LIMITED, ErrorCategory.OVERLOADED}),
}
"""The guards that read only the error's category: the dispatch resolves them when it
is built (one row group per category), so no event evaluates them."""


def _shrank(_core: Core, turn: TurnState, event: Assembled, _facts: None) -> bool:
    overflowed = turn.overflowed_size
    if overflowed is None or event.size >= overflowed:
        return False
    try:
        return bool(event.request != turn.overflowed_request)
    except Exception:
        return True


GUARDS: dict[str, Guard] = {
    "final_answer": lambda _c, turn, _e, _f: turn.final_answer,
    "no_tool_calls": lambda _c, _t, event, _f: not event.tool_calls,
    "partial": lambda _c, _t, event, _f: event.partial,
    "reductions_left": lambda core, turn, _e, _f: (
        turn.reductions < core.settings.max_context_reductions
    ),
    "ceiling_reached": lambda core, _t, _e, _f: (
        core.state.retries >= core.settings.session_retry_ceiling
    ),
    "retries_left": lambda core, turn, _e, _f: turn.attempt < core.settings.max_retries,
    "wait_fits": lambda _c, _t, _e, facts: not (facts.too_long or facts.crosses),
    "fallback_left": lambda core, turn, _e, _f: (
        turn.model_index + 1 < len(core.settings.fallback_models)
    ),
    "server_wait_too_long": lambda _c, _t, _e, facts: facts.too_long,
    "wait_crosses_wall_clock": lambda _c, _t, _e, facts: facts.crosses,
    "shrank": _shrank,
    "trips_breaker": lambda _c, _t, _e, facts: bool(facts.tripped),
}
"""Every guard that is evaluated per event, by name (the table's guards less the
category guards)."""


# -- effects ------------------------------------------------------------------------------

Effect = Callable[..., Action]
"""``effect(core, turn, event, facts, status) -> action``."""


def _model(core: Core, turn: TurnState) -> str | None:
    if turn.model_index < 0:
        return core.settings.model
    return core.settings.fallback_models[turn.model_index]


def _assemble(_core: Core, turn: TurnState, _e: None, _f: None, _s: None) -> Action:
    if turn.final_answer:
        return Assemble(reduce=False, withhold_tools=True, instruction=turn.instruction)
    return _ASSEMBLE


def _reduce(_core: Core, turn: TurnState, _e: ModelFailed, _f: None, _s: None) -> Action:
    turn.reductions += 1
    turn.overflowed_size = turn.size
    turn.overflowed_request = turn.request
    return _REDUCE


def _call_model(core: Core, turn: TurnState, event: Assembled, _f: None, _s: None) -> Action:
    turn.request = event.request
    turn.size = event.size
    turn.attempt = 0
    return CallModel(event.request, 0, _model(core, turn), turn.final_answer)


def _retry(core: Core, turn: TurnState, _e: WaitDone, _f: None, _s: None) -> Action:
    turn.attempt += 1
    return CallModel(turn.request, turn.attempt, _model(core, turn), turn.final_answer)


def _wait(core: Core, turn: TurnState, event: ModelFailed, facts: WaitFacts, _s: None) -> Action:
    state = core.state
    state.retries += 1
    state.draws += 1
    waited = state.waited_s + facts.seconds
    state.waited_s = waited if waited < _LARGEST else _LARGEST  # a sum that stays JSON
    return Wait(facts.seconds, event.error.category, turn.attempt)


def _fall_back(core: Core, turn: TurnState, event: ModelFailed, _f: Any, _s: None) -> Action:
    before = _model(core, turn)
    turn.model_index += 1
    after = core.settings.fallback_models[turn.model_index]
    turn.fallbacks = (*turn.fallbacks, Fallback(before, after, event.error))
    core.state.retries += 1
    turn.attempt = 0
    return CallModel(turn.request, 0, after, turn.final_answer)


def _complete(core: Core, turn: TurnState, event: ModelReplied, _f: None, _s: None) -> Action:
    core.state.cost_usd += event.cost
    turn.reply = event.reply
    if not event.tool_calls:
        state = core.state
        state.doom_last = None  # a reply with no tool call ends any run of identical calls
        state.doom_run = 0
    return _finish_action(core, turn, TurnStatus.COMPLETED, (), None)


def _invoke_tools(core: Core, turn: TurnState, event: ModelReplied, _f: None, _s: None) -> Action:
    state = core.state
    state.cost_usd += event.cost
    turn.reply = event.reply
    threshold = core.settings.doom_loop_threshold
    for call in event.tool_calls:
        fingerprint = call_fingerprint(call)
        if fingerprint == state.doom_last:
            state.doom_run += 1
        else:
            state.doom_last = fingerprint
            state.doom_run = 1
        if state.doom_run >= threshold:
            core.fire_limit(SessionStatus.ERROR_DOOM_LOOP)
    turn.calls = event.tool_calls
    return InvokeTools(event.tool_calls)


def _finish_tools(
    core: Core, turn: TurnState, _event: ToolsDone, facts: BreakerFacts, status: TurnStatus | None
) -> Action:
    state = core.state
    state.breakers = {p: n for p, n in facts.counts.items() if n} or None
    if facts.tripped:
        state.tripped = state.tripped | frozenset(facts.tripped)
        core.fire_limit(SessionStatus.ERROR_CIRCUIT_BREAKER)
    by_id = facts.by_id
    results = []
    for call in turn.calls:
        outcome = by_id[call.id]
        if outcome.ok:
            results.append(ToolResult(call.id, outcome.content))
        else:
            category = outcome.category or ToolErrorCategory.UNKNOWN
            results.append(ToolResult(call.id, outcome.content, True, category))
    return _finish_action(core, turn, status or TurnStatus.COMPLETED, tuple(results), None)


def _finish(core: Core, turn: TurnState, event: Any, facts: Any, status: TurnStatus) -> Action:
    error = event.error if type(event) is ModelFailed else None
    retry_at = None
    if status is TurnStatus.RETRY_DEFERRED:
        retry_at = core.clock() + (facts.server or 0.0)
    return _finish_action(core, turn, status, (), error, retry_at)


def _cancel(core: Core, turn: TurnState, event: Cancelled, _f: None, status: TurnStatus) -> Action:
    results: tuple[ToolResult, ...] = ()
    if turn.state == "invoking_tools":
        reason = f"cancelled: {event.reason}" if event.reason else "cancelled"
        results = tuple(
            ToolResult(c.id, reason, True, ToolErrorCategory.CANCELLED) for c in turn.calls
        )
    return _finish_action(core, turn, status, results, None)


def _finish_action(
    core: Core,
    turn: TurnState,
    status: TurnStatus,
    results: tuple[ToolResult, ...],
    error: ModelError | None,
    retry_at: float | None = None,
) -> Finish:
    return Finish(status, results, error, _model(core, turn), turn.fallbacks, retry_at, turn.reply)


EFFECTS: dict[str, Effect] = {
    "assemble": _assemble,
    "call_model": _call_model,
    "retry": _retry,
    "fall_back": _fall_back,
    "wait": _wait,
    "reduce": _reduce,
    "invoke_tools": _invoke_tools,
    "complete": _complete,
    "finish_tools": _finish_tools,
    "finish": _finish,
    "cancel": _cancel,
}
"""Every effect a row may name, by name."""


# -- the doom-loop fingerprint ------------------------------------------------------------

_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr
)
# json's C encoder, built once: JSONEncoder.encode builds a new one on every call,
# which is two thirds of a fingerprint's cost. Same output as _CANONICAL.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_C_CANONICAL = (
    _c_make_encoder(None, repr, json.encoder.encode_basestring, None, ":", ",", True, False, True)
    if _c_make_encoder is not None
    else None
)


def canonical_json(value: object) -> str:
    """Canonical JSON of ``value``; its ``repr`` when JSON cannot hold it (cycles,
    keys of mixed types): a fingerprint never raises."""
    if _C_CANONICAL is not None:
        try:
            return "".join(_C_CANONICAL(value, 0))
        except (RecursionError, TypeError, ValueError):
            pass
    try:
        return _CANONICAL.encode(value)
    except (RecursionError, TypeError, ValueError):
        return repr(value)


def call_fingerprint(call: ToolCall) -> str:
    """A stable hash of (tool name, canonical JSON of the arguments).

    The provider is left out on purpose: the same call routed elsewhere is still
    the same call.
    """
    canonical = canonical_json([call.name, call.arguments])
    return hashlib.blake2b(canonical.encode(), digest_size=12).hexdigest()


# -- the dispatch -------------------------------------------------------------------------


@attrs.frozen
class BoundRow:
    """One row as the engine runs it: its per-event guards, its effect, where it goes."""

    guards: tuple[Guard, ...]
    info: RowInfo
    dest: str
    effect: Effect
    status: TurnStatus | None
    names: tuple[str, ...]
    """The names of ``guards`` (the category guards already resolved are left out)."""
    steps: dict[tuple[int, ...], Step] = attrs.field(factory=dict, eq=False, repr=False)
    """The steps through this row met so far, by their counters: traces share them."""


@attrs.frozen
class Group:
    """The rows for one (state, trigger, category), in trial order, and the facts
    their guards and effects read (``None``: none)."""

    rows: tuple[BoundRow, ...]
    facts: Facts | None
    check: Callable[[Core, TurnState, Any], None] | None = None
    """The payload check of the trigger (bad data refused before anything changes)."""


DispatchKey = tuple[str, str, "ErrorCategory | None"]


class Dispatch:
    """The table as the engine runs it: ``(state, trigger, category) -> Group``.

    ``category`` is the error's category for a ``ModelFailed`` and ``None`` for every
    other trigger: each category's group holds the rows whose category guards hold for
    it, in order, with those guards already resolved. Built from ``rows`` (the table;
    the model check passes mutated ones) and ``effects`` (extra effect functions a
    mutated row may name).
    """

    __slots__ = ("groups", "legal", "rows")

    def __init__(
        self, rows: Sequence[Row] = ROWS, effects: Mapping[str, Effect] | None = None
    ) -> None:
        effect_of = {**EFFECTS, **(effects or {})}
        self.rows = tuple(rows)
        keys: dict[tuple[str, str], list[Row]] = {}
        for row in self.rows:
            keys.setdefault((row.source, row.event), []).append(row)
        self.groups: dict[DispatchKey, Group] = {}
        self.legal: dict[str, tuple[str, ...]] = {}
        for (source, trigger), group in keys.items():
            by_category = any(g in CATEGORY_GUARDS for row in group for g in row.guards)
            for category in ErrorCategory if by_category else (None,):
                members = [
                    row
                    for row in group
                    if all(
                        category in CATEGORY_GUARDS[g] for g in row.guards if g in CATEGORY_GUARDS
                    )
                ]
                self.groups[(source, trigger, category)] = _group(
                    members, effect_of, _PAYLOAD_CHECKS.get(trigger)
                )
        for source, trigger in keys:
            if trigger != START:
                self.legal[source] = (*self.legal.get(source, ()), trigger)

    def illegal_message(self, trigger: str, state: str) -> str:
        """Why ``trigger`` is refused in ``state``."""
        if state == IDLE:
            return f"{trigger} is not legal in state 'idle': call start() first"
        if state in TERMINAL_STATES:
            return f"{trigger} is not legal in state {state!r}: the turn has finished"
        legal = ", ".join(sorted(self.legal.get(state, ())))
        return f"{trigger} is not legal in state {state!r} (legal there: {legal})"


def _group(
    rows: list[Row],
    effect_of: Mapping[str, Effect],
    check: Callable[[Core, TurnState, Any], None] | None,
) -> Group:
    bound = []
    facts: Facts | None = None
    for row in rows:
        names = tuple(g for g in row.guards if g not in CATEGORY_GUARDS)
        for name in names:
            facts = FACTS_OF_GUARD.get(name, facts)
        facts = FACTS_OF_EFFECT.get(row.effect, facts)
        bound.append(
            BoundRow(
                guards=tuple(GUARDS[name] for name in names),
                info=(row.source, row.event, " & ".join(row.guards), row.dest, row.effect),
                dest=row.dest,
                effect=effect_of[row.effect],
                status=TurnStatus(row.status) if row.status else None,
                names=names,
            )
        )
    return Group(tuple(bound), facts, check)


# -- payload checks: bad data is refused before anything changes ---------------------------


def _check_replied(core: Core, turn: TurnState, event: ModelReplied) -> None:
    cost = event.cost
    if cost and not math.isfinite(core.state.cost_usd + cost):
        raise IllegalEvent(
            f"ModelReplied in state {turn.state!r}: cost {cost!r} would take the session's "
            f"spend ({core.state.cost_usd!r}) past the largest float",
            event="ModelReplied",
            state=turn.state,
        )
    if len(event.tool_calls) < 2:
        return
    seen: set[str] = set()
    for call in event.tool_calls:
        if call.id in seen:
            raise IllegalEvent(
                f"ModelReplied in state {turn.state!r}: tool call id {call.id!r} appears twice",
                event="ModelReplied",
                state=turn.state,
            )
        seen.add(call.id)


def _check_tools_done(_core: Core, turn: TurnState, event: ToolsDone) -> None:
    calls, outcomes = turn.calls, event.outcomes
    if len(calls) == 1 and len(outcomes) == 1 and outcomes[0].call_id == calls[0].id:
        return  # the common one-call round, without building two sets
    expected = {call.id for call in calls}
    seen: set[str] = set()
    problem = None
    for outcome in outcomes:
        if outcome.call_id not in expected:
            problem = f"outcome for unknown call id {outcome.call_id!r}"
        elif outcome.call_id in seen:
            problem = f"two outcomes for call id {outcome.call_id!r}"
        if problem:
            break
        seen.add(outcome.call_id)
    else:
        missing = sorted(expected - seen)
        if missing:
            problem = f"no outcome for call id(s) {', '.join(map(repr, missing))}"
    if problem:
        raise IllegalEvent(
            f"ToolsDone in state {turn.state!r}: {problem}", event="ToolsDone", state=turn.state
        )


_PAYLOAD_CHECKS: dict[str, Callable[[Core, TurnState, Any], None]] = {
    "ModelReplied": _check_replied,
    "ToolsDone": _check_tools_done,
}

DISPATCH = Dispatch()
"""The dispatch of the table."""


# -- the owner of a session's state ---------------------------------------------------------

_LIMIT_TEXT = {
    SessionStatus.ERROR_MAX_TURNS: "the maximum number of turns ({settings.max_turns})",
    SessionStatus.ERROR_MAX_BUDGET_USD: "the cost budget (${settings.max_cost_usd:g})",
    SessionStatus.ERROR_MAX_WALL_CLOCK: "the wall-clock budget ({settings.max_wall_clock_s:g} s)",
    SessionStatus.ERROR_CIRCUIT_BREAKER: "a tool provider's circuit breaker (repeated crashes)",
    SessionStatus.ERROR_DOOM_LOOP: "the repeated-tool-call guard (the same call over and over)",
}


def final_answer_instruction(limit: SessionStatus, settings: Settings) -> str:
    """The synthetic instruction of the final-answer turn for ``limit``."""
    what = _LIMIT_TEXT[limit].format(settings=settings)
    return (
        f"This session has reached {what}. Tools are no longer available. "
        "Do not call any tool: reply now with your final answer, based on what "
        f"you have so far. [limit: {limit.value}]"
    )


class Core:
    """A session's state and the one place that changes it."""

    __slots__ = ("clock", "dispatch", "groups", "observers", "settings", "state", "wall_clock")

    settings: Settings
    state: SessionState
    clock: Callable[[], float]
    wall_clock: Callable[[], float]
    observers: tuple[Observer, ...]
    dispatch: Dispatch
    groups: dict[DispatchKey, Group]

    def __init__(
        self,
        settings: Settings,
        state: SessionState,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        observers: tuple[Observer, ...],
        dispatch: Dispatch,
    ) -> None:
        self.settings = settings
        self.state = state
        self.clock = clock
        self.wall_clock = wall_clock
        self.observers = observers
        self.dispatch = dispatch
        self.groups = dispatch.groups

    def elapsed_s(self) -> float:
        """Seconds on the session's clock since it started."""
        return self.clock() - self.state.started

    # -- turns ------------------------------------------------------------------------

    def new_turn(self) -> TurnState:
        """Begin the next turn (the final-answer turn once a limit has fired)."""
        state = self.state
        if state.status is not None:
            raise SessionEnded(
                f"the session has ended ({state.status.value}); it can be replayed, not continued",
                status=state.status,
            )
        current = state.turn
        turns = state.turns
        if current is not None and current.state == IDLE:
            turns -= 1  # never started: nothing happened in it, so replaced, not counted
        elif current is not None and current.state not in TERMINAL_STATES:
            raise TurnInProgress(
                f"turn {current.index} is still running (state {current.state!r}); "
                "finish it or send it Cancelled() first"
            )
        state.turns = turns
        self.check_bounds()
        state.turns = turns + 1
        limit = state.limit
        if limit is None:
            turn = TurnState(index=state.turns)
        else:
            turn = TurnState(
                index=state.turns,
                final_answer=True,
                instruction=final_answer_instruction(limit, self.settings),
            )
        state.turn = turn
        return turn

    def fire_limit(self, limit: SessionStatus) -> None:
        """Record that ``limit`` fired (the first one to fire is kept)."""
        if self.state.limit is None:
            self.state.limit = limit

    def check_bounds(self) -> None:
        """Fire the first session bound that has been reached, if none has fired."""
        state = self.state
        if state.limit is not None:
            return
        settings = self.settings
        if settings.max_turns is not None and state.turns >= settings.max_turns:
            state.limit = SessionStatus.ERROR_MAX_TURNS
        elif settings.max_cost_usd is not None and state.cost_usd >= settings.max_cost_usd:
            state.limit = SessionStatus.ERROR_MAX_BUDGET_USD
        elif (
            settings.max_wall_clock_s is not None and self.elapsed_s() >= settings.max_wall_clock_s
        ):
            state.limit = SessionStatus.ERROR_MAX_WALL_CLOCK

    def _turn_finished(self, turn: TurnState, finish: Finish) -> None:
        if turn.final_answer:
            self.state.status = self.state.limit
            return
        if finish.status is TurnStatus.BUDGET_EXHAUSTED:
            self.fire_limit(SessionStatus.ERROR_MAX_WALL_CLOCK)
        self.check_bounds()

    # -- events ------------------------------------------------------------------------

    def fire(self, turn: TurnState, trigger: str, event: Any) -> Action:
        """Take ``event`` (``None`` for ``start``) in ``turn``, the current turn."""
        state = turn.state
        category = event.error.category if trigger == "ModelFailed" else None
        group = self.groups.get((state, trigger, category))
        if group is None:
            raise IllegalEvent(
                self.dispatch.illegal_message(trigger, state), event=trigger, state=state
            )
        if group.check is not None:
            group.check(self, turn, event)
        facts = None if group.facts is None else group.facts(self, turn, event)
        for row in group.rows:
            for guard in row.guards:
                if not guard(self, turn, event, facts):
                    break
            else:
                break
        else:  # pragma: no cover - the model check proves every group is total
            raise AssertionError(f"no row of {state!r} x {trigger!r} applies")
        action = row.effect(self, turn, event, facts, row.status)
        turn.state = row.dest
        step = step_after(row.steps, row.info, turn, self.state)
        turn.path.append(step)
        turn.actions.append(action)
        if type(action) is Finish:
            self._turn_finished(turn, action)
        if self.observers:
            record = trace_record(turn.index, len(turn.actions) - 1, step, action)
            for observer in self.observers:
                observer(record)
        return action


def _record_maker() -> Callable[[int, int, Step, Action], TraceRecord]:
    counters = ", ".join(f"{name}=step[{1 + i}]" for i, name in enumerate(TRACE_FIELDS))
    source = (
        "def trace_record(turn, index, step, action):\n"
        "    source, trigger, guard, dest, _ = step[0]\n"
        "    return TraceRecord(turn=turn, step=index, source=source, event=trigger,\n"
        f"        guard=guard, dest=dest, action=action, {counters})\n"
    )
    namespace: dict[str, Any] = {"TraceRecord": TraceRecord}
    exec(compile(source, "<trace_record, derived from TRACED>", "exec"), namespace)  # noqa: S102
    return namespace["trace_record"]  # type: ignore[no-any-return]


trace_record: Callable[[int, int, Step, Action], TraceRecord] = _record_maker()
"""The :class:`TraceRecord` of ``step``, the ``index``-th transition of ``turn``: its
row, its action and the counters of :data:`TRACED` (generated, as it runs for every
event an observer sees)."""
