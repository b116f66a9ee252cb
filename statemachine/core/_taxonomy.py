"""The two error taxonomies, and the statuses a turn and a session end with."""

from __future__ import annotations

import enum


class ErrorCategory(enum.StrEnum):
    """What went wrong with a model-provider call.

    Only ``rate_limited`` and ``overloaded`` are retryable; ``unknown`` is not, and
    keeps the vendor's raw message and code on the :class:`ModelError`.
    """

    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    AUTH_ERROR = "auth_error"
    INVALID_REQUEST = "invalid_request"
    CONTENT_FILTERED = "content_filtered"
    UNKNOWN = "unknown"


RETRYABLE_CATEGORIES = frozenset({ErrorCategory.RATE_LIMITED, ErrorCategory.OVERLOADED})


class ToolErrorCategory(enum.StrEnum):
    """What went wrong with one tool call.

    ``process_crashed`` is synthesized by the host when a plugin process died
    mid-call; a plugin never reports it about itself.
    """

    INVALID_ARGUMENTS = "invalid_arguments"
    NOT_FOUND = "not_found"
    PERMISSION_DENIED = "permission_denied"
    EXECUTION_FAILED = "execution_failed"
    TIMEOUT = "timeout"
    CONCURRENCY_CONFLICT = "concurrency_conflict"
    CANCELLED = "cancelled"
    PROCESS_CRASHED = "process_crashed"
    UNKNOWN = "unknown"


class TurnStatus(enum.StrEnum):
    """How a turn ended; each value is distinct so a host can react to each."""

    COMPLETED = "completed"
    CONTENT_FILTERED = "content_filtered"
    AUTH_ERROR = "auth_error"
    INVALID_REQUEST = "invalid_request"
    CONTEXT_EXHAUSTED = "context_exhausted"
    RETRIES_EXHAUSTED = "retries_exhausted"
    """The per-call retry cap (``max_retries``) was spent, with no fallback left."""
    RETRY_CEILING_REACHED = "retry_ceiling_reached"
    """The session-wide retry ceiling (``session_retry_ceiling``) was spent."""
    BUDGET_EXHAUSTED = "budget_exhausted"
    """The next wait would have crossed ``max_wall_clock_s``; it was not taken."""
    RETRY_DEFERRED = "retry_deferred"
    """The server asked for a wait beyond ``max_server_wait_s``; ``Finish.retry_at``
    says when it said to come back, so the host can park the session."""
    BREAKER_OPEN = "breaker_open"
    UNKNOWN_ERROR = "unknown_error"
    STREAM_INTERRUPTED = "stream_interrupted"
    """The call failed after part of a streamed reply was delivered; never resent."""
    CANCELLED = "cancelled"
    """The host cancelled the turn (:class:`~statemachine.Cancelled`)."""


class SessionStatus(enum.StrEnum):
    """How a session ended: the limit that fired (after its final-answer turn), or,
    for a session its host ended on purpose (``Session.end``), ``completed``,
    ``cancelled`` or ``failed`` (the spec's status enum)."""

    ERROR_MAX_TURNS = "error_max_turns"
    ERROR_MAX_BUDGET_USD = "error_max_budget_usd"
    ERROR_MAX_WALL_CLOCK = "error_max_wall_clock"
    ERROR_CIRCUIT_BREAKER = "error_circuit_breaker"
    ERROR_DOOM_LOOP = "error_doom_loop"
    ERROR_DENIAL_BREAKER = "error_denial_breaker"
    """``denial_threshold`` denials in a row (or the denial window's count) fired."""
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"


LIMIT_STATUSES = frozenset(status for status in SessionStatus if status.startswith("error_"))
"""The statuses of the limit-reached path (a limit that fired): the ``error_*`` ones."""
END_STATUSES = frozenset({SessionStatus.COMPLETED, SessionStatus.CANCELLED, SessionStatus.FAILED})
"""The statuses a host ends a session with on purpose."""
