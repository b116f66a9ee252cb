"""The engine inside Temporal workflows, behind :mod:`statemachine.temporal` (whose
docstring lists the pieces): the activities over a host's providers, the workflow-side
driver, and the ready-made workflow, each usable on its own.

Failures cross the activity boundary as data, never raised: a model call's exception is
classified inside the activity (``ModelFailed``), a tool's becomes a failed
``ToolOutcome``, so the engine, not Temporal's retry policy, reacts to each. Everything
the workflow holds is JSON data (the engine's codec), so the default data converter
serialises it and :mod:`._temporal_replay` reads it back from a history.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import hashlib
import inspect
import threading
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import attrs

try:
    from temporalio import activity, workflow
    from temporalio.common import RetryPolicy
    from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
    from temporalio.exceptions import CancelledError as TemporalCancelled
    from temporalio.exceptions import TimeoutError as TemporalTimeout
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
    from temporalio.workflow import ActivityCancellationType
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    raise ImportError(
        f"statemachine.temporal needs the Temporal SDK: pip install 'turnstate[temporal]' ({exc})"
    ) from exc

from ..core._actions import Action, Assemble, CallModel, Finish, InvokeTools, Wait
from ..core._codec import decode, encode
from ..core._events import (
    Assembled,
    Cancelled,
    CannotShrink,
    ModelFailed,
    ModelReplied,
    ToolsDone,
    WaitDone,
)
from ..core._exceptions import (
    ConfigError,
    IllegalEvent,
    InvalidValue,
    SessionEnded,
    SnapshotError,
    TurnInProgress,
)
from ..core._model_error import ModelError
from ..core._session import Session, Turn
from ..core._settings import Settings
from ..core._taxonomy import ErrorCategory, SessionStatus, ToolErrorCategory, TurnStatus
from ..core._tool_calls import ToolCall, ToolOutcome
from ..core._trace import TraceRecord
from ..core._usage import Usage
from ._classify import classify
from ._drivers import check_retry_owner, provider_bug, tool_failure, tool_outcome
from ._loop import CallCancelled, adrive

ASSEMBLE = "turnstate.assemble"
"""The context activity's name: ``{"action": Assemble, "prompt", "turns"}`` in,
``{"assembled": {"request", "size"}}`` or ``{"cannot_shrink": true}`` out."""
COMPLETE = "turnstate.complete"
"""The model activity's name: a ``CallModel`` in, ``{"replied": ...}`` or
``{"failed": ...}`` out; a call cancelled after the provider reported what it cost
(:func:`report_usage`), ``{"cancelled": {"cost", "usage"}}``."""
INVOKE = "turnstate.invoke"
"""The tool activity's name: one ``ToolCall`` in, its ``ToolOutcome`` out."""
WORKFLOW = "turnstate.Session"
"""The ready-made workflow's type name."""

PASSTHROUGH_MODULES = ("statemachine", "attrs", "transitions")
"""Modules a workflow worker passes through its sandbox: the engine is deterministic
and does no I/O, and attrs' generated ``__repr__`` keeps a ``threading.local`` that a
re-imported (sandboxed) attrs may not touch."""

BUG_ERRORS: tuple[type[Exception], ...] = (
    IllegalEvent,
    ConfigError,
    SnapshotError,
    SessionEnded,
    TurnInProgress,
)
"""Engine errors that mean a bug (in the host or its data): they fail the workflow
(``failure_exception_types``) instead of its task, which Temporal would retry forever."""

DEFAULT_ACTIVITY_TIMEOUT_S = 300.0
"""``start_to_close_timeout`` of a model or tool activity when the settings give no
``model_timeout_s`` / ``tool_timeout_s``."""

DEFAULT_HEARTBEAT_TIMEOUT_S = 2.0
"""``heartbeat_timeout`` of a model or tool activity unless set: the activity heartbeats
every third of it while the provider's call runs, so a dead worker is noticed within it
(an ``overloaded``/``timeout`` failure, a ``timeout`` tool outcome). It also bounds a
cancel's way to the call: the server hands a cancel over only in the answer to a
heartbeat, which the SDK sends at most once per 0.8 x this timeout (within 1.6 s)."""

STICKY_QUEUE_TIMEOUT_S = 3.0
"""What to give a worker as ``sticky_queue_schedule_to_start_timeout`` (Temporal's
default is 10 s): how long a dead worker's workflows wait on its sticky queue before
another worker may take them (and replay their histories)."""


def sandbox_restrictions() -> SandboxRestrictions:
    """Temporal's default sandbox restrictions with :data:`PASSTHROUGH_MODULES`
    passed through."""
    return SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH_MODULES)


def sandbox_runner() -> SandboxedWorkflowRunner:
    """A ``Worker(workflow_runner=...)`` that keeps the sandbox and passes the engine
    through it (:func:`sandbox_restrictions`)."""
    return SandboxedWorkflowRunner(restrictions=sandbox_restrictions())


# -- the wire format ------------------------------------------------------------------


def _value(data: Any, kind: type, where: str) -> Any:
    value = decode(data, where)
    if not isinstance(value, kind):
        raise TypeError(f"{where}: expected an encoded {kind.__name__}, got {data!r:.200}")
    return value


def _usage_of(data: dict[str, Any], where: str) -> Usage | None:
    raw = data.get("usage")
    return None if raw is None else _value(raw, Usage, where)


def model_event_data(event: ModelReplied | ModelFailed | Cancelled) -> dict[str, Any]:
    """A model activity's result as JSON data."""
    if isinstance(event, ModelReplied):
        kind = "replied"
        data = {
            "tool_calls": encode(event.tool_calls),
            "cost": event.cost,
            "reply": event.reply_data,
        }
    elif isinstance(event, Cancelled):
        kind = "cancelled"
        data = {"cost": event.cost}
    else:
        kind = "failed"
        data = {"error": encode(event.error), "partial": event.partial, "cost": event.cost}
    if event.usage is not None:
        data["usage"] = encode(event.usage)
    return {kind: data}


