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
import contextvars
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


class Driving:
    """A running drive, shown through :data:`DRIVING` to the code it calls: its model
    provider, and what the model call in flight reported it used so far. As a context
    manager it is that drive: it cancels the turn when an exception escapes, before it
    stops showing itself (the turn's observers may ask for the provider's model)."""

    __slots__ = ("_token", "provider", "spent", "turn")

    def __init__(self, turn: Turn, provider: object) -> None:
        self.turn = turn
        self.provider = provider
        self.spent: Usage | None = None

    def __enter__(self) -> Driving:
        self._token = DRIVING.set(self)
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        try:
            if exc is not None:
                cancel(self.turn, exc, self.spent)
        finally:
            DRIVING.reset(self._token)


DRIVING: contextvars.ContextVar[Driving | None] = contextvars.ContextVar(
    "statemachine.driving", default=None
)
"""The drive running in this context (``None``: none). The session's observers run
inside its ``turn.send``, so they see it too; a record handed to an observer later (a
trace replayed, a worker's observers) does not."""


def report_usage(usage: Usage) -> None:
    """Say, inside a model provider's call that ``run_turn`` or ``arun_turn`` drives, what
    the vendor has reported the call used so far (a stream's usage chunk, its
    ``cost_usd`` included): if the turn is cancelled before the call returns, its
    ``Cancelled`` charges that. A later report replaces an earlier one; the call's own
    event supersedes it. Nothing happens outside a drive (on Temporal:
    ``statemachine.temporal.report_usage``). ``TypeError`` if ``usage`` is not a
    :class:`Usage`."""
    if not isinstance(usage, Usage):
        raise TypeError(f"usage: must be a statemachine.Usage, got {type(usage).__name__}")
    driving = DRIVING.get()
    if driving is not None:
        driving.spent = usage


def provider_model() -> str | None:
    """The ``model`` of the model provider driving the current turn, when it names one
    (a non-empty ``str``): the model it calls when neither the action nor the request
    names one, which the telemetry's chat spans name. ``None`` otherwise; never raises."""
    driving = DRIVING.get()
    if driving is None or driving.provider is None:
        return None
    try:
        model = getattr(driving.provider, "model", None)
    except Exception:  # a property that raises: no model known
        return None
    return model if isinstance(model, str) and model else None


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


def drive(turn: Turn, perform: Callable[[Action], object], provider: object = None) -> Finish:
    """Run ``turn`` to its ``Finish``, ``perform`` doing each action (sync). A model
    call interrupted after its provider said what it had used (:func:`report_usage`) is
    charged that on the turn's ``Cancelled``; ``provider`` is the model provider the
    drive shows (:func:`provider_model`)."""
    action = start(turn)
    with Driving(turn, provider) as driving:
        while type(action) is not Finish:
            event = perform(action)
            driving.spent = None  # the call's event says what it cost
            action = turn.send(event)
    return action


async def adrive(
    turn: Turn, perform: Callable[[Action], Awaitable[object]], provider: object = None
) -> Finish:
    """:func:`drive` with an asyncio ``perform``."""
    action = start(turn)
    with Driving(turn, provider) as driving:
        while type(action) is not Finish:
            event = await perform(action)
            driving.spent = None  # the call's event says what it cost
            action = turn.send(event)
    return action
