"""The engine: the table's guards and effects over the declared state, and the one
object that owns a session's state.

:meth:`Core.fire` takes one event for the current turn at one moment: it finds the rows
for (state, event), derives once the *facts* their guards read, picks the first row
whose guards hold, runs its effect (which updates the state and builds the action) and
records the step. The core reads no clock: each step is given its moment (``at``, and
``wall``, Unix time, where a rule needs it), checked by :meth:`Core.reading`, so a
replay is the same calls with the recorded moments.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ._actions import (
    Action,
    Assemble,
    Fallback,
    Finish,
    InvokeTools,
    make_call_model,
    make_finish,
    make_wait,
)
from ._backoff import jitter, wait_seconds
from ._events import (
    EVENT_TYPES,
    Assembled,
    Cancelled,
    ModelFailed,
    ModelReplied,
    ToolsDone,
    WaitDone,
)
from ._exceptions import IllegalEvent, SessionEnded, TurnInProgress
from ._model_error import ModelError
from ._reachable import budget_left
from ._retry_after import retry_after
from ._settings import Settings
from ._state import RowInfo, RowSteps, SessionState, Step, TurnState, traced_counters
from ._table import (
    BACKING_OFF_TOOLS,
    CALLING,
    IDLE,
    INVOKING_TOOLS,
    ROWS,
    START,
    TERMINAL_STATES,
    Row,
)
from ._taxonomy import ErrorCategory, SessionStatus, ToolErrorCategory, TurnStatus
from ._tool_calls import ToolCall, ToolOutcome, ToolResult
from ._trace import TraceRecord
from ._trials import TRIALS, Trial

Observer = Callable[[TraceRecord], None]
DoomCheck = Callable[[tuple[ToolCall, ...]], bool]
"""A host's second-tier doom-loop check: the last ``doom_check_window`` tool calls in,
``True`` when the model is going round in circles. Asked by the session before a reply
is sent (``ModelReplied.doom_verdict``); no step calls it."""

logger = logging.getLogger("statemachine")
logger.addHandler(logging.NullHandler())  # a library logs; the host decides where to

TRIGGERS: dict[type, str] = {cls: cls.__name__ for cls in EVENT_TYPES}
"""The trigger of each event class (its name)."""

_LARGEST = sys.float_info.max
_ASSEMBLE = Assemble(reduce=False)
_REDUCE = Assemble(reduce=True)


# -- facts: what a group of rows' guards read, derived once per event --------------


WaitFacts = tuple[float | None, float, bool, bool, float]
"""What a transient failure at ``now`` would lead to, the jitter previewed:
``(server, seconds, too_long, crosses, now)``: the usable retry-after, the wait the
engine would take, whether the server asked for more than ``max_server_wait_s``, and
whether the wait would cross ``max_wall_clock_s``. (A plain tuple: no constructor to
call on the hot path.)"""


@attrs.define(init=False, eq=False, repr=False)
class ToolFacts:
    """What a tool round leads to: the breakers' and the denial counter's new values,
    the providers it trips, the latest outcome of every call, the conflicting calls
    still to re-invoke and the wait before the next, and whether a terminal tool
    succeeded. (Derived before anything changes; the effects apply it.)"""

    counts: dict[str, int]
    logs: dict[str, str] | None
    tripped: list[str]
    denials: int
    denial_log: str
    denied: bool
    outcomes: dict[str, ToolOutcome]
    pending: tuple[str, ...]
    attempt: int
    seconds: float | None
    terminal: bool


def _next_wait(core: Core, attempt: int, server: float | None, now: float) -> tuple[float, bool]:
    """The wait before retry ``attempt`` (from 0), taken at ``now``: the backoff formula
    with the session's next jitter draw (previewed, not consumed), at least ``server``;
    and whether it would cross ``max_wall_clock_s``."""
    settings = core.settings
    state = core.state
    seconds = wait_seconds(
        attempt,
        jitter(state.seed, state.draws),
        server,
        settings.base_delay_ms,
        settings.backoff_factor,
        settings.max_delay_ms,
    )
    limit = settings.max_wall_clock_s
    return seconds, limit is not None and core.bound_elapsed_s(now) + seconds > limit


def _take_wait(core: Core, seconds: float) -> None:
    """Consume the jitter draw of a wait and add it to the session's waited time (a sum
    that stays JSON: it saturates at the largest float)."""
    state = core.state
    state.draws += 1
    waited = state.waited_s + seconds
    state.waited_s = waited if waited < _LARGEST else _LARGEST


def _wait_facts(
    core: Core, turn: TurnState, event: ModelFailed, now: float, wall: float | None
) -> WaitFacts:
    error = event.error
    if error.retry_after_seconds is None and error.headers is None:
        server = None  # the common failure: the server asked for nothing
    else:
        server = retry_after(error, wall)
    seconds, crosses = _next_wait(core, turn.attempt, server, now)
    too_long = server is not None and server > core.settings.max_server_wait_s
    return server, seconds, too_long, crosses, now


def _tool_facts(
    core: Core, turn: TurnState, event: ToolsDone, now: float, _wall: float | None
) -> ToolFacts:
    facts = ToolFacts()
    by_id = {outcome.call_id: outcome for outcome in event.outcomes}
    _crash_facts(core, turn, by_id, facts)
    _denial_facts(core, turn, by_id, facts)
    _conflict_facts(core, turn, by_id, facts, now)
    return facts


def _crash_facts(
    core: Core, turn: TurnState, by_id: dict[str, ToolOutcome], facts: ToolFacts
) -> None:
    settings = core.settings
    # the crash breaker counts failed invocations: a provider that failed several
    # calls of one round (its process died under them) crashed once
    died: dict[str, bool] = {}
    for call in turn.in_flight:
        crashed = by_id[call.id].crashed
        died[call.provider] = died.get(call.provider, False) or crashed
    counts = dict(core.state.breakers or {})
    window = settings.breaker_window
    logs = dict(core.state.crash_logs or {}) if window else None
    tripped: list[str] = []
    for provider, crashed in died.items():
        count = counts.get(provider, 0) + 1 if crashed else 0
        counts[provider] = count
        trips = crashed and count >= settings.breaker_threshold
        if logs is not None and window is not None:
            log = _slide(logs.get(provider, ""), crashed, window)
            if "1" in log:
                logs[provider] = log
            else:
                logs.pop(provider, None)
            trips = trips or (crashed and log.count("1") >= settings.breaker_window_threshold)  # type: ignore[operator]
        if trips:
            tripped.append(provider)
    facts.counts, facts.logs, facts.tripped = counts, logs, tripped


def _denial_facts(
    core: Core, turn: TurnState, by_id: dict[str, ToolOutcome], facts: ToolFacts
) -> None:
    """The denial breaker: permission_denied outcomes, in a row and in a window."""
    settings = core.settings
    threshold = settings.denial_threshold
    size = settings.denial_window
    denials, denial_log, denied = core.state.denials, core.state.denial_log, False
    for call in turn.in_flight:
        hit = by_id[call.id].category is ToolErrorCategory.PERMISSION_DENIED
        if threshold is not None:
            denials = min(denials + 1, threshold) if hit else 0
            denied = denials >= threshold
        if size is not None:
            denial_log = _slide(denial_log, hit, size)
            denied = denied or (hit and denial_log.count("1") >= settings.denial_window_threshold)  # type: ignore[operator]
        if denied:
            break  # the breaker tripped: the counts stay where they tripped it
    facts.denials, facts.denial_log, facts.denied = denials, denial_log, denied


def _slide(log: str, hit: bool, size: int) -> str:
    """A sliding window's log (``1``: an outcome it counts) after one more outcome."""
    return (log + ("1" if hit else "0"))[-size:]