def model_event(data: Any) -> ModelReplied | ModelFailed | Cancelled:
    """The engine event a model activity's result stands for."""
    parts: Any = data if isinstance(data, dict) else {}
    if isinstance(replied := parts.get("replied"), dict):
        return ModelReplied(
            decode(replied.get("tool_calls", []), "replied.tool_calls"),
            cost=replied.get("cost", 0.0),
            reply=replied.get("reply"),
            usage=_usage_of(replied, "replied.usage"),
        )
    if isinstance(failed := parts.get("failed"), dict):
        return ModelFailed(
            _value(failed.get("error"), ModelError, "failed.error"),
            partial=failed.get("partial", False),
            cost=failed.get("cost", 0.0),
            usage=_usage_of(failed, "failed.usage"),
        )
    if isinstance(cancelled := parts.get("cancelled"), dict):
        cost, usage = reported_spend(cancelled)
        return Cancelled(CANCELLED_CALL, cost=cost, usage=usage)
    raise TypeError(f"a model activity result must hold 'replied' or 'failed', got {data!r:.200}")


CANCELLED_CALL = "the workflow was cancelled while the model call was in flight"


def cancelled_call(event: ModelReplied | ModelFailed | Cancelled) -> CallCancelled:
    """The workflow's cancel, asked while the model call ran: the turn ends
    ``cancelled`` whatever came back first, charged what ``event`` cost."""
    return CallCancelled(CANCELLED_CALL, event.cost, event.usage)


def reported_spend(reported: Any) -> tuple[float, Usage | None]:
    """The cost and usage :func:`report_usage` heartbeated (a cost that is not a
    finite number >= 0 counts as 0)."""
    if not isinstance(reported, dict):
        reported = {}
    cost = reported.get("cost", 0.0)
    cost = cost if type(cost) in (int, float) and 0 <= cost < float("inf") else 0.0
    return float(cost), _usage_of(reported, "heartbeat.usage")


def lost_model(lost: bool, details: Sequence[Any] = ()) -> ModelFailed:
    """What a model activity that ran out of time (``lost``: missed its heartbeat, its
    worker died or hung) stands for: ``overloaded`` with ``code="timeout"``, as the
    drivers' ``model_timeout_s``, charged what the last heartbeat's ``details`` reported
    (:func:`report_usage`)."""
    cost, usage = reported_spend(details[-1] if details else None)
    error = ModelError(ErrorCategory.OVERLOADED, _timed_out("model", lost), code="timeout")
    return ModelFailed(error, cost=cost, usage=usage)


def tool_timed_out(call: ToolCall, lost: bool) -> ToolOutcome:
    """What a tool activity that ran out of time stands for: a ``timeout`` outcome."""
    message = _timed_out("tool", lost)
    return ToolOutcome(call.id, ok=False, content=message, category=ToolErrorCategory.TIMEOUT)


def _timed_out(what: str, lost: bool) -> str:
    if lost:
        return f"the {what} activity missed its heartbeat (its worker died or hung)"
    return f"the {what} activity timed out (start_to_close_timeout)"


def tool_outcome_of(data: Any) -> ToolOutcome:
    """The outcome a tool activity's result stands for."""
    return _value(data, ToolOutcome, "ToolOutcome")  # type: ignore[no-any-return]


def context_event_data(event: Assembled | CannotShrink) -> dict[str, Any]:
    """A context activity's result as JSON data."""
    if isinstance(event, Assembled):
        return {"assembled": {"request": event.request, "size": event.size}}
    return {"cannot_shrink": True}


def context_event(data: Any) -> Assembled | CannotShrink:
    """The engine event a context activity's result stands for."""
    parts: Any = data if isinstance(data, dict) else {}
    if isinstance(parts.get("assembled"), dict):
        return Assembled(parts["assembled"].get("request"), parts["assembled"].get("size"))
    if parts.get("cannot_shrink") is True:
        return CannotShrink()
    raise TypeError(
        f"a context activity result must hold 'assembled' or 'cannot_shrink', got {data!r:.200}"
    )


# -- activities -----------------------------------------------------------------------


@attrs.frozen
class Conversation:
    """What a context provider's ``assemble`` reads through :func:`conversation`: the
    session's ``prompt`` (the workflow's input) and one record per finished turn
    (``turn``, ``status``, ``reply``, ``tool_results``), oldest first."""

    prompt: Any
    turns: tuple[Any, ...]


class ConversationStore(Protocol):
    """Where the context activities keep a session's turn records when the workflow
    sends each one only once (``SessionInput.store_conversation``): shared by every
    worker that runs the context activity. Methods may be sync or async."""

    def append(self, key: str, start: int, records: list[Any]) -> Any:
        """Keep ``records`` as the records from index ``start`` of conversation ``key``
        (a repeat overwrites the same records); ``LookupError`` if it holds fewer than
        ``start`` (some were lost: the store is not shared, or was emptied)."""

    def load(self, key: str) -> Any:
        """All of conversation ``key``'s records, oldest first (a list)."""


class InMemoryConversations:
    """A :class:`ConversationStore` in this process's memory: for one worker process
    (tests, development)."""

    def __init__(self) -> None:
        self._data: dict[str, list[Any]] = {}
        self._lock = threading.Lock()

    def append(self, key: str, start: int, records: list[Any]) -> None:
        """See :meth:`ConversationStore.append`."""
        with self._lock:
            held = self._data.setdefault(key, [])
            if start > len(held):
                raise LookupError(
                    f"conversation {key!r}: holds {len(held)} records, the next are sent "
                    f"from {start}: the ones between were kept elsewhere (a store every "
                    "worker of the context activity shares is needed)"
                )
            held[start : start + len(records)] = records

    def load(self, key: str) -> list[Any]:
        """See :meth:`ConversationStore.load`."""
        with self._lock:
            return list(self._data.get(key, ()))


@attrs.define
class Talk:
    """The conversation as the session loop sends it to the context activity: every
    record each time (``key`` ``None``), or only the records not sent yet, the first of
    them record number ``sent`` of conversation ``key`` in the context activities'
    :class:`ConversationStore`."""

    prompt: Any
    records: list[Any]
    key: str | None = None
    sent: int = 0

    def data(self, action: Assemble) -> dict[str, Any]:
        """The context activity's input for ``action``."""
        data = {"action": encode(action), "prompt": self.prompt, "turns": list(self.records)}
        if self.key is not None:
            data["conversation"] = {"key": self.key, "from": self.sent}
        return data

    def delivered(self) -> None:
        """The context activity took the records: with a store, they are sent."""
        if self.key is not None:
            self.sent += len(self.records)
            self.records = []


