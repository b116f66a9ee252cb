"""The snapshot as text: a state written as the compact JSON text a store record holds.

:func:`encode_state_text` writes a :class:`~._state.SessionState` (or a turn's
:class:`~._state.TurnState`) as ``json_text(encode_state(state, now))``, byte for
byte, reusing the text an earlier write of the same session left in a
:class:`TextCache` (a store's write then costs what changed, not the whole trace
again). The writer of each state class is read from the declaration in ``_state.py``
(each field's kind says how its value is written); this module reads the declaration,
which never reads it.

Here too are the pieces of JSON text every store record is built from:
:func:`json_text`, :func:`number_text`, :func:`number_or_null`.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any

from ._actions import Action, Assemble, Wait
from ._state import (
    ACTIONS,
    COUNT,
    FLAG,
    MODEL_INDEX,
    NUMBER,
    OPTIONAL_COUNT,
    SEED,
    SESSION_STATUS,
    SIGNED,
    STATE,
    TEXT,
    TURN,
    Kind,
    SessionState,
    TurnState,
    _same,
    encode_action,
    stored_fields,
)
from ._taxonomy import SessionStatus


class TextCache:
    """What :func:`encode_state_text` wrote last for one session, to reuse: the text of
    the trace lists' entries so far.

    A cache is never changed once built: each write returns a new one, so two threads
    writing from the same cache cannot corrupt each other's text.
    """

    __slots__ = ("actions", "grown")

    def __init__(self) -> None:
        self.grown: dict[str, tuple[int, int, str]] = {}
        """key -> (turn index, entries, their text joined by commas)"""
        self.actions: tuple[int, list[Action], list[str]] | None = None
        """(turn index, the actions, each action's text) of the last write's trace"""


def _not_json(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_py_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
"""The encoding every store record uses: compact, UTF-8, no NaN."""
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
# json's C encoder, built once (JSONEncoder.encode builds one per call, most of the
# cost of encoding a small value); the same output as _py_dumps.
_c_encode = (
    None
    if _c_make_encoder is None
    # markers None: no circular check (the engine's data is checked acyclic when it comes
    # in), and no dict shared between calls or threads
    else _c_make_encoder(None, _not_json, encode_basestring, None, ":", ",", False, False, False)
)


def _dumps(value: Any) -> str:
    if _c_encode is None:  # pragma: no cover - CPython always has the C encoder
        return _py_dumps(value)
    if type(value) is str:
        return encode_basestring(value)
    return "".join(_c_encode(value, 0))


def json_text(value: Any) -> str:
    """``value`` (plain JSON data) as the compact JSON text a store record holds."""
    return _dumps(value)


def _text_or_null(value: str | None) -> str:
    return "null" if value is None else encode_basestring(value)


def number_text(value: float) -> str:
    """A number as JSON writes it: ``float.__repr__`` for a float (a float subclass, such
    as numpy's, goes through the encoder, which writes it the same way), ``int``'s for
    an int."""
    kind = type(value)
    if kind is float:
        return float.__repr__(value)
    if kind is int:
        return int.__repr__(value)
    return _dumps(value)


def number_or_null(value: float | None) -> str:
    return "null" if value is None else number_text(value)


def _status_text(value: SessionStatus | None) -> str:
    return "null" if value is None else encode_basestring(value.value)


# -- the writer of each state class -----------------------------------------------------
#
# Each field is written by a function of its value alone (an int, a flag, a number...) or,
# for the kinds that need more, by a ``text(value, state, now, old, new)``: a reading of
# the clock (written relative to ``now``), the nested turn, the trace lists (which reuse
# what the cache ``old`` holds of the same turn and record into ``new``).

FieldText = Callable[[Any, Any, float, "TextCache", "TextCache"], str]


def _relative_text(value: float | None, _state: Any, now: float, _old: Any, _new: Any) -> str:
    return "null" if value is None else number_text(now - value)


def _turn_text(value: Any, _state: Any, now: float, old: TextCache, new: TextCache) -> str:
    return "null" if value is None else _TURN_TEXT(value, now, old, new)


def _grown_text(
    at: str,
    encoder: Callable[[Any], Any],
    value: Any,
    state: Any,
    _now: float,
    old: TextCache,
    new: TextCache,
) -> str:
    """The text of a list that only grows within a turn (``at``: its key): what ``old``
    wrote of the same turn, plus the entries added since."""
    if value is None:  # a list kept as None while empty
        return "[]"
    index = state.index
    known = old.grown.get(at)
    if known is not None and known[0] == index and known[1] <= len(value):
        body = known[2]
        added = value[known[1] :]
    else:
        body, added = "", value
    if added:
        more = ",".join(_dumps(item) for item in encoder(added))
        body = f"{body},{more}" if body else more
    new.grown[at] = (index, len(value), body)
    return f"[{body}]"


_PLAIN_ACTIONS = (Assemble, Wait)
"""Actions that hold none of the host's data: their text never changes."""


def _actions_text(
    value: list[Action], state: Any, now: float, old: TextCache, new: TextCache
) -> str:
    """The text of the turn's actions at ``now``: a ``Wait`` or an ``Assemble`` met
    before is reused; an action that carries the host's data (a request, calls,
    results) or a reading of the clock (a Finish) is written anew, as the host may have
    changed that data in place."""
    index = state.index
    known = old.actions
    seen, before = (known[1], known[2]) if known is not None and known[0] == index else ([], [])
    texts = []
    for i, action in enumerate(value):
        if i < len(seen) and action is seen[i] and type(action) in _PLAIN_ACTIONS:
            texts.append(before[i])
        else:
            texts.append(_dumps(encode_action(action, now)))
    new.actions = (index, list(value), texts)
    return f"[{','.join(texts)}]"


def _encoded_text(encoder: Callable[[Any], Any], value: Any) -> str:
    return _dumps(encoder(value))


_FLAG_TEXT = {False: "false", True: "true"}.__getitem__
_VALUE_TEXT: dict[Kind, Callable[[Any], str]] = {
    **dict.fromkeys((COUNT, SEED, MODEL_INDEX), int.__repr__),
    FLAG: _FLAG_TEXT,
    NUMBER: number_text,
    **dict.fromkeys((TEXT, STATE), _text_or_null),
    **dict.fromkeys((OPTIONAL_COUNT, SIGNED), number_or_null),
    SESSION_STATUS: _status_text,
}
"""How a value of each kind whose values are ints, flags, numbers or text is written."""


def _how(kind: Kind, at: str) -> tuple[Callable[[Any], str] | None, FieldText | None]:
    """(how a value of ``kind`` is written by itself, or how with the state, the moment
    and the caches): one of the two is ``None``. ``at`` is the snapshot key that names
    a grown list in the cache."""
    if kind in _VALUE_TEXT:
        return _VALUE_TEXT[kind], None
    if kind.relative:
        return None, _relative_text
    if kind is TURN:
        return None, _turn_text
    if kind is ACTIONS:
        return None, _actions_text
    if kind.grows:
        return None, functools.partial(_grown_text, at, kind.encode)
    # anything else is written anew: host data above all (requests, replies, tool
    # calls and outcomes, errors), which the host may change in place once the
    # engine handed it out; the store then agrees with the session
    # (as json.dumps of the snapshot would)
    if kind.encode is _same:
        return _dumps, None
    return functools.partial(_encoded_text, kind.encode), None


def _text_writer(cls: type, prefix: str) -> Callable[[Any, float, TextCache, TextCache], str]:
    """``write(state, now, old, new)``: ``state``, a ``cls``, as JSON text, a key for
    each stored field of the declaration, in order."""
    fields = []
    for f in stored_fields(cls):
        key = f.metadata["snapshot_key"] or f.name
        fields.append((_dumps(key) + ":", *_how(f.metadata["kind"], prefix + key)))
    read = operator.attrgetter(*(f.name for f in stored_fields(cls)))

    def write(state: Any, now: float, old: TextCache, new: TextCache) -> str:
        texts = [
            head + (alone(value) if alone is not None else full(value, state, now, old, new))  # type: ignore[misc]
            for (head, alone, full), value in zip(fields, read(state), strict=True)
        ]
        return "{" + ",".join(texts) + "}"

    return write


_TURN_TEXT = _text_writer(TurnState, "turn.")
_SESSION_TEXT = _text_writer(SessionState, "")


def encode_state_text(
    state: TurnState | SessionState, now: float, old: TextCache, new: TextCache
) -> str:
    """``json_text(encode_state(state, now))``, byte for byte, reusing what ``old`` holds
    (the cache of an earlier write of the same session, whose turn only grew since) and
    recording into ``new`` what the next write may reuse."""
    write = _SESSION_TEXT if type(state) is SessionState else _TURN_TEXT
    return write(state, now, old, new)
