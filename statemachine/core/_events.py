"""Events: facts the host reports to a turn, each in the past tense."""

from __future__ import annotations

from typing import Any

import attrs

from ._json_data import MAX_COUNT, finite, json_validator, owned_json
from ._model_error import OPAQUE, ModelError
from ._tool_calls import ToolCall, ToolOutcome


def _size(_instance: object, _attribute: object, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"size: must be an int >= 0, got {value!r:.60}")
    if value > MAX_COUNT:
        raise ValueError(f"size: must be < 2**63, got an int of {value.bit_length()} bits")


def _tuple_of(value: Any, kind: type, name: str) -> tuple[Any, ...]:
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name}: must be a sequence of {kind.__name__}, got {value!r}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, kind):
            raise TypeError(f"{name}: must hold {kind.__name__} items, got {item!r}")
    return items


def _tool_calls(value: Any) -> tuple[ToolCall, ...]:
    return _tuple_of(value, ToolCall, "tool_calls")


def _outcomes(value: Any) -> tuple[ToolOutcome, ...]:
    return _tuple_of(value, ToolOutcome, "outcomes")


def _cost(_instance: object, _attribute: object, value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not finite(value)
        or value < 0
    ):
        raise ValueError(f"cost: must be a finite number >= 0, got {value!r:.60}")


def _request(value: Any) -> Any:
    return owned_json(value, "request")


def _reply(value: Any) -> Any:
    return owned_json(value, "reply")


@attrs.frozen
class Assembled:
    """The context was assembled into ``request``, of ``size`` (tokens or any monotone
    measure). After ``Assemble(reduce=True)`` a size that is not strictly smaller
    than the one that overflowed counts as "cannot shrink"."""

    request: Any = attrs.field(metadata=OPAQUE, converter=_request)
    size: int = attrs.field(validator=_size)


@attrs.frozen
class CannotShrink:
    """The context providers cannot make the context any smaller."""


@attrs.frozen
class ModelReplied:
    """The model answered. ``tool_calls`` are the calls it asked for (none means the
    loop is done); ``cost`` is this call's spend in USD, summed against
    ``max_cost_usd``; ``reply`` is the host's own reply object, carried to ``Finish``."""

    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tool_calls)
    cost: float = attrs.field(default=0.0, validator=_cost)
    reply: Any = attrs.field(default=None, metadata=OPAQUE, converter=_reply)


@attrs.frozen
class ModelFailed:
    """The model call failed with ``error``.

    Set ``partial=True`` when part of a streamed reply had already been delivered:
    such a call is never resent, whatever its category (``stream_interrupted``).
    ``cost`` is what the failed call was billed (a stream that broke after usage was
    reported, a timed-out call that was charged): it counts toward ``max_cost_usd``.
    """

    error: ModelError = attrs.field(validator=attrs.validators.instance_of(ModelError))
    partial: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    cost: float = attrs.field(default=0.0, kw_only=True, validator=_cost)


@attrs.frozen
class WaitDone:
    """The host waited the seconds of the last ``Wait``."""


@attrs.frozen
class ToolsDone:
    """Every call of the last ``InvokeTools`` has an outcome, exactly one each."""

    outcomes: tuple[ToolOutcome, ...] = attrs.field(converter=_outcomes)


@attrs.frozen
class Cancelled:
    """The host abandons the turn (a cancelled task, a ``KeyboardInterrupt``).

    Legal in every running state; the turn ends ``cancelled`` and calls that were in
    flight come back as error results, so the conversation stays well-formed.
    """

    reason: str = attrs.field(
        default="",
        validator=[attrs.validators.instance_of(str), json_validator("reason")],
    )


Event = Assembled | CannotShrink | ModelReplied | ModelFailed | WaitDone | ToolsDone | Cancelled
EVENT_TYPES: tuple[type, ...] = (
    Assembled,
    CannotShrink,
    ModelReplied,
    ModelFailed,
    WaitDone,
    ToolsDone,
    Cancelled,
)
