"""The trace as OpenTelemetry spans and metrics: :class:`Telemetry`, behind
:mod:`statemachine.otel` (``docs/telemetry.md`` lists what each span and metric holds).

Everything is derived from the records alone: each carries the event that fired it
and the model call's :class:`~statemachine.Usage`. A record read from an old trace may
lack its event; what it cannot say yet (the error that moved a call to a fallback
model) the turn's ``Finish`` carries, and the spans it concerns end with the turn, at
the times they had.
"""

from __future__ import annotations

import functools
import json
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    raise ImportError(
        f"statemachine.otel needs the OpenTelemetry API: pip install 'turnstate[otel]' ({exc})"
    ) from exc

from .._version import __version__
from ..core._actions import Assemble, CallModel, Finish, InvokeTools, Wait
from ..core._events import ModelFailed, ModelReplied, ToolsDone
from ..core._taxonomy import ErrorCategory, ToolErrorCategory, TurnStatus
from ..core._tool_calls import ToolCall
from ..core._trace import TraceRecord
from ..core._usage import Usage
from ._loop import provider_model

SCOPE = "turnstate"
"""The instrumentation scope of every span and instrument."""

SEMCONV_VERSION = "1.41.0"
"""The OpenTelemetry semantic conventions release whose GenAI pages the spans and
metrics follow (the last release to carry them; 1.41.1 changed none of them)."""
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"

# fmt: off
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)
"""Seconds: the advised boundaries of ``gen_ai.client.operation.duration``."""
TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)
# fmt: on
"""Tokens: the advised boundaries of ``gen_ai.client.token.usage``."""

_NS = 1_000_000_000

# attribute names used in more than one place
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
FINISH_REASONS = "gen_ai.response.finish_reasons"
STREAM = "gen_ai.request.stream"
OUTPUT_MESSAGES = "gen_ai.output.messages"
ERROR_TYPE = "error.type"
ERROR_MESSAGE = "turnstate.error.message"

_USAGE_COUNTS = (
    ("input_tokens", "gen_ai.usage.input_tokens"),
    ("output_tokens", "gen_ai.usage.output_tokens"),
    ("cached_tokens", "gen_ai.usage.cache_read.input_tokens"),
    ("cache_creation_tokens", "gen_ai.usage.cache_creation.input_tokens"),
    ("reasoning_tokens", "gen_ai.usage.reasoning.output_tokens"),
)
"""A usage's token counts and their span attributes."""

_Where = tuple[str | None, str | None, int | None]
"""Where a call went: (provider name, server address, server port)."""
_NOWHERE: _Where = (None, None, None)


class _Instruments:
    """The instruments of one meter provider, made once and shared by every
    :class:`Telemetry` of it (a proxy meter remembers each instrument made on it)."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration",
            "s",
            "GenAI operation duration",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            "{token}",
            "Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self.retries = meter.create_counter(
            "turnstate.retries", "{retry}", "Retries taken: waits, fallbacks, tool re-invocations"
        )
        self.waits = meter.create_histogram(
            "turnstate.wait.duration",
            "s",
            "Backoff waits the engine asked for",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.turns = meter.create_counter("turnstate.turns", "{turn}", "Turns ended, by status")
        self.sessions = meter.create_counter(
            "turnstate.sessions", "{session}", "Sessions ended, by status"
        )
        self.trips = meter.create_counter(
            "turnstate.breaker.trips", "{trip}", "Circuit breakers tripped, by tool provider"
        )
        self.open = meter.create_up_down_counter(
            "turnstate.breaker.open", "{breaker}", "Open breakers of live sessions, by provider"
        )
        # UCUM has no currency unit: an annotation names what is counted
        self.cost = meter.create_counter(
            "turnstate.cost", "{USD}", "Cost charged in US dollars, by model"
        )


_INSTRUMENTS: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()


@functools.cache
def _global_instruments() -> _Instruments:
    """The global provider's: its meter is a proxy until one is set, then forwards."""
    return _Instruments(metrics.get_meter(SCOPE, __version__, schema_url=SCHEMA_URL))


def _instruments(provider: metrics.MeterProvider | None) -> _Instruments:
    if provider is None:
        return _global_instruments()
    try:
        made = _INSTRUMENTS.get(provider)
    except TypeError:  # not weakly referenceable: not shared
        return _Instruments(metrics.get_meter(SCOPE, __version__, provider, SCHEMA_URL))
    if made is None:
        made = _INSTRUMENTS[provider] = _Instruments(
            metrics.get_meter(SCOPE, __version__, provider, SCHEMA_URL)
        )
    return made


def _tracer_records(provider: trace.TracerProvider | None) -> bool:
    """Whether spans of ``provider`` (``None``: the global one, as it stands) may be
    recorded: not the API's no-op provider, nor its proxy while no SDK is set."""
    if provider is None or isinstance(provider, trace.ProxyTracerProvider):
        provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.NoOpTracerProvider | trace.ProxyTracerProvider)


def _meter_records(provider: metrics.MeterProvider | None) -> bool:
    """Whether instruments of ``provider`` (``None``: the global one, as it stands)
    record anything: not the API's no-op provider, nor the proxy the API hands out
    while no SDK is set (a name check: the proxy's class is private; were it renamed,
    this answers yes, which is only slower)."""
    chosen = metrics.get_meter_provider() if provider is None else provider
    if isinstance(chosen, metrics.NoOpMeterProvider):
        return False
    return type(chosen).__name__ != "_ProxyMeterProvider"