def _conflicting(
    settings: Settings,
    turn: TurnState,
    by_id: dict[str, ToolOutcome],
    outcomes: dict[str, ToolOutcome],
) -> tuple[list[str], int]:
    """The conflicting calls still to re-invoke after this round (``by_id``), in order,
    and how often the first has been; ``outcomes`` takes the round's."""
    conflict = ToolErrorCategory.CONCURRENCY_CONFLICT
    pending = list(turn.pending)
    if pending:  # a re-invocation of pending[0], alone
        outcome = outcomes[pending[0]] = by_id[pending[0]]
        attempt = turn.conflict_attempt
        if outcome.category is conflict and attempt < settings.max_conflict_retries:
            return pending, attempt
        return pending[1:], 0
    for call in turn.in_flight:
        outcome = outcomes[call.id] = by_id[call.id]
        if outcome.category is conflict and settings.max_conflict_retries:
            pending.append(call.id)
    return pending, 0


def _conflict_facts(
    core: Core, turn: TurnState, by_id: dict[str, ToolOutcome], facts: ToolFacts, now: float
) -> None:
    """Conflicts: re-invoked one at a time while they have re-invocations left and the
    wait fits the wall clock; whatever is left goes to the model as it is."""
    tripped = facts.tripped
    denied = facts.denied
    outcomes = {outcome.call_id: outcome for outcome in turn.outcomes}
    pending, attempt = _conflicting(core.settings, turn, by_id, outcomes)
    facts.seconds = None
    if pending and not tripped and not denied:
        seconds, crosses = _next_wait(core, attempt, None, now)
        if not crosses:
            facts.seconds = seconds
    facts.outcomes = outcomes
    facts.pending = tuple(pending) if facts.seconds is not None else ()
    facts.attempt = attempt
    facts.terminal = (
        facts.seconds is None
        and not tripped
        and not denied
        and any(call.terminates_turn and outcomes[call.id].ok for call in turn.calls)
    )


@attrs.define(eq=False, repr=False)
class DoomFacts:
    """What a reply's tool calls do to the doom-loop detector (both tiers): ``due`` says
    whether the second tier's verdict is read at this reply (``window`` the calls it
    judges); ``fired`` is the first tier's, and the verdict's once it is read."""

    last: str | None
    run: int
    fired: bool
    window: tuple[ToolCall, ...] | None
    since: int
    due: bool


def doom_facts(
    core: Core, turn: TurnState, calls: tuple[ToolCall, ...], checked: bool
) -> DoomFacts | None:
    """What a reply of ``calls`` does to the doom-loop detector, ``checked``: taken with
    a second-tier verdict (not read here); ``None`` where the detector does not run (no
    call, or the final-answer turn). Changes nothing."""
    if not calls or turn.final_answer:
        return None
    state = core.state
    settings = core.settings
    threshold = settings.doom_loop_threshold
    last, run, fired = state.doom_last, state.doom_run, False
    for call in calls:
        fingerprint = call_fingerprint(call)
        if fingerprint == last:
            run += 1
        else:
            last, run = fingerprint, 1
        fired = fired or run >= threshold
    window = None
    since = state.doom_since
    due = False
    if checked and not fired:
        size = settings.doom_check_window
        window = (*state.doom_window, *calls)[-size:]
        since += len(calls)
        if run == threshold - 1 or since >= size:
            since, due = 0, True
    return DoomFacts(last, run, fired, window, since, due)


def _doom_facts(
    core: Core, turn: TurnState, event: ModelReplied, _now: float, _wall: float | None
) -> DoomFacts | None:
    verdict = event.doom_verdict
    facts = doom_facts(core, turn, event.tool_calls, verdict is not None)
    if facts is not None and facts.due:
        facts.fired = bool(verdict)
    return facts


Facts = Callable[["Core", TurnState, Any, float, "float | None"], Any]
"""``facts(core, turn, event, now, wall)``: what a group of rows reads, at the step's
moment ``now`` (wall time ``wall``)."""

