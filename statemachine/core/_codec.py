"""Plain-JSON encoding of the package's value types, for snapshots.

An attrs value becomes ``{"$type": "ClassName", field: value, ...}``; tuples become
lists, enums their value, ``Headers`` a dict, and a NaN or infinite float (JSON has
none; a garbage ``retry_after_seconds`` can be one) ``{"$float": "nan"}``. Fields
marked opaque (the host's own requests, replies, arguments and bodies) are stored as
they are, never interpreted, so a host's data that happens to hold a ``"$type"`` key
survives unchanged.
"""

from __future__ import annotations

import enum
import functools
import math
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ._actions import Assemble, CallModel, Fallback, Finish, InvokeTools, Wait
from ._builder import build_checked_reader, build_decoder
from ._events import EVENT_TYPES
from ._json_data import short_repr, stored_form
from ._model_error import Headers, ModelError
from ._tool_calls import ToolCall, ToolOutcome, ToolResult
from ._usage import Usage

_CLASSES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        Assemble,
        CallModel,
        Fallback,
        Finish,
        InvokeTools,
        ModelError,
        ToolCall,
        ToolOutcome,
        ToolResult,
        Usage,
        Wait,
        *EVENT_TYPES,  # a store's journal holds the events it applied
    )
}


def _enums_of(annotation: Any) -> tuple[type[enum.Enum], ...]:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return (annotation,)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(e for arg in typing.get_args(annotation) for e in _enums_of(arg))
    return ()


def _field_plan(cls: type) -> tuple[tuple[str, bool, tuple[type[enum.Enum], ...]], ...]:
    attrs.resolve_types(cls)
    return tuple(
        (f.name, bool(f.metadata.get("opaque")), _enums_of(f.type))
        for f in attrs.fields(cls)
        if not f.metadata.get("hidden")
    )


def _formed(value: Any, field: str, form: str) -> Any:
    """What to write of ``value.field``: the JSON form ``value.form`` holds, or taken now."""
    data = getattr(value, form)
    if data is not None:
        return data
    return stored_form(getattr(value, field), f"{type(value).__name__}.{field}")


_OPTIONAL: dict[str, frozenset[str]] = {
    name: frozenset(f.name for f in attrs.fields(cls) if f.default is not attrs.NOTHING)
    for name, cls in _CLASSES.items()
}
"""Fields with a default: data written before a field was added may leave it out."""


_PLANS = {name: _field_plan(cls) for name, cls in _CLASSES.items()}
_KEYS = {
    name: frozenset({"$type", *(field for field, _, _ in plan)}) for name, plan in _PLANS.items()
}
"""The keys an encoded value of each class may have."""
_REQUIRED = {name: _KEYS[name] - _OPTIONAL[name] for name in _PLANS}
"""The keys an encoded value of each class must have."""
_NAMES: dict[type, str | None] = {cls: name for name, cls in _CLASSES.items()}
"""The registered name each class met so far encodes as (``None``: not a value type)."""


def _name_of(cls: type) -> str | None:
    """The registered name ``cls`` encodes as: its own, or a registered base's (a
    host's subclass of ``ModelError`` is saved, and restored, as a ``ModelError``)."""
    try:
        return _NAMES[cls]
    except KeyError:
        pass
    name = None
    if attrs.has(cls):
        name = next((_NAMES[base] for base in cls.__mro__[1:] if _NAMES.get(base)), None)
    if len(_NAMES) < 4096:
        _NAMES[cls] = name
    return name


def encode(value: Any) -> Any:
    """``value`` as plain JSON data."""
    fast = _ENCODERS.get(type(value))
    if fast is not None:
        return fast(value)
    return _encode_other(value)


def _encode_other(value: Any) -> Any:
    """``encode`` of a value whose exact type has no encoder of its own (yet)."""
    kind = type(value)
    name = _name_of(kind)
    if name is not None:
        return _encoded_fields(name, False, value)
    if isinstance(value, enum.Enum):
        if len(_ENCODERS) < 4096:
            _ENCODERS[kind] = _enum_value_of
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": repr(value)}
    if isinstance(value, Headers):
        return dict(value)
    if isinstance(value, tuple | list):
        return [encode(item) for item in value]
    return value


def _enum_value_of(value: enum.Enum) -> Any:
    return value.value


def _same(value: Any) -> Any:
    return value


