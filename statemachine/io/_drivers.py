"""The engine with I/O attached: ``run_turn`` and ``arun_turn``.

A driver is a thin loop around the sans-IO turn (the loop of :mod:`._loop`, as
httpcore's connection is a thin loop around h11), and the one place errors are
translated:

* ``model.complete(action)`` raising ``exc`` becomes ``ModelFailed(classify(exc))``
  (``complete`` may also *return* a ``ModelFailed``). A value the engine refuses at its
  door (:class:`~statemachine.InvalidValue`) is the provider's bug, not the model's:
  re-raised naming the call (which may have succeeded, and been billed).
* ``tools.invoke(call)`` raising becomes a failed ``ToolOutcome`` (``timeout`` for any
  library's timeout, else ``unknown``); it never escapes.
* ``model_timeout_s`` and ``tool_timeout_s`` bound each call: with ``asyncio.timeout``,
  or in the sync driver on a daemon thread that is abandoned when time is up (Python
  cannot kill a thread: give the SDK client its own timeout too).
* Anything that escapes (a cancel, ``KeyboardInterrupt``) cancels the turn first.

**One retry owner.** A model provider that is, or holds a few links deep, an SDK client
whose ``max_retries`` is not 0 is refused with ``ConfigError`` before anything is sent:
SDK retries would multiply with the engine's.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
import types
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, NoReturn, Protocol, TypeVar

from ..core._actions import Action, Assemble, CallModel, Finish, InvokeTools, Wait
from ..core._events import (
    Assembled,
    CannotShrink,
    ModelFailed,
    ModelReplied,
    ToolsDone,
    WaitDone,
)
from ..core._exceptions import ConfigError, InvalidValue
from ..core._session import Turn
from ..core._taxonomy import ToolErrorCategory
from ..core._tool_calls import ToolCall, ToolOutcome
from ._classify import classify, is_timeout
from ._loop import adrive, drive, text_of

_T = TypeVar("_T")


class ContextProvider(Protocol):
    """Assembles the request for the model (sync)."""

    def assemble(self, action: Assemble) -> Assembled | CannotShrink: ...


class ModelProvider(Protocol):
    """Calls the model (sync). May return ``ModelFailed`` instead of raising.

    It may have a ``model`` attribute, a non-empty ``str``: the model it calls when
    neither ``CallModel.model`` nor the request names one (the ready-made providers'
    ``model=``). The drivers show it to the session's observers, so the telemetry's chat
    spans name it (``statemachine.io._loop.provider_model``)."""

    def complete(self, action: CallModel) -> ModelReplied | ModelFailed: ...


class ToolProvider(Protocol):
    """Runs one tool call (sync)."""

    def invoke(self, call: ToolCall) -> ToolOutcome: ...


class AsyncContextProvider(Protocol):
    """Assembles the request for the model (asyncio)."""

    async def assemble(self, action: Assemble) -> Assembled | CannotShrink: ...


class AsyncModelProvider(Protocol):
    """Calls the model (asyncio). May return ``ModelFailed`` instead of raising; its
    ``model`` attribute, if any, as :class:`ModelProvider`'s."""

    async def complete(self, action: CallModel) -> ModelReplied | ModelFailed: ...


class AsyncToolProvider(Protocol):
    """Runs one tool call (asyncio); the driver runs one round's calls concurrently."""

    async def invoke(self, call: ToolCall) -> ToolOutcome: ...


# -- shared pieces ------------------------------------------------------------------


def check_retry_owner(model: object) -> None:
    """Refuse a model provider that is or holds an SDK client retrying on its own: in
    any attribute or slot, in a container, behind a bound method or a closure, a few
    levels deep (not only an attribute named ``client``)."""
    for where, candidate in _held(model, "model", _HELD_DEPTH, set()):
        if not _is_sdk_client(candidate):
            continue
        retries = getattr(candidate, "max_retries", None)
        if isinstance(retries, int) and retries != 0:
            raise ConfigError(
                f"{where}: the {type(candidate).__module__.split('.')[0]} client "
                f"{type(candidate).__name__} has max_retries={retries}, but the engine owns "
                "retries (SDK retries would multiply with the engine's). Create it with "
                "max_retries=0, pass client.with_options(max_retries=0), or use "
                "statemachine.providers, which does that for you."
            )


_HELD_DEPTH = 4
"""How many links from the provider a client is looked for."""
_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type, type(None), types.ModuleType)