_CONVERSATION: contextvars.ContextVar[Conversation] = contextvars.ContextVar(
    "statemachine.temporal.conversation"
)
_REPORTED: contextvars.ContextVar[list[dict[str, Any]]] = contextvars.ContextVar(
    "statemachine.temporal.reported"
)


def conversation() -> Conversation:
    """The conversation of the context activity that is running (``LookupError``
    outside one)."""
    try:
        return _CONVERSATION.get()
    except LookupError:
        raise LookupError(
            "statemachine.temporal.conversation() is only available inside the "
            "context activity (a context provider's assemble())"
        ) from None


def report_usage(cost: float = 0.0, usage: Usage | None = None) -> None:
    """Say, inside the model activity, what the vendor has reported so far for the call
    in flight (a stream's first usage event, say): the activity heartbeats it, so a call
    lost with its worker, or cancelled with its workflow, is still charged ``cost`` (and
    keeps ``usage``); without a report it counts as 0. ``LookupError`` outside the model
    activity; ``ValueError`` for a cost that is not a finite number >= 0."""
    box = _REPORTED.get(None)
    if box is None:
        raise LookupError(
            "statemachine.temporal.report_usage() is only available inside the model "
            "activity (a model provider's complete())"
        )
    if isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost < float("inf"):
        raise ValueError(f"cost: must be a finite number >= 0, got {cost!r:.60}")
    if usage is not None and not isinstance(usage, Usage):
        raise InvalidValue(f"usage: must be a Usage or None, got {usage!r:.60}")
    box[:] = [{"cost": float(cost), "usage": None if usage is None else encode(usage)}]
    activity.heartbeat(*box)


async def _call(method: Callable[..., Any], *arguments: Any) -> Any:
    """``method(*arguments)``: awaited when it is a coroutine function, else on a
    thread (a sync SDK call must not block the worker's event loop)."""
    if inspect.iscoroutinefunction(method):
        return await method(*arguments)
    result = await asyncio.to_thread(method, *arguments)
    if inspect.isawaitable(result):
        result = await result
    return result


async def _beat(every: float, box: list[dict[str, Any]]) -> None:
    while True:
        activity.heartbeat(*box)
        await asyncio.sleep(every)


async def _heartbeating(
    method: Callable[[Any], Any], argument: Any, box: list[dict[str, Any]] | None = None
) -> Any:
    """:func:`_call`, heartbeating what :func:`report_usage` said last (kept in ``box``)
    every third of the heartbeat timeout while it runs (a sync method runs on a thread:
    the event loop beats for it). Cancelling the activity cancels an async call."""
    box = [] if box is None else box
    token = _REPORTED.set(box)
    timeout = activity.info().heartbeat_timeout
    beat = asyncio.create_task(_beat(timeout.total_seconds() / 3, box)) if timeout else None
    try:
        return await _call(method, argument)
    finally:
        if beat is not None:
            beat.cancel()
        _REPORTED.reset(token)


def _contract(message: str) -> ApplicationError:
    return ApplicationError(message, type="ProviderContractError", non_retryable=True)


def _returned(method: str, event: object, *kinds: type) -> Any:
    """``event`` if ``method`` returned one of ``kinds``, else a contract error."""
    if not isinstance(event, kinds):
        names = " or ".join(kind.__name__ for kind in kinds)
        raise _contract(f"{method} must return {names}, got {event!r}")
    return event


class Activities:
    """The three activities over a host's providers, as the drivers take them.

    ``model.complete(CallModel)``, ``tools.invoke(ToolCall)`` and
    ``context.assemble(Assemble)`` may be sync or async; register :attr:`all` with a
    worker. A model provider holding an SDK client that retries on its own is refused
    (``ConfigError``): the engine is the one retry owner. A provider that returns the
    wrong type fails the activity, and so the workflow, with a non-retryable
    ``ProviderContractError``: a bug, not a provider failure.
    """

    def __init__(
        self,
        *,
        model: object = None,
        tools: object = None,
        context: object = None,
        conversations: ConversationStore | None = None,
    ) -> None:
        if model is not None:
            check_retry_owner(model)
        self._model = model
        self._tools = tools
        self._context = context
        self._conversations = conversations

    @property
    def all(self) -> list[Callable[..., Any]]:
        """The activities whose provider was given, for ``Worker(activities=...)``."""
        pairs = (
            (self._context, self.assemble),
            (self._model, self.complete),
            (self._tools, self.invoke),
        )
        return [fn for provider, fn in pairs if provider is not None]

    @activity.defn(name=ASSEMBLE)
    async def assemble(self, data: dict[str, Any]) -> dict[str, Any]:
        """The context activity: ``context.assemble(action)``, with
        :func:`conversation` set."""
        action = _value(data.get("action"), Assemble, "action")
        turns = data.get("turns") or []
        kept = data.get("conversation")
        if isinstance(kept, dict):  # the workflow sends each record once: the store has the rest
            if self._conversations is None:
                raise _contract(
                    "the workflow keeps its conversation in the context activities' store "
                    "(SessionInput.store_conversation), but Activities got no conversations="
                )
            await _call(self._conversations.append, kept["key"], kept["from"], turns)
            turns = await _call(self._conversations.load, kept["key"])
        token = _CONVERSATION.set(Conversation(data.get("prompt"), tuple(turns)))
        try:
            event = await _call(self._context.assemble, action)  # type: ignore[attr-defined]
        finally:
            _CONVERSATION.reset(token)
        return context_event_data(_returned("context.assemble", event, Assembled, CannotShrink))

    @activity.defn(name=COMPLETE)
    async def complete(self, data: dict[str, Any]) -> dict[str, Any]:
        """The model activity: one attempt of ``model.complete(action)``; a raised
        error is classified here and returned, never raised."""
        action = _value(data, CallModel, "CallModel")
        reported: list[dict[str, Any]] = []
        try:
            event = await _heartbeating(self._model.complete, action, reported)  # type: ignore[attr-defined]
        except asyncio.CancelledError:
            details = activity.cancellation_details()
            if reported and details is not None and details.cancel_requested:
                return {"cancelled": reported[-1]}  # what the vendor billed the cancelled call
            raise
        except InvalidValue as exc:  # the provider's bug, not the model's failure
            raise _contract(str(provider_bug(action, exc))) from exc
        except Exception as exc:
            event = ModelFailed(classify(exc))
        return model_event_data(_returned("model.complete", event, ModelReplied, ModelFailed))

    @activity.defn(name=INVOKE)
    async def invoke(self, data: dict[str, Any]) -> dict[str, Any]:
        """The tool activity: ``tools.invoke(call)``; a raised error becomes a failed
        outcome (``timeout`` for a timeout, else ``unknown``), as in the drivers."""
        call = _value(data, ToolCall, "ToolCall")
        try:
            outcome = await _heartbeating(self._tools.invoke, call)  # type: ignore[attr-defined]
        except Exception as exc:
            outcome = tool_failure(call, exc)
        result: dict[str, Any] = encode(tool_outcome(call, outcome))
        return result


