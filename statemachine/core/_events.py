"""Events: facts the host reports to a turn, each in the past tense."""

from __future__ import annotations

from typing import Any, get_args

import attrs

from ._exceptions import InvalidValue
from ._json_data import (
    MAX_COUNT,
    finite,
    instance_of,
    json_form,
    json_validator,
    owned_json,
    short_repr,
)
from ._model_error import HIDDEN, OPAQUE, REPLY, ModelError
from ._tool_calls import ToolCall, ToolOutcome
from ._usage import Usage


def _size(_instance: object, _attribute: object, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidValue(f"size: must be an int >= 0, got {value!r:.60}")
    if value > MAX_COUNT:
        raise InvalidValue(f"size: must be < 2**63, got an int of {value.bit_length()} bits")


def _tuple_of(value: Any, kind: type, name: str) -> tuple[Any, ...]:
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise InvalidValue(f"{name}: must be a sequence of {kind.__name__}, got {value!r}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, kind):
            raise InvalidValue(f"{name}: must hold {kind.__name__} items, got {item!r}")
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
        raise InvalidValue(f"cost: must be a finite number >= 0, got {value!r:.60}")


def _request(value: Any) -> Any:
    return owned_json(value, "request")


def _usage(value: Any) -> Any:
    if value is not None and type(value) is not Usage:
        raise InvalidValue(f"usage: must be a Usage or None, got {value!r:.80}")
    return value


def _doom_verdict(_instance: object, _attribute: object, value: Any) -> None:
    if value is not None and type(value) is not bool:
        raise InvalidValue(f"doom_verdict: must be True, False or None, got {short_repr(value)}")


def _charge(event: ModelReplied | ModelFailed | Cancelled) -> None:
    """Reconcile ``cost`` and ``usage.cost_usd``: one says what the other leaves out,
    and two that disagree are refused."""
    usage = event.usage
    if usage is None:
        return
    if usage.cost_usd is None:
        if event.cost:
            object.__setattr__(event, "usage", attrs.evolve(usage, cost_usd=float(event.cost)))
    elif not event.cost:
        object.__setattr__(event, "cost", usage.cost_usd)
    elif event.cost != usage.cost_usd:
        name = type(event).__name__
        raise InvalidValue(
            f"{name}.cost: {event.cost!r} and usage.cost_usd {usage.cost_usd!r} disagree "
            "(give the cost once, in either)"
        )


@attrs.frozen
class Assembled:
    """The context was assembled into ``request``, of ``size`` (tokens or any monotone
    measure); after ``Assemble(reduce=True)`` one not strictly smaller cannot shrink."""

    request: Any = attrs.field(metadata=OPAQUE, converter=_request)
    size: int = attrs.field(validator=_size)


@attrs.frozen
class CannotShrink:
    """The context providers cannot make the context any smaller."""


@attrs.frozen
class ModelReplied:
    """The model answered. ``tool_calls`` are the calls it asked for (none: the loop is
    done); ``cost`` is this call's spend in USD; ``usage`` what the call used and was
    (:class:`Usage`, whose ``cost_usd`` is the ``cost`` when that is left out).

    ``reply`` is the host's own reply object, handed back by ``Finish.reply`` in
    process; snapshots, stores and traces keep its JSON form, taken here
    (``reply_data``: plain data copied, a pydantic model's ``model_dump(mode="json")``,
    a dataclass's or attrs instance's ``asdict``); an object with none is refused."""

    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tool_calls)
    cost: float = attrs.field(default=0.0, validator=_cost)
    reply: Any = attrs.field(default=None, metadata=REPLY)
    usage: Usage | None = attrs.field(default=None, kw_only=True, converter=_usage)
    doom_verdict: bool | None = attrs.field(
        default=None, kw_only=True, repr=False, validator=_doom_verdict
    )
    """The host's second-tier doom check on this reply's tool calls (``None``: taken
    without one): where a verdict is due, whether the last ``doom_check_window`` calls go
    round in circles (``True`` fires ``error_doom_loop``), else ``False``. Filled in by
    ``Turn.send`` from the session's ``doom_check``, so a replay asks no check."""
    reply_data: Any = attrs.field(init=False, eq=False, repr=False, metadata=HIDDEN)
    """The JSON form of ``reply``, taken when the event was made."""

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "reply_data", json_form(self.reply, "ModelReplied.reply"))
        _charge(self)


def _model_error(_instance: object, _attribute: object, value: Any) -> None:
    """``ModelFailed.error`` holds a :class:`ModelError`; a category name or an SDK
    exception is refused with the line that builds one."""
    if isinstance(value, ModelError):
        return
    if isinstance(value, str):
        hint = f"sm.ModelFailed(sm.ModelError({value[:60]!r}, ...))"
    elif isinstance(value, BaseException):
        hint = "sm.ModelFailed(sm.classify(exc)), which reads an SDK's exception"
    else:
        hint = 'sm.ModelFailed(sm.ModelError("rate_limited", ...))'
    raise InvalidValue(
        f"ModelFailed.error: must be a ModelError, got {short_repr(value)}; write {hint}"
    )


@attrs.frozen
class ModelFailed:
    """The model call failed with ``error``.

    ``partial=True``: part of a streamed reply had already been delivered, so the call
    is never resent (``stream_interrupted``). ``cost`` is what the failed call was
    billed, counted toward ``max_cost_usd``; ``usage`` what it used, as far as the
    provider reported it (its ``cost_usd`` is the ``cost`` when that is left out).
    """

    error: ModelError = attrs.field(validator=_model_error)
    partial: bool = attrs.field(default=False, validator=instance_of(bool))
    cost: float = attrs.field(default=0.0, kw_only=True, validator=_cost)
    usage: Usage | None = attrs.field(default=None, kw_only=True, converter=_usage)

    def __attrs_post_init__(self) -> None:
        _charge(self)


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

    Legal in every running state; the turn ends ``cancelled`` and calls in flight come
    back as error results, so the conversation stays well-formed. ``cost`` and
    ``usage`` are those of the model call in flight (state ``calling`` only), charged
    as a reply's would be; ``Cancelled()`` charges nothing.
    """

    reason: str = attrs.field(
        default="",
        validator=[instance_of(str), json_validator("reason")],
    )
    cost: float = attrs.field(default=0.0, kw_only=True, validator=_cost, repr=False)
    usage: Usage | None = attrs.field(default=None, kw_only=True, converter=_usage, repr=False)

    def __attrs_post_init__(self) -> None:
        _charge(self)

    def __repr__(self) -> str:
        # a cancel that charges nothing prints as it always did (traces pin the text)
        charged = self.cost or self.usage is not None
        spend = f", cost={self.cost!r}, usage={self.usage!r}" if charged else ""
        return f"Cancelled(reason={self.reason!r}{spend})"


Event = Assembled | CannotShrink | ModelReplied | ModelFailed | WaitDone | ToolsDone | Cancelled
EVENT_TYPES: tuple[type, ...] = get_args(Event)
