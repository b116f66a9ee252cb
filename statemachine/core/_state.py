"""The engine's state, declared once.

Everything a session knows between two events is a field of :class:`SessionState` or
of the current turn's :class:`TurnState`, declared with :func:`declared`: its *kind*
(how it is written to a snapshot, read back, validated and copied), how the model
checker's key sees it and whether a trace record carries it. The snapshot codec
(:func:`encode_state`, :func:`decode_state`), the copies (:func:`copy_session_state`),
the checker's key (:func:`key_fields`) and the traced counters (:data:`TRACED`) all
follow from it. What the declaration cannot say
per field is checked by ``_reachable.reachable_problem``.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from typing import Any, get_args

import attrs

from ._actions import Action, Assemble, CallModel, Fallback, Finish, InvokeTools, Wait
from ._builder import build_copy
from ._codec import compact, decode, encode
from ._exceptions import SnapshotError
from ._json_data import MAX_COUNT, finite, json_problem, short_repr
from ._model_error import ModelError
from ._table import IDLE, ROWS, STATES
from ._taxonomy import SessionStatus, TurnStatus
from ._tool_calls import ToolCall, ToolOutcome, ToolResult
from ._usage import Usage

# -- kinds: how one field is written, read back and copied ------------------------


@attrs.frozen
class Kind:
    """How a declared field is encoded into a snapshot and decoded (validated) back:
    ``decode(raw, key)`` raises :class:`SnapshotError` naming ``key``; ``copy`` is
    ``None`` for immutable values (shared between copies)."""

    name: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any, str], Any]
    copy: Callable[[Any], Any] | None = None
    relative: bool = False
    """A reading of the session's clock: written as the seconds elapsed since it."""
    stored: bool = True
    """Written to a snapshot; ``False``: kept in this process only."""


def _same(value: Any) -> Any:
    return value


def _type_name(value: object) -> str:
    return type(value).__name__


def _count(raw: Any, key: str) -> int:
    if type(raw) is not int:
        raise SnapshotError(f"{key}: must be int, got {_type_name(raw)}")
    if raw < 0:
        raise SnapshotError(f"{key}: must be >= 0, got {short_repr(raw)}")
    if raw > MAX_COUNT:
        raise SnapshotError(f"{key}: must be < 2**63, got {short_repr(raw)}")
    return raw


def _seed(raw: Any, key: str) -> int:
    if type(raw) is not int:
        raise SnapshotError(f"{key}: must be int, got {_type_name(raw)}")
    if not 0 <= raw < 1 << 64:
        raise SnapshotError(f"{key}: must be a 64-bit unsigned int, got {short_repr(raw)}")
    return raw


def _optional_count(raw: Any, key: str) -> int | None:
    return None if raw is None else _count(raw, key)


def _model_index(raw: Any, key: str) -> int:
    if type(raw) is not int:
        raise SnapshotError(f"{key}: must be int, got {_type_name(raw)}")
    if not -1 <= raw <= MAX_COUNT:
        raise SnapshotError(f"{key}: {short_repr(raw)} is out of range")
    return raw


def _flag(raw: Any, key: str) -> bool:
    if type(raw) is not bool:
        raise SnapshotError(f"{key}: must be bool, got {_type_name(raw)}")
    return raw


def _text(raw: Any, key: str) -> str | None:
    if raw is None:
        return None
    if type(raw) is not str or json_problem(raw) is not None:
        raise SnapshotError(f"{key}: must be str or null, got {_type_name(raw)}")
    return raw


def _number(raw: Any, key: str) -> float:
    if type(raw) not in (int, float) or not (finite(raw) and raw >= 0):
        raise SnapshotError(f"{key}: must be a finite number >= 0, got {short_repr(raw)}")
    return float(raw)


def _state_name(raw: Any, key: str) -> str:
    if type(raw) is not str or raw not in STATES:
        raise SnapshotError(f"{key}: {short_repr(raw)} is not a state of the machine")
    return raw


def _session_status(raw: Any, key: str) -> SessionStatus | None:
    if raw is None:
        return None
    if type(raw) is not str:
        raise SnapshotError(f"{key}: must be str or null, got {_type_name(raw)}")
    try:
        return SessionStatus(raw)
    except (TypeError, ValueError):
        raise SnapshotError(f"{key}: {short_repr(raw)} is not a SessionStatus") from None


