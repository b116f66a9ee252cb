"""The determinism check Temporal's replayer does not make: timer durations.

Temporal's replayer checks that replayed workflow code issues the same *kinds* of
commands in the same order, not a timer's duration nor an activity's input, so a
changed seed, backoff setting or engine version replays "fine" and waits differently.
:func:`check_replay` runs the session loop of :class:`~._temporal.SessionWorkflow`
over a recorded history, feeding it the history's activity results at the history's
workflow times, and compares every action with the history:

* ``Wait`` with the next ``TimerStarted`` (to the nanosecond the SDK writes:
  ``int(seconds * 1e9)``);
* ``CallModel``, ``Assemble`` and each ``InvokeTools`` call with the next
  ``ActivityTaskScheduled`` (activity type and input);
* the end: continue-as-new with the same snapshot, or the same result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import attrs
from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter

from ..core._actions import Assemble, CallModel
from ..core._codec import encode
from ..core._events import Assembled, Cancelled, CannotShrink, ModelFailed, ModelReplied
from ..core._exceptions import ConfigError, InvalidValue
from ..core._settings import Settings
from ..core._tool_calls import ToolCall, ToolOutcome
from ._temporal import (
    ASSEMBLE,
    BUG_ERRORS,
    COMPLETE,
    FAILED_SESSION,
    INVOKE,
    WORKFLOW,
    Continue,
    Holder,
    SessionInput,
    Talk,
    cancelled_call,
    check_input,
    context_event,
    conversation_key,
    fails_workflow,
    human_input,
    lost_model,
    model_event,
    session_loop,
    tool_outcome_of,
    tool_timed_out,
)

__all__ = ["Drift", "check_replay"]

_E = EventType
_RESULTS = {
    _E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "activity_task_completed_event_attributes",
    _E.EVENT_TYPE_ACTIVITY_TASK_FAILED: "activity_task_failed_event_attributes",
    _E.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "activity_task_timed_out_event_attributes",
    _E.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "activity_task_canceled_event_attributes",
}
_ENDS = {
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
    _E.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
}
"""The events that close a run."""
_NEVER = 1 << 62
"""An event id past any history's end."""


@attrs.frozen
class Drift:
    """The first place where the engine and a recorded history disagree.

    ``index`` counts the commands compared before it (activities and timers, from 0);
    ``event_id`` is the history event found there (``None``: the history had no
    more); ``expected`` says what the engine asked for, ``found`` what the history
    holds.
    """

    index: int
    event_id: int | None
    expected: str
    found: str

    def __str__(self) -> str:
        where = "at the end of the history" if self.event_id is None else f"event {self.event_id}"
        return (
            f"drift at command {self.index} ({where}): the engine asks for {self.expected}, "
            f"the history has {self.found}"
        )


class _Found(Exception):
    """A drift (or ``None``: the history ends here), on its way out of the loop."""

    def __init__(self, drift: Drift | None) -> None:
        super().__init__(str(drift))
        self.drift = drift


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=True, default=repr)


def _nanos(seconds: float) -> int:
    """A timer's duration as the Python SDK writes it (``FromNanoseconds(int(d * 1e9))``)."""
    return int(seconds * 1e9)