def _held(obj: object, where: str, depth: int, seen: set[int]) -> Iterator[tuple[str, object]]:
    """``obj`` and what it holds, with where: attributes and slots, the items of a
    container (64 at most), a bound method's object, a function's closure."""
    yield where, obj
    if depth == 0 or isinstance(obj, _LEAVES) or id(obj) in seen or _is_sdk_client(obj):
        return
    seen.add(id(obj))
    children: list[tuple[str, object]] = []
    if isinstance(obj, dict):
        children = [(f"{where}[{k!r:.40}]", v) for k, v in list(obj.items())[:64]]
    elif isinstance(obj, list | tuple | set | frozenset):
        children = [(f"{where}[{i}]", v) for i, v in enumerate(list(obj)[:64])]
    elif inspect.ismethod(obj):
        children = [(f"{where}.__self__", obj.__self__)]
    elif inspect.isfunction(obj):
        cells = obj.__closure__ or ()
        children = [(f"{where}.<closure>", c.cell_contents) for c in cells if _filled(c)]
    else:
        children = [(f"{where}.{name}", value) for name, value in _attributes(obj)]
    for place, child in children:
        yield from _held(child, place, depth - 1, seen)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _attributes(obj: object) -> list[tuple[str, object]]:
    """``obj``'s instance attributes and filled slots (no properties: nothing runs)."""
    try:
        found = dict(vars(obj))
    except TypeError:
        found = {}
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in found and name not in ("__dict__", "__weakref__"):
                try:
                    found[name] = object.__getattribute__(obj, name)
                except AttributeError:
                    continue
    return list(found.items())[:64]


def _is_sdk_client(obj: object) -> bool:
    """An OpenAI or Anthropic client, or any client the same generator made (the
    Stainless SDKs: Groq, Together, Cerebras...), whose ``max_retries`` retries."""
    root = type(obj).__module__.split(".")[0]
    if root in {"anthropic", "openai"} and hasattr(obj, "max_retries"):
        return True
    return hasattr(obj, "max_retries") and any(
        cls.__module__.endswith("._base_client") for cls in type(obj).__mro__
    )


def _context_event(action: Assemble, event: object) -> Assembled | CannotShrink:
    if not isinstance(event, Assembled | CannotShrink):
        raise TypeError(
            f"context.assemble({action!r}) must return Assembled or CannotShrink, got {event!r}"
        )
    return event


def _model_event(action: CallModel, event: object) -> ModelReplied | ModelFailed:
    if not isinstance(event, ModelReplied | ModelFailed):
        raise TypeError(
            f"model.complete(attempt={action.attempt}, model={action.model!r}) must return "
            f"ModelReplied or ModelFailed, got {event!r}"
        )
    return event


def _timeout_error(what: str, seconds: float) -> TimeoutError:
    return TimeoutError(f"{what} timed out after {seconds:g}s (driver timeout)")


def tool_outcome(call: ToolCall, outcome: object) -> ToolOutcome:
    """``outcome`` if it is the ToolOutcome of ``call``, else a failed one saying what
    the tool provider returned instead."""
    if isinstance(outcome, ToolOutcome) and outcome.call_id == call.id:
        return outcome
    return ToolOutcome(
        call.id,
        ok=False,
        content=(
            f"tools.invoke({call.name!r}) must return a ToolOutcome for call id "
            f"{call.id!r}, got {outcome!r}"
        ),
        category=ToolErrorCategory.UNKNOWN,
    )


def tool_failure(call: ToolCall, exc: Exception) -> ToolOutcome:
    """The failed outcome of a tool call that raised ``exc``: ``timeout`` for any
    library's timeout, else ``unknown``, the raw error in ``details``; an invocation
    that failed (``invoke_failed``), which the crash breaker counts."""
    if is_timeout(exc, {cls.__name__ for cls in type(exc).__mro__}):
        category = ToolErrorCategory.TIMEOUT
    else:
        category = ToolErrorCategory.UNKNOWN
    return ToolOutcome(
        call.id,
        ok=False,
        content=f"{type(exc).__name__}: {text_of(exc)}",
        category=category,
        details=error_details(exc),
        invoke_failed=True,
    )


def error_details(exc: BaseException) -> dict[str, str]:
    """The raw underlying error as JSON data (``ToolOutcome.details``): its type, with
    module, and its message, bounded and made valid text."""
    kind = type(exc)
    return {"type": f"{kind.__module__}.{kind.__qualname__}", "message": text_of(exc)}


def _limits(turn: Turn, model: object) -> tuple[float | None, float | None]:
    """The model and tool call timeouts of ``turn``'s settings, once ``model`` is
    known not to retry on its own."""
    check_retry_owner(model)
    settings = turn.session.settings if isinstance(turn, Turn) else None
    return (settings.model_timeout_s, settings.tool_timeout_s) if settings else (None, None)


def _unexpected(action: object) -> NoReturn:
    raise TypeError(f"unexpected action {action!r}")


# -- sync ----------------------------------------------------------------------------


