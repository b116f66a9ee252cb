"""OpenTelemetry for the engine: spans and metrics from a session's trace.

``pip install 'turnstate[otel]'`` (``opentelemetry-api``; configure an SDK and an
exporter as for any instrumented library)::

    from statemachine.otel import Telemetry

    telemetry = Telemetry()
    session = sm.Session(settings, observers=[telemetry], session_id="chat-42")
    telemetry.bind(session)          # its id, limits and status, as they happen
    ...
    telemetry.end()                  # after the last turn (a limit ends it by itself)

The spans follow the OpenTelemetry GenAI semantic conventions (release
:data:`SEMCONV_VERSION`): an ``invoke_workflow {agent}`` span for the session, under it
one ``invoke_agent {agent}`` span per turn, and under each turn one ``chat {model}``
span per model call attempt and one ``execute_tool {name}`` span per tool call; waits,
fallbacks, context reductions, breaker trips, limits and the session's end are their
events. The metrics are the GenAI client metrics (``gen_ai.client.operation.duration``,
``gen_ai.client.token.usage``) and ``turnstate.*`` counters of retries, waits, turns,
sessions, breakers and cost. Span times are the records' ``at`` (the session's
injected clock) plus ``clock_offset`` (default: measured at the first record, so a
``time.monotonic`` clock reads as Unix time), so a simulated or replayed turn has its
true durations. No content leaves the process unless ``capture_content`` is set. With no
SDK configured the observer does nothing with the session's records.

``docs/telemetry.md`` lists every span, attribute, event and metric.
"""

from __future__ import annotations

from .io._otel import SCOPE, SEMCONV_VERSION, Telemetry, replay

__all__ = ["SCOPE", "SEMCONV_VERSION", "Telemetry", "replay"]
