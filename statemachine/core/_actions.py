"""Actions: what a turn tells the host to do next, each an imperative.

Plain frozen values with no ``__weakref__`` slot, so the engine can make one on every
step through an unfrozen twin (:func:`_builder.build_maker`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ._builder import build_maker
from ._model_error import HIDDEN, OPAQUE, REPLY, ModelError
from ._taxonomy import ErrorCategory, ToolErrorCategory, TurnStatus
from ._tool_calls import ToolCall, ToolResult


@attrs.frozen(weakref_slot=False)
class Assemble:
    """Assemble the context; with ``reduce`` smaller than the last, which overflowed.
    On the final-answer turn ``withhold_tools`` is true and ``instruction`` is the
    synthetic text to append."""

    reduce: bool
    withhold_tools: bool = False
    instruction: str | None = None


@attrs.frozen(weakref_slot=False)
class CallModel:
    """Send ``request`` to ``model`` (``None``: the host's default model); ``attempt``
    counts retries of the same request from 0."""

    request: Any = attrs.field(metadata=OPAQUE)
    attempt: int
    model: str | None = None
    withhold_tools: bool = False


@attrs.frozen(weakref_slot=False)
class Wait:
    """Sleep ``seconds`` before retrying after a ``category`` error on ``attempt``: a
    model error's, or ``ToolErrorCategory.CONCURRENCY_CONFLICT`` before a conflicting
    tool call is re-invoked. ``retry_after`` is the wait the server asked for, which
    ``seconds`` is never shorter than (``None``: none); it takes no part in ``==``."""

    seconds: float
    category: ErrorCategory | ToolErrorCategory
    attempt: int
    retry_after: float | None = attrs.field(default=None, eq=False)


@attrs.frozen(weakref_slot=False)
class InvokeTools:
    """Run these tool calls (concurrently if you like), then send ``ToolsDone``."""

    calls: tuple[ToolCall, ...]


@attrs.frozen
class Fallback:
    """A move down ``fallback_models``: ``error`` on ``from_model`` caused it."""

    from_model: str | None
    to_model: str
    error: ModelError


@attrs.frozen(weakref_slot=False)
class Finish:
    """The turn is over with ``status``.

    ``tool_results`` holds one result per tool call of the reply (error-flagged for
    failed or blocked calls); ``error`` is the model error that ended the turn, if any;
    ``model`` served the last attempt, after the moves ``fallbacks``. ``retry_at``
    (``retry_deferred`` only) is when, on the session's clock, the server said to come
    back. ``reply`` is the object the ``ModelReplied`` carried (after a restore: its
    JSON form). ``done``: no further model call is needed (no tool call, or a
    ``terminates_turn`` call succeeded). ``==`` compares status, tool results and error.
    """

    status: TurnStatus
    tool_results: tuple[ToolResult, ...] = ()
    error: ModelError | None = None
    model: str | None = attrs.field(default=None, eq=False)
    fallbacks: tuple[Fallback, ...] = attrs.field(default=(), eq=False)
    retry_at: float | None = attrs.field(default=None, eq=False)
    reply: Any = attrs.field(default=None, metadata=REPLY, eq=False)
    done: bool = attrs.field(default=False, eq=False)
    reply_data: Any = attrs.field(default=None, kw_only=True, eq=False, repr=False, metadata=HIDDEN)
    """The JSON form of ``reply`` (``None``: ``reply`` is data already)."""


Action = Assemble | CallModel | Wait | InvokeTools | Finish


def _maker(cls: type) -> Callable[..., Any]:
    """A maker of ``cls`` whose ``make(*values)`` equals ``cls(*values)``, every field
    given in order, set straight through its slots (for a class that runs nothing)."""
    fields = attrs.fields(cls)
    if any(f.validator or f.converter for f in fields) or hasattr(cls, "__attrs_post_init__"):
        raise TypeError(f"{cls.__name__} runs code when it is made: build it by its __init__")
    return build_maker(cls, tuple(f.name for f in fields))


make_call_model: Callable[[Any, int, str | None, bool], CallModel] = _maker(CallModel)
"""``CallModel(request, attempt, model, withhold_tools)``, made on every retry."""
make_wait: Callable[[float, Any, int, float | None], Wait] = _maker(Wait)
"""``Wait(seconds, category, attempt, retry_after)``, made on every wait."""
make_finish: Callable[..., Finish] = _maker(Finish)
"""``Finish(status, tool_results, error, model, fallbacks, retry_at, reply, done,
reply_data)``, made at the end of every turn."""