FACTS_OF_GUARD: dict[str, Facts] = {
    "wait_fits": _wait_facts,
    "server_wait_too_long": _wait_facts,
    "wait_crosses_wall_clock": _wait_facts,
    "trips_breaker": _tool_facts,
    "trips_denial_breaker": _tool_facts,
    "conflict_retry": _tool_facts,
    "terminal_tool": _tool_facts,
}
"""The facts each guard that needs any reads (the rows' effects read the same)."""
FACTS_OF_EFFECT: dict[str, Facts] = {
    "wait": _wait_facts,
    "finish_tools": _tool_facts,
    "tool_wait": _tool_facts,
    "invoke_tools": _doom_facts,
}
"""The facts each effect that needs any reads, whatever its row's guards."""


# -- guards -----------------------------------------------------------------------------
#
# Each guard is a question about ``(core, turn, event, facts)`` that reads and never
# changes; what it means in words is ``_table.GUARDS`` (the diagrams' legend).

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


GUARDS: dict[str, Guard] = {
    "final_answer": lambda _core, turn, _event, _facts: turn.final_answer,
    "no_tool_calls": lambda _core, _turn, event, _facts: not event.tool_calls,
    "partial": lambda _core, _turn, event, _facts: event.partial,
    "reductions_left": lambda core, turn, _event, _facts: (
        turn.reductions < core.settings.max_context_reductions
    ),
    "ceiling_reached": lambda core, _turn, _event, _facts: (
        core.state.retries >= core.settings.session_retry_ceiling
    ),
    "retries_left": lambda core, turn, _event, _facts: turn.attempt < core.settings.max_retries,
    # a wait's facts: (server, seconds, too long, crosses the wall clock, now)
    "wait_fits": lambda _core, _turn, _event, facts: not (facts[2] or facts[3]),
    "fallback_left": lambda core, turn, _event, _facts: (
        turn.model_index + 1 < len(core.settings.fallback_models)
    ),
    "server_wait_too_long": lambda _core, _turn, _event, facts: facts[2],
    "wait_crosses_wall_clock": lambda _core, _turn, _event, facts: facts[3],
    # both requests are JSON data (checked when they came in): comparing them cannot raise
    "shrank": lambda _core, turn, event, _facts: (
        turn.overflowed_size is not None
        and event.size < turn.overflowed_size
        and bool(event.request != turn.overflowed_request)
    ),
    "trips_breaker": lambda _core, _turn, _event, facts: bool(facts.tripped),
    "trips_denial_breaker": lambda _core, _turn, _event, facts: facts.denied,
    "conflict_retry": lambda _core, _turn, _event, facts: facts.seconds is not None,
    "terminal_tool": lambda _core, _turn, _event, facts: facts.terminal,
}
"""Every guard that is evaluated per event, by name (the table's guards less the
category guards)."""


# -- effects ------------------------------------------------------------------------------

Effect = Callable[..., Action]
"""``effect(core, turn, event, facts, status) -> action``."""


def model_of(core: Core, turn: TurnState) -> str | None:
    """The model ``turn`` currently calls (``None``: the host's default)."""
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
    return make_call_model(event.request, 0, model_of(core, turn), turn.final_answer)


def _retry(core: Core, turn: TurnState, _e: WaitDone, _f: None, _s: None) -> Action:
    turn.attempt += 1
    return make_call_model(turn.request, turn.attempt, model_of(core, turn), turn.final_answer)


def _wait(core: Core, turn: TurnState, event: ModelFailed, facts: WaitFacts, _s: None) -> Action:
    core.state.retries += 1
    _take_wait(core, facts[1])
    return make_wait(facts[1], event.error.category, turn.attempt, facts[0])


def _fall_back(core: Core, turn: TurnState, event: ModelFailed, _f: Any, _s: None) -> Action:
    before = model_of(core, turn)
    turn.model_index += 1
    after = core.settings.fallback_models[turn.model_index]
    turn.fallbacks = (*turn.fallbacks, Fallback(before, after, event.error))
    core.state.retries += 1
    turn.attempt = 0
    return make_call_model(turn.request, 0, after, turn.final_answer)


def _complete(core: Core, turn: TurnState, event: ModelReplied, _f: None, _s: None) -> Action:
    turn.reply_data = event.reply_data
    if not event.tool_calls:
        state = core.state
        state.doom_last = None  # a reply with no tool call ends any run of identical calls
        state.doom_run = 0
    # the reply is this event's (what _reply would find first)
    return _finish_action(core, turn, TurnStatus.COMPLETED, (), None, None, True, event.reply)


def _invoke_tools(
    core: Core, turn: TurnState, event: ModelReplied, facts: DoomFacts | None, _s: None
) -> Action:
    state = core.state
    turn.reply_data = event.reply_data
    if facts is not None:  # None: no detector runs (the table never invokes then)
        state.doom_last = facts.last
        state.doom_run = facts.run
        if facts.window is not None:
            state.doom_window = facts.window
            state.doom_since = facts.since
        if facts.fired:
            core.fire_limit(SessionStatus.ERROR_DOOM_LOOP)
    turn.calls = turn.in_flight = event.tool_calls
    return InvokeTools(event.tool_calls)


def _apply_tool_facts(core: Core, turn: TurnState, facts: ToolFacts) -> None:
    state = core.state
    state.breakers = {p: n for p, n in facts.counts.items() if n} or None
    state.crash_logs = facts.logs or None  # None without a breaker_window, or no crash in it
    state.denials = facts.denials
    state.denial_log = facts.denial_log
    turn.outcomes = tuple(facts.outcomes.values())
    turn.pending = facts.pending
    if facts.tripped:
        state.tripped = state.tripped | frozenset(facts.tripped)
        core.fire_limit(SessionStatus.ERROR_CIRCUIT_BREAKER)
    if facts.denied:
        core.fire_limit(SessionStatus.ERROR_DENIAL_BREAKER)


