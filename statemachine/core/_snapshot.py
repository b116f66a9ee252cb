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

Version 4 is read with no usage kept. Version 3 is read with its steps' times unknown
(``None``). Version 2 is read with the
fields version 3 added at their defaults. Version 1 (the first release) is read too: it
is rewritten into version 2 (its ``doom`` object split in two, its turn's counters
replayed along its trace from ``retries_at_start``) and then read like any other.

:func:`read_snapshot` refuses anything the engine could not have written: each field is
checked by its kind, then the whole state by ``reachable_problem``. Every refusal is a
:class:`SnapshotError` naming the key, whatever the data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ._exceptions import ConfigError, SnapshotError
from ._json_data import finite, json_problem, short_repr
from ._reachable import COUNTER_DELTAS, check_reachable
from ._settings import Settings
from ._state import (
    ROW_INFOS,
    SessionState,
    TurnState,
    declared_defaults,
    decode_state,
    defaults_since,
    encode_state,
)
from ._state_text import TextCache, encode_state_text, json_text

SNAPSHOT_FORMAT = "statemachine.session"
SNAPSHOT_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)


_CACHE_SIZE = 256
_WRITTEN: dict[tuple[str, int], tuple[Settings, Any]] = {}
_READ: dict[tuple[Any, ...], Settings] = {}
"""Settings written and read by snapshots, by identity and by value: a store restores
and snapshots the same few settings over and over (Settings are immutable)."""


def _written(what: str, settings: Settings, make: Callable[[Settings], Any]) -> Any:
    """``make(settings)``, computed once per settings object (by identity)."""
    cached = _WRITTEN.get((what, id(settings)))
    if cached is None or cached[0] is not settings:
        cached = (settings, make(settings))
        if len(_WRITTEN) >= _CACHE_SIZE:
            _WRITTEN.clear()
        _WRITTEN[(what, id(settings))] = cached
    return cached[1]


def _settings_data(settings: Settings) -> dict[str, Any]:
    data = dict(_written("data", settings, Settings.to_dict))
    data["fallback_models"] = list(settings.fallback_models)
    return data


def _head_text(settings: Settings) -> str:
    """The snapshot's text up to its first state field: format, version, settings."""
    head = json_text(
        {
            "format": SNAPSHOT_FORMAT,
            "version": SNAPSHOT_VERSION,
            "settings": _settings_data(settings),
        }
    )
    return head[:-1] + ","


def _settings_of(raw: dict[str, Any]) -> Settings:
    key = tuple(
        (name, type(value), repr(value) if type(value) is float else value)
        for name, value in sorted(raw.items())
        if type(value) is not list
    ) + tuple((name, tuple(value)) for name, value in sorted(raw.items()) if type(value) is list)
    try:
        settings = _READ.get(key)
    except TypeError:  # an unhashable value (a nested table): read it, don't cache it
        return Settings.from_dict(raw)
    if settings is None:
        settings = Settings.from_dict(raw)
        if len(_READ) >= _CACHE_SIZE:
            _READ.clear()
        _READ[key] = settings
    return settings


def write_snapshot(settings: Settings, state: SessionState, now: float) -> dict[str, Any]:
    """The snapshot of ``state`` under ``settings``, the session's clock reading ``now``."""
    return {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "settings": _settings_data(settings),
        **encode_state(state, now),
    }


def write_snapshot_text(
    settings: Settings, state: SessionState, now: float, old: TextCache, new: TextCache
) -> str:
    """``json_text(write_snapshot(settings, state, now))``, byte for byte, built from what
    an earlier write of the same session left in ``old`` (see ``encode_state_text``):
    a store's write costs what changed, not the whole trace again."""
    head: str = _written("head", settings, _head_text)
    return head + encode_state_text(state, now, old, new)[1:]


def read_snapshot(data: object, now: float) -> tuple[Settings, SessionState]:
    """The settings and state in ``data``; :class:`SnapshotError` if it is not a snapshot
    this engine could have written."""
    try:
        return _read(data, now)
    except RecursionError:  # pragma: no cover - every value's depth is checked first
        raise SnapshotError("snapshot: nested too deep to read") from None


def _read(data: object, now: float) -> tuple[Settings, SessionState]:
    if not isinstance(data, Mapping):
        raise SnapshotError(f"snapshot: must be a JSON object, got {type(data).__name__}")
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
    raw_settings = body.pop("settings")
    if type(raw_settings) is not dict:
        raise SnapshotError("settings: must be a JSON object")
    problem = json_problem(raw_settings, strict=True)
    if problem is not None:
        raise SnapshotError(f"settings: must be JSON data: {problem}")
    try:
        settings = _settings_of(raw_settings)
    except ConfigError as exc:
        raise SnapshotError(f"settings: {exc}") from None
    except (TypeError, ValueError, OverflowError) as exc:  # pragma: no cover - defensive
        raise SnapshotError(f"settings: {exc}") from None
    state: SessionState = decode_state(SessionState, body, now)
    check_reachable(state, settings)
    if version == 1 and state.turn is not None:
        status = state.turn.status
        if v1_status != (status.value if status else None):
            raise SnapshotError(f"turn.status: {short_repr(v1_status)} is not where its trace ends")
    return settings, state


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