# -- the workflow side ----------------------------------------------------------------


class TurnIO(Protocol):
    """What a turn needs done: :class:`_Activities` does it with activities and timers,
    the replay check with a recorded history."""

    def now(self) -> float: ...

    async def assemble(self, action: Assemble, talk: Talk) -> Assembled | CannotShrink: ...

    async def complete(self, action: CallModel) -> ModelReplied | ModelFailed: ...

    async def invoke(self, calls: tuple[ToolCall, ...]) -> tuple[ToolOutcome, ...]: ...

    async def sleep(self, seconds: float) -> None: ...

    def continue_as_new_suggested(self) -> bool: ...

    async def human(self, holder: Holder, kind: str, timeout_s: float) -> dict[str, Any] | None:
        """A person's input of ``kind`` (an update), or ``None`` after ``timeout_s``."""


def workflow_clock() -> float:
    """The workflow's clock, in seconds (``workflow.time()``): deterministic, the same
    at replay; both the session's monotonic and its wall clock inside a workflow."""
    return workflow.time()


def new_session(
    settings: Settings | None = None,
    *,
    seed: int | None = None,
    session_id: str | None = None,
    **options: Any,
) -> Session:
    """A session for workflow code: both clocks read workflow time, never ``time.*``.

    ``seed`` defaults to one derived from the workflow id (:func:`seed_of`), so jitter
    is never random at replay; ``session_id`` defaults to the workflow id. Other keyword
    arguments go to ``Session``.
    """
    workflow_id = workflow.info().workflow_id
    return Session(
        settings,
        seed_of(workflow_id) if seed is None else seed,
        workflow_clock,
        wall_clock=workflow_clock,
        session_id=workflow_id if session_id is None else session_id,
        **options,
    )


def restore_session(data: dict[str, Any], **options: Any) -> Session:
    """``Session.restore(data)`` on workflow time (a snapshot carried by
    continue-as-new, or kept in the workflow's input)."""
    return Session.restore(data, workflow_clock, wall_clock=workflow_clock, **options)


def seed_of(text: str) -> int:
    """A 64-bit seed fixed by ``text`` (a workflow id): SHA-256, not ``hash()``, which
    Python salts per process."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


@dataclasses.dataclass(frozen=True)
class ActivityOptions:
    """How the workflow-side driver starts its activities. ``task_queue`` ``None``:
    the workflow's own. Timeouts ``None``: the settings' ``model_timeout_s`` /
    ``tool_timeout_s``, else :data:`DEFAULT_ACTIVITY_TIMEOUT_S`. Retries are never an
    option: every attempt is the engine's decision (``maximum_attempts=1``)."""

    task_queue: str | None = None
    model_timeout_s: float | None = None
    tool_timeout_s: float | None = None
    context_timeout_s: float = 60.0
    heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S
    """The model and tool activities' ``heartbeat_timeout``."""


_ONE_ATTEMPT = RetryPolicy(maximum_attempts=1)
_TRY_CANCEL = ActivityCancellationType.TRY_CANCEL

WAIT_CANCELLATION_PATCH = "turnstate-wait-cancellation"
"""The ``workflow.patched`` id under which a cancelled workflow waits for its model
and tool activities to confirm their cancellation before it ends: histories recorded
before it replay as they ran."""


class _Activities:
    """:class:`TurnIO` with Temporal activities and durable timers."""

    def __init__(self, options: ActivityOptions, settings: Settings) -> None:
        self._queue = options.task_queue
        model = options.model_timeout_s or settings.model_timeout_s or DEFAULT_ACTIVITY_TIMEOUT_S
        tool = options.tool_timeout_s or settings.tool_timeout_s or DEFAULT_ACTIVITY_TIMEOUT_S
        self._model = timedelta(seconds=model)
        self._tool = timedelta(seconds=tool)
        self._context = timedelta(seconds=options.context_timeout_s)
        self._heartbeat = timedelta(seconds=options.heartbeat_timeout_s)
        self._cancellation = _TRY_CANCEL
        if workflow.patched(WAIT_CANCELLATION_PATCH):
            self._cancellation = ActivityCancellationType.WAIT_CANCELLATION_COMPLETED

    def now(self) -> float:
        return workflow.time()

    def _start(
        self, name: str, data: Any, timeout: timedelta, heartbeat: timedelta | None = None
    ) -> workflow.ActivityHandle[Any]:
        return workflow.start_activity(
            name,
            data,
            start_to_close_timeout=timeout,
            heartbeat_timeout=heartbeat,
            retry_policy=_ONE_ATTEMPT,
            task_queue=self._queue,
            result_type=dict,
            # a model or tool call: wait until it has stopped (the context one is quick)
            cancellation_type=self._cancellation if heartbeat else _TRY_CANCEL,
        )

    async def assemble(self, action: Assemble, talk: Talk) -> Assembled | CannotShrink:
        try:
            return context_event(await self._start(ASSEMBLE, talk.data(action), self._context))
        except ActivityError as err:
            raise _failed("context", err) from err

    async def complete(self, action: CallModel) -> ModelReplied | ModelFailed:
        call = self._start(COMPLETE, encode(action), self._model, self._heartbeat)
        try:
            data = await call
        except asyncio.CancelledError:
            if call.done() and not call.cancelled() and call.exception() is None:
                # the reply came back in the workflow task that brought the cancel
                raise cancelled_call(model_event(call.result())) from None
            raise
        except ActivityError as err:
            if isinstance(err.cause, TemporalTimeout):
                lost = err.cause.type is TimeoutType.HEARTBEAT
                return lost_model(lost, err.cause.last_heartbeat_details)
            raise _failed("model", err) from err
        event = model_event(data)
        if isinstance(event, Cancelled) or workflow.cancellation_reason() is not None:
            # the cancel was asked while the call ran, and the call came back first
            raise cancelled_call(event)
        return event

    async def invoke(self, calls: tuple[ToolCall, ...]) -> tuple[ToolOutcome, ...]:
        return tuple(await asyncio.gather(*(self._invoke(call) for call in calls)))

    async def _invoke(self, call: ToolCall) -> ToolOutcome:
        try:
            data = await self._start(INVOKE, encode(call), self._tool, self._heartbeat)
        except ActivityError as err:
            if isinstance(err.cause, TemporalTimeout):
                return tool_timed_out(call, err.cause.type is TimeoutType.HEARTBEAT)
            raise _failed("tool", err) from err
        return tool_outcome_of(data)

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            await workflow.sleep(seconds)

    def continue_as_new_suggested(self) -> bool:
        return workflow.info().is_continue_as_new_suggested()

    async def human(self, holder: Holder, kind: str, timeout_s: float) -> dict[str, Any] | None:
        holder.waiting = kind
        try:
            await workflow.wait_condition(lambda: bool(holder.inbox), timeout=timeout_s)
        except TimeoutError:
            return None
        finally:
            holder.waiting = None
        return holder.inbox.pop(0)


