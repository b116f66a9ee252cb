"""The driver loop, written once: start (or resume) a turn, perform each action with the
host's I/O, send back the event it produced, until the turn's ``Finish``.

Every driver (``run_turn``, ``arun_turn``, the Temporal workflow's) is this loop with
its own ``perform``: the function that does what one action asks and returns the event
that says what happened. Anything that escapes ``perform`` or the engine (a cancelled
task, a ``KeyboardInterrupt``, a provider's programming error) first sends
``Cancelled(reason)`` to the running turn, which finishes ``cancelled`` with its calls
in flight as error results, and then propagates: the session stays consistent.

The two loops are twins that differ only in ``await`` (as httpcore's sync and async
connections do); the rest of a driver is its ``perform``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..core._actions import Action, Finish
from ..core._events import Cancelled
from ..core._session import Turn
from ..core._table import CALLING
from ..core._usage import Usage

MAX_REASON = 2000
"""Characters of an escaping exception's text kept as the cancel reason."""


def start(turn: Turn) -> Action:
    """The turn's first action (it is started here), or the action it owes an event for
    (a turn resumed mid-way), or its ``Finish``."""
    if not isinstance(turn, Turn):
        raise TypeError(f"turn: expected a statemachine.Turn, got {turn!r}")
    if turn.state == "idle":
        return turn.start()
    action = turn.action
    if action is None:  # pragma: no cover - a started turn has emitted an action
        raise RuntimeError(f"turn {turn!r} is started but has no action")
    return action


def text_of(exc: BaseException, limit: int = MAX_REASON) -> str:
    """``str(exc)``, bounded and made valid text (a broken ``__str__`` included)."""
    try:
        text = str(exc)
    except Exception:  # a broken __str__ is still an error to report
        text = f"<unprintable {type(exc).__name__}>"
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class CallCancelled(asyncio.CancelledError):
    """The model call in flight was cancelled, or came back after its cancel was
    asked: ``cost`` and ``usage`` are what the provider or the vendor reported of it,
    which the turn's ``Cancelled`` charges (:func:`cancel`)."""

    def __init__(self, message: str, cost: float = 0.0, usage: Usage | None = None) -> None:
        super().__init__(message)
        self.cost = cost
        self.usage = usage


def cancel(turn: Turn, exc: BaseException, usage: Usage | None = None) -> None:
    """Cancel ``turn`` because ``exc`` escaped its I/O, if it is running and current.
    While its model call is in flight, the ``Cancelled`` charges what the call was
    billed: a :class:`CallCancelled`'s cost and usage, else ``usage`` (what the
    caller saw of the call so far, a stream's usage say; its ``cost_usd`` charged)."""
    if turn.state != "idle" and not turn.done and turn.current:
        reason = f"{type(exc).__name__}: {text_of(exc)}".rstrip(": ")
        cost = 0.0
        if isinstance(exc, CallCancelled):
            cost, usage = exc.cost, exc.usage
        if turn.state == CALLING and (cost or usage is not None):
            turn.send(Cancelled(reason=reason, cost=cost, usage=usage))
        else:
            turn.send(Cancelled(reason=reason))


def drive(turn: Turn, perform: Callable[[Action], object]) -> Finish:
    """Run ``turn`` to its ``Finish``, ``perform`` doing each action (sync)."""
    action = start(turn)
    try:
        while type(action) is not Finish:
            action = turn.send(perform(action))
    except BaseException as exc:
        cancel(turn, exc)
        raise
    return action


async def adrive(turn: Turn, perform: Callable[[Action], Awaitable[object]]) -> Finish:
    """Run ``turn`` to its ``Finish``, ``perform`` doing each action (asyncio)."""
    action = start(turn)
    try:
        while type(action) is not Finish:
            action = turn.send(await perform(action))
    except BaseException as exc:
        cancel(turn, exc)
        raise
    return action
