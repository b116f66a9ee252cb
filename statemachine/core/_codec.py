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
import math
import types
import typing
from typing import Any

import attrs

from ._actions import Assemble, CallModel, Fallback, Finish, InvokeTools, Wait
from ._model_error import Headers, ModelError
from ._tool_calls import ToolCall, ToolOutcome, ToolResult

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
        Wait,
    )
}


def _enum_of(annotation: Any) -> type[enum.Enum] | None:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _enum_of(arg)
            if found is not None:
                return found
    return None


def _field_plan(cls: type) -> tuple[tuple[str, bool, type[enum.Enum] | None], ...]:
    attrs.resolve_types(cls)
    return tuple(
        (f.name, bool(f.metadata.get("opaque")), _enum_of(f.type)) for f in attrs.fields(cls)
    )


_PLANS = {name: _field_plan(cls) for name, cls in _CLASSES.items()}


def encode(value: Any) -> Any:
    """``value`` as plain JSON data."""
    cls = type(value)
    name = cls.__name__
    if name in _PLANS and _CLASSES[name] is cls:
        out: dict[str, Any] = {"$type": name}
        for field, opaque, _ in _PLANS[name]:
            item = getattr(value, field)
            out[field] = item if opaque else encode(item)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": repr(value)}
    if isinstance(value, Headers):
        return dict(value)
    if isinstance(value, tuple | list):
        return [encode(item) for item in value]
    return value


def decode(data: Any, where: str) -> Any:
    """The value ``encode`` turned into ``data``; ``ValueError`` naming ``where`` if
    it is not such data."""
    if isinstance(data, list):
        return tuple(decode(item, f"{where}[{i}]") for i, item in enumerate(data))
    if not isinstance(data, dict):
        return data
    if "$float" in data and len(data) == 1:
        if data["$float"] not in ("nan", "inf", "-inf"):
            raise ValueError(f"{where}: {data['$float']!r} is not a non-finite float")
        return float(data["$float"])
    if "$type" not in data:
        return data
    name = data["$type"]
    plan = _PLANS.get(name) if isinstance(name, str) else None
    if plan is None:
        raise ValueError(f"{where}: unknown value type {name!r}")
    expected = {field for field, _, _ in plan} | {"$type"}
    if set(data) != expected:
        odd = sorted(set(data) ^ expected)
        raise ValueError(f"{where}: {name} has missing or unknown field(s) {odd}")
    kwargs: dict[str, Any] = {}
    try:
        for field, opaque, enum_class in plan:
            item = data[field]
            if opaque:
                kwargs[field] = item
            elif enum_class is not None and item is not None:
                kwargs[field] = enum_class(item)
            else:
                kwargs[field] = decode(item, f"{where}.{field}")
        return _CLASSES[name](**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