def _result(call: ToolCall, outcome: ToolOutcome) -> ToolResult:
    if outcome.ok:
        return ToolResult(call.id, outcome.content)
    return ToolResult(
        call.id,
        outcome.content,
        True,
        outcome.category or ToolErrorCategory.UNKNOWN,
        retryable=bool(outcome.retryable),
        details=outcome.details,
    )


def _finish_tools(
    core: Core, turn: TurnState, _event: ToolsDone, facts: ToolFacts, status: TurnStatus | None
) -> Action:
    _apply_tool_facts(core, turn, facts)
    turn.conflict_attempt = 0
    outcomes = facts.outcomes
    results = tuple(_result(call, outcomes[call.id]) for call in turn.calls)
    status = status or TurnStatus.COMPLETED
    return _finish_action(core, turn, status, results, None, None, facts.terminal, _reply(turn))


def _tool_wait(core: Core, turn: TurnState, _e: ToolsDone, facts: ToolFacts, _s: None) -> Action:
    _apply_tool_facts(core, turn, facts)
    seconds: float = facts.seconds  # type: ignore[assignment]
    turn.conflict_attempt = facts.attempt + 1
    core.state.tool_retries += 1
    _take_wait(core, seconds)
    return make_wait(seconds, ToolErrorCategory.CONCURRENCY_CONFLICT, facts.attempt, None)


def _reinvoke(_core: Core, turn: TurnState, _e: WaitDone, _f: None, _s: None) -> Action:
    first = turn.pending[0]
    call = next(call for call in turn.calls if call.id == first)
    turn.in_flight = (call,)
    return InvokeTools(turn.in_flight)


def _finish(core: Core, turn: TurnState, event: Any, facts: Any, status: TurnStatus) -> Action:
    error = event.error if type(event) is ModelFailed else None
    retry_at = None
    if status is TurnStatus.RETRY_DEFERRED:
        retry_at = facts[4] + facts[0]  # now + server: only a server's wait is deferred
        retry_at = min(_LARGEST, retry_at)
    if error is not None and status in _LOGGED:
        _log_failure(core, turn, error, status)
    return _finish_action(core, turn, status, (), error, retry_at, False, _reply(turn))


_LOGGED = frozenset({TurnStatus.INVALID_REQUEST, TurnStatus.UNKNOWN_ERROR})


def _log_failure(core: Core, turn: TurnState, error: ModelError, status: TurnStatus) -> None:
    """Log a failure a human must look at with the request's shape, never its content
    (the request may hold a user's data; the error's message may echo it)."""
    if not logger.isEnabledFor(logging.WARNING):
        return  # nobody listens: the request's shape is not walked
    logger.warning(
        "model call failed: %s (code=%s, status=%s, model=%s, turn=%d, attempt=%d); "
        "request shape: %s",
        status.value,
        error.code,
        error.status,
        model_of(core, turn),
        turn.index,
        turn.attempt,
        request_shape(turn.request),
    )


