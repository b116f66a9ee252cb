"""OpenTelemetry for the engine: spans and metrics from a session's trace.

``pip install 'turnstate[otel]'`` (``opentelemetry-api``; configure an SDK and an
exporter as for any instrumented library)::

    from statemachine.otel import Telemetry

    telemetry = Telemetry()
    session = sm.Session(settings, observers=[telemetry], session_id="chat-42")
    telemetry.bind(session)          # its id, limits and status, as they happen
    ...
    telemetry.end()                  # after the last turn (a limit ends it by itself)

What the OpenTelemetry GenAI semantic conventions (release :data:`SEMCONV_VERSION`)
describe, derived from the session's trace records:

* an ``invoke_workflow {agent}`` span for the session (parent: the host's current
  span, or ``parent``), with the breaker trips, the limits that fired and the
  session's end as events;
* under it one ``invoke_agent {agent}`` span per turn, from ``idle -start->`` to its
  ``Finish`` (``turnstate.turn.status``; ``error.type`` = the status when it is not
  ``completed``; the tokens its calls used), with every wait (``turnstate.wait``:
  seconds, category, attempt, the retry-after honoured), fallback
  (``turnstate.fallback``) and context reduction as events;
* under each turn one ``chat {model}`` span (kind ``CLIENT``) per model call attempt,
  from its ``CallModel`` to the ``ModelReplied``, ``ModelFailed`` or ``Cancelled``
  that answers it, and one ``execute_tool {name}`` span per tool call of an
  ``InvokeTools`` until its ``ToolsDone``.

A chat span carries what the attempt's event says: the usage's tokens, response id,
finish reason and answered model, where the call went (``gen_ai.provider.name``,
``server.address``, ``server.port``: a ready-made provider reports them on every
event, failures included), and for a failure its category (``error.type``) and HTTP
status. What a span needs when it starts (the provider, the server) comes from the
last usage of the same requested model, else from ``provider_name``. The requested
model (``gen_ai.request.model``, the span's name) is ``CallModel.model``, else the
request mapping's ``model``, else the ``model`` attribute of the model provider
``run_turn`` or ``arun_turn`` is calling (the ready-made providers' ``model=``; a
host-written provider may have one): the model the call is sent to.

Span times are the records' ``at`` (the session's injected clock) plus
``clock_offset`` (default: measured once, at the first record, so that a
``time.monotonic`` clock reads as Unix time), so a simulated or replayed turn has its
true durations. A failure whose category the record cannot say yet (one read from a
trace without its event that moved to a fallback model: the ``Finish`` carries it)
ends its span when the turn ends, with the end time it had.

Metrics: the GenAI client metrics ``gen_ai.client.operation.duration`` (s) and
``gen_ai.client.token.usage`` (``{token}``), each with the conventions' advised
buckets, and ``turnstate.retries`` (by ``error.type`` and ``turnstate.retry.kind``:
``wait``, ``fallback``, ``tool_wait``), ``turnstate.wait.duration`` (s),
``turnstate.turns``, ``turnstate.sessions``, ``turnstate.breaker.trips``,
``turnstate.breaker.open`` and ``turnstate.cost`` (``{USD}``).

No content leaves the process unless ``capture_content`` is set: requests, replies,
tool definitions, arguments and results, and error messages are then recorded in the
conventions' structured form (``[{"role": ..., "parts": [...]}]``) as JSON text.

Only ``opentelemetry-api`` is imported. When it is made, and again at the session's
first record, the observer asks whether anything records (the providers, the session
span); when nothing does (the API's no-op providers, no SDK configured) it does
nothing with the session's records. With no observer attached the engine builds no
record at all. See ``docs/telemetry.md``.
"""

from __future__ import annotations

from .io._otel import SCOPE, SEMCONV_VERSION, Telemetry, replay

__all__ = ["SCOPE", "SEMCONV_VERSION", "Telemetry", "replay"]