def _opaque(raw: Any, key: str) -> Any:
    problem = json_problem(raw, strict=True)
    if problem is not None:
        raise SnapshotError(f"{key}: must be JSON data: {problem}")
    return raw


def _values_of(
    kind: type, valid: Callable[[Any], bool] | None = None
) -> Callable[[Any, str], tuple[Any, ...]]:
    def read(raw: Any, key: str) -> tuple[Any, ...]:
        if type(raw) is not list:
            raise SnapshotError(f"{key}: must be list, got {_type_name(raw)}")
        items = _decoded(raw, key)
        if not all(type(item) is kind for item in items) or (valid and not valid(items)):
            raise SnapshotError(f"{key}: must hold {kind.__name__} values")
        return items  # type: ignore[no-any-return]

    return read


def _decoded(raw: Any, key: str) -> Any:
    """The engine's values encoded in ``raw`` (depth-bounded: never a RecursionError)."""
    try:
        return decode(raw, key)
    except (TypeError, ValueError) as exc:
        raise SnapshotError(str(exc)) from None


def _dict_of(
    what: str, names: str, read: Callable[[Any, str], Any]
) -> Callable[[Any, str], dict[str, Any] | None]:
    """The decoder of a dict of ``what`` (``None`` for none): its keys are non-empty
    text (``names`` in a refusal), each value read by ``read``."""

    def decode(raw: Any, key: str) -> dict[str, Any] | None:
        if type(raw) is not dict:
            raise SnapshotError(f"{key}: must be dict of {what}, got {_type_name(raw)}")
        out = {}
        for name, value in raw.items():
            if type(name) is not str or not name or json_problem(name) is not None:
                raise SnapshotError(f"{key}: {names} must be non-empty str, got {short_repr(name)}")
            out[name] = read(value, f"{key}.{name}")
        return out or None

    return decode


_counts_by_provider = _dict_of("provider: count", "provider names", _count)


def _crash_counts(raw: Any, key: str) -> dict[str, int] | None:
    counts = _counts_by_provider(raw, key) or {}
    return {provider: n for provider, n in counts.items() if n} or None


def _provider_name(raw: Any, key: str) -> str:
    if type(raw) is not str or not raw or json_problem(raw) is not None:
        raise SnapshotError(f"{key}: provider names must be non-empty str, got {short_repr(raw)}")
    return raw


def _providers(raw: Any, key: str) -> frozenset[str]:
    if type(raw) is not list:
        raise SnapshotError(f"{key}: must be list of provider names, got {_type_name(raw)}")
    return frozenset(_provider_name(item, key) for item in raw)


def _signed(raw: Any, key: str) -> float | None:
    if raw is None:
        return None
    if type(raw) not in (int, float) or not finite(raw):
        raise SnapshotError(f"{key}: must be a finite number or null, got {short_repr(raw)}")
    return float(raw)


def _optional_number(raw: Any, key: str) -> float | None:
    return None if raw is None else _number(raw, key)


def _window(raw: Any, key: str) -> str:
    if type(raw) is not str or raw.strip("01"):
        raise SnapshotError(f"{key}: must be a str of 0s and 1s, got {short_repr(raw)}")
    return raw


def _ids(raw: Any, key: str) -> tuple[str, ...]:
    if type(raw) is not list or not all(type(i) is str and i for i in raw):
        raise SnapshotError(f"{key}: must be a list of call ids, got {short_repr(raw)}")
    return tuple(raw)


def _by_step(
    raw: Any, key: str, what: str, read: Callable[[Any, str], Any]
) -> list[tuple[int, Any]] | None:
    """The ``[step, what]`` entries of ``raw`` (``None`` for none), each read by ``read``."""
    if type(raw) is not list:
        raise SnapshotError(f"{key}: must be list, got {_type_name(raw)}")
    entries: list[tuple[int, Any]] = []
    for i, entry in enumerate(raw):
        if type(entry) is not list or len(entry) != 2:
            raise SnapshotError(f"{key}[{i}]: must be [step, {what}], got {short_repr(entry)}")
        entries.append((_count(entry[0], f"{key}[{i}][0]"), read(entry[1], f"{key}[{i}][1]")))
    return entries or None


def _decode_costs(raw: Any, key: str) -> list[tuple[int, float]] | None:
    return _by_step(raw, key, "cost", _number)


