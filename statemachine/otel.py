"""OpenTelemetry for the engine: spans and metrics from a session's trace.

``pip install 'turnstate[otel]'`` (``opentelemetry-api``; configure an SDK and an
exporter as for any instrumented library)::

    from statemachine.otel import Telemetry

    telemetry = Telemetry(provider_name="anthropic", session_id="chat-42")
    session = sm.Session(settings, observers=[telemetry])
    telemetry.bind(session)          # limits and the session's status, as they happen
    ...
    telemetry.end()                  # after the last turn (a limit ends it by itself)

One ``session`` span, an ``invoke_agent`` span per turn, a ``chat {model}`` span per
model call attempt and an ``execute_tool {name}`` span per tool call, following the
OpenTelemetry GenAI semantic conventions; waits, fallbacks and context reductions are
events of the turn, breaker trips and limits events of the session; times come from
the session's injected clock. No request or reply content is recorded unless
``capture_content=True``. See ``docs/telemetry.md``.
"""

from __future__ import annotations

from .io._otel import SCOPE, Telemetry, replay

__all__ = ["SCOPE", "Telemetry", "replay"]