def _failed(what: str, err: ActivityError) -> BaseException:
    """What an activity that did not return becomes: the workflow's own cancellation
    when the activity was cancelled with it, else a non-retryable bug error."""
    if isinstance(err.cause, TemporalCancelled):
        return asyncio.CancelledError(f"the {what} activity was cancelled")
    return ApplicationError(
        f"the {what} activity failed ({err.cause!r:.300}): the activities return failures "
        "as data, so this is a bug or a lost worker setup, not a provider error",
        type="ActivityFailed",
        non_retryable=True,
    )


async def run_turn(
    turn: Turn,
    *,
    options: ActivityOptions | None = None,
    prompt: Any = None,
    turns: Sequence[Any] = (),
) -> Finish:
    """``sm.arun_turn`` for workflow code: run ``turn`` to its ``Finish`` with the
    activities of :class:`Activities` and durable timers.

    Each ``CallModel`` is one activity attempt, each ``Wait`` one ``workflow.sleep``;
    a round's tool calls run as concurrent activities. ``prompt`` and ``turns`` are what
    the context provider's :func:`conversation` gives. Cancelling the workflow sends
    ``Cancelled()`` to the turn (which finishes ``cancelled``) and re-raises.
    """
    io = _Activities(options or ActivityOptions(), turn.session.settings)
    return await drive(turn, io, Talk(prompt, list(turns)))


Gate = Callable[[tuple[ToolCall, ...]], Awaitable[dict[str, ToolOutcome]]]
"""What a round's tool calls go through first: the outcomes of those that must not
run (a person rejected them), by call id."""


async def drive(turn: Turn, io: TurnIO, talk: Talk, gate: Gate | None = None) -> Finish:
    """Run ``turn`` to its ``Finish`` with ``io``: the drivers' loop (``_loop.adrive``),
    as both the workflow and the replay check run it."""

    async def tools(calls: tuple[ToolCall, ...]) -> tuple[ToolOutcome, ...]:
        stopped = {} if gate is None else await gate(calls)
        run = tuple(call for call in calls if call.id not in stopped)
        done = dict(zip((c.id for c in run), await io.invoke(run) if run else (), strict=True))
        return tuple(stopped.get(call.id) or done[call.id] for call in calls)

    async def perform(action: Action) -> object:
        if isinstance(action, Assemble):
            event = await io.assemble(action, talk)
            talk.delivered()
            return event
        if isinstance(action, CallModel):
            return await io.complete(action)
        if isinstance(action, Wait):
            await io.sleep(action.seconds)
            return WaitDone()
        if isinstance(action, InvokeTools):
            return ToolsDone(await tools(action.calls))
        raise TypeError(f"unexpected action {action!r}")  # pragma: no cover - no other action

    return await adrive(turn, perform)


# -- the ready-made workflow ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SessionInput:
    """The ready-made workflow's input (``docs/temporal.md``).

    ``prompt`` is the host's data for the context provider (:func:`conversation`);
    ``settings`` a ``Settings.to_dict()``-shaped mapping (unknown keys fail the
    workflow: ``ConfigError``); ``seed`` ``None``: derived from the workflow id.
    ``sleep_through_deferred``: how many turns in a row that end ``retry_deferred``
    are each followed by a durable sleep until their ``retry_at`` and a new turn,
    instead of ending the workflow. ``turns_per_run``: continue-as-new after this many
    turns in one run (or when Temporal suggests it). ``fail_workflow``: a session that
    ends with any status but ``completed`` fails the workflow (``ApplicationError`` of
    type ``SessionFailed``, the :class:`Report` as its details) instead of completing
    it with the report. ``snapshot``, ``turns``, ``sent``, ``runs`` and ``deferred``
    are what continue-as-new carries; leave them out.
    """

    prompt: Any = None
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int | None = None
    session_id: str | None = None
    sleep_through_deferred: int = 0
    turns_per_run: int = 50
    task_queue: str | None = None
    activity_timeout_s: float | None = None
    heartbeat_timeout_s: float | None = None
    """The model and tool activities' ``heartbeat_timeout`` (``None``:
    :data:`DEFAULT_HEARTBEAT_TIMEOUT_S`)."""
    fail_workflow: bool = False
    await_human_s: float = 0.0
    """How long the workflow waits for a person (an update) where one can let the
    session go on: after an ``auth_error`` turn (``credentials``), after a limit fired
    (``raise_limit``), and for each call of an ``approve_tools`` tool (``decide``). 0:
    it never waits."""
    approve_tools: list[str] = dataclasses.field(default_factory=list)
    """Tools whose calls run only once a person approved them (``decide``); a call
    rejected, or not decided in time, comes back as a ``permission_denied`` outcome."""
    store_conversation: bool = False
    """Send each turn's record to the context activity once, instead of the whole
    conversation every time: the context activities keep it
    (``Activities(conversations=...)``), so the history grows by the same bytes a turn."""
    snapshot: dict[str, Any] | None = None
    turns: list[Any] = dataclasses.field(default_factory=list)
    sent: int = 0
    """With ``store_conversation``: the records the store held at continue-as-new
    (``turns`` holds the ones after)."""
    runs: int = 0
    deferred: int = 0
    """The turns in a row that had ended ``retry_deferred`` at continue-as-new."""