COUNT = Kind("count", _same, _count)
SEED = Kind("seed", _same, _seed)
OPTIONAL_COUNT = Kind("optional count", _same, _optional_count)
MODEL_INDEX = Kind("model index", _same, _model_index)
FLAG = Kind("flag", _same, _flag)
TEXT = Kind("text", _same, _text)
NUMBER = Kind("number", _same, _number)
STATE = Kind("state", _same, _state_name)
SESSION_STATUS = Kind("session status", lambda v: None if v is None else v.value, _session_status)
OPAQUE = Kind("host data", _same, _opaque)
"""The host's own data (requests, replies): JSON data, never interpreted."""
CALLS = Kind("tool calls", encode, _values_of(ToolCall))
FALLBACKS = Kind("fallbacks", encode, _values_of(Fallback, lambda v: _fallbacks(v)))  # noqa: PLW0108 - defined below


def _optional_dict(name: str, decode: Callable[[Any, str], Any]) -> Kind:
    """A dict kept as ``None`` while empty: written as ``{}``, copied when set."""
    return Kind(name, lambda v: dict(v or {}), decode, lambda v: None if v is None else dict(v))


CRASH_COUNTS = _optional_dict("crash counts", _crash_counts)
PROVIDERS = Kind("providers", sorted, _providers)
CLOCK = Kind("clock reading", _same, _number, relative=True)
OPTIONAL_CLOCK = Kind("optional clock reading", _same, _optional_number, relative=True)
SIGNED = Kind("signed number", _same, _signed)
CHILD_COSTS = _optional_dict("child costs", _dict_of("session id: spend", "session ids", _number))
WINDOW = Kind("window", _same, _window)
"""The last outcomes of a sliding window, oldest first: ``1`` counted, ``0`` not."""
WINDOWS = _optional_dict("windows", _dict_of("provider: window", "provider names", _window))
OUTCOMES = Kind("tool outcomes", encode, _values_of(ToolOutcome))
IDS = Kind("call ids", list, _ids)


def _copy_list(value: list[Any] | None) -> list[Any] | None:
    return None if value is None else list(value)


COSTS = Kind("costs", lambda v: [list(e) for e in v or ()], _decode_costs, _copy_list)

UNKNOWN_TIME = math.nan
"""A step time a snapshot did not record (format 3): written ``null``."""


def _new_times() -> array[float]:
    return _NO_TIMES[:]  # a copy of an empty array: array("d") parses its arguments


_NO_TIMES: array[float] = array("d")


def _encode_times(times: array[float]) -> list[float | None]:
    return [None if math.isnan(t) else t for t in times]


def _decode_times(raw: Any, key: str) -> array[float]:
    if type(raw) is not list:
        raise SnapshotError(f"{key}: must be list, got {_type_name(raw)}")
    return array(
        "d",
        (UNKNOWN_TIME if t is None else _number(t, f"{key}[{i}]") for i, t in enumerate(raw)),
    )


def _not_read(_raw: Any, key: str) -> Any:  # pragma: no cover - never in a snapshot
    raise SnapshotError(f"{key}: not a snapshot field")


IN_PROCESS = Kind("kept in process", _same, _not_read, list, stored=False)
"""A list kept in this process only: no snapshot holds it."""
IN_PROCESS_TIME = Kind("time kept in process", _same, _not_read, stored=False)
"""A time kept in this process only (:data:`UNKNOWN_TIME` once restored)."""


def _usage(raw: Any, key: str) -> Usage:
    usage = _decoded(raw, key)
    if type(usage) is not Usage:
        raise SnapshotError(f"{key}: must be a Usage, got {short_repr(usage)}")
    return usage


def _decode_usages(raw: Any, key: str) -> list[tuple[int, Usage]] | None:
    return _by_step(raw, key, "usage", _usage)


USAGES = Kind(
    "usages",
    lambda v: [[step, compact(usage)] for step, usage in v or ()],
    _decode_usages,
    _copy_list,
)
TIMES = Kind("step times", _encode_times, _decode_times, lambda v: v[:])
"""Seconds since the session's start, as an array of floats (8 bytes a step)."""


def _encode_path(path: list[Step]) -> list[list[Any]]:
    return [[*step[0][:4], *step[1:]] for step in path]