def run_turn(
    turn: Turn,
    *,
    model: ModelProvider,
    tools: ToolProvider,
    context: ContextProvider,
    sleep: Callable[[float], Any] | None = None,
) -> Finish:
    """Run ``turn`` to its ``Finish``, executing every action with the providers.

    Starts the turn if it is not started (and resumes it from its last action if
    it is); returns at once with the ``Finish`` of a finished turn. Tool calls run
    one after the other. See the module docstring for errors, timeouts and
    cancellation.
    """
    model_limit, tool_limit = _limits(turn, model)
    do_sleep = time.sleep if sleep is None else sleep

    def perform(action: Action) -> object:
        if isinstance(action, Assemble):
            return _context_event(action, context.assemble(action))
        if isinstance(action, CallModel):
            return _sync_model(model, action, model_limit)
        if isinstance(action, Wait):
            do_sleep(action.seconds)
            return WaitDone()
        if isinstance(action, InvokeTools):
            return ToolsDone(tuple(_sync_tool(tools, call, tool_limit) for call in action.calls))
        _unexpected(action)  # pragma: no cover - the engine emits no other action

    return drive(turn, perform, model)


def _sync_model(model: ModelProvider, action: CallModel, limit: float | None) -> object:
    try:
        event = _bounded(lambda: model.complete(action), limit, "model call")
    except InvalidValue as exc:
        raise provider_bug(action, exc) from exc
    except Exception as exc:
        return ModelFailed(classify(exc))
    return _model_event(action, event)


def provider_bug(action: CallModel, exc: InvalidValue) -> InvalidValue:
    """The error a driver raises when a model provider built a value the engine refuses."""
    return InvalidValue(
        f"model.complete(attempt={action.attempt}, model={action.model!r}) built a value "
        f"the engine refuses: {exc}. This is a bug in the model provider, not a model "
        "failure (the call itself may have succeeded, and been billed): fix the provider"
    )


def _sync_tool(tools: ToolProvider, call: ToolCall, limit: float | None) -> ToolOutcome:
    try:
        return tool_outcome(call, _bounded(lambda: tools.invoke(call), limit, f"tool {call.name}"))
    except Exception as exc:
        return tool_failure(call, exc)


def _bounded(fn: Callable[[], _T], limit: float | None, what: str) -> _T:
    """``fn()``, or ``TimeoutError`` after ``limit`` seconds (on a daemon thread)."""
    if limit is None:
        return fn()
    done = threading.Event()
    box: list[Any] = []

    def work() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:
            box.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=work, name=f"statemachine {what}", daemon=True).start()
    if not done.wait(limit):
        raise _timeout_error(what, limit)
    ok, value = box[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


# -- asyncio -------------------------------------------------------------------------


async def arun_turn(
    turn: Turn,
    *,
    model: AsyncModelProvider,
    tools: AsyncToolProvider,
    context: AsyncContextProvider,
    sleep: Callable[[float], Awaitable[Any]] | None = None,
) -> Finish:
    """The asyncio twin of :func:`run_turn`; the tool calls of a round run concurrently.

    ``sleep`` defaults to ``asyncio.sleep``; a plain function is accepted too (its
    result is awaited only when it is awaitable), which is handy for a fake clock.
    """
    model_limit, tool_limit = _limits(turn, model)
    do_sleep: Callable[[float], Any] = asyncio.sleep if sleep is None else sleep

    async def perform(action: Action) -> object:
        if isinstance(action, Assemble):
            return _context_event(action, await context.assemble(action))
        if isinstance(action, CallModel):
            return await _async_model(model, action, model_limit)
        if isinstance(action, Wait):
            result = do_sleep(action.seconds)
            if inspect.isawaitable(result):
                await result
            return WaitDone()
        if isinstance(action, InvokeTools):
            return ToolsDone(await _async_tools(tools, action.calls, tool_limit))
        _unexpected(action)  # pragma: no cover - the engine emits no other action

    return await adrive(turn, perform, model)


async def _async_model(model: AsyncModelProvider, action: CallModel, limit: float | None) -> object:
    try:
        call = model.complete(action)  # no timeout to enter: the common case, one await
        event = await (call if limit is None else _within(call, limit, "model call"))
    except InvalidValue as exc:
        raise provider_bug(action, exc) from exc
    except Exception as exc:
        return ModelFailed(classify(exc))
    return _model_event(action, event)


async def _within(call: Awaitable[_T], limit: float, what: str) -> _T:
    """``await call``, or ``TimeoutError`` saying ``what`` ran out of ``limit`` seconds."""
    try:
        async with asyncio.timeout(limit):
            return await call
    except TimeoutError as exc:
        if str(exc):
            raise
    raise _timeout_error(what, limit)  # (out of the handler: a fresh error, as the sync one)


async def _async_tools(
    tools: AsyncToolProvider, calls: tuple[ToolCall, ...], limit: float | None
) -> tuple[ToolOutcome, ...]:
    if len(calls) == 1:
        return (await _async_tool(tools, calls[0], limit),)
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(_async_tool(tools, call, limit)) for call in calls]
    return tuple(task.result() for task in tasks)


async def _async_tool(tools: AsyncToolProvider, call: ToolCall, limit: float | None) -> ToolOutcome:
    try:
        invoked = tools.invoke(call)
        outcome = await (invoked if limit is None else _within(invoked, limit, f"tool {call.name}"))
    except Exception as exc:
        return tool_failure(call, exc)
    return tool_outcome(call, outcome)