def request_shape(value: object, depth: int = 0) -> str:
    """The shape of ``value`` (types, mapping keys, sizes), never its content: what a
    log may show of a request. Strings show their length only; mapping keys are
    shown when they look like identifiers (a field name, not data)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"str[{len(value)}]"
    if depth >= 4:
        return type(value).__name__
    if isinstance(value, dict):
        parts = []
        for i, (key, item) in enumerate(value.items()):
            if i == 20:
                parts.append(f"...+{len(value) - 20}")
                break
            name = key if isinstance(key, str) and key.isidentifier() and len(key) <= 40 else "?"
            parts.append(f"{name}: {request_shape(item, depth + 1)}")
        return "{" + ", ".join(parts) + "}"
    if isinstance(value, list | tuple):
        if not value:
            return "list[0]"
        return f"list[{len(value)}] of {request_shape(value[0], depth + 1)}"
    return type(value).__name__


def _cancel(core: Core, turn: TurnState, event: Cancelled, _f: None, status: TurnStatus) -> Action:
    results: tuple[ToolResult, ...] = ()
    if turn.state in (INVOKING_TOOLS, BACKING_OFF_TOOLS):
        reason = f"cancelled: {event.reason}" if event.reason else "cancelled"
        # a call in flight has no outcome yet, or is the pending conflict re-invoked
        unsettled = set(turn.pending)
        outcomes = {o.call_id: o for o in turn.outcomes}
        results = tuple(
            ToolResult(c.id, reason, True, ToolErrorCategory.CANCELLED)
            if c.id in unsettled or c.id not in outcomes
            else _result(c, outcomes[c.id])
            for c in turn.calls
        )
        turn.pending = ()
        turn.conflict_attempt = 0
    return _finish_action(core, turn, status, results, None, None, False, _reply(turn))


def _finish_action(
    core: Core,
    turn: TurnState,
    status: TurnStatus,
    results: tuple[ToolResult, ...],
    error: ModelError | None,
    retry_at: float | None,
    done: bool,
    reply: Any,
) -> Finish:
    """The Finish of ``turn`` with ``status``, the reply being handled ``reply`` (the
    host's object, :func:`_reply`)."""
    return make_finish(
        status,
        results,
        error,
        model_of(core, turn),
        turn.fallbacks,
        retry_at,
        reply,
        done,
        turn.reply_data,
    )


def _reply(turn: TurnState) -> Any:
    """The host's own reply object whose JSON form the turn holds (``reply_data``): the
    reply its event carried, in this process; that form itself for a turn restored
    after the reply."""
    data = turn.reply_data
    for kept in reversed(turn.events):
        event = kept[0] if type(kept) is tuple else kept  # (event, the wall time it was given)
        if type(event) is ModelReplied:
            return event.reply if event.reply_data is data else data
    return data


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
    "tool_wait": _tool_wait,
    "reinvoke": _reinvoke,
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
    """A stable hash of (tool name, canonical JSON of the arguments): the provider is
    left out, as the same call routed elsewhere is still the same call."""
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
    steps: RowSteps = attrs.field(eq=False, repr=False)
    """The steps through this row met so far, by their counters: traces share them."""


@attrs.frozen
class Group:
    """The rows for one (state, trigger, category), in trial order, and the facts
    their guards and effects read (``None``: none)."""

    rows: tuple[BoundRow, ...]
    facts: Facts | None
    check: Callable[[Core, TurnState, Any], None] | None = None
    """The payload check of the trigger (bad data refused before anything changes)."""
    charges: bool = False
    """The trigger reports a model call's usage: its event's ``cost`` is charged."""
    trial: Callable[..., Trial[BoundRow]] | None = None
    """The table's own trial of these rows (``_trials.TRIALS``), if it has one."""
    choose: Trial[BoundRow] = attrs.field(default=None, eq=False, repr=False)
    """The first row whose guards all hold (``None``: none does): the trial, or
    :meth:`try_rows`."""
    only: BoundRow | None = attrs.field(default=None, eq=False, repr=False)
    """The one row of a group with nothing to try, charge, check or derive."""

    def __attrs_post_init__(self) -> None:
        chosen = self.try_rows if self.trial is None else self.trial(self.rows)
        object.__setattr__(self, "choose", chosen)
        if (
            len(self.rows) == 1
            and not self.rows[0].guards
            and self.facts is None
            and self.check is None
            and not self.charges
        ):
            object.__setattr__(self, "only", self.rows[0])

    def try_rows(self, core: Core, turn: TurnState, event: Any, facts: Any) -> BoundRow | None:
        """The first row whose guards all hold (``None``: none's do), as each trial of
        ``_trials.py`` finds it."""
        for row in self.rows:
            if all(guard(core, turn, event, facts) for guard in row.guards):
                return row
        return None


DispatchKey = tuple[str, str, "ErrorCategory | None"]


class Dispatch:
    """The table as the engine runs it: ``(state, trigger, category) -> Group``, the
    category a ``ModelFailed``'s (its category guards resolved), else ``None``. Built
    from ``rows`` (the model check passes mutated ones) and ``effects`` (extra effect
    functions a mutated row may name).
    """

    __slots__ = ("by_state", "failures", "groups", "legal", "rows")

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
                key = (source, trigger, category)
                trial = TRIALS.get(key) if self.rows == ROWS else None
                self.groups[key] = _group(
                    trigger, members, effect_of, _PAYLOAD_CHECKS.get(trigger), trial
                )
        # the groups Core.fire looks up, by state and then trigger (a ModelFailed's by its
        # category, in a map of their own): two lookups of a string, no key tuple built
        self.by_state: dict[str, dict[str, Group]] = {}
        self.failures: dict[str, dict[ErrorCategory, Group]] = {}
        for (source, trigger, category), built in self.groups.items():
            if trigger == "ModelFailed" and category is not None:
                self.failures.setdefault(source, {})[category] = built
            elif trigger != "ModelFailed" and category is None:
                self.by_state.setdefault(source, {})[trigger] = built
        for source, trigger in keys:  # idle's only trigger is start, named by its own message
            self.legal[source] = (*self.legal.get(source, ()), trigger)

    def illegal_message(self, trigger: str, state: str) -> str:
        """Why ``trigger`` is refused in ``state``."""
        if state == IDLE:
            return f"{trigger} is not legal in state 'idle': call start() first"
        if state in TERMINAL_STATES:
            return f"{trigger} is not legal in state {state!r}: the turn has finished"
        legal = ", ".join(sorted(self.legal.get(state, ())))
        return f"{trigger} is not legal in state {state!r} (legal there: {legal})"


_USAGE_TRIGGERS = frozenset({"ModelReplied", "ModelFailed", "Cancelled"})
"""The triggers whose event reports a model call's cost and usage."""


def _group(
    trigger: str,
    rows: list[Row],
    effect_of: Mapping[str, Effect],
    check: Callable[[Core, TurnState, Any], None] | None,
    trial: Callable[..., Trial[BoundRow]] | None,
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
                info=row.info,
                dest=row.dest,
                effect=effect_of[row.effect],
                status=TurnStatus(row.status) if row.status else None,
                names=names,
                steps=RowSteps(row.info),
            )
        )
    return Group(tuple(bound), facts, check, trigger in _USAGE_TRIGGERS, trial)


# -- payload checks: bad data is refused before anything changes ---------------------------


def refused(trigger: str, state: str, problem: str) -> IllegalEvent:
    """The refusal of a ``trigger`` event in ``state`` for ``problem`` in its payload."""
    return IllegalEvent(f"{trigger} in state {state!r}: {problem}", event=trigger, state=state)


def _overspent(
    core: Core, turn: TurnState, event: ModelReplied | ModelFailed | Cancelled
) -> IllegalEvent:
    """The refusal of a cost that would take the session's spend past the largest float."""
    return refused(
        type(event).__name__,
        turn.state,
        f"cost {event.cost!r} would take the session's spend ({core.state.cost_usd!r}) "
        "past the largest float",
    )


def _check_replied(_core: Core, turn: TurnState, event: ModelReplied) -> None:
    if len(event.tool_calls) < 2:
        return
    seen: set[str] = set()
    for call in event.tool_calls:
        if call.id in seen:
            raise refused("ModelReplied", turn.state, f"tool call id {call.id!r} appears twice")
        seen.add(call.id)