def _decode_path(raw: Any, key: str) -> list[Step]:
    if type(raw) is not list:
        raise SnapshotError(f"{key}: must be list, got {_type_name(raw)}")
    path: list[Step] = []
    infos = ROW_INFOS
    for i, entry in enumerate(raw):
        if type(entry) is not list or len(entry) != 7:
            raise SnapshotError(
                f"{key}[{i}]: must be [source, event, guard, dest, attempt, "
                f"reductions, session_retries], got {short_repr(entry)}"
            )
        source, trigger, guard, dest, *counters = entry
        info = None
        if type(source) is type(trigger) is type(guard) is type(dest) is str:
            info = infos.get((source, trigger, guard, dest))
        if info is None:
            raise SnapshotError(
                f"{key}[{i}]: {short_repr(entry[:4])} is not a transition of this engine's table"
            )
        for j, counter in enumerate(counters):
            if type(counter) is not int or not 0 <= counter <= MAX_COUNT:
                _count(counter, f"{key}[{i}][{4 + j}]")  # raises, naming the counter
        path.append(make_step(info, *counters))
    return path


def _decode_actions(raw: Any, key: str) -> list[Action]:
    if type(raw) is not list:
        raise SnapshotError(f"{key}: must be list, got {_type_name(raw)}")
    actions = _decoded(raw, key)
    for i, action in enumerate(actions):
        if type(action) not in ACTION_TYPES:
            raise SnapshotError(f"{key}[{i}]: not an action: {short_repr(action)}")
        problem = _action_problem(action)
        if problem is not None:
            raise SnapshotError(f"{key}[{i}]: {type(action).__name__}.{problem}")
    return list(actions)


