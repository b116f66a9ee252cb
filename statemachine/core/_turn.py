"""``Turn``: one pass of the loop, driven through the compiled transition table.

The guards and effects the table names live here. Guards are pure: they read the
turn, its session and the event, and change nothing (a jitter draw is *previewed*,
not consumed). Effects run after a row is chosen; they update the counters and
build the action. A turn holds plain slots and a list of trace tuples, so thousands
of live turns cost little.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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
from ._exceptions import IllegalEvent
from ._machine import COMPILED
from ._model_error import ModelError
from ._retry_after import retry_after
from ._table import IDLE, START, TERMINAL_STATES
from ._taxonomy import ErrorCategory, ToolErrorCategory, TurnStatus
from ._tool_calls import ToolCall, ToolResult
from ._trace import TraceRecord

if TYPE_CHECKING:
    from ._session import Session

_TRIGGERS: dict[type, str] = {
    cls: cls.__name__
    for cls in (Assembled, CannotShrink, ModelReplied, ModelFailed, WaitDone, ToolsDone, Cancelled)
}

_ASSEMBLE = Assemble(reduce=False)
_REDUCE = Assemble(reduce=True)

RowInfo = tuple[str, str, str, str, str]
"""(source, trigger, guard label, dest, effect) of one row: shared by every turn whose
trace passes through it, so a trace costs two pointers per transition."""


class Turn:
    """One turn of a :class:`Session`: ``start()``, then ``send(event)`` until a
    :class:`Finish`.

    Create turns with ``Session.new_turn()``. ``state`` is the current state's name
    and ``status`` is ``None`` until the turn finishes. An event that is not legal
    in the current state raises :class:`IllegalEvent` and changes nothing.
    """

    __slots__ = (
        "_actions",
        "_attempt",
        "_calls",
        "_fallbacks",
        "_model_index",
        "_overflowed_request",
        "_overflowed_size",
        "_path",
        "_probe",
        "_reductions",
        "_reply",
        "_request",
        "_retries_at_start",
        "_session",
        "_size",
        "_state",
        "final_answer",
        "index",
        "instruction",
    )

    def __init__(
        self,
        session: Session,
        index: int,
        *,
        final_answer: bool = False,
        instruction: str | None = None,
    ) -> None:
        self._session = session
        self.index = index
        """This turn's number in its session, from 1."""
        self.final_answer = final_answer
        """Whether this is the final-answer turn of the limit-reached path."""
        self.instruction = instruction
        """The synthetic final-answer instruction (final-answer turn only)."""
        self._state = IDLE
        self._attempt = 0
        self._reductions = 0
        self._model_index = -1
        self._request: Any = None
        self._size = 0
        self._overflowed_size: int | None = None
        self._overflowed_request: Any = None
        self._calls: tuple[ToolCall, ...] = ()
        self._reply: Any = None
        self._fallbacks: tuple[Fallback, ...] = ()
        self._path: list[RowInfo] = []
        """The row of every transition taken, in order."""
        self._actions: list[Action] = []
        """The action of every transition taken, in order."""
        self._retries_at_start = session._retries
        """The session's retries when the turn began: the trace's counters replay from it."""
        self._probe: tuple[Any, ...] | None = None
        """A guard's derived values for the event being handled (reset after it)."""

    # -- the protocol ------------------------------------------------------

    def start(self) -> Action:
        """Start the turn; returns its first action (an :class:`Assemble`)."""
        return self._fire(START, None)

    def send(self, event: object) -> Action:
        """Take ``event``; return the next action (a :class:`Finish` at the end)."""
        trigger = _TRIGGERS.get(type(event))
        if trigger is None:
            raise IllegalEvent(
                f"{event!r} is not an event (expected one of "
                f"{', '.join(sorted(_TRIGGERS.values()))}) in state {self._state!r}",
                event=type(event).__name__,
                state=self._state,
            )
        return self._fire(trigger, event)

    def _fire(self, trigger: str, event: Any) -> Action:
        state = self._state
        rows = _COMPILED.get((state, trigger))
        if rows is None:
            raise IllegalEvent(_illegal_message(trigger, state), event=trigger, state=state)
        if isinstance(rows, dict):
            rows = rows[event.error.category]
        check = _PAYLOAD_CHECKS.get(trigger)
        if check is not None:
            check(self, event)
        for row in rows:
            for guard in row[0]:
                if not guard(self, event):
                    break
            else:
                break
        else:  # pragma: no cover - the model check proves every row list is total
            raise AssertionError(f"no row of {state!r} x {trigger!r} applies")
        _, info, dest, effect, status = row
        action = effect(self, event, status)
        self._state = dest
        self._probe = None
        self._path.append(info)
        self._actions.append(action)
        session = self._session
        if type(action) is Finish:
            session._turn_finished(self, action)
        if session._observers:
            record = TraceRecord(
                turn=self.index,
                step=len(self._actions) - 1,
                source=state,
                event=trigger,
                guard=info[2],
                dest=dest,
                action=action,
                attempt=self._attempt,
                session_retries=session._retries,
                reductions=self._reductions,
            )
            for observer in session._observers:
                observer(record)
        return action

    # -- what the turn holds -----------------------------------------------

    @property
    def state(self) -> str:
        """The current state's name (``idle`` before ``start()``)."""
        return self._state

    @property
    def status(self) -> TurnStatus | None:
        """``None`` while the turn runs, then the status its :class:`Finish` carries."""
        action = self._actions[-1] if self._actions else None
        return action.status if type(action) is Finish else None

    @property
    def done(self) -> bool:
        """Whether the turn has finished."""
        return self._state in TERMINAL_STATES

    @property
    def action(self) -> Action | None:
        """The last action emitted: what the host owes an event for."""
        return self._actions[-1] if self._actions else None

    @property
    def finish(self) -> Finish | None:
        """The :class:`Finish` the turn ended with, or ``None`` while it runs."""
        action = self._actions[-1] if self._actions else None
        return action if type(action) is Finish else None

    @property
    def attempt(self) -> int:
        """The current call's attempt number (0 for a first try)."""
        return self._attempt

    @property
    def reductions(self) -> int:
        """How many context reductions this turn asked for."""
        return self._reductions

    @property
    def model(self) -> str | None:
        """The model the turn currently calls (``None``: the host's default)."""
        return _model(self)

    @property
    def session(self) -> Session:
        """The session this turn belongs to."""
        return self._session

    @property
    def trace(self) -> tuple[TraceRecord, ...]:
        """One frozen record per transition taken so far, in order.

        The counters of each record are replayed from the rows' effects (see
        ``COUNTER_EFFECTS``): a turn stores only its rows and actions.
        """
        records = []
        attempt, retries, reductions = 0, self._retries_at_start, 0
        for step, (info, action) in enumerate(zip(self._path, self._actions, strict=True)):
            source, trigger, guard, dest, effect = info
            resets, retried, waited, reduced = COUNTER_EFFECTS.get(effect, _NO_COUNTS)
            attempt = 0 if resets else attempt + retried
            retries += waited
            reductions += reduced
            records.append(
                TraceRecord(
                    turn=self.index,
                    step=step,
                    source=source,
                    event=trigger,
                    guard=guard,
                    dest=dest,
                    action=action,
                    attempt=attempt,
                    session_retries=retries,
                    reductions=reductions,
                )
            )
        return tuple(records)

    def __repr__(self) -> str:
        return f"<Turn {self.index} state={self._state!r} status={self.status!s}>"