@dataclasses.dataclass(frozen=True)
class Report:
    """The session's counters and state: the ``status`` query's answer and the
    workflow's result.

    ``status`` is the session's status, ``None`` only while it can go on (``failed``
    once a turn ended the conversation: ``last_turn``, the last finished turn's status,
    says why); ``state`` the current turn's state; ``runs`` how many times the workflow
    continued as new; ``reply`` the last turn's reply.
    """

    status: str | None
    last_turn: str | None
    state: str | None
    turns: int
    retries: int
    waited_s: float
    cost_usd: float
    tool_retries: int
    denials: int
    tripped: list[str]
    crash_counts: dict[str, int]
    elapsed_s: float
    runs: int
    reply: Any = None


def report(session: Session, runs: int, reply: Any = None) -> Report:
    """The :class:`Report` of ``session`` as it is now."""
    turn = session.current_turn
    finish = turn.finish if turn is not None else None
    return Report(
        status=None if session.status is None else session.status.value,
        last_turn=None if finish is None else finish.status.value,
        state=None if turn is None else turn.state,
        turns=session.turns,
        retries=session.retries_used,
        waited_s=session.waited_s,
        cost_usd=session.cost_usd,
        tool_retries=session.tool_retries,
        denials=session.denials,
        tripped=sorted(session.tripped_providers),
        crash_counts=dict(sorted(session.crash_counts.items())),
        elapsed_s=session.elapsed_s,
        runs=runs,
        reply=reply,
    )


@attrs.frozen
class Continue:
    """The session loop's request to continue as new with this state (``deferred``:
    the run of ``retry_deferred`` turns so far; ``sent``: the records the context
    activities' store holds)."""

    snapshot: dict[str, Any]
    turns: list[Any]
    deferred: int = 0
    sent: int = 0


TRACE_KEPT = 256
"""How many trace records the ``trace`` query gives (the run's latest)."""
_TRACED = ("turn", "step", "source", "event", "guard", "dest")
"""The fields of a trace record the ``trace`` query gives, with its ``caused_by``."""


@attrs.define
class Holder:
    """Where the session loop leaves its session and trace, for the queries, and where
    the workflow's updates leave a person's input (``inbox``) while it waits for one of
    kind ``waiting``."""

    session: Session | None = None
    reply: Any = None
    waiting: str | None = None
    inbox: list[dict[str, Any]] = attrs.Factory(list)
    log: list[TraceRecord] = attrs.Factory(list)

    def observe(self, record: TraceRecord) -> None:
        """A session observer: the run's last :data:`TRACE_KEPT` trace records."""
        self.log.append(record)
        if len(self.log) > TRACE_KEPT:
            del self.log[: len(self.log) - TRACE_KEPT]


CREDENTIALS = "credentials"
"""The update that resumes a session after ``auth_error``: a reference to the new
credentials (never the secret: updates are kept in the history)."""
RAISE_LIMIT = "raise_limit"
"""The update that raises a bound after its limit fired: settings to change."""
DECIDE = "decide"
"""The update that approves or rejects a tool call waiting for a person:
``{"call_id", "approve", "note"}``."""


def human_input(name: str, argument: Any) -> dict[str, Any]:
    """The inbox entry an update's argument stands for (the workflow's update handler
    and the replay check build it alike), or ``ValueError`` saying what is wrong."""
    if name == CREDENTIALS:
        if not isinstance(argument, str) or not argument:
            raise ValueError("credentials: a non-empty reference to the new credentials")
        return {"kind": CREDENTIALS, "ref": argument}
    if name == RAISE_LIMIT:
        if not isinstance(argument, dict) or not argument:
            raise ValueError("raise_limit: a table of the settings to change")
        return {"kind": RAISE_LIMIT, "settings": dict(argument)}
    if name == DECIDE:
        if not isinstance(argument, dict) or not isinstance(argument.get("call_id"), str):
            raise ValueError('decide: {"call_id": str, "approve": bool, "note": str}')
        if not isinstance(argument.get("approve"), bool):
            raise ValueError("decide: approve must be true or false")
        note = argument.get("note", "")
        if not isinstance(note, str):
            raise ValueError("decide: note must be text")
        call_id = argument["call_id"]
        return {"kind": f"{DECIDE}:{call_id}", "approve": argument["approve"], "note": note}
    raise ValueError(f"no human input named {name!r}")


def raised(
    session: Session,
    changes: dict[str, Any],
    clock: Callable[[], float],
    observers: Sequence[Callable[[TraceRecord], None]] = (),
) -> Session:
    """``session`` with ``changes`` to its settings and the limit that fired cleared,
    checked as a restore checks it: ``ConfigError`` for an unknown or bad setting or
    when the limit still holds under the new settings, ``SnapshotError`` when the
    state could not be reached under them."""
    snapshot = session.snapshot()
    settings = Settings.from_dict({**snapshot["settings"], **changes}, source="raise_limit")
    snapshot["settings"] = settings.to_dict()
    snapshot["limit"] = None
    probe = Session.restore(snapshot, clock, wall_clock=clock)
    if probe.new_turn().final_answer:  # the bound still holds: the next turn is the last
        fired = session.limit_reached
        raise ConfigError(
            f"raise_limit: {fired.value if fired else 'the limit'} still holds under "
            f"{changes!r:.100}"
        )
    return Session.restore(snapshot, clock, wall_clock=clock, observers=observers)


def rejected(call: ToolCall, note: str) -> ToolOutcome:
    """A tool call a person rejected (or did not approve in time)."""
    return ToolOutcome(
        call.id,
        ok=False,
        content=f"rejected by a person: {note}" if note else "rejected by a person",
        category=ToolErrorCategory.PERMISSION_DENIED,
    )


def turn_record(finish: Finish, index: int) -> dict[str, Any]:
    """One finished turn as the conversation keeps it (JSON data)."""
    return {
        "turn": index,
        "status": finish.status.value,
        "reply": finish.reply,
        "tool_results": [
            {"call_id": r.call_id, "content": r.content, "is_error": r.is_error}
            for r in finish.tool_results
        ],
    }


