"""The snapshot format: a session's declared state as plain JSON data.

Version 5 (written now) is the declaration of ``_state.py``, field by field (the
fields a snapshot stores: a turn's events and the host's reply object stay in the
process; the reply's JSON form is its ``reply``)::

    {"format": "statemachine.session", "version": 5, "settings": {...},
     "seed": 7, "draws": 1, "retries": 1, "turns": 1, "cost_usd": 0.0,
     "elapsed_s": 0.5, "breakers": {}, "tripped": [], "doom_last": null,
     "doom_run": 0, "limit": null, "status": null,
     "turn": {"index": 1, "final_answer": false, "instruction": null,
              "state": "backing_off", "attempt": 0, "reductions": 0,
              "model_index": -1, "request": ..., "size": 900,
              "overflowed_size": null, "overflowed_request": null, "calls": [],
              "reply": null, "fallbacks": [],
              "path": [[source, event, guard, dest, attempt, reductions,
                        session_retries], ...],
              "actions": [{"$type": "Assemble", ...}, ...],
              "times": [0.0, 0.5, ...],
              "usages": [[step, {"$type": "Usage", "input_tokens": 900, ...}], ...], ...}}

Versions 1 to 4 are still read, each brought up to the next (``_from_version_*``).

:func:`read_snapshot` refuses anything the engine could not have written: each field is
checked by its kind, then the whole state by ``reachable_problem``; every refusal is a
:class:`SnapshotError` naming the key. Both ways run as code generated at import from
the declaration (``_reader``, ``_writer``); :func:`read_snapshot_by_fields` is what the
reader must equal.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ._actions import Assemble, CallModel, Finish, Wait, make_call_model, make_wait
from ._builder import build_state_reader, build_state_writer
from ._codec import checked_decoder, encode
from ._exceptions import ConfigError, SnapshotError
from ._json_data import MAX_COUNT, finite, json_problem, plain_json, short_repr
from ._reachable import COUNTER_DELTAS, check_reachable
from ._settings import Settings
from ._state import (
    _FIELD_CHECKS,
    ACTIONS,
    CLOCK,
    COUNT,
    FLAG,
    MODEL_INDEX,
    NUMBER,
    OPAQUE,
    OPTIONAL_CLOCK,
    OPTIONAL_COUNT,
    PATH,
    ROW_INFOS,
    SEED,
    SESSION_STATUS,
    SIGNED,
    STATE,
    TEXT,
    TIMES,
    TURN,
    WINDOW,
    Kind,
    SessionState,
    Step,
    TurnState,
    _is_data,
    _same,
    action_at,
    declared_defaults,
    decode_state,
    defaults_since,
    encode_action,
    make_step,
    stored_fields,
)
from ._table import STATES
from ._taxonomy import SessionStatus

SNAPSHOT_FORMAT = "statemachine.session"
SNAPSHOT_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)


_CACHE_SIZE = 256
_SETTINGS_DATA: dict[int, tuple[Settings, dict[str, Any]]] = {}
"""``Settings.to_dict`` of the settings snapshots wrote lately, by identity: a store
snapshots the same few settings over and over (Settings are immutable)."""


def _settings_data(settings: Settings) -> dict[str, Any]:
    cached = _SETTINGS_DATA.get(id(settings))
    if cached is None or cached[0] is not settings:
        if len(_SETTINGS_DATA) >= _CACHE_SIZE:
            _SETTINGS_DATA.clear()
        cached = _SETTINGS_DATA[id(settings)] = (settings, settings.to_dict())
    data = dict(cached[1])
    data["fallback_models"] = list(settings.fallback_models)
    return data


def write_snapshot(settings: Settings, state: SessionState, now: float) -> dict[str, Any]:
    """The snapshot of ``state`` under ``settings``, the session's clock reading ``now``:
    ``{"format", "version", "settings", **encode_state(state, now)}``, written by the
    code generated below."""
    return _write_session(settings, state, now)


def read_snapshot(data: object, now: float) -> tuple[Settings, SessionState]:
    """The settings and state in ``data``; :class:`SnapshotError` if it is not a snapshot
    this engine could have written."""
    return _read(data, now, _settings_seen, _read_session_state)


def read_snapshot_by_fields(data: object, now: float) -> tuple[Settings, SessionState]:
    """:func:`read_snapshot` as it is specified: the settings checked and built anew,
    every field read by its kind's own decoder (``decode_state``). The generated reader
    must give the same settings, state or refusal (the tests compare the two, on valid
    and forged snapshots)."""
    return _read(
        data, now, _settings_read, lambda raw, now, _: decode_state(SessionState, raw, now)
    )


def _read(
    data: object,
    now: float,
    settings_of: Callable[[Any], Settings],
    read_state: Callable[[Any, float, set[int]], SessionState],
) -> tuple[Settings, SessionState]:
    if type(data) is not dict and not isinstance(data, Mapping):
        hint = (
            " (the snapshot's text: parse it first, Session.restore(json.loads(text)))"
            if isinstance(data, str | bytes | bytearray)
            else ""
        )
        raise SnapshotError(f"snapshot: must be a JSON object, got {type(data).__name__}{hint}")
    if data.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotError(
            f"format: not a statemachine session snapshot: {short_repr(data.get('format'))}"
        )
    version = data.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise SnapshotError(
            f"version: {short_repr(version)} is not supported (this engine reads "
            f"{', '.join(map(str, READABLE_VERSIONS))})"
        )
    body = dict(data)
    v1_status: object = None
    if version == 1:
        body, v1_status = _from_version_1(body)
    del body["format"], body["version"]
    if version < 3:
        _from_version_2(body)
    if version < 4:
        _from_version_3(body)
    if version < 5:
        _from_version_4(body, now)
    if "settings" not in body:
        raise SnapshotError("settings: missing")
    try:
        settings = settings_of(body.pop("settings"))
        state = read_state(body, now, set())
    except RecursionError:  # pragma: no cover - every value's depth is checked first
        raise SnapshotError("snapshot: nested too deep to read") from None
    check_reachable(state, settings)
    if version == 1 and state.turn is not None:
        status = state.turn.status
        if v1_status != (status.value if status else None):
            raise SnapshotError(f"turn.status: {short_repr(v1_status)} is not where its trace ends")
    return settings, state


def _settings_read(raw: Any) -> Settings:
    """The settings ``raw`` (a snapshot's ``settings``) holds, checked."""
    if type(raw) is not dict:
        raise SnapshotError("settings: must be a JSON object")
    problem = json_problem(raw, strict=True)
    if problem is not None:
        raise SnapshotError(f"settings: must be JSON data: {problem}")
    try:
        return Settings.from_dict(raw)
    except ConfigError as exc:
        raise SnapshotError(f"settings: {exc}") from None
    except (TypeError, ValueError, OverflowError) as exc:  # pragma: no cover - defensive
        raise SnapshotError(f"settings: {exc}") from None


_SEEN_SIZE = 8
_SEEN: list[tuple[dict[str, Any], list[str], list[type], list[str], Settings]] = []
"""The settings read lately, newest first, each with the dict it was read from (a copy),
its keys and its values' types in order, and the keys whose values are lists."""


def _settings_seen(raw: Any) -> Settings:
    """:func:`_settings_read`, without checking and building again the settings of a dict
    read lately (a store restores the snapshots of a few configurations over and over)."""
    settings = _recent_settings(raw)
    if settings is None:
        settings = _settings_read(raw)
        _remember_settings(raw, settings)
    return settings


def _recent_settings(raw: Any) -> Settings | None:
    """The settings of a dict read lately that ``raw`` equals: the same keys in the same
    order, values of the same exact types (compared first, so no host code runs in the
    comparison), equal."""
    if type(raw) is not dict or set(map(type, raw)) != _STR_ONLY:
        return None
    types = list(map(type, raw.values()))
    for known, keys, known_types, lists, settings in _SEEN:
        if (
            types == known_types
            and list(raw) == keys  # before the list-valued keys are read from raw
            and all(set(map(type, raw[key])) <= _STR_ONLY for key in lists)
            and raw == known
        ):
            return settings
    return None


def _remember_settings(raw: dict[str, Any], settings: Settings) -> None:
    """Keep ``settings``, read from ``raw``, for :func:`_recent_settings`: when its values
    are scalars or lists of str, none of them a float zero (``0.0 == -0.0``, which the
    settings keep apart: those are read anew every time)."""
    values = raw.values()
    if not all(
        type(v) in _SCALARS or (type(v) is list and set(map(type, v)) <= _STR_ONLY) for v in values
    ) or any(type(v) is float and v == 0.0 for v in values):
        return
    if len(_SEEN) >= _SEEN_SIZE:
        _SEEN.pop()
    lists = [key for key, value in raw.items() if type(value) is list]
    known = {key: list(value) if key in lists else value for key, value in raw.items()}
    _SEEN.insert(0, (known, list(raw), list(map(type, values)), lists, settings))


_STR_ONLY = {str}
_SCALARS = frozenset({str, int, float, bool, type(None)})


# -- the generated reader and writer ------------------------------------------------------
#
# One function per state class, generated from its declaration: the reader takes every
# field in order, accepts at once a value its kind's fast test (below) passes, and hands
# any other to the kind's own decoder, which reads it or refuses it naming the key; the
# writer is one dict display. ``read_snapshot_by_fields`` is the specification.

_FAST_TESTS: dict[int, str] = {
    id(COUNT): "type({v}) is int and 0 <= {v} <= MAX_COUNT",
    id(SEED): "type({v}) is int and 0 <= {v} < SEED_END",
    id(OPTIONAL_COUNT): "{v} is None or type({v}) is int and 0 <= {v} <= MAX_COUNT",
    id(MODEL_INDEX): "type({v}) is int and -1 <= {v} <= MAX_COUNT",
    id(FLAG): "type({v}) is bool",
    id(TEXT): "{v} is None or type({v}) is str and {v}.isascii()",
    id(NUMBER): "type({v}) is float and 0.0 <= {v} < INF",
    id(CLOCK): "type({v}) is float and 0.0 <= {v} < INF",
    id(OPTIONAL_CLOCK): "{v} is None or type({v}) is float and 0.0 <= {v} < INF",
    id(SIGNED): "{v} is None or type({v}) is float and -INF < {v} < INF",
    id(STATE): "type({v}) is str and {v} in STATES",
    id(WINDOW): "type({v}) is str and not {v}.strip('01')",
    id(OPAQUE): "{v} is None or plain({v}, seen)",
}
"""Per kind, a test of a raw value whose passing means the kind's decoder gives the value
back as it is (the common case: an exact int, float or str in range)."""


def _plain(value: Any, seen: set[int]) -> bool:
    """Whether ``value`` is certainly JSON data (``plain_json``), remembering in ``seen``
    the ids of the values found so (a snapshot taken in this process holds the turn's
    request once more in every ``CallModel``)."""
    if id(value) in seen:
        return True
    if plain_json(value):
        seen.add(id(value))
        return True
    return False


_PATH_TYPES = (str, str, str, str, int, int, int)
_PATH_STEPS: dict[tuple[Any, ...], Step] = {}
_MAX_PATH_STEPS = 1 << 16


def _fast_path(raw: Any) -> list[Step] | None:
    """A turn's path read entry by entry, each a table row and counters met before (or
    new and in range); ``None`` where the kind's decoder must read it."""
    if type(raw) is not list:
        return None
    path = []
    for entry in raw:
        if type(entry) is not list or tuple(map(type, entry)) != _PATH_TYPES:
            return None
        key = tuple(entry)
        step = _PATH_STEPS.get(key)
        if step is None:
            info = ROW_INFOS.get(key[:4])
            if info is None or not all(0 <= counter <= MAX_COUNT for counter in key[4:]):
                return None
            step = make_step(info, *key[4:])
            if len(_PATH_STEPS) < _MAX_PATH_STEPS:
                _PATH_STEPS[key] = step
        path.append(step)
    return path


def _fast_times(raw: Any) -> array[float] | None:
    """A turn's step times, when all are finite floats >= 0 (a sum that overflows goes
    the kind's way too)."""
    if type(raw) is not list or not set(map(type, raw)) <= _FLOAT_ONLY:
        return None
    if raw and not (min(raw) >= 0.0 and sum(raw) < math.inf):
        return None
    return array("d", raw)


_FLOAT_ONLY = {float}

_ACTION_READERS = {
    cls.__name__: checked_decoder(
        cls, _FIELD_CHECKS[cls], data_check=_is_data, plain=_plain, make=make
    )
    for cls, make in ((Assemble, None), (CallModel, make_call_model), (Wait, make_wait))
}
"""The actions of a turn under way, read with their checks (``_FIELD_CHECKS``) at once;
the rest (a Finish, tool calls) go the kind's way."""


def _fast_actions(raw: Any, seen: set[int]) -> list[Any] | None:
    if type(raw) is not list:
        return None
    actions = []
    for item in raw:
        if type(item) is not dict:
            return None
        name = item.get("$type")
        read = _ACTION_READERS.get(name) if type(name) is str else None
        action = None if read is None else read(item, seen)
        if action is None:
            return None
        actions.append(action)
    return actions


def _empty_of(kind: Kind, key: str) -> tuple[str, Any] | None:
    """(``"list"`` or ``"dict"``, what the kind's decoder makes of an empty one) when
    that is immutable: an empty value is then read with no call."""
    for shape, empty in (("list", []), ("dict", {})):
        try:
            value = kind.decode(empty, key)
        except SnapshotError:
            continue
        if value is None or type(value) in (tuple, frozenset):
            return shape, value
    return None


def _reader(cls: type, prefix: str, turn_reader: Any = None) -> Callable[..., Any]:
    """``read(raw, now, seen)``: ``decode_state(cls, raw, now, prefix)``, generated
    (``_builder.build_state_reader``): a restore reads every field of a session and of
    its turn, and a loop over the fields (a call and a name lookup each) reads them at
    about twice the cost."""
    fields = []
    for f in stored_fields(cls):
        kind: Kind = f.metadata["kind"]
        key = f.metadata["snapshot_key"] or f.name
        how: tuple[str, Any]
        if kind is TURN:
            how = ("turn", None)
        elif kind is PATH or kind is TIMES:
            how = ("fast", _fast_path if kind is PATH else _fast_times)
        elif kind is ACTIONS:
            how = ("actions", None)
        elif kind is SESSION_STATUS:
            how = ("status", {status.value: status for status in SessionStatus})
        elif id(kind) in _FAST_TESTS:
            how = ("test", _FAST_TESTS[id(kind)])
        elif (empty := _empty_of(kind, prefix + key)) is not None:
            how = ("empty", empty)
        else:
            how = ("decode", None)
        fields.append((f.name, key, kind.decode, kind.relative, *how))
    helpers = {
        "by_fields": lambda raw, now: decode_state(cls, raw, now, prefix),
        "MAX_COUNT": MAX_COUNT,
        "SEED_END": 1 << 64,
        "INF": math.inf,
        "STATES": frozenset(STATES),
        "plain": _plain,
        "fast_actions": _fast_actions,
        "action_at": action_at,
        "read_turn": turn_reader,
    }
    return build_state_reader(cls, prefix, fields, helpers)


_read_session_state = _reader(SessionState, "", _reader(TurnState, "turn."))


_ENCODED: dict[int, tuple[Any, dict[str, Any]]] = {}
_FLAT_ACTIONS = (Assemble, Wait)
"""Actions whose encoding is a few scalars (none holds the host's data, which the cache
would keep alive)."""


def _encoded_action(action: Any) -> Any:
    """``encode(action)``; an ``Assemble`` or ``Wait`` encoded before (the same object: a
    turn's earlier actions, snapshot after snapshot) as a copy of what it gave then."""
    if type(action) not in _FLAT_ACTIONS:
        return encode(action)
    known = _ENCODED.get(id(action))
    if known is not None and known[0] is action:
        return dict(known[1])
    data = encode(action)
    if len(_ENCODED) >= _CACHE_SIZE * 16:
        _ENCODED.clear()
    _ENCODED[id(action)] = (action, dict(data))
    return data


def _writer(cls: type, turn_writer: Any = None, head: bool = False) -> Callable[..., Any]:
    """``write(state, now)``: ``encode_state(state, now)`` as one dict display, generated
    (``_builder.build_state_writer``: about half the cost of ``encode_state``'s loop;
    with ``head``: ``write(settings, state, now)``, the snapshot's format, version and
    settings first)."""
    fields = []
    for f in stored_fields(cls):
        kind: Kind = f.metadata["kind"]
        key = f.metadata["snapshot_key"] or f.name
        how: tuple[str, Any]
        if kind.relative:
            how = ("relative", None)
        elif kind is TURN:
            how = ("turn", None)
        elif kind is ACTIONS:
            how = ("actions", None)
        elif kind.encode is _same:
            how = ("same", None)
        else:
            default: Any = f.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = default.factory()
            empty = kind.encode(default)
            # an empty default that encodes as an empty list or dict: written with no call
            shape = type(default) if not default and empty in ([], {}) and not empty else None
            how = ("encode", (kind.encode, shape, type(empty)))
        fields.append((f.name, key, *how))
    helpers = {
        "write_turn": turn_writer,
        "settings_data": _settings_data,
        "encode": _encoded_action,
        "encode_action": encode_action,
        "Finish": Finish,
    }
    head_items = (SNAPSHOT_FORMAT, SNAPSHOT_VERSION) if head else None
    return build_state_writer(cls, fields, head_items, helpers)


_write_session: Callable[[Settings, SessionState, float], dict[str, Any]] = _writer(
    SessionState, _writer(TurnState), head=True
)


# -- version 4 --------------------------------------------------------------------------


def _from_version_4(body: dict[str, Any], now: float) -> None:
    """Version 4 kept no usage: its turn's steps reported none. It wrote a Finish's
    ``retry_at`` as the reading of the writer's clock, not as seconds after the
    snapshot's moment: it is read back as that reading, as it was."""
    turn = body.get("turn")
    if type(turn) is dict:
        turn = {**defaults_since(TurnState, 4), **turn}
        actions = turn.get("actions")
        if type(actions) is list:
            turn["actions"] = [_retry_at_from_now(action, now) for action in actions]
        body["turn"] = turn


def _retry_at_from_now(action: Any, now: float) -> Any:
    """A version-4 Finish with its absolute ``retry_at`` made relative to ``now`` (so
    reading it back gives the absolute value again)."""
    if type(action) is dict and action.get("$type") == "Finish":
        retry_at = action.get("retry_at")
        if (
            isinstance(retry_at, int | float)
            and not isinstance(retry_at, bool)
            and finite(retry_at)
        ):
            return {**action, "retry_at": retry_at - now}
    return action


# -- version 3 --------------------------------------------------------------------------


def _from_version_3(body: dict[str, Any]) -> None:
    """Version 3 did not record when each transition was taken: its steps' times are
    unknown (``None``), and every step taken after the restore has one."""
    turn = body.get("turn")
    if type(turn) is dict:
        path = turn.get("path")
        body["turn"] = {**turn, "times": [None] * len(path) if type(path) is list else []}


# -- version 2 --------------------------------------------------------------------------


def _from_version_2(body: dict[str, Any]) -> None:
    """Version 2's layout completed into version 3's: the fields version 3 added
    (sub-sessions, denials, windows, conflicts, idle time, costs) at their defaults;
    a turn invoking tools had all its calls in flight."""
    for key, value in defaults_since(SessionState, 2).items():
        body.setdefault(key, value)
    turn = body.get("turn")
    if type(turn) is dict:
        turn = dict(turn)
        for key, value in defaults_since(TurnState, 2).items():
            turn.setdefault(key, value)
        if turn.get("state") == "invoking_tools":
            turn["in_flight"] = turn.get("calls")
        body["turn"] = turn


# -- version 1 --------------------------------------------------------------------------

_V1_SESSION_KEYS = frozenset(
    {"seed", "draws", "retries", "turns", "cost_usd", "elapsed_s", "breakers", "tripped"}
    | {"limit", "status", "turn"}
)
"""The session keys version 1 had (besides ``doom``): a field declared since then
comes in with its declared default."""


def _from_version_1(body: dict[str, Any]) -> tuple[dict[str, Any], object]:
    """Version 1's layout rewritten as version 2's (values are checked afterwards)."""
    for key, value in declared_defaults(SessionState).items():
        if key not in _V1_SESSION_KEYS:
            body.setdefault(key, value)
    doom = body.pop("doom", None)
    if type(doom) is not dict or set(doom) != {"last", "run"}:
        raise SnapshotError("doom: must be an object with 'last' and 'run'")
    body["doom_last"], body["doom_run"] = doom["last"], doom["run"]
    turn = body.get("turn")
    if turn is None:
        return body, None
    if type(turn) is not dict:
        raise SnapshotError("turn: must be a JSON object")
    turn = dict(turn)
    for key in ("status", "retries_at_start", "trace"):
        if key not in turn:
            raise SnapshotError(f"turn.{key}: missing")
    status = turn.pop("status")
    retries = turn.pop("retries_at_start")
    trace = turn.pop("trace")
    if type(retries) is not int or type(trace) is not list:
        raise SnapshotError("turn.trace: must be a list, from a count of retries_at_start")
    path, actions = [], []
    attempt = reductions = 0
    for i, entry in enumerate(trace):
        if type(entry) is not list or len(entry) != 5:
            raise SnapshotError(f"turn.trace[{i}]: must be a list of 5 items")
        info = ROW_INFOS.get(tuple(entry[:4])) if all(type(x) is str for x in entry[:4]) else None
        if info is None:
            raise SnapshotError(f"turn.trace[{i}]: not a transition of this engine's table")
        moved, reduced, waited = COUNTER_DELTAS.get(info[4], (None, 0, 0))
        if moved is not None:
            attempt = 0 if moved == 0 else attempt + 1
        retries += waited
        reductions += reduced
        path.append([*entry[:4], attempt, reductions, retries])
        actions.append(entry[4])
    turn["path"], turn["actions"] = path, actions
    body["turn"] = turn
    return body, status
