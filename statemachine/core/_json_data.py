"""What "JSON data" means for the host's own values, checked once at the door.

A session's snapshot is plain JSON, so every value of the host's that the engine keeps
(requests, replies, tool arguments and contents, error bodies) must be data that
``json.dumps(..., allow_nan=False)`` writes and ``json.loads`` reads back: ``dict``
with ``str`` keys, ``list`` (or ``tuple``, written as a list), ``str``, ``int``,
finite ``float``, ``bool`` and ``None``. On top of JSON's own rules:

* nesting is at most :data:`MAX_DEPTH` containers deep (no recursion limit is ever
  near, in this process or the one that restores it);
* at most :data:`MAX_NODES` values in one piece of data;
* integers fit in :data:`MAX_INT_BITS` bits (JSON writers refuse integers of more
  than 4,300 digits);
* keys are ``str``, or an ``int``, finite ``float``, ``bool`` or ``None``, which JSON
  writes as text (and reads back as text);
* strings are valid Unicode (no lone surrogate, which UTF-8 cannot encode).

The check walks the value iteratively, so hostile data cannot raise ``RecursionError``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from enum import Enum
from typing import Any, TypeVar

import attrs

from ._exceptions import InvalidValue

_Member = TypeVar("_Member", bound=Enum)

MAX_DEPTH = 100
MAX_NODES = 1_000_000
MAX_INT_BITS = 14_000
MAX_COUNT = (1 << 63) - 1
"""The largest counter, size or integer setting the engine takes: each fits in a
signed 64-bit integer wherever the snapshot is read."""


def finite(value: float) -> bool:
    """Whether the number ``value`` is finite, an int too large for a float included
    (``math.isfinite`` would raise ``OverflowError`` for it)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def short_repr(value: object) -> str:
    """``repr`` of a refused value for a message, cut short (it may be huge or hostile)."""
    if type(value) is int and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def json_problem(value: Any, *, strict: bool = False) -> str | None:
    """Why ``value`` is not JSON data as defined above, or ``None`` if it is.

    The reason names the path inside ``value`` (``[2].content``...). With ``strict``
    (data read back from a snapshot) subclasses of the JSON types are refused too: only
    a JSON parser's own types can be trusted not to run code when compared or hashed.
    """
    kind = type(value)
    if kind is str:
        return None if value.isascii() else _text_problem(value, "")
    if value is None or kind is bool or (kind is float and math.isfinite(value)):
        return None
    if kind is int:
        return None if value.bit_length() <= MAX_INT_BITS else "an integer too large"
    if plain_json(value):
        return None
    return _walk(value, strict)


def plain_json(root: Any) -> bool:
    """Whether ``root`` is certainly JSON data (``json_problem`` finds none, ``strict``
    or not): the common case, checked without building the paths that explain a
    refusal. ``False`` only means ``json_problem`` must look: only the JSON parser's own
    types pass here (an ``int`` or ``None`` key is JSON data, and goes that way).

    The walk goes one nesting level at a time (the values below a level are gathered
    by C-level ``extend``), so a value costs one type test, not a stack entry."""
    level = [root]
    depth = nodes = 0
    while level:
        nodes += len(level)
        if nodes > MAX_NODES:
            return False
        below: list[Any] = []
        for value in level:
            kind = type(value)
            if kind is str:
                if not value.isascii():
                    return False
            elif kind is dict:
                if depth >= MAX_DEPTH:
                    return False
                for key in value:
                    if type(key) is not str or not key.isascii():
                        return False
                below.extend(value.values())
            elif kind is list or kind is tuple:
                if depth >= MAX_DEPTH:
                    return False
                below.extend(value)
            elif kind is int:
                if value.bit_length() > MAX_INT_BITS:
                    return False
            elif kind is float:
                if not math.isfinite(value):
                    return False
            elif value is not None and kind is not bool:
                return False
        level = below
        depth += 1
    return True