def _float(value: float) -> Any:
    return value if math.isfinite(value) else {"$float": repr(value)}


def _items(value: tuple[Any, ...] | list[Any]) -> list[Any]:
    return [encode(item) for item in value]


_PLAIN: frozenset[type] = frozenset({int, str, bool, type(None)})
"""Types ``encode`` returns as they are."""


_NO_DEFAULT = object()


def _writes(cls: type) -> tuple[tuple[str, bool, str | None, Any], ...]:
    """(field, opaque, form, default) of each encoded field of ``cls``: the field holding
    the JSON form it is written as (``None``: itself; a reply object's is its
    ``reply_data``), its default (``_NO_DEFAULT``: none, or a factory's)."""
    forms = {f.name: f.metadata["form"] for f in attrs.fields(cls) if "form" in f.metadata}
    defaults = {
        f.name: f.default
        for f in attrs.fields(cls)
        if f.default is not attrs.NOTHING and not isinstance(f.default, attrs.Factory)  # type: ignore[arg-type]
    }
    return tuple(
        (field, opaque, forms.get(field), defaults.get(field, _NO_DEFAULT))
        for field, opaque, _ in _PLANS[cls.__name__]
    )


_WRITES = {name: _writes(cls) for name, cls in _CLASSES.items()}


def _encoded_fields(name: str, compacted: bool, value: Any) -> dict[str, Any]:
    """``{"$type": name}`` and each encoded field of ``value``, an instance of the
    registered class ``name`` (or of a subclass): the host's data and a value of a
    plain type as it is, any other encoded (``compact`` with ``compacted``, which also
    leaves out a field that holds its default: the same type and an equal value)."""
    out: dict[str, Any] = {"$type": name}
    again = compact if compacted else encode
    for field, opaque, form, default in _WRITES[name]:
        item = getattr(value, field) if form is None else _formed(value, field, form)
        if compacted and type(item) is type(default) and item == default:
            continue
        out[field] = item if opaque or type(item) in _PLAIN else again(item)
    return out


_ENCODERS: dict[type, Any] = {
    **{cls: functools.partial(_encoded_fields, name, False) for name, cls in _CLASSES.items()},
    **dict.fromkeys((int, str, bool, type(None), dict), _same),
    float: _float,
    tuple: _items,
    list: _items,
    Headers: dict,
}
"""``encode`` of each exact type met so far that has a way of its own (an enum class is
added when first met)."""


def compact(value: Any) -> Any:
    """``encode(value)`` without the fields that hold their default (``decode`` gives
    the same value back): what a store's journal writes on every advance."""
    fast = _COMPACT.get(type(value))
    if fast is not None:
        return fast(value)
    if type(value) in (tuple, list):
        return [compact(item) for item in value]
    return encode(value)


_COMPACT: dict[type, Any] = {
    cls: functools.partial(_encoded_fields, name, True) for name, cls in _CLASSES.items()
}


MAX_DEPTH = 100
"""How deep encoded values may nest (the engine's own values nest a few levels)."""