def _illegal_message(trigger: str, state: str) -> str:
    if state == IDLE:
        return f"{trigger} is not legal in state 'idle': call start() first"
    if state in TERMINAL_STATES:
        return f"{trigger} is not legal in state {state!r}: the turn has finished"
    legal = sorted(t for (s, t) in _COMPILED if s == state and t != START)
    return f"{trigger} is not legal in state {state!r} (legal there: {', '.join(legal)})"


def _model(turn: Turn) -> str | None:
    settings = turn._session.settings
    if turn._model_index < 0:
        return settings.model
    return settings.fallback_models[turn._model_index]


# -- payload checks: bad data is refused before anything changes --------------


def _check_replied(turn: Turn, event: ModelReplied) -> None:
    if len(event.tool_calls) < 2:
        return
    seen: set[str] = set()
    for call in event.tool_calls:
        if call.id in seen:
            raise IllegalEvent(
                f"ModelReplied in state {turn._state!r}: tool call id {call.id!r} appears twice",
                event="ModelReplied",
                state=turn._state,
            )
        seen.add(call.id)


def _check_tools_done(turn: Turn, event: ToolsDone) -> None:
    calls, outcomes = turn._calls, event.outcomes
    if len(calls) == 1 and len(outcomes) == 1 and outcomes[0].call_id == calls[0].id:
        return  # the common one-call round, without building two sets
    expected = {call.id for call in calls}
    seen: set[str] = set()
    problem = None
    for outcome in event.outcomes:
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
            f"ToolsDone in state {turn._state!r}: {problem}", event="ToolsDone", state=turn._state
        )