def _check_tools_done(_core: Core, turn: TurnState, event: ToolsDone) -> None:
    calls, outcomes = turn.in_flight, event.outcomes
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
        raise refused("ToolsDone", turn.state, problem)


def _check_cancelled(_core: Core, turn: TurnState, event: Cancelled) -> None:
    if turn.state != CALLING and (event.cost or event.usage is not None):
        raise refused(
            "Cancelled",
            turn.state,
            "a cost or usage is the model call's in flight, and none is (only in state "
            "'calling'); send Cancelled(reason) alone",
        )


_PAYLOAD_CHECKS: dict[str, Callable[[Core, TurnState, Any], None]] = {
    "ModelReplied": _check_replied,
    "ToolsDone": _check_tools_done,
    "Cancelled": _check_cancelled,
}
"""The payload checks of the triggers that have one (``Core.fire`` refuses a cost
past the largest float itself)."""

DISPATCH: Dispatch = Dispatch()
"""The dispatch of the table."""


# -- the owner of a session's state ---------------------------------------------------------

_LIMIT_TEXT = {
    SessionStatus.ERROR_MAX_TURNS: "the maximum number of turns ({settings.max_turns})",
    SessionStatus.ERROR_MAX_BUDGET_USD: "the cost budget (${settings.max_cost_usd:g})",
    SessionStatus.ERROR_MAX_WALL_CLOCK: "the wall-clock budget ({settings.max_wall_clock_s:g} s)",
    SessionStatus.ERROR_CIRCUIT_BREAKER: "a tool provider's circuit breaker (repeated crashes)",
    SessionStatus.ERROR_DOOM_LOOP: "the repeated-tool-call guard (the same call over and over)",
    SessionStatus.ERROR_DENIAL_BREAKER: "the denial breaker (tool calls denied over and over)",
}


def final_answer_instruction(limit: SessionStatus, settings: Settings) -> str:
    """The synthetic instruction of the final-answer turn for ``limit``."""
    if limit is SessionStatus.ERROR_MAX_BUDGET_USD and settings.max_cost_usd is None:
        what = "the cost budget of a session it belongs to"
    else:
        what = _LIMIT_TEXT[limit].format(settings=settings)
    return (
        f"This session has reached {what}. Tools are no longer available. "
        "Do not call any tool: reply now with your final answer, based on what "
        f"you have so far. [limit: {limit.value}]"
    )


