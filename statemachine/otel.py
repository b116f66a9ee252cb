"""OpenTelemetry for the engine: spans and metrics from a session's trace.

``pip install 'turnstate[otel]'`` (``opentelemetry-api``; configure an SDK and an
exporter as for any instrumented library)::

    from statemachine.otel import Telemetry

    telemetry = Telemetry()
    session = sm.Session(settings, observers=[telemetry], session_id="chat-42")
    telemetry.bind(session)          # its id, limits and status, as they happen
    ...
    telemetry.end()                  # after the last turn (a limit ends it by itself)

One ``invoke_workflow`` span for the session, an ``invoke_agent`` span per turn, a
``chat {model}`` span per model call attempt and an ``execute_tool {name}`` span per
tool call, with the attributes and the two client metrics of the OpenTelemetry GenAI
semantic conventions (release :data:`SEMCONV_VERSION`): tokens, the model that
answered, the provider and server, each failure's category and HTTP status, from the
events and the :class:`~statemachine.Usage` the trace carries. Waits, fallbacks and
context reductions are events of the turn, breaker trips and limits events of the
session; times come from the session's injected clock. No request or reply content is
recorded unless ``capture_content=True``. See ``docs/telemetry.md``.
"""

from __future__ import annotations

from .io._otel import SCOPE, SEMCONV_VERSION, Telemetry, replay

__all__ = ["SCOPE", "SEMCONV_VERSION", "Telemetry", "replay"]