_PAYLOAD_CHECKS: dict[str, Callable[[Turn, Any], None]] = {
    "ModelReplied": _check_replied,
    "ToolsDone": _check_tools_done,
}


_CATEGORY_GUARDS: dict[str, frozenset[ErrorCategory]] = {
    "auth_error": frozenset({ErrorCategory.AUTH_ERROR}),
    "invalid_request": frozenset({ErrorCategory.INVALID_REQUEST}),
    "content_filtered": frozenset({ErrorCategory.CONTENT_FILTERED}),
    "unknown": frozenset({ErrorCategory.UNKNOWN}),
    "context_length_exceeded": frozenset({ErrorCategory.CONTEXT_LENGTH_EXCEEDED}),
    "transient": frozenset({ErrorCategory.RATE_LIMITED, ErrorCategory.OVERLOADED}),
}


# -- guards ---------------------------------------------------------------------


def _category_in(name: str) -> Callable[[Turn, ModelFailed], bool]:
    """The guard ``name`` of ``_CATEGORY_GUARDS``, as a function (for the model
    check and the agreement test; the hot path pre-sorts rows by category instead)."""
    categories = _CATEGORY_GUARDS[name]

    def guard(_turn: Turn, event: ModelFailed) -> bool:
        return event.error.category in categories

    guard.__name__ = name
    return guard


def _probe(turn: Turn, event: ModelFailed) -> tuple[object, float | None, float, bool, bool]:
    """(event, server retry-after, the wait we would take, too long, crosses the wall
    clock) for this failure, computed once per event and previewing the jitter draw."""
    probe = turn._probe
    if probe is not None and probe[0] is event:
        return probe
    session = turn._session
    settings = session.settings
    server = retry_after(event.error, session._wall_clock)
    seconds = wait_seconds(
        turn._attempt,
        jitter(session._seed, session._draws),
        server,
        settings.base_delay_ms,
        settings.backoff_factor,
        settings.max_delay_ms,
    )
    too_long = server is not None and server > settings.max_server_wait_s
    limit = settings.max_wall_clock_s
    crosses = limit is not None and session.elapsed_s + seconds > limit
    probe = (event, server, seconds, too_long, crosses)
    turn._probe = probe
    return probe


def _server_wait_too_long(turn: Turn, event: ModelFailed) -> bool:
    return _probe(turn, event)[3]


def _wait_crosses_wall_clock(turn: Turn, event: ModelFailed) -> bool:
    return _probe(turn, event)[4]


def _wait_fits(turn: Turn, event: ModelFailed) -> bool:
    probe = _probe(turn, event)
    return not (probe[3] or probe[4])


def _breaker_probe(turn: Turn, event: ToolsDone) -> tuple[dict[str, int], list[str]]:
    """The crash counts after this event and the providers it trips, computed once."""
    probe = turn._probe
    if probe is not None and probe[0] is event:
        return probe[1], probe[2]
    counts, tripped = turn._session._breaker_after(turn._calls, event.outcomes)
    turn._probe = (event, counts, tripped)
    return counts, tripped


def _trips_breaker(turn: Turn, event: ToolsDone) -> bool:
    return bool(_breaker_probe(turn, event)[1])


def _shrank(turn: Turn, event: Assembled) -> bool:
    overflowed = turn._overflowed_size
    if overflowed is None or event.size >= overflowed:
        return False
    try:
        return bool(event.request != turn._overflowed_request)
    except Exception:
        return True


