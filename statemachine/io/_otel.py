"""The trace as OpenTelemetry spans and metrics (``statemachine.otel``).

:class:`Telemetry` is a session observer: it sees each :class:`TraceRecord` as the
transition is taken and derives, from the records alone, the spans the GenAI
semantic conventions describe:

* a ``session`` span for the session (parent: the host's current span, or
  ``parent``), with the breaker trips, the limits that fired and the session's end as
  events;
* under it one ``invoke_agent {agent}`` span per turn, from ``idle -start->`` to its
  ``Finish`` (``turnstate.turn.status``; ``error.type`` = the status when it is not
  ``completed``), with every wait (``turnstate.wait``: seconds, category, attempt),
  fallback (``turnstate.fallback``: from and to model, the error) and context
  reduction as events;
* under each turn one ``chat {model}`` span (kind ``CLIENT``) per model call attempt,
  from its ``CallModel`` to the ``ModelReplied``, ``ModelFailed`` or ``Cancelled``
  that answers it, with ``error.type`` = the error category of a failure, and one
  ``execute_tool {name}`` span per tool call of an ``InvokeTools`` until its
  ``ToolsDone`` (``error.type`` = the tool error category of a failed outcome).

Span times are the records' ``at`` (the session's injected clock) plus
``clock_offset`` (default: measured once, at the first record, so that a
``time.monotonic`` clock reads as Unix time), so a simulated or replayed turn has its
true durations. A failure whose category the record cannot say yet (one that moved
to a fallback model: the ``Finish`` carries it) ends its span when the turn ends,
with the end time it had.

Metrics (instruments of ``meter_provider``): ``turnstate.retries`` (by ``error.type``
and ``turnstate.retry.kind``: ``wait``, ``fallback``, ``tool_wait``),
``turnstate.wait.duration`` (histogram, s), ``turnstate.turns`` (by
``turnstate.turn.status``), ``turnstate.sessions`` (by
``turnstate.session.status``), ``turnstate.breaker.trips`` and
``turnstate.breaker.open`` (by ``turnstate.tool.provider``: open breakers of live
sessions), ``turnstate.cost`` (USD, by ``gen_ai.request.model``) and the GenAI
``gen_ai.client.operation.duration`` (s) of every model call.

No content leaves the process unless ``capture_content`` is set: requests, replies,
tool arguments, tool results and error messages are then recorded
(``gen_ai.input.messages``, ``gen_ai.output.messages``, ``gen_ai.tool.call.arguments``,
``gen_ai.tool.call.result``, ``turnstate.error.message``) as JSON text.

Only ``opentelemetry-api`` is imported: without an SDK configured every span and
instrument is a no-op, and with no observer attached the engine builds no record.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from .._version import __version__
from ..core._actions import Assemble, CallModel, Finish, InvokeTools, Wait
from ..core._events import ModelFailed
from ..core._taxonomy import ErrorCategory, ToolErrorCategory, TurnStatus
from ..core._tool_calls import ToolCall
from ..core._trace import TraceRecord
from ..core._usage import Usage

SCOPE = "turnstate"
"""The instrumentation scope of every span and instrument."""

_NS = 1_000_000_000

# attribute names (the GenAI conventions' where they have one)
OPERATION = "gen_ai.operation.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
PROVIDER = "gen_ai.provider.name"
AGENT = "gen_ai.agent.name"
CONVERSATION = "gen_ai.conversation.id"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"
HTTP_STATUS = "http.response.status_code"


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


class _TurnSpans:
    """The spans of one running turn, and what the next record closes."""

    __slots__ = (
        "call_model",
        "calls",
        "chat",
        "chat_attrs",
        "chat_start",
        "cost",
        "deferred_chats",
        "deferred_tools",
        "events",
        "fallback_events",
        "index",
        "span",
        "tools",
    )

    def __init__(self, index: int, span: Span) -> None:
        self.index = index
        self.span = span
        self.chat: Span | None = None
        self.chat_start = 0
        self.chat_attrs: dict[str, Any] = {}
        self.call_model: CallModel | None = None
        self.deferred_chats: list[tuple[Span, int, int, dict[str, Any]]] = []
        """Failed attempts whose category the Finish will say (fallbacks), in order:
        (span, end, start, attributes)."""
        self.fallback_events: list[dict[str, Any]] = []
        """The attributes of the turn's fallback events (their error comes last)."""
        self.tools: dict[str, tuple[Span, ToolCall]] = {}
        """Tool calls in flight, by call id."""
        self.deferred_tools: dict[str, tuple[Span, int, ToolCall]] = {}
        """Tool calls answered by a round that went on to a conflict wait."""
        self.calls: dict[str, ToolCall] = {}
        """Every tool call of the turn, by id (for the breaker's providers)."""
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        """The turn span's events, added in time order when it ends."""
        self.cost = 0.0