class _History:
    """:class:`~._temporal.TurnIO` over a recorded history: each command the loop
    issues is compared with the history's next one, and answered with its recorded
    result at the workflow time the workflow saw it."""

    def __init__(self, events: list[HistoryEvent], converter: DataConverter) -> None:
        self._converter = converter.payload_converter
        self._events = events
        of: defaultdict[int, list[HistoryEvent]] = defaultdict(list)
        for e in events:
            of[e.event_type].append(e)
        commands = (_E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, _E.EVENT_TYPE_TIMER_STARTED)
        self._commands = [e for e in events if e.event_type in commands]
        self._results = {
            getattr(e, field).scheduled_event_id: e
            for e in events
            if (field := _RESULTS.get(e.event_type)) is not None
        }
        self._fired = {
            e.timer_fired_event_attributes.timer_id: e for e in of[_E.EVENT_TYPE_TIMER_FIRED]
        }
        completed = {
            e.workflow_task_completed_event_attributes.started_event_id
            for e in of[_E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
        }
        self._tasks = [
            (e.event_id, e.event_time.ToNanoseconds() / 1e9)
            for e in of[_E.EVENT_TYPE_WORKFLOW_TASK_STARTED]
            if e.event_id in completed
        ]
        cancels = of[_E.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED]
        self._cancel = self._delivered(cancels[0].event_id) if cancels else None
        self._updates = of[_E.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED]
        self._used: set[int] = set()
        self._now = self._tasks[0][1] if self._tasks else 0.0
        self.index = 0

    # -- what the loop sees ------------------------------------------------------

    def now(self) -> float:
        return self._now

    def continue_as_new_suggested(self) -> bool:
        return False  # the end of the run is compared instead (see check_replay)

    async def assemble(self, action: Assemble, talk: Talk) -> Assembled | CannotShrink:
        (result,) = self._answered(ASSEMBLE, [(talk.data(action), f"{action!r:.200}")])
        return context_event(self._completed(result))  # else the context activity's bug

    async def complete(self, action: CallModel) -> ModelReplied | ModelFailed:
        (result,) = self._answered(COMPLETE, [(encode(action), f"{action!r:.200}")])
        if result.event_type == _E.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            info = result.activity_task_timed_out_event_attributes.failure.timeout_failure_info
            return lost_model(_heartbeat(result), self._decoded(info.last_heartbeat_details))
        event = model_event(self._completed(result))
        if isinstance(event, Cancelled):  # the call's own cancellation, billed
            raise cancelled_call(event)
        return event

    async def invoke(self, calls: tuple[ToolCall, ...]) -> tuple[ToolOutcome, ...]:
        results = self._answered(INVOKE, [(encode(call), f"{call!r:.200}") for call in calls])
        return tuple(
            tool_timed_out(call, _heartbeat(result))
            if result.event_type == _E.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
            else tool_outcome_of(self._completed(result))
            for call, result in zip(calls, results, strict=True)
        )

    async def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._fire(self._timer(f"a timer of {_nanos(seconds)} ns ({seconds!r} s)", seconds)[1])

    async def human(self, holder: Holder, kind: str, timeout_s: float) -> dict[str, Any] | None:
        """The wait for a person: the timer of ``wait_condition``'s timeout, and the
        first update accepted before it fired (its input), else ``None``. (``holder``'s
        inbox is the live workflow's: here the history is.)"""
        del holder
        expected = f"a wait for {kind} of {_nanos(timeout_s)} ns ({timeout_s!r} s)"
        event, fired = self._timer(expected, timeout_s)
        limit = fired.event_id if fired is not None else _NEVER
        fresh = (e for e in self._updates if e.event_id not in self._used)
        update = next((e for e in fresh if event.event_id < e.event_id < limit), None)
        if update is not None:
            self._used.add(update.event_id)
            request = update.workflow_execution_update_accepted_event_attributes.accepted_request
            self._advance(update.event_id)
            try:
                return human_input(request.input.name, self._first(request.input.args))
            except ValueError as exc:
                self._drift(update, f"an input for {kind}", f"an update {exc}")
        self._fire(fired)
        return None

    # -- reading the history -------------------------------------------------------

    def _answered(self, name: str, inputs: list[tuple[Any, str]]) -> list[HistoryEvent]:
        """The results of activities ``name`` scheduled with ``inputs`` (data, what it
        is), compared with the history's next commands; the workflow time is then the
        one the last result was delivered at."""
        scheduled = [self._activity(name, data, what) for data, what in inputs]
        results = [self._result(event) for event in scheduled]
        self._advance(max(r.event_id for r in results))
        return results

    def _completed(self, result: HistoryEvent) -> Any:
        """A completed activity's result (the history ends where one failed)."""
        if result.event_type != _E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            raise _Found(None)
        return self._first(result.activity_task_completed_event_attributes.result)

    def _timer(self, expected: str, seconds: float) -> tuple[HistoryEvent, HistoryEvent | None]:
        """The next event, a timer of ``seconds`` (a drift naming ``expected``
        otherwise), taken, and the event of its firing, if it fired."""
        event = self._next(expected, _E.EVENT_TYPE_TIMER_STARTED)
        attributes = event.timer_started_event_attributes
        found = attributes.start_to_fire_timeout.ToNanoseconds()
        if found != _nanos(seconds):
            self._drift(event, expected, f"a timer of {found} ns ({found / 1e9!r} s)")
        self.index += 1
        return event, self._fired.get(attributes.timer_id)

    def _fire(self, fired: HistoryEvent | None) -> None:
        """Go on past a timer's firing (cancelled first: the workflow's cancel)."""
        if self._cancelled_before(fired):
            raise asyncio.CancelledError
        if fired is None:
            raise _Found(None)
        self._advance(fired.event_id)

    def _next(self, expected: str, kind: EventType.ValueType) -> HistoryEvent:
        """The history's next command, of ``kind`` (a drift naming ``expected``
        otherwise)."""
        if self.index >= len(self._commands):
            if self._cancel is not None:
                raise asyncio.CancelledError
            end = self.end()
            if end is None or end.event_type == _E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
                raise _Found(None)  # the history stops here, or the run failed here
            raise _Found(Drift(self.index, None, expected, f"no more commands ({_described(end)})"))
        event = self._commands[self.index]
        if event.event_type != kind:
            self._drift(event, expected, _described(event))
        return event

    def _activity(self, name: str, data: Any, what: str) -> HistoryEvent:
        expected = f"activity {name} with {what}"
        event = self._next(expected, _E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
        attributes = event.activity_task_scheduled_event_attributes
        if attributes.activity_type.name != name:
            self._drift(event, expected, f"activity {attributes.activity_type.name}")
        found = self._first(attributes.input)
        if _json(found) != _json(data):
            self._drift(event, f"{expected}: {_json(data):.300}", f"input {_json(found):.300}")
        self.index += 1
        return event

    def _result(self, scheduled: HistoryEvent) -> HistoryEvent:
        result = self._results.get(scheduled.event_id)
        if self._cancelled_before(result):
            raise self._cancelled(scheduled, result)
        if result is None or result.event_type == _E.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            raise _Found(None)
        return result

    def _cancelled(
        self, scheduled: HistoryEvent, result: HistoryEvent | None
    ) -> asyncio.CancelledError:
        """The workflow's cancel, delivered before ``result``: a model call that came
        back all the same is charged what it cost, as the live workflow charges it."""
        name = scheduled.activity_task_scheduled_event_attributes.activity_type.name
        if (
            name != COMPLETE
            or result is None
            or result.event_type != _E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        ):
            return asyncio.CancelledError()
        return cancelled_call(model_event(self._completed(result)))

    def _cancelled_before(self, result: HistoryEvent | None) -> bool:
        if self._cancel is None:
            return False
        return result is None or self._delivered(result.event_id) >= self._cancel

    def _delivered(self, event_id: int) -> int:
        """The workflow task that delivered event ``event_id`` to the workflow."""
        return next((task for task, _ in self._tasks if task > event_id), _NEVER)

    def _advance(self, event_id: int) -> None:
        self._now = next((at for task, at in self._tasks if task > event_id), self._now)

    def _decoded(self, payloads: Payloads) -> list[Any]:
        return self._converter.from_payloads(list(payloads.payloads)) if payloads.payloads else []

    def _first(self, payloads: Payloads) -> Any:
        return next(iter(self._decoded(payloads)), None)

    def _drift(self, event: HistoryEvent, expected: str, found: str) -> None:
        raise _Found(Drift(self.index, event.event_id, expected, found))

    def end(self) -> HistoryEvent | None:
        """The event that closed the run, if it is closed."""
        return next((e for e in reversed(self._events) if e.event_type in _ENDS), None)

    def input_of(self, event: HistoryEvent, field: str) -> SessionInput:
        """The :class:`SessionInput` an event carries, or ``ValueError`` saying what
        is wrong with it."""
        what = "the start event" if event.event_id == 1 else f"event {event.event_id}"
        payloads = list(getattr(event, field).input.payloads)
        if len(payloads) != 1:
            raise ValueError(
                f"history: {what} carries {len(payloads)} inputs, not one SessionInput"
            )
        try:
            (data,) = self._converter.from_payloads(payloads, [SessionInput])
        except Exception as exc:  # the converter's TypeError, or a codec's own error
            raise ValueError(f"history: {what}'s input is not a SessionInput ({exc})") from None
        try:
            return check_input(data)
        except ConfigError as exc:
            raise ValueError(f"history: {what}'s input: {exc}") from None

    def result_of(self, event: HistoryEvent) -> Any:
        return self._first(event.workflow_execution_completed_event_attributes.result)

    @property
    def left(self) -> list[HistoryEvent]:
        return self._commands[self.index :]


def _heartbeat(timed_out: HistoryEvent) -> bool:
    """Whether an activity timed out for a missed heartbeat (its worker was lost)."""
    failure = timed_out.activity_task_timed_out_event_attributes.failure
    return bool(failure.timeout_failure_info.timeout_type == TimeoutType.TIMEOUT_TYPE_HEARTBEAT)


def _described(event: HistoryEvent) -> str:
    if event.event_type == _E.EVENT_TYPE_TIMER_STARTED:
        nanos = event.timer_started_event_attributes.start_to_fire_timeout.ToNanoseconds()
        return f"a timer of {nanos} ns"
    if event.event_type == _E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
        return f"activity {event.activity_task_scheduled_event_attributes.activity_type.name}"
    return EventType.Name(event.event_type)


def _history(history: object) -> list[HistoryEvent]:
    """The events of ``history``, or ``ValueError`` saying why it is not a history."""
    if isinstance(history, WorkflowHistory):
        return list(history.events)
    if isinstance(history, str):
        try:
            history = json.loads(history)
        except ValueError as exc:
            raise ValueError(f"history: the text is not JSON ({exc})") from None
    elif not isinstance(history, Mapping):
        raise InvalidValue(
            "history: expected a WorkflowHistory or its JSON (text or parsed), "
            f"got {type(history).__name__}"
        )
    if not isinstance(history, Mapping):
        raise InvalidValue(
            f"history: the JSON must be an object holding 'events', got {type(history).__name__}"
        )
    try:
        return list(WorkflowHistory.from_json("", dict(history)).events)
    except Exception as exc:  # protobuf's ParseError and the SDK's own checks alike
        raise ValueError(f"history: not a Temporal history ({exc})") from None


def _start(events: list[HistoryEvent]) -> HistoryEvent:
    """The run's start event, if it starts a :data:`WORKFLOW` run."""
    if not events or events[0].event_type != _E.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
        raise ValueError("history: the first event must be WorkflowExecutionStarted")
    kind = events[0].workflow_execution_started_event_attributes.workflow_type.name
    if kind != WORKFLOW:
        raise ValueError(
            f"history: a {kind!r} workflow's; check_replay replays {WORKFLOW!r} "
            "(SessionWorkflow) histories only"
        )
    return events[0]


def _run(coro: Any) -> Any:
    """Run a coroutine that never suspends (its I/O is the recorded history)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("the session loop suspended while replaying a recorded history")


def check_replay(
    history: WorkflowHistory | str | Mapping[str, Any],
    *,
    settings: Settings | None = None,
    seed: int | None = None,
    workflow_id: str | None = None,
    data_converter: DataConverter | None = None,
) -> Drift | None:
    """Replay one run of a recorded :class:`SessionWorkflow` history through the
    engine and return the first :class:`Drift`, or ``None`` if they agree (up to where
    the history ends).

    ``history`` is a ``WorkflowHistory`` (``await handle.fetch_history()``) or its
    JSON (``to_json()``, text or parsed). ``settings`` and ``seed`` replace the ones the
    run started with (or the carried snapshot's), to see what a changed configuration
    would have done. The workflow id (the default seed and session id) is read from the
    history; pass ``workflow_id`` for a JSON history from a server that does not record
    it. ``data_converter`` must be the one the workflow ran with.

    Raises ``ValueError`` naming what is wrong when ``history`` is not a Temporal
    history, is another workflow type's, or its start (or continue-as-new) event
    does not carry one valid :class:`SessionInput`.
    """
    events = _history(history)
    start = _start(events).workflow_execution_started_event_attributes
    if settings is not None and not isinstance(settings, Settings):
        raise InvalidValue(f"settings: must be a Settings or None, got {settings!r:.60}")
    if seed is not None and type(seed) is not int:
        raise InvalidValue(f"seed: must be an int or None, got {seed!r:.60}")
    recorded = _History(events, data_converter or DataConverter.default)
    data = recorded.input_of(events[0], "workflow_execution_started_event_attributes")
    data = _override(data, settings, seed)
    if workflow_id is None:
        workflow_id = start.workflow_id or _workflow_id(history)
    key = conversation_key(workflow_id, start.first_execution_run_id)
    end = recorded.end()
    try:
        outcome = _run(session_loop(data, recorded, workflow_id, Holder(), key))
    except _Found as found:
        return found.drift
    except BUG_ERRORS as error:
        if end is not None and end.event_type == _E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            return None  # the run failed with the same bug
        return Drift(recorded.index, None, f"no run ({type(error).__name__}: {error})", "a run")
    except asyncio.CancelledError:
        if end is None or end.event_type == _E.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED:
            return None
        return Drift(recorded.index, end.event_id, "the run to end cancelled", _described(end))
    if extra := recorded.left:
        return Drift(recorded.index, extra[0].event_id, "no more commands", _described(extra[0]))
    return None if end is None else _compare_end(recorded, end, outcome, data)


def _compare_end(
    recorded: _History, end: HistoryEvent, outcome: Any, data: SessionInput
) -> Drift | None:
    """The run's end (``outcome``) against the event that closed the recorded run."""
    index, at = recorded.index, end.event_id
    if isinstance(outcome, Continue):
        if end.event_type != _E.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            return Drift(index, at, "continue-as-new", _described(end))
        carried = recorded.input_of(end, "workflow_execution_continued_as_new_event_attributes")
        found, expected = _json(carried.snapshot), _json(outcome.snapshot)
        if found != expected:
            return Drift(
                index, at, f"continue-as-new carrying {expected:.300}", f"a snapshot {found:.300}"
            )
        return None
    if fails_workflow(data, outcome):
        if end.event_type != _E.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            return Drift(index, at, f"the run to fail ({FAILED_SESSION})", _described(end))
        failure = end.workflow_execution_failed_event_attributes.failure.application_failure_info
        if failure.type != FAILED_SESSION:
            return Drift(index, at, f"a {FAILED_SESSION} failure", f"a {failure.type!r} failure")
        return None
    if end.event_type != _E.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
        return Drift(index, at, "the run to complete", _described(end))
    result = recorded.result_of(end)
    plain = json.loads(_json(dataclasses.asdict(outcome)))
    if _json(result) != _json(plain):
        return Drift(index, at, f"the result {_json(plain):.300}", f"{result!r:.300}")
    return None


def _override(data: SessionInput, settings: Settings | None, seed: int | None) -> SessionInput:
    """``data`` with ``settings`` and ``seed`` in place of its own (and its snapshot's)."""
    changes: dict[str, Any] = {}
    if settings is not None:
        changes["settings"] = settings.to_dict()
    if seed is not None:
        changes["seed"] = seed
    if data.snapshot is not None and changes:
        changes["snapshot"] = {**data.snapshot, **changes}
    return dataclasses.replace(data, **changes) if changes else data


def _workflow_id(history: Any) -> str:
    workflow_id = getattr(history, "workflow_id", "")
    return workflow_id if isinstance(workflow_id, str) else ""