GUARD_FUNCTIONS: dict[str, Callable[[Turn, Any], bool]] = {
    "final_answer": lambda turn, _event: turn.final_answer,
    "no_tool_calls": lambda _turn, event: not event.tool_calls,
    "partial": lambda _turn, event: event.partial,
    **{name: _category_in(name) for name in _CATEGORY_GUARDS},
    "reductions_left": lambda turn, _event: (
        turn._reductions < turn._session.settings.max_context_reductions
    ),
    "ceiling_reached": lambda turn, _event: (
        turn._session._retries >= turn._session.settings.session_retry_ceiling
    ),
    "retries_left": lambda turn, _event: turn._attempt < turn._session.settings.max_retries,
    "wait_fits": _wait_fits,
    "fallback_left": lambda turn, _event: (
        turn._model_index + 1 < len(turn._session.settings.fallback_models)
    ),
    "server_wait_too_long": _server_wait_too_long,
    "wait_crosses_wall_clock": _wait_crosses_wall_clock,
    "shrank": _shrank,
    "trips_breaker": _trips_breaker,
}


# -- effects --------------------------------------------------------------------


def _assemble(turn: Turn, _event: None, _status: TurnStatus | None) -> Action:
    if turn.final_answer:
        return Assemble(reduce=False, withhold_tools=True, instruction=turn.instruction)
    return _ASSEMBLE


def _reduce(turn: Turn, _event: ModelFailed, _status: TurnStatus | None) -> Action:
    turn._reductions += 1
    turn._overflowed_size = turn._size
    turn._overflowed_request = turn._request
    return _REDUCE


def _call_model(turn: Turn, event: Assembled, _status: TurnStatus | None) -> Action:
    turn._request = event.request
    turn._size = event.size
    turn._attempt = 0
    return CallModel(event.request, 0, _model(turn), turn.final_answer)


def _retry(turn: Turn, _event: WaitDone, _status: TurnStatus | None) -> Action:
    turn._attempt += 1
    return CallModel(turn._request, turn._attempt, _model(turn), turn.final_answer)


def _wait(turn: Turn, event: ModelFailed, _status: TurnStatus | None) -> Action:
    seconds = _probe(turn, event)[2]
    session = turn._session
    session._retries += 1
    session._draws += 1
    return Wait(seconds, event.error.category, turn._attempt)


def _fall_back(turn: Turn, event: ModelFailed, _status: TurnStatus | None) -> Action:
    before = _model(turn)
    turn._model_index += 1
    after = turn._session.settings.fallback_models[turn._model_index]
    turn._fallbacks = (*turn._fallbacks, Fallback(before, after, event.error))
    turn._session._retries += 1
    turn._attempt = 0
    return CallModel(turn._request, 0, after, turn.final_answer)


def _take_reply(turn: Turn, event: ModelReplied) -> None:
    turn._session._cost += event.cost
    turn._reply = event.reply


def _complete(turn: Turn, event: ModelReplied, _status: TurnStatus | None) -> Action:
    _take_reply(turn, event)
    if not event.tool_calls:
        turn._session._end_doom_run()
    return _finish_action(turn, TurnStatus.COMPLETED, (), None)


def _invoke_tools(turn: Turn, event: ModelReplied, _status: TurnStatus | None) -> Action:
    _take_reply(turn, event)
    turn._session._watch_doom_loop(event.tool_calls)
    turn._calls = event.tool_calls
    return InvokeTools(event.tool_calls)


def _finish_tools(turn: Turn, event: ToolsDone, status: TurnStatus | None) -> Action:
    turn._session._apply_breakers(*_breaker_probe(turn, event))
    by_id = {outcome.call_id: outcome for outcome in event.outcomes}
    results = []
    for call in turn._calls:
        outcome = by_id[call.id]
        if outcome.ok:
            results.append(ToolResult(call.id, outcome.content))
        else:
            category = outcome.category or ToolErrorCategory.UNKNOWN
            results.append(ToolResult(call.id, outcome.content, True, category))
    return _finish_action(turn, status or TurnStatus.COMPLETED, tuple(results), None)