class Telemetry:
    """A session observer that turns its trace into OpenTelemetry spans and metrics.

    ``Session(..., observers=[telemetry])``; one :class:`Telemetry` per session.
    ``tracer_provider`` and ``meter_provider`` default to the global ones;
    ``parent`` is the context the session span is a child of (default: the current
    context when the first record arrives). ``agent_name`` names the turn spans
    (``invoke_agent {agent_name}``), ``provider_name`` is ``gen_ai.provider.name``
    (``anthropic``, ``openai``...), ``session_id`` is ``gen_ai.conversation.id``.
    ``clock_offset`` is added to the session clock's readings to make Unix time
    (``None``: ``time.time() - at`` of the first record). ``capture_content``
    records requests, replies, tool arguments and results, and error messages.

    :meth:`bind` lets it read the session's limit and status after each record
    (the limit and session-end events and the session metrics need it);
    :meth:`end` ends the session span (a session ended by a limit or by
    ``Session.end`` during a turn ends it by itself once bound).
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        parent: otel_context.Context | None = None,
        agent_name: str = "turnstate",
        provider_name: str | None = None,
        session_id: str | None = None,
        clock_offset: float | None = None,
        capture_content: bool = False,
    ) -> None:
        self._tracer = trace.get_tracer(SCOPE, __version__, tracer_provider)
        meter = metrics.get_meter(SCOPE, __version__, meter_provider)
        self._retries = meter.create_counter(
            "turnstate.retries", "{retry}", "Retries taken: waits, fallbacks, tool re-invocations"
        )
        self._waits = meter.create_histogram(
            "turnstate.wait.duration", "s", "Backoff waits the engine asked for"
        )
        self._turns = meter.create_counter("turnstate.turns", "{turn}", "Turns ended, by status")
        self._sessions = meter.create_counter(
            "turnstate.sessions", "{session}", "Sessions ended, by status"
        )
        self._trips = meter.create_counter(
            "turnstate.breaker.trips", "{trip}", "Circuit breakers tripped, by tool provider"
        )
        self._open = meter.create_up_down_counter(
            "turnstate.breaker.open", "{breaker}", "Open breakers of live sessions, by provider"
        )
        self._cost = meter.create_counter("turnstate.cost", "USD", "Cost charged, by model")
        self._duration = meter.create_histogram(
            "gen_ai.client.operation.duration", "s", "GenAI operation duration"
        )
        self._parent = parent
        self._agent = agent_name
        self._base: dict[str, Any] = {}
        if provider_name is not None:
            self._base[PROVIDER] = provider_name
        if session_id is not None:
            self._base[CONVERSATION] = session_id
        self._offset = clock_offset
        self._capture = capture_content
        self._session_span: Span | None = None
        self._session_context: otel_context.Context | None = None
        self._turn: _TurnSpans | None = None
        self._last_ns = 0
        self._bound: Any = None
        self._limit: str | None = None
        self._tripped: list[str] = []
        self._ended = False

    # -- the host's side -------------------------------------------------------

    def bind(self, session: Any) -> None:
        """Read ``session`` (a :class:`~statemachine.Session`) after every record:
        its limit (``turnstate.limit`` events) and status (the session span's end)."""
        self._bound = session

    def __call__(self, record: TraceRecord) -> None:
        session = self._bound
        if session is None:
            self.observe(record)
            return
        limit = session.limit_reached
        status = session.status
        self.observe(
            record,
            limit=None if limit is None else limit.value,
            session_status=None if status is None else status.value,
        )

    def end(self, status: str | None = None, *, at: float | None = None) -> None:
        """End the session span (with ``status``, a ``SessionStatus`` value, if the
        session ended) at ``at`` on the session clock (default: the last record's
        time). A turn still running is ended as it stands. Idempotent."""
        if self._ended:
            return
        self._ended = True
        now = self._last_ns if at is None else self._ns(at)
        turn = self._turn
        if turn is not None:
            self._end_turn(turn, None, now)
        span = self._session_span
        if span is None:
            return
        if status is None and self._bound is not None and self._bound.status is not None:
            status = self._bound.status.value
        if status is not None:
            span.set_attribute("turnstate.session.status", status)
            span.add_event("turnstate.session_end", {"turnstate.session.status": status}, now)
            self._sessions.add(1, {"turnstate.session.status": status})
            if status not in ("completed", "cancelled"):
                span.set_status(Status(StatusCode.ERROR, status))
                span.set_attribute(ERROR_TYPE, status)
        for provider in self._tripped:
            self._open.add(-1, {"turnstate.tool.provider": provider})
        span.end(now)

    # -- the records -----------------------------------------------------------

    def _ns(self, at: float | None) -> int:
        if at is None:
            return self._last_ns
        if self._offset is None:
            self._offset = time.time() - at
        return int((at + self._offset) * _NS)

    def observe(
        self,
        record: TraceRecord,
        *,
        limit: str | None = None,
        session_status: str | None = None,
    ) -> None:
        """Take one record, with the session's limit and status as they stood after
        it (what :meth:`__call__` reads from a bound session; a replay passes what
        its source recorded)."""
        if self._ended:
            return
        now = self._ns(record.at)
        self._last_ns = now
        if self._session_span is None:
            self._open_session(now)
        turn = self._turn
        if record.step == 0 or turn is None or turn.index != record.turn:
            if turn is not None:
                self._end_turn(turn, None, now)
            turn = self._open_turn(record, now)
        self._close_pending(turn, record, now)
        self._open_next(turn, record, now)
        finished = type(record.action) is Finish
        if finished:
            self._end_turn(turn, record, now)
        if limit is not None and limit != self._limit:
            self._limit = limit
            if self._session_span is not None:
                self._session_span.add_event("turnstate.limit", {"turnstate.limit": limit}, now)
        if finished and session_status is not None:
            self.end(session_status, at=record.at)

    def _open_session(self, now: int) -> None:
        parent = self._parent if self._parent is not None else otel_context.get_current()
        attributes = dict(self._base)
        attributes[AGENT] = self._agent
        span = self._tracer.start_span(
            "session", parent, SpanKind.INTERNAL, attributes, start_time=now
        )
        self._session_span = span
        self._session_context = trace.set_span_in_context(span, parent)

    def _open_turn(self, record: TraceRecord, now: int) -> _TurnSpans:
        attributes: dict[str, Any] = {
            **self._base,
            OPERATION: "invoke_agent",
            AGENT: self._agent,
            "turnstate.turn.index": record.turn,
        }
        action = record.action
        if type(action) is Assemble:
            attributes["turnstate.turn.final_answer"] = action.withhold_tools
        span = self._tracer.start_span(
            f"invoke_agent {self._agent}",
            self._session_context,
            SpanKind.INTERNAL,
            attributes,
            start_time=now,
        )
        turn = _TurnSpans(record.turn, span)
        self._turn = turn
        return turn

    def _close_pending(self, turn: _TurnSpans, record: TraceRecord, now: int) -> None:
        """End what ``record``'s event answers: the model call in flight, the tools."""
        event = record.event
        action = record.action
        if record.cost_usd:
            turn.cost += record.cost_usd
            model = turn.call_model.model if turn.call_model is not None else None
            self._cost.add(record.cost_usd, {REQUEST_MODEL: model or "default"})
        chat = turn.chat
        if chat is not None and event in ("ModelReplied", "ModelFailed", "Cancelled"):
            turn.chat = None
            attrs = turn.chat_attrs
            if record.cost_usd:
                chat.set_attribute("turnstate.cost_usd", record.cost_usd)
            usage = record.usage
            if usage is not None:
                _usage_attributes(chat, usage)
            if event == "ModelReplied":
                if usage is not None and usage.model is not None:
                    chat.set_attribute(RESPONSE_MODEL, usage.model)
                elif type(action) is Finish and action.model is not None:
                    chat.set_attribute(RESPONSE_MODEL, action.model)
                if self._capture and type(action) is Finish and action.reply is not None:
                    chat.set_attribute("gen_ai.output.messages", _json(action.reply))
                self._end_chat(chat, turn.chat_start, now, attrs, None)
            elif event == "Cancelled":
                self._end_chat(chat, turn.chat_start, now, attrs, "cancelled")
            else:
                # the error itself: the event the record carries; a record read from a
                # trace without it has the Finish's (a fallback's comes with the Finish)
                cause = record.caused_by
                error = cause.error if type(cause) is ModelFailed else None
                if error is None and type(action) is Finish:
                    error = action.error
                category = _failure_category(action) if error is None else error.category.value
                if error is not None:
                    self._error_details(chat, error)
                if category is None:  # a fallback: the Finish will say which error
                    turn.deferred_chats.append((chat, now, turn.chat_start, attrs))
                else:
                    self._end_chat(chat, turn.chat_start, now, attrs, category)
        if event == "ToolsDone" or (event == "Cancelled" and turn.tools):
            if type(action) is Finish:
                return  # the Finish ends them with their results
            for call_id, (span, call) in turn.tools.items():
                turn.deferred_tools[call_id] = (span, now, call)
            turn.tools = {}
        elif event == "WaitDone" and type(action) is InvokeTools:
            for call in action.calls:  # re-invoked: the deferred attempt conflicted
                deferred = turn.deferred_tools.pop(call.id, None)
                if deferred is not None:
                    span, end, _ = deferred
                    _end_error(span, ToolErrorCategory.CONCURRENCY_CONFLICT.value, end)

    def _end_chat(
        self, span: Span, start: int, end: int, attrs: dict[str, Any], error: str | None
    ) -> None:
        point = {OPERATION: "chat", REQUEST_MODEL: attrs.get(REQUEST_MODEL, "default")}
        if error is not None:
            point[ERROR_TYPE] = error
            _end_error(span, error, end)
        else:
            span.end(end)
        self._duration.record((end - start) / _NS, point)

    def _error_details(self, span: Span, error: Any) -> None:
        if error.status is not None:
            span.set_attribute(HTTP_STATUS, error.status)
        if error.retry_after_seconds is not None:
            span.set_attribute("turnstate.retry_after_s", error.retry_after_seconds)
        if self._capture and error.message:
            span.set_attribute("turnstate.error.message", error.message)

    def _open_next(self, turn: _TurnSpans, record: TraceRecord, now: int) -> None:
        """Start what ``record``'s action begins: a model call, tool calls; note waits."""
        action = record.action
        if isinstance(action, CallModel):
            if "fallback_left" in record.guard:
                moved = {
                    "turnstate.fallback.from_model": _model_name(turn.call_model),
                    "turnstate.fallback.to_model": action.model or "default",
                }
                turn.events.append((now, "turnstate.fallback", moved))
                cause = record.caused_by
                if type(cause) is ModelFailed:  # the error that moved it is the record's
                    category = cause.error.category.value
                    moved[ERROR_TYPE] = category
                    self._retries.add(1, {ERROR_TYPE: category, "turnstate.retry.kind": "fallback"})
                else:  # a record read without its event: the Finish will say
                    turn.fallback_events.append(moved)
            attrs: dict[str, Any] = {
                **self._base,
                OPERATION: "chat",
                "turnstate.attempt": action.attempt,
                "turnstate.step": record.step,
            }
            if action.model is not None:
                attrs[REQUEST_MODEL] = action.model
            if action.withhold_tools:
                attrs["turnstate.withhold_tools"] = True
            if self._capture:
                attrs["gen_ai.input.messages"] = _json(action.request)
            parent = trace.set_span_in_context(turn.span)
            name = f"chat {action.model}" if action.model else "chat"
            turn.chat = self._tracer.start_span(
                name, parent, SpanKind.CLIENT, attrs, start_time=now
            )
            turn.chat_start = now
            turn.chat_attrs = attrs
            turn.call_model = action
        elif isinstance(action, Wait):
            category = action.category.value
            tool = isinstance(action.category, ToolErrorCategory)
            attributes: dict[str, Any] = {
                "turnstate.wait.seconds": action.seconds,
                ERROR_TYPE: category,
                "turnstate.attempt": action.attempt,
            }
            server = getattr(action, "retry_after", None)
            if server is not None:
                attributes["turnstate.retry_after_s"] = server
            turn.events.append((now, "turnstate.wait", attributes))
            self._retries.add(
                1, {ERROR_TYPE: category, "turnstate.retry.kind": "tool_wait" if tool else "wait"}
            )
            self._waits.record(action.seconds, {ERROR_TYPE: category})
        elif isinstance(action, Assemble):
            if action.reduce:
                turn.events.append(
                    (
                        now,
                        "turnstate.context_reduction",
                        {"turnstate.reductions": record.reductions},
                    )
                )
        elif isinstance(action, InvokeTools):
            parent = trace.set_span_in_context(turn.span)
            for call in action.calls:
                turn.calls[call.id] = call
                attributes = {
                    **self._base,
                    OPERATION: "execute_tool",
                    TOOL_NAME: call.name,
                    TOOL_CALL_ID: call.id,
                    TOOL_TYPE: "function",
                    "turnstate.tool.provider": call.provider,
                    "turnstate.step": record.step,
                }
                if self._capture:
                    attributes["gen_ai.tool.call.arguments"] = _json(call.arguments)
                span = self._tracer.start_span(
                    f"execute_tool {call.name}",
                    parent,
                    SpanKind.INTERNAL,
                    attributes,
                    start_time=now,
                )
                turn.tools[call.id] = (span, call)

    def _end_turn(self, turn: _TurnSpans, record: TraceRecord | None, now: int) -> None:
        """End the turn's spans: with its Finish (``record``), or as they stand."""
        self._turn = None
        finish = record.action if record is not None else None
        fallbacks = finish.fallbacks if type(finish) is Finish else ()
        # the moves this observer saw are the last ones (it may have joined mid-turn)
        seen = fallbacks[len(fallbacks) - len(turn.deferred_chats) :] if fallbacks else ()
        for i, (span, end, start, attrs) in enumerate(turn.deferred_chats):
            error = seen[i].error if i < len(seen) else None
            category = error.category.value if error is not None else "transient"
            if error is not None:
                self._error_details(span, error)
            if i < len(turn.fallback_events):
                turn.fallback_events[i][ERROR_TYPE] = category
            self._retries.add(1, {ERROR_TYPE: category, "turnstate.retry.kind": "fallback"})
            self._end_chat(span, start, end, attrs, category)
        if turn.chat is not None:
            self._end_chat(turn.chat, turn.chat_start, now, turn.chat_attrs, "unfinished")
        results = {r.call_id: r for r in finish.tool_results} if type(finish) is Finish else {}
        ending = [(s, now, c) for s, c in turn.tools.values()]
        ending.extend(turn.deferred_tools.values())
        for span, end, call in ending:
            result = results.get(call.id)
            if result is not None and self._capture:
                span.set_attribute("gen_ai.tool.call.result", _json(result.content))
            if result is None:
                _end_error(span, "unfinished", end)
            elif result.is_error:
                category = result.category.value if result.category is not None else "unknown"
                _end_error(span, category, end)
            else:
                span.end(end)
        span = turn.span
        for at, name, attributes in sorted(turn.events, key=lambda e: e[0]):
            span.add_event(name, attributes, at)
        span.set_attribute("turnstate.cost_usd", turn.cost)
        if type(finish) is not Finish or record is None:
            _end_error(span, "unfinished", now)
            return
        status = finish.status.value
        span.set_attribute("turnstate.turn.status", status)
        span.set_attribute("turnstate.session_retries", record.session_retries)
        if finish.model is not None:
            span.set_attribute(RESPONSE_MODEL, finish.model)
        self._turns.add(1, {"turnstate.turn.status": status})
        if record.guard in ("trips_breaker", "trips_denial_breaker"):
            self._breaker(turn, finish, record.guard, now)
        if finish.status is TurnStatus.COMPLETED:
            span.end(now)
        else:
            _end_error(span, status, now)

    def _breaker(self, turn: _TurnSpans, finish: Finish, guard: str, now: int) -> None:
        if guard == "trips_denial_breaker":
            providers = ["denial"]
        else:
            crashed = {r.call_id for r in finish.tool_results if r.category is _CRASHED}
            providers = sorted({turn.calls[c].provider for c in crashed if c in turn.calls})
        session_span = self._session_span
        if session_span is None:  # pragma: no cover - a turn runs inside the session span
            return
        session_span.add_event(
            "turnstate.breaker_open",
            {
                "turnstate.breaker": guard.removeprefix("trips_"),
                "turnstate.tool.providers": providers,
            },
            now,
        )
        for provider in providers:
            self._trips.add(1, {"turnstate.tool.provider": provider})
            self._open.add(1, {"turnstate.tool.provider": provider})
            self._tripped.append(provider)


_CRASHED = ToolErrorCategory.PROCESS_CRASHED


def _model_name(call: CallModel | None) -> str:
    return (call.model if call is not None else None) or "default"


def _failure_category(action: object) -> str | None:
    """The model error category a ``ModelFailed`` record's action shows, or ``None``
    (a move to a fallback model: the turn's ``Finish`` carries the error)."""
    if isinstance(action, Wait):
        return action.category.value
    if isinstance(action, Finish):
        if action.error is not None:
            return action.error.category.value
        return action.status.value
    if isinstance(action, Assemble):
        return ErrorCategory.CONTEXT_LENGTH_EXCEEDED.value
    return None


def _usage_attributes(span: Span, usage: Usage) -> None:
    """A model call's usage as the GenAI conventions' attributes."""
    if usage.input_tokens is not None:
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
    if usage.output_tokens is not None:
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
    if usage.cached_tokens is not None:
        span.set_attribute("gen_ai.usage.cache_read.input_tokens", usage.cached_tokens)
    if usage.response_id is not None:
        span.set_attribute("gen_ai.response.id", usage.response_id)
    if usage.finish_reason is not None:
        span.set_attribute("gen_ai.response.finish_reasons", [usage.finish_reason])
    if usage.model is not None:
        span.set_attribute(RESPONSE_MODEL, usage.model)


def _end_error(span: Span, error: str, end: int) -> None:
    span.set_attribute(ERROR_TYPE, error)
    span.set_status(Status(StatusCode.ERROR, error))
    span.end(end)


def replay(
    records: Sequence[TraceRecord],
    telemetry: Telemetry,
    *,
    session_status: str | None = None,
    limits: Callable[[TraceRecord], str | None] | None = None,
) -> None:
    """Feed recorded ``records`` (a trace file's, a turn's ``trace``) to
    ``telemetry`` and end its session span with ``session_status``: the spans of a
    past session, with its true times. ``limits`` says the limit that had fired
    after a record, if the source recorded it."""
    for record in records:
        telemetry.observe(record, limit=None if limits is None else limits(record))
    telemetry.end(session_status)