def _json(value: object) -> str:
    """``value`` as JSON text; never raises (what JSON cannot hold is written as text)."""
    try:
        return json.dumps(value, default=_text, ensure_ascii=False)
    except Exception:  # a cycle, keys that are not text
        return json.dumps(_text(value), ensure_ascii=False)


def _text(value: object) -> str:
    """``str(value)``, or its type's name when that raises."""
    try:
        return value if isinstance(value, str) else str(value)
    except Exception:
        return f"<{type(value).__name__}>"


_JSON_NATIVE = (dict, list, tuple, int, float, bool, type(None))


@attrs.define
class _Chat:
    """One model call attempt in flight: its span and what its metrics need."""

    span: Span
    start: int
    model: str | None
    """The model requested."""
    where: _Where
    """Where the call went, as far as known."""
    usage: Usage | None = None
    """What its event reported."""


@attrs.define
class _TurnSpans:
    """The spans of one running turn, and what the next record closes."""

    index: int
    span: Span
    where: _Where = _NOWHERE
    """Where the turn's last call went, as far as known."""
    chat: _Chat | None = None
    first_call: CallModel | None = None
    last_model: str | None = None
    """The model the turn's last call asked for (:func:`_requested_model`)."""
    deferred_chats: list[tuple[_Chat, int]] = attrs.Factory(list)
    """Failed attempts whose category the Finish will say (fallbacks read from a
    trace without their events), in order: (chat, end)."""
    fallback_events: list[dict[str, Any]] = attrs.Factory(list)
    """The attributes of those fallbacks' events (their error comes last)."""
    tools: dict[str, tuple[Span, ToolCall]] = attrs.Factory(dict)
    """Tool calls in flight, by call id."""
    deferred_tools: dict[str, tuple[Span, int, ToolCall]] = attrs.Factory(dict)
    """Tool calls answered by a round that went on to a conflict wait."""
    calls: dict[str, ToolCall] = attrs.Factory(dict)
    """Every tool call of the turn, by id (for the breaker's providers)."""
    events: list[tuple[int, str, dict[str, Any]]] = attrs.Factory(list)
    """The turn span's events, added in time order when it ends."""
    cost: float = 0.0
    usages: list[Usage] = attrs.Factory(list)
    """The usage of every model call outcome of the turn, in order."""
    replied: ModelReplied | None = None
    """The turn's last reply."""


