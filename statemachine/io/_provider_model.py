"""The model a driver's model provider calls by default, as the session's observers see it.

A model provider may say which model it calls when neither ``CallModel.model`` nor the
request names one: its ``model`` attribute, a non-empty ``str`` (the ready-made
providers' ``model=``; a host-written provider may define one too). A session's
observers see trace records, not providers, so while ``run_turn`` or ``arun_turn``
drives a turn it holds its provider in a context variable (:data:`DRIVEN`), and the
telemetry asks :func:`provider_model` for the model of a call whose action and request
name none: that is the model its chat span names (``chat {model}``,
``gen_ai.request.model``).

The observers run inside the driver's ``turn.send``, so they see the variable; a
record handed to an observer later (a trace replayed, a worker's observers) does not,
and its chat spans name only what the record holds.
"""

from __future__ import annotations

from contextvars import ContextVar

DRIVEN: ContextVar[object] = ContextVar("statemachine_model_provider", default=None)
"""The model provider of the turn being driven in this context (``None``: none). A
driver sets it around its loop and resets it with the token the set returned (a
context manager would cost three times as much per turn)."""


def provider_model() -> str | None:
    """The ``model`` of the model provider driving the current turn, when it names one
    (a non-empty ``str``); ``None`` otherwise. Never raises."""
    provider = DRIVEN.get()
    if provider is None:
        return None
    try:
        model = getattr(provider, "model", None)
    except Exception:  # a property that raises: no model known
        return None
    return model if isinstance(model, str) and model else None