@attrs.define(init=False, eq=False, repr=False)
class Core:
    """A session's state and the one place that changes it."""

    settings: Settings
    state: SessionState
    observers: tuple[Observer, ...]
    dispatch: Dispatch
    by_state: dict[str, dict[str, Group]]
    failures: dict[str, dict[ErrorCategory, Group]]
    doom_check: DoomCheck | None
    """Asked by ``Turn.judged`` before a reply is sent; no step calls it."""
    parent: Core | None
    """The parent session's core, for a child spawned in this process (live spend)."""
    children: list[weakref.ref[Any]] | None
    """The sessions spawned from this one in this process (``None`` until the first)."""
    last: float
    """The latest moment the state holds (:func:`last_reading`): no step is before it."""
    ceiling: float
    """A float from ``last`` up to it is surely seconds from the session's start: it
    needs no other check (:meth:`reading` checks the rest)."""

    def __init__(
        self,
        settings: Settings,
        state: SessionState,
        observers: tuple[Observer, ...],
        dispatch: Dispatch,
        doom_check: DoomCheck | None = None,
        last: float | None = None,
    ) -> None:
        """``last``: :func:`last_reading` of ``state``, when the caller knows it (a new
        session's is its start)."""
        self.settings = settings
        self.state = state
        self.observers = observers
        self.dispatch = dispatch
        self.by_state = dispatch.by_state
        self.failures = dispatch.failures
        self.doom_check = doom_check
        self.parent = None
        self.children = None
        self.last = last_reading(state) if last is None else last
        started = state.started
        # the one float most sessions share; a start far below 0 has its own
        self.ceiling = _CEILING if started >= -_CEILING else started + _CEILING

    # -- time ----------------------------------------------------------------------

    def reading(self, at: object) -> float:
        """``at``, a reading of the session's clock, as the moment of a step: one before
        the state's last reading is read as that one (the clock stood still).

        Raises ``TypeError`` for what is not a number, ``ValueError`` for a reading
        that is not finite or so far from the session's start that the seconds between
        do not fit a float.
        """
        reading = _reading(at, "at")
        last = self.last
        if reading < last:
            return last
        if reading - self.state.started >= _INFINITY:
            raise ValueError(
                f"at: {reading!r} is too far from the session's start "
                f"({self.state.started!r}) for the seconds between to be a number"
            )
        return reading

    def elapsed_s(self, now: float) -> float:
        """Seconds on the session's clock from its start to ``now``."""
        return now - self.state.started

    def bound_elapsed_s(self, now: float) -> float:
        """The seconds ``max_wall_clock_s`` measures at ``now`` (a checked reading):
        with ``wall_clock_counts_idle = False``, all but the idle ones."""
        elapsed = now - self.state.started
        return elapsed if self.settings.wall_clock_counts_idle else elapsed - self.idle_s(now)

    def idle_s(self, now: float) -> float:
        """Seconds the session spent between turns, up to ``now``."""
        state = self.state
        idle = state.idle_s
        if state.finished_at is not None:
            idle += max(0.0, now - state.finished_at)
        return idle

    # -- spend ---------------------------------------------------------------------

    def charge(self, cost: float) -> None:
        """Count ``cost`` here and at every live ancestor."""
        state = self.state
        total = state.cost_usd + cost
        state.cost_usd = total if total < _LARGEST else _LARGEST
        parent = self.parent
        if parent is not None and state.session_id is not None:
            parent.record_child_spend(state.session_id, state.cost_usd)

    def record_child_spend(self, child_id: str, total: float) -> None:
        """``child_id``'s total spend is ``total``: the difference from what was last
        reported is counted here (and at the live ancestors). A total that is not
        larger changes nothing, so a repeated or late report is harmless."""
        state = self.state
        costs = state.child_costs
        known = 0.0 if costs is None else costs.get(child_id, 0.0)
        if not total > known:
            return
        state.child_costs = {**(costs or {}), child_id: total}
        self.charge(total - known)

    def record_ancestor_budget(self, budget: float | None) -> None:
        """The ancestors' smallest remaining budget is ``budget`` now (``None``: none
        of them has one), as a parent in another process reported it."""
        state = self.state
        state.ancestor_budget_usd = budget
        state.ancestor_mark_usd = state.cost_usd

    def remaining_budget_usd(self) -> float | None:
        """The smallest remaining ``max_cost_usd`` on the path to the root (``None``:
        no session on it has a budget). With a live parent the ancestors are read
        now, and the reading is kept (``ancestor_budget_usd``) for a snapshot."""
        state = self.state
        if self.parent is not None:
            state.ancestor_budget_usd = self.parent.remaining_budget_usd()
            state.ancestor_mark_usd = state.cost_usd
        return budget_left(state, self.settings)

    # -- turns ------------------------------------------------------------------------

    def new_turn(self, now: float) -> TurnState:
        """Begin the next turn at ``now`` (the final-answer turn once a limit has fired)."""
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
        self.check_bounds(now)
        state.turns = turns + 1
        limit = state.limit
        if limit is None:
            turn = TurnState(state.turns)  # the index
        else:
            turn = TurnState(
                index=state.turns,
                final_answer=True,
                instruction=final_answer_instruction(limit, self.settings),
            )
        turn.made = now - state.started  # its bounds were checked now: a replay makes it then
        state.turn = turn
        return turn

    def fire_limit(self, limit: SessionStatus) -> None:
        """Record that ``limit`` fired (the first one to fire is kept)."""
        if self.state.limit is None:
            self.state.limit = limit

    def check_bounds(self, now: float) -> None:
        """Fire the first session bound that has been reached at ``now``, if none has
        fired."""
        state = self.state
        if state.limit is not None:
            return
        settings = self.settings
        if settings.max_turns is not None and state.turns >= settings.max_turns:
            state.limit = SessionStatus.ERROR_MAX_TURNS
            return
        if settings.max_cost_usd is not None or state.ancestor_budget_usd is not None:
            remaining = self.remaining_budget_usd()
            if remaining is not None and remaining <= 0:
                state.limit = SessionStatus.ERROR_MAX_BUDGET_USD
                return
        if (
            settings.max_wall_clock_s is not None
            and self.bound_elapsed_s(now) >= settings.max_wall_clock_s
        ):
            state.limit = SessionStatus.ERROR_MAX_WALL_CLOCK

    def _turn_finished(self, turn: TurnState, finish: Finish, now: float) -> None:
        self.state.finished_at = now
        if turn.final_answer:
            self.state.status = self.state.limit
            return
        if finish.status is TurnStatus.BUDGET_EXHAUSTED:
            self.fire_limit(SessionStatus.ERROR_MAX_WALL_CLOCK)
        self.check_bounds(now)

    def end(self, status: SessionStatus, reason: str, now: float) -> Finish | None:
        """End the session on purpose with ``status`` (one of :data:`END_STATUSES`) at
        ``now``; a running turn is cancelled first (``cancelled``, ``failed``), and so is
        every live child session. Returns the cancelled turn's Finish, if there was one."""
        state = self.state
        if state.status is not None:
            raise SessionEnded(
                f"the session has already ended ({state.status.value})", status=state.status
            )
        turn = state.turn
        finish = None
        if turn is not None and turn.state != IDLE and turn.state not in TERMINAL_STATES:
            if status is SessionStatus.COMPLETED:
                raise TurnInProgress(
                    f"turn {turn.index} is still running (state {turn.state!r}): a session "
                    "completes between turns; end it cancelled or failed to abandon the turn"
                )
            finish = self.fire(turn, "Cancelled", Cancelled(reason), now, None)
        if status is not SessionStatus.COMPLETED:
            for ref in self.children or ():
                child = ref()
                if child is not None and child.status is None:
                    child.end(SessionStatus.CANCELLED, reason=reason or "parent ended", at=now)
        state.status = status
        return finish  # type: ignore[return-value]

    # -- events ------------------------------------------------------------------------

    def start(self, turn: TurnState, now: float) -> Action:
        """Start ``turn`` at ``now``; the time since the last turn's Finish was idle
        (counted only when the start is legal)."""
        state = self.state
        if state.finished_at is not None and START in self.by_state.get(turn.state, ()):
            state.idle_s += max(0.0, now - state.finished_at)
            state.finished_at = None
        return self.fire(turn, START, None, now, None)

    def fire(
        self, turn: TurnState, trigger: str, event: Any, now: float, wall: float | None
    ) -> Action:
        """Take ``event`` (``None`` for ``start``) in ``turn``, the current turn, at the
        moment ``now`` (checked by :meth:`reading`) with Unix time ``wall``."""
        state = turn.state
        groups: Mapping[Any, Group] | None
        if trigger == "ModelFailed":
            groups, key = self.failures.get(state), event.error.category
        else:
            groups, key = self.by_state.get(state), trigger
        group = None if groups is None else groups.get(key)
        if group is None:
            raise IllegalEvent(
                self.dispatch.illegal_message(trigger, state), event=trigger, state=state
            )
        session = self.state
        row = group.only
        if row is not None:  # nothing to try, charge, check or derive
            facts = usage = None
            cost = 0.0
        else:
            if group.charges:  # a model call's outcome (or abandonment): its cost and usage
                cost, usage = event.cost, event.usage
                if cost and not math.isfinite(session.cost_usd + cost):
                    raise _overspent(self, turn, event)
            else:
                cost, usage = 0.0, None
            if group.check is not None:
                group.check(self, turn, event)
            facts = None if group.facts is None else group.facts(self, turn, event, now, wall)
            row = group.choose(self, turn, event, facts)
            if row is None:  # pragma: no cover - the model check proves every group is total
                raise AssertionError(f"no row of {state!r} x {trigger!r} applies")
            if cost:
                self.charge(cost)
        turn.events.append(event)  # before the effect: a Finish finds its reply's event
        action = row.effect(self, turn, event, facts, row.status)
        turn.state = row.dest
        step = row.steps[traced_counters(turn, session)]
        turn.path.append(step)
        turn.actions.append(action)
        self.last = now
        elapsed = now - session.started
        turn.times.append(elapsed)
        if cost or usage is not None or wall is not None:
            _keep(turn, cost, usage, wall)
        if type(action) is Finish:
            self._turn_finished(turn, action, now)
        if self.observers:  # what turn_record would read back from the turn, at hand
            made = made_at(turn, session.started) if trigger == START else None
            at = session.started + elapsed
            index = len(turn.path) - 1
            record = trace_record(
                turn.index, index, step, action, cost, at, event, wall, usage, made
            )
            for observer in self.observers:
                observer(record)
        return action