def open_session(
    data: SessionInput,
    io: TurnIO,
    workflow_id: str,
    observers: Sequence[Callable[[TraceRecord], None]] = (),
) -> Session:
    """The session a run starts with: restored from the carried snapshot, or new."""
    if data.snapshot is not None:
        return Session.restore(data.snapshot, io.now, wall_clock=io.now, observers=observers)
    settings = Settings.from_dict(data.settings)
    seed = seed_of(workflow_id) if data.seed is None else data.seed
    return Session(
        settings,
        seed,
        io.now,
        wall_clock=io.now,
        session_id=data.session_id or workflow_id,
        observers=observers,
    )


def conversation_key(workflow_id: str, first_run_id: str) -> str:
    """The key of a session's conversation in a :class:`ConversationStore`: the same
    across continue-as-new, another for a new workflow under a reused id."""
    return f"{workflow_id}/{first_run_id}"


_GOES_ON = frozenset({TurnStatus.COMPLETED, TurnStatus.BREAKER_OPEN})
"""Turn statuses after which the session's next turn runs (a limit's final-answer
turn included); any other ends the workflow with the session as it is."""


async def session_loop(
    data: SessionInput, io: TurnIO, workflow_id: str, holder: Holder, key: str | None = None
) -> Report | Continue:
    """Run the session's turns: the ready-made workflow's body, also run by the replay
    check. ``key`` names the conversation in the context activities' store."""
    session = holder.session = open_session(data, io, workflow_id, [holder.observe])
    if data.store_conversation and key is None:
        raise ConfigError("store_conversation: the session loop needs the conversation's key")
    talk = Talk(data.prompt, list(data.turns), key if data.store_conversation else None, data.sent)
    ran, deferred = 0, data.deferred
    gate = _approval(data, io, holder) if data.approve_tools else None
    while session.status is None:
        turn = session.current_turn
        if turn is None or turn.done:
            session = await _raise_limit(data, io, holder, session, talk)
            turn = session.new_turn()
        try:
            finish = await drive(turn, io, talk, gate)
        except asyncio.CancelledError:
            if session.status is None:
                session.end(SessionStatus.CANCELLED, reason="the workflow was cancelled")
            raise
        talk.records.append(turn_record(finish, turn.index))
        holder.reply = finish.reply
        ran += 1
        deferred = deferred + 1 if finish.status is TurnStatus.RETRY_DEFERRED else 0
        if not await _goes_on(data, io, holder, session, talk, finish, deferred):
            break
        if session.status is None and (ran >= data.turns_per_run or io.continue_as_new_suggested()):
            return Continue(session.snapshot(), talk.records, deferred, talk.sent)
    return report(session, data.runs, holder.reply)


async def _raise_limit(
    data: SessionInput, io: TurnIO, holder: Holder, session: Session, talk: Talk
) -> Session:
    """The session the next turn runs in: after a limit fired, with the settings a
    person raised within ``await_human_s``, if one did."""
    wait = float(data.await_human_s)
    if wait and session.limit_reached is not None:
        given = await io.human(holder, RAISE_LIMIT, wait)
        if given is not None:  # checked by the update's validator
            session = holder.session = raised(session, given["settings"], io.now, [holder.observe])
            talk.records.append({"human": RAISE_LIMIT, "settings": given["settings"]})
    return session


async def _goes_on(
    data: SessionInput,
    io: TurnIO,
    holder: Holder,
    session: Session,
    talk: Talk,
    finish: Finish,
    deferred: int,
) -> bool:
    """Whether the session's next turn runs after ``finish`` (``deferred``: the turns
    in a row that ended ``retry_deferred``), once it slept through a deferral or a
    person gave new credentials; it ends the session where it cannot go on."""
    if finish.done and session.status is None:
        session.end(SessionStatus.COMPLETED)
        return False
    wait = float(data.await_human_s)
    if deferred and deferred <= data.sleep_through_deferred:
        retry_at = finish.retry_at if finish.retry_at is not None else io.now()
        await io.sleep(max(0.0, retry_at - io.now()))
    elif finish.status is TurnStatus.AUTH_ERROR and wait:
        given = await io.human(holder, CREDENTIALS, wait)
        if given is None:
            session.end(SessionStatus.FAILED, reason="no new credentials in time")
            return False
        talk.records.append({"human": CREDENTIALS, "ref": given["ref"]})
    elif finish.status not in _GOES_ON:
        if session.status is None:  # the conversation cannot go on: Report.status says so
            session.end(SessionStatus.FAILED, reason=f"a turn ended {finish.status.value}")
        return False
    return True


def _approval(data: SessionInput, io: TurnIO, holder: Holder) -> Gate:
    """The gate of ``approve_tools``: each such call waits for a person's decision."""
    names = frozenset(data.approve_tools)

    async def gate(calls: tuple[ToolCall, ...]) -> dict[str, ToolOutcome]:
        stopped: dict[str, ToolOutcome] = {}
        for call in calls:
            if call.name not in names:
                continue
            given = await io.human(holder, f"{DECIDE}:{call.id}", float(data.await_human_s))
            if given is None:
                stopped[call.id] = rejected(call, "no decision in time")
            elif not given["approve"]:
                stopped[call.id] = rejected(call, given["note"])
        return stopped

    return gate


def _count(least: int) -> tuple[Callable[[Any], bool], str]:
    # a bool is an int here: the first release's sleep_through_deferred was a bool
    return (lambda value: isinstance(value, int) and value >= least), f"an int >= {least}"


def _seconds(value: Any) -> bool:
    return value is None or (type(value) in (int, float) and 0 < value < float("inf"))


def _name(value: Any) -> bool:
    return value is None or (isinstance(value, str) and bool(value))


_SECONDS = (_seconds, "a finite number > 0 or None")
_BOOL = (lambda value: isinstance(value, bool)), "a bool"
_TABLE = (lambda value: isinstance(value, dict)), "a table"
_INPUT_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "sleep_through_deferred": _count(0),
    "turns_per_run": _count(1),
    "runs": _count(0),
    "deferred": _count(0),
    "sent": _count(0),
    "await_human_s": ((lambda value: _seconds(value or None)), _SECONDS[1]),
    "approve_tools": (
        (lambda value: isinstance(value, list) and all(isinstance(t, str) and t for t in value)),
        "a list of tool names",
    ),
    "store_conversation": _BOOL,
    "fail_workflow": _BOOL,
    "settings": _TABLE,
    "snapshot": ((lambda value: value is None or isinstance(value, dict)), _TABLE[1]),
    "turns": ((lambda value: isinstance(value, list)), "a list"),
    "seed": ((lambda value: value is None or type(value) is int), "an int or None"),
    "session_id": (_name, "a non-empty str or None"),
    "task_queue": (_name, "a non-empty str or None"),
    "activity_timeout_s": _SECONDS,
    "heartbeat_timeout_s": _SECONDS,
}
"""The input's fields that are checked, in order: what each must hold, and its wording."""