def _text_problem(text: str, where: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return f"{where or 'the value'}: a string with a lone surrogate (not valid Unicode)"
    return None


def _walk(root: Any, strict: bool = False) -> str | None:
    stack: list[tuple[Any, str, int]] = [(root, "", 0)]
    nodes = 0
    while stack:
        value, where, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            return f"more than {MAX_NODES} values"
        kind = type(value)
        if kind not in _EXACT:
            if strict:
                return f"{where or 'the value'}: a {kind.__name__}, not one of JSON's own types"
            kind = _base_kind(value)
        if kind is dict or kind is list or kind is tuple:
            if depth >= MAX_DEPTH:
                return f"{where or 'the value'}: nested more than {MAX_DEPTH} levels deep"
            problem = _push_items(value, where, depth + 1, stack)
        else:
            problem = _scalar_problem(value, kind, where)
        if problem is not None:
            return problem
    return None


def _scalar_problem(value: Any, kind: type, where: str) -> str | None:
    """Why the value ``value`` (of the JSON kind ``kind``) at ``where`` is not JSON data."""
    if kind is str:
        return None if value.isascii() else _text_problem(value, where)
    if value is None or kind is bool:
        return None
    if kind is int:
        if value.bit_length() <= MAX_INT_BITS:
            return None
        return f"{where or 'the value'}: an integer of more than {MAX_INT_BITS} bits"
    if kind is float:
        if math.isfinite(value):
            return None
        return f"{where or 'the value'}: {value!r} (JSON has no NaN or infinity)"
    return f"{where or 'the value'}: a {kind.__name__}, which is not JSON data"


def _push_items(
    value: Any, where: str, depth: int, stack: list[tuple[Any, str, int]]
) -> str | None:
    """Push the items of the container ``value`` (at ``where``) on ``stack``, at
    ``depth``; why a key of it is not JSON data, if one is not."""
    if not isinstance(value, dict):
        stack.extend((item, f"{where}[{i}]", depth) for i, item in enumerate(value))
        return None
    for key, item in value.items():
        if type(key) is str:
            if not key.isascii() and _text_problem(key, where):
                return f"{where or 'the value'}: a key with a lone surrogate"
        elif not _scalar_key(key):
            return f"{where or 'the value'}: a key JSON cannot write ({key!r:.40})"
        stack.append((item, f"{where}.{key}" if where else str(key), depth))
    return None


def _scalar_key(key: object) -> bool:
    if key is None or type(key) is bool:
        return True
    if type(key) is int:
        return key.bit_length() <= MAX_INT_BITS
    return type(key) is float and math.isfinite(key)


_EXACT = frozenset({str, int, float, bool, dict, list, tuple, type(None)})
_BASES = (bool, str, int, float, dict, list, tuple)


def _base_kind(value: object) -> type:
    """The JSON kind of a subclass (a ``StrEnum`` is a str, an ``OrderedDict`` a dict)."""
    for base in _BASES:
        if isinstance(value, base):
            return base
    return type(value)


_COPY = json.JSONEncoder(ensure_ascii=False, allow_nan=False, check_circular=False)
_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


def owned_json(value: Any, name: str) -> Any:
    """``value`` checked to be JSON data (``ValueError`` naming ``name`` if not), as an
    owned copy: what a snapshot would give back (tuples as lists, keys as text).

    The engine keeps the host's data for retries, traces and snapshots; an owned copy
    means a host that goes on changing its own list or dict after sending it changes
    nothing in the engine, and what a restored session holds is what a live one holds.
    """
    problem = json_problem(value)
    if problem is not None:
        raise InvalidValue(f"{name}: must be JSON data: {problem}")
    return value if type(value) in _JSON_SCALARS else json.loads(_COPY.encode(value))


_CONTAINERS = (dict, list, tuple)


def json_form(value: Any, name: str) -> Any:
    """The JSON form of the host's object ``value``: what a snapshot, a store or a trace
    file keeps of it (checked JSON data, owned: a copy).

    JSON data is copied as it is (tuples as lists); a pydantic model (the official
    SDKs' replies) is its ``model_dump(mode="json")``, a dataclass its
    ``dataclasses.asdict``, an attrs instance its ``attrs.asdict``; anything else has no
    JSON form the engine knows, and is refused (``InvalidValue`` naming ``name``, saying
    how to fix it)."""
    kind = type(value)
    if kind in _JSON_SCALARS or kind in _CONTAINERS:
        return owned_json(value, name)
    data: Any
    how: str
    try:
        dump = getattr(value, "model_dump", None)
    except Exception as exc:  # an object whose attribute lookup raises what it likes
        raise InvalidValue(
            f"{name}: looking up {kind.__qualname__}.model_dump raised {short_repr(exc)}"
        ) from None
    if callable(dump) and not isinstance(value, type):
        data, how = _converted(lambda: dump(mode="json"), name, kind, "model_dump(mode='json')")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        data, how = _converted(lambda: dataclasses.asdict(value), name, kind, "dataclasses.asdict")
    elif attrs.has(kind):
        data, how = _converted(lambda: attrs.asdict(value), name, kind, "attrs.asdict")
    elif isinstance(value, (*_CONTAINERS, str, int, float)):  # a subclass: a NamedTuple...
        return owned_json(value, name)
    else:
        raise InvalidValue(
            f"{name}: a {kind.__module__}.{kind.__qualname__} has no JSON form the engine knows "
            "(a snapshot keeps the host's objects as JSON): give JSON data, a pydantic model, "
            "a dataclass or an attrs instance, or convert it yourself"
        )
    problem = json_problem(data)
    if problem is not None:
        raise InvalidValue(f"{name}: {how} of a {kind.__qualname__} is not JSON data: {problem}")
    # an owned copy of the JSON parser's own types (a dict or str subclass comes back
    # plain: a snapshot is read back with those only)
    return data if type(data) in _JSON_SCALARS else json.loads(_COPY.encode(data))


def _converted(convert: Any, name: str, kind: type, how: str) -> tuple[Any, str]:
    try:
        return convert(), how
    except Exception as exc:
        raise InvalidValue(
            f"{name}: {how} of a {kind.__qualname__} failed: {short_repr(exc)}"
        ) from None


def stored_form(value: Any, name: str) -> Any:
    """What to write of the host's ``value`` (data the engine holds already, or an object
    whose JSON form is taken now)."""
    if type(value) in _JSON_SCALARS or type(value) in _CONTAINERS:
        return value
    return json_form(value, name)


def check_unicode(text: str, name: str) -> None:
    """Refuse ``text`` (``InvalidValue`` naming ``name``) if it holds a lone surrogate,
    which UTF-8 cannot encode."""
    if not text.isascii() and _text_problem(text, name):
        raise InvalidValue(f"{name}: a string with a lone surrogate")


def member_of(kind: type[_Member], raw: Any, name: str) -> _Member:
    """``raw`` as a member of the enum ``kind``, whose value it is (``InvalidValue``
    naming ``name`` and every value if it is none)."""
    if type(raw) is kind:
        return raw
    try:
        return kind(raw)
    except ValueError:
        names = ", ".join(member.value for member in kind)
        raise InvalidValue(f"{name}: {raw!r} is not one of {names}") from None


def instance_of(kind: type | tuple[type, ...], name: str | None = None) -> Any:
    """An attrs validator: the field holds a ``kind`` (``InvalidValue`` naming it)."""

    def validate(instance: object, attribute: Any, value: Any) -> None:
        if not isinstance(value, kind):
            field = name or f"{type(instance).__name__}.{attribute.name}"
            expected = (
                kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            )
            raise InvalidValue(f"{field}: must be a {expected}, got {short_repr(value)}")

    return validate


def json_validator(name: str) -> Any:
    """An attrs validator: the field holds JSON data (``ValueError`` naming it)."""

    def validate(_instance: object, _attribute: object, value: Any) -> None:
        problem = json_problem(value)
        if problem is not None:
            raise InvalidValue(f"{name}: must be JSON data: {problem}")

    return validate