class _Bad(Exception):
    """A refusal on its way up, collecting the path to the value it names."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[str] = []


def decode(data: Any, where: str) -> Any:
    """The value ``encode`` turned into ``data``; ``ValueError`` naming ``where`` (and
    the path inside it) if it is not such data. Never recurses more than
    :data:`MAX_DEPTH` levels, whatever the data."""
    try:
        return _decode(data, 0)
    except _Bad as bad:
        raise ValueError(f"{where}{''.join(reversed(bad.path))}: {bad.message}") from None


def _decode(data: Any, depth: int) -> Any:
    kind = type(data)
    if kind is list:
        if depth >= MAX_DEPTH:
            raise _Bad(f"nested more than {MAX_DEPTH} levels deep")
        items = []
        for i, item in enumerate(data):
            if type(item) in _PLAIN_DATA:
                items.append(item)
                continue
            try:
                items.append(_decode(item, depth + 1))
            except _Bad as bad:
                bad.path.append(f"[{i}]")
                raise
        return tuple(items)
    if kind is not dict:
        return data
    if "$float" in data and len(data) == 1:
        if data["$float"] not in ("nan", "inf", "-inf"):
            raise _Bad(f"{short_repr(data['$float'])} is not a non-finite float")
        return float(data["$float"])
    if "$type" not in data:
        return data
    name = data["$type"]
    decode_one = _DECODERS.get(name) if type(name) is str else None
    if decode_one is None:
        raise _Bad(f"unknown value type {short_repr(name)}")
    return decode_one(data, depth)


def _decode_fields(name: str, data: dict[Any, Any], depth: int) -> Any:
    """The value of the registered class ``name`` that ``data`` encodes, field by field."""
    plan = _PLANS[name]
    keys = data.keys()
    if not (keys <= _KEYS[name] and _REQUIRED[name] <= keys):
        expected = {field for field, _, _ in plan} | {"$type"}
        odd = sorted(str(k)[:40] for k in (set(data) ^ expected) - _OPTIONAL[name])
        raise _Bad(f"{name} has missing or unknown field(s) {odd}")
    if depth >= MAX_DEPTH:
        raise _Bad(f"nested more than {MAX_DEPTH} levels deep")
    kwargs: dict[str, Any] = {}
    for field, opaque, enum_classes in plan:
        if field not in data:
            continue  # a field added later, with its default
        item = data[field]
        if opaque:
            kwargs[field] = item
        elif enum_classes and item is not None:
            kwargs[field] = _enum_value(enum_classes, item, f"{name}.{field}")
        else:
            try:
                kwargs[field] = _decode(item, depth + 1)
            except _Bad as bad:
                bad.path.append(f".{field}")
                raise
    try:
        return _CLASSES[name](**kwargs)
    except (TypeError, ValueError) as exc:
        raise _Bad(_short_message(exc)) from None


_PLAIN_DATA: frozenset[type] = frozenset({str, int, float, bool, type(None)})
"""What ``_decode`` gives back as it is (besides a dict that is no encoded value)."""


def _decoder_of(name: str) -> Any:
    """``_decode`` of data naming the registered class ``name``: data holding every field
    (what the engine writes now) is read by straight-line code generated from the
    fields (``_builder.build_decoder``); any other goes field by field
    (``_decode_fields``), which names what is missing or unknown."""
    return build_decoder(
        _CLASSES[name],
        name,
        _PLANS[name],
        {
            "decode_fields": _decode_fields,
            "Bad": _Bad,
            "too_deep": f"nested more than {MAX_DEPTH} levels deep",
            "MAX_DEPTH": MAX_DEPTH,
            "plain": _PLAIN_DATA,
            "decode": _decode,
            "enum_value": _enum_value,
            "short_message": _short_message,
        },
    )


def _enum_value(classes: tuple[type[enum.Enum], ...], item: Any, where: str) -> enum.Enum:
    for enum_class in classes:
        try:
            return enum_class(item)
        except (TypeError, ValueError):
            continue
    names = " or ".join(c.__name__ for c in classes)
    raise _Bad(f"{where}: {short_repr(item)} is not a {names}")


def _short_message(exc: Exception) -> str:
    try:
        text = str(exc)
    except Exception:
        return type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def checked_decoder(
    cls: type,
    checks: Sequence[tuple[str, Callable[[Any], bool]]],
    *,
    data_check: Callable[[Any], bool] | None = None,
    plain: Callable[[Any, set[int]], bool] | None = None,
    make: Callable[..., Any] | None = None,
) -> Callable[[dict[Any, Any], set[int]], Any]:
    """``read(data, seen)``: the value of the registered class ``cls`` that ``data``
    encodes, when it holds every field, each a JSON scalar, an opaque value or an
    enum's value, and each value passes its check of ``checks`` (field, predicate);
    ``None`` for any other data, which the caller reads the general way (that way
    names what is wrong). A check that is ``data_check`` (when given) passes at once where
    ``plain(value, seen)`` does (``seen``: the ids of values found to be data in this
    read), as straight-line code generated from the fields. ``make`` (every field's
    value, in order) builds the value instead of ``cls``, when given."""
    name = cls.__name__
    plan = _PLANS[name]
    if make is not None and [field for field, _, _ in plan] != [f.name for f in attrs.fields(cls)]:
        raise TypeError(f"{name}: make takes every field, and some are not encoded")
    index = {field: i for i, (field, _, _) in enumerate(plan)}
    tests = [(index[field], check, check is data_check) for field, check in checks]
    return build_checked_reader(cls, plan, tests, _PLAIN_DATA, plain, make)


_DECODERS: dict[str, Any] = {name: _decoder_of(name) for name in _CLASSES}
"""``_decode`` of each registered class, by name."""