def _keep(turn: TurnState, cost: float, usage: Any, wall: float | None) -> None:
    """Keep what the turn's last step charged, used and was given (the lists stay
    ``None`` while empty, and a wall time sits with its event: a live turn holds fewer
    bytes)."""
    step = len(turn.path) - 1
    if cost:
        if turn.costs is None:
            turn.costs = [(step, cost)]
        else:
            turn.costs.append((step, cost))
    if usage is not None:
        if turn.usages is None:
            turn.usages = [(step, usage)]
        else:
            turn.usages.append((step, usage))
    if wall is not None:  # rare: kept beside the step's event (appended last), no list of its own
        turn.events[-1] = (turn.events[-1], wall)


_INFINITY = float("inf")
_CEILING = sys.float_info.max / 4


def needs_wall(event: object) -> bool:
    """Whether a rule may read the wall time of the step ``event`` makes: a failure
    whose headers may hold an HTTP-date ``retry-after``."""
    return type(event) is ModelFailed and event.error.headers is not None


def last_reading(state: SessionState) -> float:
    """The latest moment ``state`` holds (the session's start, its current turn's last
    step, its last Finish): no step can be taken before it."""
    last = state.started
    turn = state.turn
    if turn is not None and turn.times:
        latest = turn.times[-1]
        if not math.isnan(latest):  # a time a snapshot of format 3 left unknown
            last += latest
    finished = state.finished_at
    if finished is not None and finished > last:
        last = finished
    return last


def made_at(turn: TurnState, started: float) -> float | None:
    """When ``turn`` was made (``new_turn``) on the clock of a session that started at
    ``started``; ``None`` for a turn restored from a snapshot (which keeps the turn, not
    that moment)."""
    made = turn.made
    return None if math.isnan(made) else started + made


def wall_reading(wall: object) -> float | None:
    """``wall`` (Unix time, or ``None``) checked as a step's wall time."""
    return None if wall is None else _reading(wall, "wall")


def _reading(value: object, name: str) -> float:
    """``value`` as a finite float of seconds, or the error that names ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}: must be a number of seconds, got {value!r:.60}")
    try:
        reading = float(value)
    except OverflowError:
        reading = _INFINITY
    if not math.isfinite(reading):
        raise ValueError(f"{name}: must be a finite number of seconds, got {value!r:.60}")
    return reading


def turn_record(turn: TurnState, index: int, started: float) -> TraceRecord:
    """The :class:`TraceRecord` of ``turn``'s ``index``-th transition in a session that
    started at ``started``, read back from what the turn keeps (a restored turn keeps no
    event of the steps before its snapshot)."""
    at = turn.times[index]
    unknown = len(turn.path) - len(turn.events)
    event = turn.events[index - unknown] if index >= unknown else None
    wall = None
    if type(event) is tuple:  # a step given a wall time keeps it beside its event
        event, wall = event
    return trace_record(
        turn.index,
        index,
        turn.path[index],
        turn.actions[index],
        _kept_at(turn.costs, index, 0.0),
        None if math.isnan(at) else started + at,  # NaN: unknown (format 3)
        event,
        wall,
        _kept_at(turn.usages, index, None),
        None if index else made_at(turn, started),  # a start's: when its turn was made
    )


def trace_record(
    turn: int,
    index: int,
    step: Step,
    action: Action,
    cost: float,
    at: float | None,
    event: Any,
    wall: float | None,
    usage: Any,
    made_at: float | None,
) -> TraceRecord:
    """The :class:`TraceRecord` of ``step``, the ``index``-th transition of turn
    ``turn``: its row, action and counters (:data:`TRACED`), what its event cost and
    used, when it was taken, the event that caused it and (a start's) when its turn was
    made. :meth:`Core.fire` passes what it holds; :func:`turn_record` reads it back."""
    source, trigger, guard, dest, _ = step[0]
    return TraceRecord(
        turn=turn,
        step=index,
        source=source,
        event=trigger,
        guard=guard,
        dest=dest,
        action=action,
        attempt=step[1],
        reductions=step[2],
        session_retries=step[3],
        cost_usd=cost,
        at=at,
        caused_by=event,
        wall=wall,
        usage=usage,
        made_at=made_at,
    )


def _kept_at(entries: list[tuple[int, Any]] | None, index: int, default: Any) -> Any:
    """The value ``entries`` (``(step, value)``, in step order) keep for step ``index``."""
    for step, value in reversed(entries or ()):
        if step <= index:
            return value if step == index else default
    return default
