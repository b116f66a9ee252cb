"""The engine between an agent framework's loop and its model, written once for both
integrations.

Theory of operation. A framework's agent loop calls its model once per step (a
request), runs the tools the reply asked for itself, and sends their results with
the next request. Each such request is one engine turn: ``Bridge.request`` opens a
turn, answers its ``Assemble`` from the framework's messages (reduced when the engine
says so), performs each ``CallModel`` on the model the engine names (the first, or a
fallback), sleeps through each ``Wait`` with the injected ``sleep``, and returns the
reply to the framework when the engine has accepted it. A reply with tool calls
leaves the turn at ``InvokeTools``: the framework runs them, and the next request's
messages say how they went, which ``settle_tools`` sends as ``ToolsDone`` before the
next turn opens. So the session sees every tool call (its doom-loop guard counts
them) and every spend, and its bounds hold across the agent's run: a limit that
fires makes the next request the final-answer turn (tools withheld, the engine's
instruction appended), and a request after that raises :class:`TurnFailed`.

A streamed request hands the stream over once its first event arrived (an error
before that is an ordinary failed call, retried or not as the engine says); after
the hand-over a failure is reported ``partial=True`` with the usage the stream had
reported, so the engine ends the turn ``stream_interrupted`` and nothing is resent.

Nothing here imports a framework.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import attrs

from ..core._actions import Action, Assemble, CallModel, Finish, InvokeTools, Wait
from ..core._events import (
    Assembled,
    Cancelled,
    CannotShrink,
    ModelFailed,
    ModelReplied,
    ToolsDone,
    WaitDone,
)
from ..core._exceptions import ConfigError, SessionEnded, TurnInProgress
from ..core._model_error import ModelError
from ..core._session import Session, Turn
from ..core._settings import Settings
from ..core._taxonomy import SessionStatus, ToolErrorCategory, TurnStatus
from ..core._tool_calls import ToolCall, ToolOutcome
from ..core._usage import Usage
from ..io._classify import classify
from ..io._loop import cancel, text_of

__all__ = [
    "Bridge",
    "CallResult",
    "TurnFailed",
    "classify_raised",
    "listed",
    "model_names",
    "no_outcome",
    "outcome",
    "settings_for",
]

_V = TypeVar("_V")

MAX_TOOL_TEXT = 4000
"""Characters of a tool result kept in ``ToolsDone`` (the framework keeps the rest)."""


class TurnFailed(RuntimeError):
    """The engine ended a model request's turn without a reply the framework can use.

    ``status`` names why: a :class:`~statemachine.TurnStatus` (``auth_error``,
    ``rate_limited`` retries spent as ``retries_exhausted``, ``retry_deferred``,
    ``content_filtered``, ``stream_interrupted``...) or, for a request made after the
    session ended, the :class:`~statemachine.SessionStatus` that ended it.
    ``finish`` is the turn's :class:`~statemachine.Finish` (``None`` for a session that
    had ended), ``error`` the model error that ended it, ``retry_at`` (for
    ``retry_deferred``) when, on the session's clock, the server said to come back.
    """

    def __init__(self, status: TurnStatus | SessionStatus | str, finish: Finish | None = None):
        self.status = status
        self.finish = finish
        self.error: ModelError | None = None if finish is None else finish.error
        self.retry_at: float | None = None if finish is None else finish.retry_at
        super().__init__(self._describe())

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt from what it was made of: the default (cls(*args), args being the
        # message) would read the message as the status, "the session has ended (...)"
        return (type(self), (self.status, self.finish), self.__dict__)

    def _describe(self) -> str:
        if self.finish is None:
            return (
                f"the session has ended ({self.status}): no model request goes out after "
                "its final-answer turn; start a new session for a new conversation"
            )
        text = f"the engine ended the turn {self.status}"
        if self.error is not None:
            text += f" ({self.error.category}"
            if self.error.message:
                text += f": {self.error.message[:300]}"
            text += ")"
        asked = None if self.error is None else self.error.retry_after_seconds
        if asked is not None and self.status == TurnStatus.RETRY_DEFERRED:
            # retry_at alone is a reading of the session's clock (time.monotonic unless
            # given), a number a reader cannot turn into a wait
            text += (
                f"; the server asked to wait {asked:g} s, longer than the engine waits "
                "(Settings.max_server_wait_s)"
            )
        if self.retry_at is not None:
            text += f"; come back at {self.retry_at:.1f} on the session's clock"
        return text


def listed(models: object) -> list[Any]:
    """``models`` (a list or tuple of models) as a list; anything else (a string, a
    set, one object of the wrong type) is a ``ConfigError`` naming it."""
    if not isinstance(models, list | tuple):
        raise ConfigError(f"models: expected a model or a list of models, got {models!r:.80}")
    return list(models)


def model_names(models: list[Any], name_of: Callable[[Any], str]) -> tuple[str, ...]:
    """The engine names of ``models`` (first = default, the rest = the fallback chain);
    a list with no model, or two models of one name, is a ``ConfigError``."""
    if not models:
        raise ConfigError("models: expected a model or a non-empty list of models, got none")
    names = tuple(name_of(model) for model in models)
    for index, name in enumerate(names):
        if names.index(name) != index:
            raise ConfigError(
                f"models: two models are named {name!r}; the engine routes fallbacks by "
                "name, so each model of the chain needs its own"
            )
    return names


def settings_for(settings: Settings | None, names: tuple[str, ...]) -> Settings:
    """``settings`` with ``fallback_models`` set to the chain after ``names[0]``; a
    ``fallback_models`` that names another chain is a ``ConfigError``."""
    base = Settings() if settings is None else settings
    if not isinstance(base, Settings):
        raise ConfigError(f"settings: must be a statemachine.Settings, got {settings!r}")
    chain = names[1:]
    if base.fallback_models and base.fallback_models != chain:
        raise ConfigError(
            f"settings.fallback_models: {list(base.fallback_models)} differs from the models "
            f"given after the first ({list(chain)}): give the chain once, as the models list"
        )
    return base if base.fallback_models == chain else attrs.evolve(base, fallback_models=chain)


def classify_raised(exc: BaseException) -> ModelError:
    """The engine's error for an exception a framework raised from a model call: the
    SDK exception it wraps (its ``__cause__`` chain) when there is one, else its HTTP
    status and body when it carries them, else ``exc`` itself."""
    for link in _chain(exc):
        root = type(link).__module__.split(".")[0]
        if root in {"openai", "anthropic", "httpx", "httpx2"}:
            return classify(link)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return classify((status, {}, getattr(exc, "body", None)))
    return classify(exc)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def tool_text(content: Any) -> str:
    """A tool result as bounded text for ``ToolOutcome.content``."""
    text = content if isinstance(content, str) else text_of(_Shown(content), MAX_TOOL_TEXT)
    return text if len(text) <= MAX_TOOL_TEXT else text[: MAX_TOOL_TEXT - 3] + "..."


class _Shown(Exception):
    """``str`` of any value through ``text_of`` (bounded, valid text, never raising)."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value

    def __str__(self) -> str:
        return str(self.value)