def _finish(turn: Turn, event: Any, status: TurnStatus) -> Action:
    error = event.error if type(event) is ModelFailed else None
    retry_at = None
    if status is TurnStatus.RETRY_DEFERRED:
        server = _probe(turn, event)[1]
        retry_at = turn._session._clock() + (server or 0.0)
    return _finish_action(turn, status, (), error, retry_at)


def _cancel(turn: Turn, event: Cancelled, status: TurnStatus) -> Action:
    results: tuple[ToolResult, ...] = ()
    if turn._state == "invoking_tools":
        reason = f"cancelled: {event.reason}" if event.reason else "cancelled"
        results = tuple(
            ToolResult(c.id, reason, True, ToolErrorCategory.CANCELLED) for c in turn._calls
        )
    return _finish_action(turn, status, results, None)


def _finish_action(
    turn: Turn,
    status: TurnStatus,
    results: tuple[ToolResult, ...],
    error: ModelError | None,
    retry_at: float | None = None,
) -> Finish:
    return Finish(status, results, error, _model(turn), turn._fallbacks, retry_at, turn._reply)


COUNTER_EFFECTS: dict[str, tuple[bool, int, int, int]] = {
    # effect: (resets the attempt, attempt +, session retries +, reductions +)
    "call_model": (True, 0, 0, 0),
    "retry": (False, 1, 0, 0),
    "wait": (False, 0, 1, 0),
    "fall_back": (True, 0, 1, 0),
    "reduce": (False, 0, 0, 1),
}
"""How each effect moves the counters a trace record carries (``Turn.trace`` replays
them; a test checks the replay against what observers saw live)."""
_NO_COUNTS = (False, 0, 0, 0)

EFFECT_FUNCTIONS: dict[str, Callable[[Turn, Any, Any], Action]] = {
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

_Row = tuple[
    tuple[Callable[[Turn, Any], bool], ...],
    RowInfo,
    str,
    Callable[[Turn, Any, Any], Action],
    "TurnStatus | None",
]


def _bind(
    compiled: dict[tuple[str, str], tuple[tuple[tuple[str, ...], str, str, str | None], ...]],
) -> dict[tuple[str, str], tuple[_Row, ...] | dict[ErrorCategory, tuple[_Row, ...]]]:
    """Resolve the compiled table's guard and effect names to this module's functions.

    Rows guarded by an error category are pre-sorted by category (a pure
    specialisation: for each category, the rows whose category guards hold, in
    order, with those guards already evaluated), so a ``ModelFailed`` costs one
    dict lookup instead of a walk past every other category's rows.
    """
    bound: dict[tuple[str, str], tuple[_Row, ...] | dict[ErrorCategory, tuple[_Row, ...]]] = {}
    for key, rows in compiled.items():
        by_category = any(g in _CATEGORY_GUARDS for guards, *_ in rows for g in guards)
        if not by_category:
            bound[key] = tuple(_bind_row(*key, row, ()) for row in rows)
            continue
        bound[key] = {
            category: tuple(
                _bind_row(*key, row, tuple(_CATEGORY_GUARDS))
                for row in rows
                if all(category in _CATEGORY_GUARDS[g] for g in row[0] if g in _CATEGORY_GUARDS)
            )
            for category in ErrorCategory
        }
    return bound


def _bind_row(
    source: str,
    trigger: str,
    row: tuple[tuple[str, ...], str, str, str | None],
    evaluated: tuple[str, ...],
) -> _Row:
    guards, dest, effect, status = row
    return (
        tuple(GUARD_FUNCTIONS[g] for g in guards if g not in evaluated),
        (source, trigger, " & ".join(guards), dest, effect),
        dest,
        EFFECT_FUNCTIONS[effect],
        TurnStatus(status) if status else None,
    )


_COMPILED = _bind(COMPILED)


def row_infos() -> dict[tuple[str, str, str, str], RowInfo]:
    """Every row of the bound table by (source, trigger, guard label, dest)."""
    infos: dict[tuple[str, str, str, str], RowInfo] = {}
    for rows in _COMPILED.values():
        for group in rows.values() if isinstance(rows, dict) else (rows,):
            for row in group:
                infos.setdefault(row[1][:4], row[1])
    return infos