class Telemetry:
    """A session observer that turns its trace into OpenTelemetry spans and metrics.

    ``Session(..., observers=[telemetry])``; one :class:`Telemetry` per session.
    ``tracer_provider`` and ``meter_provider`` default to the global ones;
    ``parent`` is the context the session span is a child of (default: the current
    context when the first record arrives). ``agent_name`` names the turn spans
    (``invoke_agent {agent_name}``) and the session's (``invoke_workflow
    {agent_name}``). ``provider_name`` is the ``gen_ai.provider.name`` of calls whose
    usage does not say (the ready-made providers' always does). ``session_id`` is
    ``gen_ai.conversation.id`` (default: the bound session's ``session_id``).
    ``clock_offset`` is added to the session clock's readings to make Unix time
    (``None``: ``time.time() - at`` of the first record). ``capture_content`` records
    requests, replies, tool definitions, arguments and results, and error messages.

    :meth:`bind` lets it read the session's id, limit and status; :meth:`end` ends the
    session span (a bound session that a limit or ``Session.end`` ends during a turn
    ends it by itself). Whether anything records is decided when the observer is made
    and again at the session's first record: with neither spans nor metrics recording
    (no SDK configured), a record costs one attribute read.
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
        self._tracer = trace.get_tracer(SCOPE, __version__, tracer_provider, SCHEMA_URL)
        self._meter_provider = meter_provider
        self._m = _instruments(meter_provider)
        self._parent = parent
        self._agent = agent_name
        self._provider = provider_name
        self._session_id = session_id
        self._base: dict[str, Any] = {}
        """Attributes of every span: the conversation id, once known."""
        self._known: dict[str | None, _Where] = {}
        """Where the last call to each requested model went."""
        self._latest: str | None = provider_name
        """The provider of the last call whose usage named one (else ``provider_name``)."""
        self._offset = clock_offset
        self._capture = capture_content
        self._off = not (_tracer_records(tracer_provider) or _meter_records(meter_provider))
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
        """Read ``session`` (a :class:`~statemachine.Session`): its ``session_id`` (the
        conversation id, when none was given) when the first record arrives, and its
        limit (``turnstate.limit`` events) and status (the session span's end) after
        every record."""
        self._bound = session

    def __call__(self, record: TraceRecord) -> None:
        if self._off:
            return
        session = self._bound
        if session is None:
            self.observe(record)
            return
        limit, status = session.limit_reached, session.status
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
        if self._off:
            return
        now = self._ns(at)
        if self._turn is not None:
            self._end_turn(self._turn, None, now)
        span = self._session_span
        if span is None:
            return
        if status is None and self._bound is not None and self._bound.status is not None:
            status = self._bound.status.value
        if status is not None:
            span.set_attribute("turnstate.session.status", status)
            span.add_event("turnstate.session_end", {"turnstate.session.status": status}, now)
            self._m.sessions.add(1, {"turnstate.session.status": status})
        for provider in self._tripped:
            self._m.open.add(-1, {"turnstate.tool.provider": provider})
        _end_span(span, now, None if status in (None, "completed", "cancelled") else status)

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
        if self._ended or self._off:
            return
        session_span = self._session_span
        if session_span is None:
            session_span = self._open_session(record)
            if self._off:
                return
        now = self._last_ns = self._ns(record.at)
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
            session_span.add_event("turnstate.limit", {"turnstate.limit": limit}, now)
        if finished and session_status is not None:
            self.end(session_status, at=record.at)

    def _start(
        self,
        name: str,
        parent: otel_context.Context | None,
        operation: str,
        attributes: dict[str, Any],
        now: int,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> Span:
        """Start a span of ``operation`` (with the attributes of every span)."""
        attributes = {**self._base, OPERATION: operation, **attributes}
        return self._tracer.start_span(name, parent, kind, attributes, start_time=now)

    def _open_session(self, record: TraceRecord) -> Span:
        """Start the session span at the first record, and decide whether anything
        records (else the observer is off for the rest of the session)."""
        parent = self._parent if self._parent is not None else otel_context.get_current()
        conversation = self._session_id
        if conversation is None and self._bound is not None:
            conversation = self._bound.session_id
        if conversation is not None:
            self._base["gen_ai.conversation.id"] = conversation
        now = self._ns(record.at)
        workflow = {"gen_ai.workflow.name": self._agent}
        span = self._start(
            f"invoke_workflow {self._agent}", parent, "invoke_workflow", workflow, now
        )
        self._session_span = span
        if not span.is_recording() and not _meter_records(self._meter_provider):
            self._off = True
        else:
            self._session_context = trace.set_span_in_context(span, parent)
        return span

    def _open_turn(self, record: TraceRecord, now: int) -> _TurnSpans:
        attributes: dict[str, Any] = {
            "gen_ai.agent.name": self._agent,
            "turnstate.turn.index": record.turn,
        }
        provider = self._latest
        if provider is not None:
            attributes[PROVIDER] = provider
        action = record.action
        if type(action) is Assemble:
            attributes["turnstate.turn.final_answer"] = action.withhold_tools
        name = f"invoke_agent {self._agent}"
        span = self._start(name, self._session_context, "invoke_agent", attributes, now)
        turn = self._turn = _TurnSpans(record.turn, span, where=(provider, None, None))
        return turn

    def _close_pending(self, turn: _TurnSpans, record: TraceRecord, now: int) -> None:
        """End what ``record``'s event answers: the model call in flight, the tools."""
        event, action, chat = record.event, record.action, turn.chat
        if record.cost_usd:
            turn.cost += record.cost_usd
            cost_point: dict[str, Any] = {}
            if chat is not None:
                provider = (record.usage and record.usage.provider_name) or chat.where[0]
                _where_attributes(cost_point, (provider, None, None), chat.model)
            self._m.cost.add(record.cost_usd, cost_point)
        if chat is not None and event in ("ModelReplied", "ModelFailed", "Cancelled"):
            turn.chat = None
            self._answer_chat(turn, chat, record, now)
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
                    _end_span(deferred[0], deferred[1], _CONFLICT)

    def _answer_chat(self, turn: _TurnSpans, chat: _Chat, record: TraceRecord, now: int) -> None:
        """End a model call attempt's span with what its event says."""
        usage = record.usage
        found: dict[str, Any] = {}
        if record.cost_usd:
            found["turnstate.cost_usd"] = record.cost_usd
        if usage is not None:
            chat.usage = usage
            turn.usages.append(usage)
            _usage_attributes(found, usage)
            self._learn(chat, usage)
        turn.where = chat.where
        error: str | None = None
        if record.event == "ModelReplied":
            self._reply_attributes(found, turn, chat, record)
        elif record.event == "Cancelled":
            error = "cancelled"
        else:
            error = self._failure_attributes(found, record)
        if found:
            chat.span.set_attributes(found)
        if error is None and record.event == "ModelFailed":  # a fallback: the Finish says why
            turn.deferred_chats.append((chat, now))
        else:
            self._end_chat(chat, now, error)

    def _reply_attributes(
        self, found: dict[str, Any], turn: _TurnSpans, chat: _Chat, record: TraceRecord
    ) -> None:
        """What a reply says: the OpenAI response attributes, the output messages."""
        cause, action = record.caused_by, record.action
        reason = record.usage.finish_reason if record.usage is not None else None
        if type(cause) is ModelReplied:
            turn.replied = cause
            if isinstance(cause.reply, Mapping) and chat.where[0] == "openai":
                _openai_attributes(found, cause.reply)
            if self._capture:
                found[OUTPUT_MESSAGES] = _json(
                    output_messages(cause.reply, cause.tool_calls, reason)
                )
        elif self._capture and type(action) is Finish and action.reply is not None:
            found[OUTPUT_MESSAGES] = _json(output_messages(action.reply, (), reason))

    def _failure_attributes(self, found: dict[str, Any], record: TraceRecord) -> str | None:
        """A failure's details, and its category (``None``: a move to a fallback model,
        whose error the turn's ``Finish`` carries)."""
        # the error is the record's event's; a record read without its event has the
        # Finish's
        cause, action = record.caused_by, record.action
        error = cause.error if type(cause) is ModelFailed else None
        if error is None and type(action) is Finish:
            error = action.error
        if error is None:
            return _failure_category(action)
        self._error_details(found, error)
        return error.category.value

    def _learn(self, chat: _Chat, usage: Usage) -> None:
        """Take where the call went from its usage, and remember it for the next call
        to the same model."""
        if usage.provider_name is None and usage.server_address is None:
            return
        provider, address, port = chat.where
        if usage.server_address is not None:
            address, port = usage.server_address, usage.server_port
        chat.where = (usage.provider_name or provider, address, port)
        self._known[chat.model] = chat.where
        if usage.provider_name is not None:
            self._latest = usage.provider_name

    def _end_chat(self, chat: _Chat, end: int, error: str | None) -> None:
        """End the span and record the call's duration and tokens."""
        _end_span(chat.span, end, error)
        usage = chat.usage
        point: dict[str, Any] = {OPERATION: "chat"}
        _where_attributes(point, chat.where, chat.model)
        if usage is not None:
            if usage.model is not None:
                point[RESPONSE_MODEL] = usage.model
            for kind, count in (("input", usage.input_tokens), ("output", usage.output_tokens)):
                if count is not None:
                    self._m.tokens.record(count, {**point, "gen_ai.token.type": kind})
        if error is not None:
            point[ERROR_TYPE] = error
        self._m.duration.record((end - chat.start) / _NS, point)

    def _error_details(self, found: dict[str, Any], error: Any) -> None:
        if error.status is not None:
            found["http.response.status_code"] = error.status
        if error.retry_after_seconds is not None and type(error.retry_after_seconds) is float:
            found["turnstate.retry_after_s"] = error.retry_after_seconds
        if self._capture and error.message:
            found[ERROR_MESSAGE] = error.message

    def _open_next(self, turn: _TurnSpans, record: TraceRecord, now: int) -> None:
        """Start what ``record``'s action begins: a model call, tool calls; note waits."""
        action = record.action
        if isinstance(action, CallModel):
            self._open_chat(turn, record, action, now)
        elif isinstance(action, Wait):
            category = action.category.value
            attributes: dict[str, Any] = {
                "turnstate.wait.seconds": action.seconds,
                ERROR_TYPE: category,
                "turnstate.attempt": action.attempt,
            }
            if action.retry_after is not None:
                attributes["turnstate.retry_after_s"] = action.retry_after
            turn.events.append((now, "turnstate.wait", attributes))
            tool = isinstance(action.category, ToolErrorCategory)
            self._retry(category, "tool_wait" if tool else "wait")
            self._m.waits.record(action.seconds, {ERROR_TYPE: category})
        elif isinstance(action, Assemble) and action.reduce:
            reductions = {"turnstate.reductions": record.reductions}
            turn.events.append((now, "turnstate.context_reduction", reductions))
        elif isinstance(action, InvokeTools):
            self._open_tools(turn, record, action, now)

    def _retry(self, category: str, kind: str) -> None:
        self._m.retries.add(1, {ERROR_TYPE: category, "turnstate.retry.kind": kind})

    def _open_chat(
        self, turn: _TurnSpans, record: TraceRecord, action: CallModel, now: int
    ) -> None:
        request = action.request
        model = _requested_model(action)
        if "fallback_left" in record.guard:
            self._fallback(turn, record, model, now)
        where = self._known.get(model) or (self._provider, None, None)
        attributes: dict[str, Any] = {
            "turnstate.attempt": action.attempt,
            "turnstate.step": record.step,
        }
        _where_attributes(attributes, where, model)
        if action.withhold_tools:
            attributes["turnstate.withhold_tools"] = True
        if isinstance(request, Mapping):
            _request_attributes(attributes, request, where[0])
        if self._capture:
            _content_attributes(attributes, request)
        if turn.first_call is None:
            turn.first_call = action
            if model is not None:
                turn.span.set_attribute(REQUEST_MODEL, model)
        turn.last_model = model
        parent = trace.set_span_in_context(turn.span)
        name = f"chat {model}" if model else "chat"
        span = self._start(name, parent, "chat", attributes, now, SpanKind.CLIENT)
        turn.chat = _Chat(span, now, model, where)

    def _fallback(self, turn: _TurnSpans, record: TraceRecord, model: str | None, now: int) -> None:
        """Note a move to a fallback ``model``: an event of the turn, a retry."""
        moved: dict[str, Any] = {}
        if turn.last_model is not None:
            moved["turnstate.fallback.from_model"] = turn.last_model
        if model is not None:
            moved["turnstate.fallback.to_model"] = model
        turn.events.append((now, "turnstate.fallback", moved))
        cause = record.caused_by
        if type(cause) is ModelFailed:  # the error that moved it is the record's
            moved[ERROR_TYPE] = cause.error.category.value
            self._retry(moved[ERROR_TYPE], "fallback")
        else:  # a record read without its event: the Finish will say
            turn.fallback_events.append(moved)

    def _open_tools(
        self, turn: _TurnSpans, record: TraceRecord, action: InvokeTools, now: int
    ) -> None:
        parent = trace.set_span_in_context(turn.span)
        for call in action.calls:
            turn.calls[call.id] = call
            attributes = {
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.id,
                "gen_ai.tool.type": "function",
                "turnstate.tool.provider": call.provider,
                "turnstate.step": record.step,
            }
            if self._capture:
                attributes["gen_ai.tool.call.arguments"] = _json(_as_object(call.arguments))
            name = f"execute_tool {call.name}"
            turn.tools[call.id] = (self._start(name, parent, "execute_tool", attributes, now), call)

    def _end_turn(self, turn: _TurnSpans, record: TraceRecord | None, now: int) -> None:
        """End the turn's spans: with its Finish (``record``), or as they stand."""
        self._turn = None
        finish = record.action if record is not None else None
        if type(finish) is not Finish:
            finish = None
        self._end_fallbacks(turn, finish)
        if turn.chat is not None:
            self._end_chat(turn.chat, now, "unfinished")
        self._end_tools(turn, finish, now)
        span = turn.span
        for at, name, attributes in sorted(turn.events, key=lambda e: e[0]):
            span.add_event(name, attributes, at)
        span.set_attributes(self._turn_attributes(turn))
        if finish is None or record is None:
            _end_span(span, now, "unfinished")
            return
        status = finish.status.value
        span.set_attribute("turnstate.turn.status", status)
        span.set_attribute("turnstate.session_retries", record.session_retries)
        self._m.turns.add(1, {"turnstate.turn.status": status})
        if record.guard in ("trips_breaker", "trips_denial_breaker"):
            self._breaker(turn, finish, record, now)
        _end_span(span, now, None if finish.status is TurnStatus.COMPLETED else status)

    def _end_fallbacks(self, turn: _TurnSpans, finish: Finish | None) -> None:
        """End the attempts that moved to a fallback model, with the errors the Finish
        carries (the moves this observer saw are the last ones: it may have joined
        mid-turn)."""
        fallbacks = finish.fallbacks if finish is not None else ()
        seen = fallbacks[len(fallbacks) - len(turn.deferred_chats) :] if fallbacks else ()
        for i, (chat, end) in enumerate(turn.deferred_chats):
            error = seen[i].error if i < len(seen) else None
            category = error.category.value if error is not None else "transient"
            if error is not None:
                found: dict[str, Any] = {}
                self._error_details(found, error)
                if found:
                    chat.span.set_attributes(found)
            if i < len(turn.fallback_events):
                turn.fallback_events[i][ERROR_TYPE] = category
            self._retry(category, "fallback")
            self._end_chat(chat, end, category)

    def _end_tools(self, turn: _TurnSpans, finish: Finish | None, now: int) -> None:
        """End the tool calls' spans with their results in the Finish."""
        results = {r.call_id: r for r in finish.tool_results} if finish is not None else {}
        ending = [(s, now, c) for s, c in turn.tools.values()]
        ending.extend(turn.deferred_tools.values())
        for span, end, call in ending:
            result = results.get(call.id)
            if result is None:
                _end_span(span, end, "unfinished")
            elif result.is_error:
                if self._capture:
                    span.set_attribute(ERROR_MESSAGE, _text_of(result.content))
                category = result.category.value if result.category is not None else "unknown"
                _end_span(span, end, category)
            else:
                if self._capture:
                    result_json = _json(_as_object(result.content))
                    span.set_attribute("gen_ai.tool.call.result", result_json)
                span.end(end)

    def _turn_attributes(self, turn: _TurnSpans) -> dict[str, Any]:
        """What the turn span says at its end: its calls' provider, tokens, last reply."""
        found: dict[str, Any] = {"turnstate.cost_usd": turn.cost}
        if turn.where[0] is not None:
            found[PROVIDER] = turn.where[0]
        for field, key in _USAGE_COUNTS:
            counts = [getattr(u, field) for u in turn.usages if getattr(u, field) is not None]
            if counts:
                found[key] = sum(counts)
        replied = turn.replied
        last = replied.usage if replied is not None else None
        if last is not None:
            if last.model is not None:
                found[RESPONSE_MODEL] = last.model
            if last.finish_reason is not None:
                found[FINISH_REASONS] = (last.finish_reason,)
        if self._capture:
            if turn.first_call is not None:
                _content_attributes(found, turn.first_call.request)
            if replied is not None:
                reason = last.finish_reason if last is not None else None
                found[OUTPUT_MESSAGES] = _json(
                    output_messages(replied.reply, replied.tool_calls, reason)
                )
        return found

    def _breaker(self, turn: _TurnSpans, finish: Finish, record: TraceRecord, now: int) -> None:
        guard = record.guard
        if guard == "trips_denial_breaker":
            providers = ["denial"]
        else:
            done = record.caused_by
            if isinstance(done, ToolsDone):  # what the breaker counted: failed invocations
                crashed = {o.call_id for o in done.outcomes if o.crashed}
            else:  # a record without its event: the deaths its results show
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
            self._m.trips.add(1, {"turnstate.tool.provider": provider})
            self._m.open.add(1, {"turnstate.tool.provider": provider})
            self._tripped.append(provider)


_CRASHED = ToolErrorCategory.PROCESS_CRASHED
_CONFLICT = ToolErrorCategory.CONCURRENCY_CONFLICT.value


def _requested_model(action: CallModel) -> str | None:
    """The model a call asks for, as its provider resolves it: ``CallModel.model`` (a
    fallback, the settings' model), else the request mapping's ``model``, else the
    ``model`` of the provider the driver calls (``None``: none of them names one)."""
    if action.model is not None:
        return action.model
    request = action.request
    if isinstance(request, Mapping):
        named = request.get("model")
        if isinstance(named, str) and named:
            return named
    return provider_model()


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


def _usage_attributes(found: dict[str, Any], usage: Usage) -> None:
    """A model call's usage as the GenAI conventions' attributes."""
    for field, key in _USAGE_COUNTS:
        count = getattr(usage, field)
        if count is not None:
            found[key] = count
    if usage.model is not None:
        found[RESPONSE_MODEL] = usage.model
    if usage.response_id is not None:
        found["gen_ai.response.id"] = usage.response_id
    if usage.finish_reason is not None:
        found[FINISH_REASONS] = (usage.finish_reason,)
    _where_attributes(found, (usage.provider_name, usage.server_address, usage.server_port))
    if usage.streamed:
        found[STREAM] = True


def _where_attributes(found: dict[str, Any], where: _Where, model: str | None = None) -> None:
    """Where a call went (and the model it asked for) as the conventions' attributes."""
    provider, address, port = where
    if provider is not None:
        found[PROVIDER] = provider
    if model is not None:
        found[REQUEST_MODEL] = model
    if address is not None:
        found["server.address"] = address
        if port is not None:
            found["server.port"] = port


def _end_span(span: Span, end: int, error: str | None) -> None:
    """End ``span``, failed with ``error`` (``error.type``, status ERROR) unless ``None``."""
    if error is not None:
        span.set_attribute(ERROR_TYPE, error)
        span.set_status(Status(StatusCode.ERROR, error))
    span.end(end)


# -- the request's parameters ---------------------------------------------------------


_NUMBERS = (
    ("max_tokens", "gen_ai.request.max_tokens", int),
    ("max_completion_tokens", "gen_ai.request.max_tokens", int),
    ("max_output_tokens", "gen_ai.request.max_tokens", int),
    ("temperature", "gen_ai.request.temperature", float),
    ("top_p", "gen_ai.request.top_p", float),
    ("top_k", "gen_ai.request.top_k", float),
    ("frequency_penalty", "gen_ai.request.frequency_penalty", float),
    ("presence_penalty", "gen_ai.request.presence_penalty", float),
    ("seed", "gen_ai.request.seed", int),
)
"""A create argument, its attribute and the attribute's type (an int must be whole)."""


def _request_attributes(found: dict[str, Any], request: Mapping[Any, Any], provider: Any) -> None:
    """The request's sampling parameters, as far as the mapping of create arguments
    the host assembled holds them (what a provider adds of its own is not seen)."""
    for name, key, kind in _NUMBERS:
        value = _request_number(request.get(name), kind)
        if value is not None:
            found[key] = value
    stop = request.get("stop", request.get("stop_sequences"))
    stop = (stop,) if isinstance(stop, str) else stop
    if isinstance(stop, list | tuple) and stop and all(isinstance(s, str) for s in stop):
        found["gen_ai.request.stop_sequences"] = tuple(stop)
    count = request.get("n")
    if type(count) is int and count != 1:
        found["gen_ai.request.choice.count"] = count
    if request.get("stream") is True:
        found[STREAM] = True
    form = request.get("response_format")
    shape = form.get("type") if isinstance(form, Mapping) else form
    if isinstance(shape, str) and shape in _OUTPUT_TYPES:
        found["gen_ai.output.type"] = _OUTPUT_TYPES[shape]
    tier = request.get("service_tier")
    if provider == "openai" and isinstance(tier, str) and tier != "auto":
        found["openai.request.service_tier"] = tier


def _request_number(value: object, kind: type) -> int | float | None:
    """A sampling parameter as its attribute's type (an int must be whole), or ``None``."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    if kind is float:
        return float(value)
    return int(value) if not isinstance(value, float) or value.is_integer() else None


_OUTPUT_TYPES = {
    "json_object": "json",
    "json_schema": "json",
    "json": "json",
    "text": "text",
}
"""A ``response_format`` type, as ``gen_ai.output.type``."""


def _openai_attributes(found: dict[str, Any], reply: Mapping[Any, Any]) -> None:
    """The OpenAI conventions' response attributes, from a reply's JSON form."""
    kind = reply.get("object")
    if kind in ("chat.completion", "chat.completion.chunk"):
        found["openai.api.type"] = "chat_completions"
    elif kind == "response":
        found["openai.api.type"] = "responses"
    tier = reply.get("service_tier")
    if isinstance(tier, str):
        found["openai.response.service_tier"] = tier
    fingerprint = reply.get("system_fingerprint")
    if isinstance(fingerprint, str):
        found["openai.response.system_fingerprint"] = fingerprint


# -- content, in the conventions' structured form ---------------------------------------
#
# Requests and replies are the host's data, of any shape. The common shapes (OpenAI chat
# and responses, Anthropic messages, plain text) are converted part by part; anything
# else becomes a text part holding its JSON, so the result always has the conventions'
# form. Nothing here raises: a converter that fails falls back to that text part.


def _content_attributes(found: dict[str, Any], request: Any) -> None:
    """``gen_ai.input.messages``, ``gen_ai.system_instructions`` and
    ``gen_ai.tool.definitions`` of ``request``."""
    try:
        messages, system = input_messages(request)
    except Exception:
        messages, system = [_message("user", [_text_part(request)])], None
    found["gen_ai.input.messages"] = _json(messages)
    if system:
        found["gen_ai.system_instructions"] = _json(system)
    if isinstance(request, Mapping):
        try:
            tools = tool_definitions(request.get("tools"))
        except Exception:
            tools = []
        if tools:
            found["gen_ai.tool.definitions"] = _json(tools)


def _message(role: Any, parts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"role": role if isinstance(role, str) and role else "user", "parts": parts, **extra}


def _text_part(content: Any) -> dict[str, Any]:
    return {"type": "text", "content": _text_of(content)}


def _as_object(value: Any) -> Any:
    """A tool's arguments or result as an object: JSON text is decoded (the conventions
    expect the object, not its serialization); anything else is kept."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _text_of(content: Any) -> str:
    """Text as it is, JSON data as its JSON, anything else as its text."""
    if isinstance(content, str):
        return content
    return _json(content) if isinstance(content, _JSON_NATIVE) else _text(content)