CallResult = tuple[ModelReplied | ModelFailed | None, _V | None]
"""What a call gave: the event for the engine and the framework's value (its reply, or
an opened stream with ``None`` as the event: handed over, settled later)."""


class Run:
    """One agent run: its bridge to the session and how far its history is cut."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.cut = 1
        """Messages from this index on are sent (with the first); 1: nothing dropped."""


def bridges(
    settings: Settings,
    *,
    seed: int | None,
    clock: Callable[[], float] | None,
    wall_clock: Callable[[], float] | None,
    sleep: Callable[[float], Any] | None,
    session: Session | None,
    failure: type[TurnFailed],
) -> tuple[Callable[[], Bridge], Run | None]:
    """What makes each run's bridge, and the one run every call shares when the host
    gave its ``session``. A bridge is built here, so a bad seed, clock or sleep is
    refused when the model is, not at its first request."""
    new_bridge = functools.partial(
        Bridge,
        settings,
        seed=seed,
        clock=clock,
        wall_clock=wall_clock,
        sleep=sleep,
        session=session,
        failure=failure,
    )
    first = new_bridge()
    return new_bridge, (Run(first) if session is not None else None)


def token_cost(
    price_per_mtok: tuple[float, float] | None, tokens_in: int | None, tokens_out: int | None
) -> float | None:
    """What the tokens cost at ``price_per_mtok``: ``None`` without a price, without a
    token, or past a float."""
    if price_per_mtok is None or not (tokens_in or tokens_out):
        return None
    price_in, price_out = (float(price) for price in price_per_mtok)
    cost = ((tokens_in or 0) * price_in + (tokens_out or 0) * price_out) / 1_000_000
    return cost if math.isfinite(cost) else None


class Bridge:
    """One conversation's session, and the turn whose tool calls the framework is
    running. See the module docstring."""

    def __init__(
        self,
        settings: Settings,
        *,
        seed: int | None = None,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Any] | None = None,
        session: Session | None = None,
        failure: type[TurnFailed] = TurnFailed,
    ) -> None:
        if session is not None and not isinstance(session, Session):
            raise ConfigError(f"session: must be a statemachine.Session, got {session!r}")
        if sleep is not None and not callable(sleep):
            raise ConfigError(f"sleep: must be a function of seconds, got {sleep!r}")
        if session is None:
            session = Session(
                settings,
                seed=seed,
                clock=time.monotonic if clock is None else clock,
                wall_clock=time.time if wall_clock is None else wall_clock,
            )
        elif session.settings.fallback_models != settings.fallback_models:
            raise ConfigError(
                f"session: its settings.fallback_models {list(session.settings.fallback_models)} "
                f"are not the models given after the first ({list(settings.fallback_models)})"
            )
        self.session = session
        self._sleep: Callable[[float], Any] = asyncio.sleep if sleep is None else sleep
        self._pending: Turn | None = None
        self._failure = failure

    # -- the tool round the framework ran between two requests ---------------------

    @property
    def busy(self) -> bool:
        """Whether a request is out or the last reply's tools have not been reported."""
        turn = self.session.current_turn
        return self._pending is not None or (turn is not None and not turn.done)

    @property
    def pending_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls of the last reply, whose results the next request brings."""
        turn = self._pending
        if turn is None or not turn.current or not isinstance(turn.action, InvokeTools):
            return ()
        return turn.action.calls

    def settle_tools(self, outcome_of: Callable[[ToolCall], ToolOutcome | None]) -> None:
        """Send the pending turn the outcomes of its tool calls (``outcome_of(call)``;
        ``None``: the framework brought no result for it, a ``cancelled`` outcome)."""
        calls = self.pending_calls
        turn, self._pending = self._pending, None
        if turn is None or not calls:
            return
        outcomes = tuple(
            outcome_of(call)
            or ToolOutcome(
                call.id,
                ok=False,
                content="the framework sent the next request without this call's result",
                category=ToolErrorCategory.CANCELLED,
            )
            for call in calls
        )
        action = turn.send(ToolsDone(outcomes))
        if not isinstance(action, Finish):  # a re-invocation the framework cannot do
            turn.send(Cancelled(reason="the framework runs its tools itself"))

    # -- one request ------------------------------------------------------------------

    async def request(
        self,
        assemble: Callable[[Assemble], Assembled | CannotShrink],
        call: Callable[[CallModel], Awaitable[CallResult[_V]]],
    ) -> tuple[Turn, _V]:
        """Run one framework request as a new turn. Returns the turn and the value of
        the call the engine accepted; for a stream handed over, the turn is left at
        ``calling`` and :meth:`settle` must be given the stream's end."""
        turn = self._open()
        action: Action = turn.start()
        try:
            while True:
                if isinstance(action, Assemble):
                    action = turn.send(assemble(action))
                elif isinstance(action, CallModel):
                    event, value = await call(action)
                    if event is None:  # a stream handed over: settled later
                        return turn, value  # type: ignore[return-value]
                    action = turn.send(event)
                    if isinstance(action, InvokeTools | Finish):
                        return turn, self._end(turn, action, value)
                elif isinstance(action, Wait):
                    slept = self._sleep(action.seconds)
                    if inspect.isawaitable(slept):
                        await slept
                    action = turn.send(WaitDone())
                else:
                    return turn, self._end(turn, action, None)
        except BaseException as exc:
            cancel(turn, exc)
            raise

    def settle(self, turn: Turn, event: ModelReplied | ModelFailed) -> None:
        """Send a handed-over stream's end (its reply, or its failure, ``partial`` once
        anything was delivered); raises :class:`TurnFailed` when the turn failed."""
        if not turn.current or turn.done:
            return
        self._end(turn, turn.send(event), None)

    def abandon(self, turn: Turn, exc: BaseException, usage: Usage | None = None) -> None:
        """Cancel ``turn`` because ``exc`` escaped the framework while it held it;
        ``usage``: what the stream it handed over had used so far (its cost charged)."""
        cancel(turn, exc, usage)

    def _open(self) -> Turn:
        if self._pending is not None:  # the last reply's tools, with no results brought
            self.settle_tools(no_outcome)
        try:
            return self.session.new_turn()
        except TurnInProgress as exc:
            raise TurnInProgress(
                "another model request of this session is still running: a session serves "
                "one request at a time, so agent runs that overlap (asyncio tasks, threads) "
                "each need their own; leave session= unset for one session per run"
            ) from exc
        except SessionEnded as exc:
            status = self.session.status
            raise self._failure(status if status is not None else "ended") from exc

    def _end(self, turn: Turn, action: Action, value: _V | None) -> _V:
        if isinstance(action, InvokeTools):
            self._pending = turn
            return value  # type: ignore[return-value]
        if not isinstance(action, Finish):  # pragma: no cover - a reply's step ends here
            raise TypeError(f"unexpected action {action!r} at the end of a model call")
        if action.status is TurnStatus.COMPLETED:
            return value  # type: ignore[return-value]
        raise self._failure(action.status, action)


def no_outcome(call: ToolCall) -> None:
    """No result for ``call``: the framework brought none."""


def outcome(
    call: ToolCall,
    ok: bool,
    content: Any,
    category: ToolErrorCategory | None,
    *,
    invoke_failed: bool = False,
) -> ToolOutcome:
    """The outcome of ``call`` the framework reported, as the engine takes it
    (``invoke_failed``: the framework says the tool raised)."""
    return ToolOutcome(
        call.id,
        ok=ok,
        content=tool_text(content),
        category=category,
        invoke_failed=invoke_failed,
    )