def check_input(data: SessionInput) -> SessionInput:
    """``data`` if its fields hold what the workflow can run with, else ``ConfigError``
    naming the first field that does not (a bug error: it fails the workflow)."""
    for name, (holds, what) in _INPUT_FIELDS.items():
        value = getattr(data, name)
        if not holds(value):
            raise ConfigError(f"SessionInput.{name}: must be {what}, got {value!r:.60}")
        if name == "approve_tools" and value and not data.await_human_s:
            raise ConfigError(
                "SessionInput.approve_tools: needs await_human_s > 0 to wait for a decision"
            )
    return data


FAILED_SESSION = "SessionFailed"
"""The type of the ``ApplicationError`` a session that ended failed fails the
workflow with (``SessionInput.fail_workflow``)."""


def fails_workflow(data: SessionInput, outcome: Report) -> bool:
    """Whether the run of ``data`` that ended with ``outcome`` fails the workflow."""
    return data.fail_workflow and outcome.status not in (None, SessionStatus.COMPLETED.value)


def _io_of(data: SessionInput) -> _Activities:
    """The workflow-side driver a run of ``data`` runs with."""
    if data.snapshot is not None:
        settings = Settings.from_dict(data.snapshot.get("settings", {}), source="snapshot")
    else:
        settings = Settings.from_dict(data.settings)
    heartbeat = data.heartbeat_timeout_s
    options = ActivityOptions(
        task_queue=data.task_queue,
        model_timeout_s=data.activity_timeout_s,
        tool_timeout_s=data.activity_timeout_s,
        heartbeat_timeout_s=DEFAULT_HEARTBEAT_TIMEOUT_S if heartbeat is None else heartbeat,
    )
    return _Activities(options, settings)


@workflow.defn(name=WORKFLOW, failure_exception_types=list(BUG_ERRORS))
class SessionWorkflow:
    """A session's turns, run by the engine: start it with a :class:`SessionInput`.

    Runs turns until the model answers (the session ends ``completed``), a limit's
    final-answer turn is over, or a turn ends with a status that ends the conversation
    (``auth_error``, ``retries_exhausted``...). ``status`` (a query) gives the
    :class:`Report`; cancelling the workflow cancels the running turn. Register it with
    :class:`Activities` and ``workflow_runner=sandbox_runner()``.
    """

    def __init__(self) -> None:
        self._holder = Holder()
        self._runs = 0

    @workflow.run
    async def run(self, data: SessionInput) -> Report:
        """Run the session (see the class docstring)."""
        data = check_input(data)
        self._runs = data.runs
        info = workflow.info()
        key = conversation_key(info.workflow_id, info.first_execution_run_id)
        outcome = await session_loop(data, _io_of(data), info.workflow_id, self._holder, key)
        if isinstance(outcome, Continue):
            workflow.continue_as_new(
                dataclasses.replace(
                    data,
                    snapshot=outcome.snapshot,
                    turns=outcome.turns,
                    runs=data.runs + 1,
                    deferred=outcome.deferred,
                    sent=outcome.sent,
                )
            )
        if fails_workflow(data, outcome):
            raise ApplicationError(
                f"the session ended {outcome.status} (its last turn: {outcome.last_turn})",
                dataclasses.asdict(outcome),
                type=FAILED_SESSION,
                non_retryable=True,
            )
        return outcome

    def _check(self, kind: str, name: str, argument: Any) -> None:
        human_input(name, argument)
        if self._holder.waiting != kind or self._holder.inbox:
            waiting = self._holder.waiting or "nothing"
            raise ValueError(f"{name}: the session is not waiting for it (it waits for {waiting})")

    @workflow.update(name=CREDENTIALS)
    def credentials(self, ref: str) -> str:
        """After an ``auth_error`` turn: the new credentials are in place (``ref``
        names them for the providers, through the conversation's records); the
        session goes on with a new turn."""
        self._holder.inbox.append(human_input(CREDENTIALS, ref))
        return "accepted"

    @credentials.validator
    def _credentials_ok(self, ref: str) -> None:
        self._check(CREDENTIALS, CREDENTIALS, ref)

    @workflow.update(name=RAISE_LIMIT)
    def raise_limit(self, settings: dict[str, Any]) -> str:
        """After a limit fired, before the final-answer turn: change these settings
        so that it no longer holds, and go on with a normal turn."""
        self._holder.inbox.append(human_input(RAISE_LIMIT, settings))
        return "accepted"

    @raise_limit.validator
    def _raise_limit_ok(self, settings: dict[str, Any]) -> None:
        self._check(RAISE_LIMIT, RAISE_LIMIT, settings)
        session = self._holder.session
        assert session is not None  # noqa: S101 - it waits for this only with a session
        raised(session, settings, workflow_clock)  # ConfigError, SnapshotError: rejected

    @workflow.update(name=DECIDE)
    def decide(self, decision: dict[str, Any]) -> str:
        """Approve or reject a tool call of ``approve_tools`` waiting for a person."""
        self._holder.inbox.append(human_input(DECIDE, decision))
        return "accepted"

    @decide.validator
    def _decide_ok(self, decision: dict[str, Any]) -> None:
        call_id = decision.get("call_id") if isinstance(decision, dict) else None
        self._check(f"{DECIDE}:{call_id}", DECIDE, decision)

    @workflow.query(name="trace")
    def trace(self) -> list[dict[str, Any]]:
        """This run's latest trace records (:data:`TRACE_KEPT`), as data: each step's
        turn, source, event, guard, destination and the event that caused it."""
        return [
            {name: getattr(r, name) for name in _TRACED}
            | {"caused_by": None if r.caused_by is None else encode(r.caused_by)}
            for r in self._holder.log
        ]

    @workflow.query(name="status")
    def status(self) -> Report | None:
        """The session's counters and state (``None`` before it is built)."""
        session = self._holder.session
        return None if session is None else report(session, self._runs, self._holder.reply)