def input_messages(request: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``request`` (a ``CallModel.request``) as the conventions' input messages and
    system instructions: a mapping's ``messages`` (OpenAI chat, Anthropic), ``input``
    (OpenAI responses) or ``prompt``, its ``system`` or ``instructions``; a list of
    messages; a string (one user message). Anything else is one user message holding
    its JSON."""
    system, body = None, request
    if isinstance(request, Mapping):
        raw = request.get("system", request.get("instructions"))
        system = None if raw is None else _parts(raw)
        key = next((k for k in ("messages", "input", "prompt") if k in request), None)
        body = request if key is None else request[key]
    if isinstance(body, list | tuple):
        return [_input_message(item) for item in body], system
    return [_message("user", [_text_part(body)])], system


def _input_message(item: Any) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        return _message("user", [_text_part(item)])
    kind = item.get("type")
    if kind == "function_call":  # an OpenAI responses item: the model's call
        return _message("assistant", [_tool_call(item.get("call_id"), item)])
    if kind == "function_call_output":
        return _message("tool", [_tool_response(item.get("call_id"), item.get("output"))])
    role = item.get("role")
    extra = {"name": item["name"]} if isinstance(item.get("name"), str) else {}
    if role == "tool":  # OpenAI chat: a tool's result
        response = _tool_response(item.get("tool_call_id"), item.get("content"))
        return _message("tool", [response], **extra)
    parts = _parts(item.get("content"))
    for call in item.get("tool_calls") or ():
        if isinstance(call, Mapping):
            parts.append(_tool_call(call.get("id"), call.get("function") or call))
    legacy = item.get("function_call")
    if isinstance(legacy, Mapping):
        parts.append(_tool_call(None, legacy))
    return _message(role, parts, **extra)


def _parts(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, list | tuple):
        return [_part(block) for block in content]
    return [_text_part(content)]


def _tool_call(call_id: Any, function: Mapping[Any, Any]) -> dict[str, Any]:
    name = function.get("name")
    arguments = function.get("arguments", function.get("input"))
    return {
        "type": "tool_call",
        "id": call_id if isinstance(call_id, str) else None,
        "name": name if isinstance(name, str) else "",
        "arguments": _as_object(arguments),
    }


def _part(block: Any) -> dict[str, Any]:
    """One content block (OpenAI's or Anthropic's) as a conventions part."""
    if not isinstance(block, Mapping):
        return _text_part(block)
    kind = block.get("type")
    convert = _PARTS.get(kind) if isinstance(kind, str) else None
    part = convert(block) if convert is not None else None
    if part is not None:
        return part
    # a part this converter does not know: kept as the conventions' generic part
    generic = {str(k): v for k, v in block.items() if k != "type"}
    return {**generic, "type": kind if isinstance(kind, str) and kind else "unknown"}


def _text_block(block: Mapping[Any, Any]) -> dict[str, Any] | None:
    text = block.get("text")
    if not isinstance(text, str) and block.get("type") == "text":
        text = block.get("content")  # the conventions' own text part
    return _text_part(text) if isinstance(text, str) else None


def _tool_response(call_id: Any, content: Any) -> dict[str, Any]:
    return {"type": "tool_call_response", "id": call_id, "response": _as_object(content)}


def _thinking(block: Mapping[Any, Any]) -> dict[str, Any] | None:
    thinking = block.get("thinking")
    return {"type": "reasoning", "content": thinking} if isinstance(thinking, str) else None


def _image_url(block: Mapping[Any, Any]) -> dict[str, Any] | None:
    url = block.get("image_url")
    url = url.get("url") if isinstance(url, Mapping) else url
    if isinstance(url, str):
        return {"type": "uri", "modality": "image", "uri": url}
    if isinstance(block.get("file_id"), str):
        return {"type": "file", "modality": "image", "file_id": block["file_id"]}
    return None


def _sourced(block: Mapping[Any, Any]) -> dict[str, Any] | None:
    """An Anthropic image or document: base64 data or a URL."""
    source = block.get("source")
    modality = "image" if block.get("type") == "image" else "document"
    if not isinstance(source, Mapping):
        return None
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        return _blob(modality, source["data"], source.get("media_type"))
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "uri", "modality": modality, "uri": source["url"]}
    return None


def _audio(block: Mapping[Any, Any]) -> dict[str, Any] | None:
    audio = block.get("input_audio")
    if not isinstance(audio, Mapping) or not isinstance(audio.get("data"), str):
        return None
    form = audio.get("format")
    return _blob("audio", audio["data"], f"audio/{form}" if isinstance(form, str) else None)


def _blob(modality: str, content: str, mime_type: object) -> dict[str, Any]:
    part = {"type": "blob", "modality": modality, "content": content}
    if isinstance(mime_type, str):
        part["mime_type"] = mime_type
    return part


def _file(block: Mapping[Any, Any]) -> dict[str, Any] | None:
    file = block.get("file")
    if isinstance(file, Mapping) and isinstance(file.get("file_id"), str):
        return {"type": "file", "modality": "document", "file_id": file["file_id"]}
    return None


_PARTS: dict[str, Callable[[Mapping[Any, Any]], dict[str, Any] | None]] = {
    "text": _text_block,
    "input_text": _text_block,
    "output_text": _text_block,
    "tool_use": lambda block: _tool_call(block.get("id"), block),  # Anthropic: the model's call
    "tool_result": lambda block: _tool_response(block.get("tool_use_id"), block.get("content")),
    "thinking": _thinking,
    "image_url": _image_url,
    "input_image": _image_url,
    "image": _sourced,
    "document": _sourced,
    "input_audio": _audio,
    "file": _file,
}
"""A content block's type and its converter (``None``: not of the shape it knows)."""


_FINISH = {
    "stop": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "length": "length",
    "max_tokens": "length",
    "tool_calls": "tool_call",
    "tool_use": "tool_call",
    "function_call": "tool_call",
    "content_filter": "content_filter",
    "refusal": "content_filter",
}
"""The providers' finish reasons, as the output messages schema names them."""


def _finish(reason: Any, calls: bool) -> str:
    if isinstance(reason, str) and reason:
        return _FINISH.get(reason, reason)
    return "tool_call" if calls else "stop"


def output_messages(
    reply: Any, tool_calls: Sequence[ToolCall] = (), finish_reason: str | None = None
) -> list[dict[str, Any]]:
    """A ``ModelReplied``'s ``reply`` (and ``tool_calls``) as the conventions' output
    messages, one per choice: an OpenAI chat completion's choices, an Anthropic
    message's content blocks, a text; else the tool calls, with the reply's text as a
    text part. ``finish_reason`` is the usage's, for a reply that holds none."""
    try:
        return _output_messages(reply, tool_calls, finish_reason)
    except Exception:
        return [_answer(None, [_text_part(reply)], finish_reason)]


def _output_messages(
    reply: Any, tool_calls: Sequence[ToolCall], finish_reason: str | None
) -> list[dict[str, Any]]:
    dump = getattr(reply, "model_dump", None)
    if not isinstance(reply, Mapping | str) and reply is not None and callable(dump):
        reply = dump(mode="json")  # an SDK object the host kept as it came
    if isinstance(reply, Mapping):
        choices = reply.get("choices")
        if isinstance(choices, list | tuple) and choices:
            return [_choice(choice) for choice in choices]
        if isinstance(reply.get("content"), list | tuple):  # an Anthropic message
            parts = _parts(reply["content"])
            return [_answer(reply.get("role"), parts, reply.get("stop_reason", finish_reason))]
    parts = [] if reply is None else [_text_part(_text_of(reply))]
    parts.extend(
        {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        for call in tool_calls
    )
    return [_answer(None, parts, finish_reason)]


def _choice(choice: Any) -> dict[str, Any]:
    """An OpenAI chat completion's choice as an output message."""
    if not isinstance(choice, Mapping):
        return _answer(None, [_text_part(choice)], "stop")
    message = choice.get("message")
    if not isinstance(message, Mapping):
        message = {}
    parts = _input_message({**message, "role": "assistant"})["parts"]
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal:
        parts.append(_text_part(refusal))
    return _answer(message.get("role"), parts, choice.get("finish_reason"))


def _answer(role: Any, parts: list[dict[str, Any]], reason: Any) -> dict[str, Any]:
    """An output message: its finish reason, else ``tool_call`` when it calls tools."""
    calls = any(part.get("type") == "tool_call" for part in parts)
    return {
        "role": role if isinstance(role, str) and role else "assistant",
        "parts": parts,
        "finish_reason": _finish(reason, calls),
    }


def tool_definitions(tools: Any) -> list[dict[str, Any]]:
    """A request's ``tools`` as the conventions' tool definitions: their type and name
    only (the conventions advise against the optional description and parameters by
    default: they are large)."""
    if not isinstance(tools, list | tuple):
        return []
    out = []
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        name = tool.get("name")
        if name is None and isinstance(function, Mapping):
            name = function.get("name")
        if not isinstance(name, str) or not name:
            continue
        kind = tool.get("type")
        out.append({"type": kind if isinstance(kind, str) and kind else "function", "name": name})
    return out


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