def _is_count(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_COUNT


def _is_seconds(value: object, optional: bool = False) -> bool:
    if value is None:
        return optional
    if type(value) not in (int, float):
        return False
    seconds: float = value  # type: ignore[assignment]
    return finite(seconds) and seconds >= 0


def _is_text(value: object) -> bool:
    return value is None or (type(value) is str and json_problem(value) is None)


def _is_data(value: object) -> bool:
    return json_problem(value) is None


def _all(values: object, kind: type) -> bool:
    return type(values) is tuple and all(type(v) is kind for v in values)


def _results(values: object) -> bool:
    return _all(values, ToolResult) and all(
        type(r.call_id) is str
        and type(r.is_error) is bool
        and type(r.retryable) is bool
        and _is_data(r.content)
        and _is_data(r.details)
        for r in values  # type: ignore[attr-defined]
    )


def _fallbacks(values: object) -> bool:
    return _all(values, Fallback) and all(
        _is_text(f.from_model) and type(f.to_model) is str and type(f.error) is ModelError
        for f in values  # type: ignore[attr-defined]
    )


_FIELD_CHECKS: dict[type, tuple[tuple[str, Callable[[Any], bool]], ...]] = {
    Assemble: (
        ("reduce", lambda v: type(v) is bool),
        ("withhold_tools", lambda v: type(v) is bool),
        ("instruction", _is_text),
    ),
    CallModel: (
        ("request", _is_data),
        ("attempt", _is_count),
        ("model", _is_text),
        ("withhold_tools", lambda v: type(v) is bool),
    ),
    Wait: (
        ("seconds", _is_seconds),
        ("attempt", _is_count),
        ("retry_after", lambda v: _is_seconds(v, optional=True)),
    ),
    InvokeTools: (("calls", lambda v: _all(v, ToolCall) and len(v) > 0),),
    Finish: (
        ("status", lambda v: type(v) is TurnStatus),
        ("tool_results", _results),
        ("error", lambda v: v is None or type(v) is ModelError),
        ("model", _is_text),
        ("fallbacks", _fallbacks),
        ("retry_at", lambda v: v is None or (type(v) in (int, float) and finite(v))),
        ("reply", _is_data),
        ("done", lambda v: type(v) is bool),
    ),
}
"""What a decoded action's fields must hold (the codec runs no validators)."""


def _action_problem(action: Action) -> str | None:
    for name, valid in _FIELD_CHECKS[type(action)]:
        if not valid(getattr(action, name)):
            return f"{name}: {short_repr(getattr(action, name))} is not what the engine writes"
    return None


PATH = Kind("path", _encode_path, _decode_path, list)
ACTIONS = Kind("actions", encode, _decode_actions, list)
"""The turn's actions, a Finish's ``retry_at`` written relative to the snapshot's
moment (:func:`encode_action`) like every reading of the clock."""


def encode_action(action: Action, now: float) -> Any:
    """``action`` as a snapshot writes it at ``now``."""
    data = encode(action)
    if type(action) is Finish and action.retry_at is not None:
        data["retry_at"] = action.retry_at - now
    return data


def action_at(action: Action, now: float, where: str) -> Action:
    """``action`` as a snapshot read at ``now`` holds it (the inverse of
    :func:`encode_action`): :class:`SnapshotError` naming ``where`` if its moment is
    beyond a float."""
    if type(action) is Finish and action.retry_at is not None:
        retry_at = action.retry_at + now
        if not math.isfinite(retry_at):
            raise SnapshotError(
                f"{where}: a Finish's retry_at {action.retry_at!r:.40} s after the snapshot "
                f"was taken is beyond a float on a clock reading {now!r:.40}"
            )
        return attrs.evolve(action, retry_at=retry_at)
    return action


ACTION_TYPES: tuple[type, ...] = get_args(Action)

# -- the trace's rows and steps -------------------------------------------------------

RowInfo = tuple[str, str, str, str, str]
"""(source, trigger, guard label, dest, effect) of one table row, shared by every
trace that passes through it."""

Step = tuple[RowInfo, int, int, int]
"""A transition taken: its row and the counters after it, in the order of
:data:`TRACED` (attempt, reductions, session retries)."""


def _row_infos() -> dict[tuple[str, str, str, str], RowInfo]:
    infos: dict[tuple[str, str, str, str], RowInfo] = {}
    for row in ROWS:
        infos.setdefault(row.key, row.info)
    return infos


ROW_INFOS = _row_infos()
"""Every row of the table by (source, trigger, guard label, dest)."""

_STEPS: dict[Step, Step] = {}
_MAX_INTERNED = 1 << 16


def make_step(info: RowInfo, *counters: int) -> Step:
    """The step for ``info`` with these counters (in :data:`TRACED` order), shared by
    every trace that has it, up to a bounded number of distinct steps."""
    step: Step = (info, *counters)  # type: ignore[assignment]
    shared = _STEPS.get(step)
    if shared is not None:
        return shared
    if len(_STEPS) < _MAX_INTERNED:
        _STEPS[step] = step
    return step


# -- the declaration -----------------------------------------------------------------


def declared(
    kind: Kind,
    default: Any = attrs.NOTHING,
    *,
    factory: Callable[[], Any] | None = None,
    key: str = "exact",
    trace: str | None = None,
    snapshot_key: str | None = None,
    since: int = 1,
) -> Any:
    """Declare one field of the state.

    ``key``: how the model checker's state key sees it: ``"exact"``, ``"omit"`` or
    ``"cap:<setting>"`` (a counter bounded by that setting). ``trace``: the
    :class:`TraceRecord` field that carries it; ``snapshot_key``: its key, when not the
    field's name; ``since``: the snapshot format that added it (older ones read its
    default).
    """
    metadata = {
        "kind": kind,
        "key": key,
        "trace": trace,
        "snapshot_key": snapshot_key,
        "since": since,
    }
    if factory is not None:
        return attrs.field(factory=factory, metadata=metadata)
    return attrs.field(default=default, metadata=metadata)


@attrs.define(slots=True, eq=False, repr=False)
class TurnState:
    """The state of one turn: where it is, its counters, its request and its history."""

    index: int = declared(COUNT, key="omit")
    """This turn's number in its session, from 1."""
    final_answer: bool = declared(FLAG, False)
    """Whether this is the final-answer turn of the limit-reached path."""
    instruction: str | None = declared(TEXT, None, key="omit")
    """The synthetic final-answer instruction (final-answer turn only)."""
    state: str = declared(STATE, IDLE)
    attempt: int = declared(COUNT, 0, key="cap:max_retries", trace="attempt")
    """The current call's attempt number (0 for a first try)."""
    reductions: int = declared(COUNT, 0, key="cap:max_context_reductions", trace="reductions")
    model_index: int = declared(MODEL_INDEX, -1)
    """-1 for ``Settings.model``, else the index into ``fallback_models``."""
    request: Any = declared(OPAQUE, None, key="omit")
    size: int = declared(COUNT, 0, key="omit")
    overflowed_size: int | None = declared(OPTIONAL_COUNT, None, key="omit")
    overflowed_request: Any = declared(OPAQUE, None, key="omit")
    calls: tuple[ToolCall, ...] = declared(CALLS, (), key="providers")
    """The tool calls of the reply being handled."""
    reply_data: Any = declared(OPAQUE, None, key="omit", snapshot_key="reply")
    """The JSON form of the reply being handled (its event holds the host's object)."""
    fallbacks: tuple[Fallback, ...] = declared(FALLBACKS, (), key="omit")
    path: list[Step] = declared(PATH, factory=list, key="omit")
    """The row and counters of every transition taken, in order."""
    actions: list[Action] = declared(ACTIONS, factory=list, key="omit")
    """The action of every transition taken, in order."""
    in_flight: tuple[ToolCall, ...] = declared(CALLS, (), key="providers", since=3)
    """The calls of the last ``InvokeTools`` (all of ``calls``, or one re-invoked)."""
    outcomes: tuple[ToolOutcome, ...] = declared(OUTCOMES, (), key="omit", since=3)
    """The latest outcome of every call that has one, in the order they came."""
    pending: tuple[str, ...] = declared(IDS, (), since=3)
    """Calls that conflicted (``concurrency_conflict``) and wait to be re-invoked, in
    order: the first is re-invoked next, alone."""
    conflict_attempt: int = declared(COUNT, 0, key="cap:max_conflict_retries", since=3)
    """How often the first pending call has been re-invoked (or is about to be)."""
    costs: list[tuple[int, float]] | None = declared(COSTS, None, key="omit", since=3)
    """(step, cost) of every event of this turn that carried a cost (``None``: none)."""
    times: array[float] = declared(TIMES, factory=_new_times, key="omit", since=4)
    """When each transition was taken, in seconds since the session started."""
    events: list[Any] = declared(IN_PROCESS, factory=list, key="omit")
    """The event of each transition taken in this process (``None`` for a start;
    ``(event, wall)`` for a step given a wall time): the last ``len(events)`` steps'."""
    usages: list[tuple[int, Usage]] | None = declared(USAGES, None, key="omit", since=5)
    """(step, usage) of every model call's outcome of this turn that reported one."""
    made: float = declared(IN_PROCESS_TIME, UNKNOWN_TIME, key="omit")
    """When the turn was made (``new_turn``), in seconds since the session started
    (:data:`UNKNOWN_TIME` once restored)."""

    @property
    def status(self) -> TurnStatus | None:
        """The status of the :class:`Finish` the turn ended with, if it has."""
        actions = self.actions
        action = actions[-1] if actions else None
        return action.status if type(action) is Finish else None


TURN = Kind(
    "turn", _same, lambda raw, _key: raw, lambda t: None if t is None else copy_turn_state(t)
)
"""The current turn: a nested :class:`TurnState` (encoded field by field)."""


@attrs.define(slots=True, eq=False, repr=False)
class SessionState:
    """Everything a session carries from one event to the next."""

    seed: int = declared(SEED, 0, key="omit")
    """The jitter seed, a 64-bit unsigned int."""
    draws: int = declared(COUNT, 0, key="omit")
    """How many jitter draws the session has consumed."""
    retries: int = declared(COUNT, 0, key="cap:session_retry_ceiling", trace="session_retries")
    """Retries (waits and fallbacks) taken across the session."""
    turns: int = declared(COUNT, 0, key="cap:max_turns")
    """How many turns have been created, the final-answer turn included."""
    cost_usd: float = declared(NUMBER, 0.0, key="omit")
    waited_s: float = declared(NUMBER, 0.0, key="omit")
    """Seconds of backoff the session's ``Wait`` actions asked for, summed."""
    started: float = declared(CLOCK, 0.0, key="omit", snapshot_key="elapsed_s")
    """The session's clock when it started (a snapshot holds the seconds since)."""
    breakers: dict[str, int] | None = declared(CRASH_COUNTS, None)
    """Consecutive crashes per provider, where not zero (``ToolOutcome.crashed``)."""
    tripped: frozenset[str] = declared(PROVIDERS, frozenset())
    doom_last: str | None = declared(TEXT, None, key="omit")
    """The fingerprint of the last tool call, for the doom-loop detector."""
    doom_run: int = declared(COUNT, 0, key="omit")
    """How many identical calls in a row end with ``doom_last``."""
    limit: SessionStatus | None = declared(SESSION_STATUS, None)
    status: SessionStatus | None = declared(SESSION_STATUS, None)
    session_id: str | None = declared(TEXT, None, key="omit", since=3)
    """The session's id in its tree (``None``: a root nobody named)."""
    parent_id: str | None = declared(TEXT, None, key="omit", since=3)
    """The parent's ``session_id`` for a child session (``Session.spawn``)."""
    children: int = declared(COUNT, 0, key="omit", since=3)
    """How many children this session has spawned (their ids count up)."""
    child_costs: dict[str, float] | None = declared(CHILD_COSTS, None, key="omit", since=3)
    """Each child's total spend, as last reported (``cost_usd`` includes their sum)."""
    ancestor_budget_usd: float | None = declared(SIGNED, None, key="omit", since=3)
    """The ancestors' smallest remaining budget as last known, when ``cost_usd`` was
    ``ancestor_mark_usd`` (``None``: no ancestor has one)."""
    ancestor_mark_usd: float = declared(NUMBER, 0.0, key="omit", since=3)
    tool_retries: int = declared(COUNT, 0, key="omit", since=3)
    """Re-invocations of conflicting tool calls across the session."""
    denials: int = declared(COUNT, 0, key="cap:denial_threshold", since=3)
    """Consecutive ``permission_denied`` outcomes."""
    denial_log: str = declared(WINDOW, "", since=3)
    """The last ``denial_window`` outcomes (``1``: denied), when the window is set."""
    crash_logs: dict[str, str] | None = declared(WINDOWS, None, since=3)
    """Per provider, its last ``breaker_window`` rounds (``1``: it crashed)."""
    doom_window: tuple[ToolCall, ...] = declared(CALLS, (), key="omit", since=3)
    """The last ``doom_check_window`` tool calls (kept when a second-tier check is set)."""
    doom_since: int = declared(COUNT, 0, key="omit", since=3)
    """Tool calls since the second-tier check was last consulted."""
    idle_s: float = declared(NUMBER, 0.0, key="omit", since=3)
    """Seconds between a turn's Finish and the next start(), summed."""
    finished_at: float | None = declared(OPTIONAL_CLOCK, None, key="omit", since=3)
    """The clock when the last turn finished, while no turn runs."""
    turn: TurnState | None = declared(TURN, None, key="nested")
    """The current turn (the latest one created)."""


# -- what follows from the declaration --------------------------------------------------

_Plan = tuple[tuple[str, str, Kind], ...]


def stored_fields(cls: type) -> tuple[attrs.Attribute, ...]:  # type: ignore[type-arg]
    """The declared fields of ``cls`` a snapshot holds."""
    return tuple(f for f in attrs.fields(cls) if f.metadata["kind"].stored)


def _plan(cls: type) -> _Plan:
    return tuple(
        (f.name, f.metadata["snapshot_key"] or f.name, f.metadata["kind"])
        for f in stored_fields(cls)
    )


_PLANS: dict[type, _Plan] = {cls: _plan(cls) for cls in (TurnState, SessionState)}

TRACED: tuple[tuple[type, str, str], ...] = tuple(
    (cls, f.name, f.metadata["trace"])
    for cls in (TurnState, SessionState)
    for f in attrs.fields(cls)
    if f.metadata["trace"]
)
"""(state class, field, TraceRecord field) of every counter a trace record carries,
in the order a :data:`Step` holds them."""


def encode_state(state: TurnState | SessionState, now: float) -> dict[str, Any]:
    """The state as plain JSON data, one key per declared field, clock readings
    written relative to ``now``."""
    out: dict[str, Any] = {}
    for name, key, kind in _PLANS[type(state)]:
        value = getattr(state, name)
        if kind.relative:
            out[key] = None if value is None else now - value
        elif kind is ACTIONS:
            out[key] = [encode_action(action, now) for action in value]
        elif kind is TURN:
            out[key] = None if value is None else encode_state(value, now)
        else:
            out[key] = kind.encode(value)
    return out


def decode_state(cls: type[Any], raw: Any, now: float, prefix: str = "") -> Any:
    """The ``cls`` state :func:`encode_state` wrote into ``raw``, every field checked by
    its kind: :class:`SnapshotError` names the first key missing, unknown or wrong."""
    if type(raw) is not dict:
        raise SnapshotError(
            f"{prefix.rstrip('.') or 'snapshot'}: must be a JSON object, got {_type_name(raw)}"
        )
    plan = _PLANS[cls]
    values = {}
    for name, key, kind in plan:
        if key not in raw:
            raise SnapshotError(f"{prefix}{key}: missing")
        if kind is TURN:
            item = raw[key]
            values[name] = None if item is None else decode_state(TurnState, item, now, "turn.")
            continue
        value = kind.decode(raw[key], prefix + key)
        if kind is ACTIONS:
            value = [action_at(action, now, prefix + key) for action in value]
        values[name] = now - value if kind.relative and value is not None else value
    if len(raw) != len(plan):
        known = {key for _, key, _ in plan}
        extra = sorted(str(k) for k in raw if k not in known)
        raise SnapshotError(f"{prefix}{extra[0]}: not a field of the {cls.__name__}")
    return cls(**values)


def _copier(cls: type) -> Callable[[Any], Any]:
    """Straight-line field copies (the model checker's hottest path): mutable kinds
    copied by their ``copy``, the rest shared."""
    return build_copy(cls, tuple((f.name, f.metadata["kind"].copy) for f in attrs.fields(cls)))


copy_turn_state: Callable[[TurnState], TurnState] = _copier(TurnState)
"""An independent copy of a turn's state."""
copy_session_state: Callable[[SessionState], SessionState] = _copier(SessionState)
"""An independent copy of a session's state, its current turn's included."""


def shift_fits(state: SessionState, delta: float) -> bool:
    """Whether every reading :func:`shift_state` moves stays a float, moved by
    ``delta``."""
    turn = state.turn
    readings = [state.started, state.finished_at or 0.0]
    if turn is not None:
        readings += [a.retry_at for a in turn.actions if type(a) is Finish and a.retry_at]
    return all(math.isfinite(reading + delta) for reading in readings)


def shift_state(state: SessionState, delta: float) -> None:
    """Move every reading of the session's clock ``state`` holds by ``delta`` seconds:
    its start, its last finish and its Finish actions' ``retry_at`` (the trace's times
    are seconds since the start: they stay)."""
    if not delta:
        return
    state.started += delta
    if state.finished_at is not None:
        state.finished_at += delta
    turn = state.turn
    if turn is None:
        return
    actions = turn.actions
    for i, action in enumerate(actions):
        if type(action) is Finish and action.retry_at is not None:
            actions[i] = attrs.evolve(action, retry_at=action.retry_at + delta)


class RowSteps(dict[tuple[int, int, int], Step]):
    """The steps through one row met so far, by their counters, shared by every trace
    through the row (made when first looked up, kept up to a bound)."""

    __slots__ = ("info",)

    _LIMIT = 4096

    def __init__(self, info: RowInfo) -> None:
        super().__init__()
        self.info = info

    def __missing__(self, counters: tuple[int, int, int]) -> Step:
        step: Step = (self.info, *counters)
        if len(self) < self._LIMIT:
            self[counters] = step
        return step


def traced_counters(turn: TurnState, session: SessionState) -> tuple[int, int, int]:
    """The counters of :data:`TRACED`, as they stand."""
    return (turn.attempt, turn.reductions, session.retries)


if tuple((cls.__name__, name, trace) for cls, name, trace in TRACED) != (  # pragma: no cover
    ("TurnState", "attempt", "attempt"),
    ("TurnState", "reductions", "reductions"),
    ("SessionState", "retries", "session_retries"),
):
    raise ImportError("traced_counters and trace_record read the traced counters by name")


def declared_defaults(cls: type) -> dict[str, Any]:
    """The snapshot value of every declared field that has a default (for formats that
    predate a field)."""
    out: dict[str, Any] = {}
    for f in stored_fields(cls):
        if f.default is not attrs.NOTHING and not isinstance(f.default, attrs.Factory):  # type: ignore[arg-type]
            kind: Kind = f.metadata["kind"]
            if kind is not TURN and not kind.relative:
                out[f.metadata["snapshot_key"] or f.name] = kind.encode(f.default)
    return out


def defaults_since(cls: type, version: int) -> dict[str, Any]:
    """The snapshot value of every field added after format ``version`` (what a
    snapshot of that version means by leaving it out)."""
    out: dict[str, Any] = {}
    for f in stored_fields(cls):
        if f.metadata["since"] > version:
            kind: Kind = f.metadata["kind"]
            default = f.default.factory() if isinstance(f.default, attrs.Factory) else f.default  # type: ignore[arg-type,union-attr]
            # written as the engine writes it: an empty optional dict is {}, not null
            out[f.metadata["snapshot_key"] or f.name] = kind.encode(default)
    return out


def key_fields(cls: type) -> tuple[tuple[str, str], ...]:
    """(field, key mode) of every field the model checker's state key reads."""
    return tuple(
        (f.name, f.metadata["key"]) for f in attrs.fields(cls) if f.metadata["key"] != "omit"
    )
