"""The store's errors: one class per way a store call can fail, each naming the session."""

from __future__ import annotations

from ..core._exceptions import SnapshotError


class StoreError(Exception):
    """Base class of the store's errors; ``session_id`` names the session concerned."""

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class InvalidSessionId(StoreError, ValueError):
    """A session id or tenant name does not match ``[A-Za-z0-9._-]{1,128}``."""


class SessionNotFound(StoreError, LookupError):
    """No record for this session: never created, deleted, expired, or lost (a store
    restarted without persistence)."""


class StaleWrite(StoreError, RuntimeError):
    """A compare-and-set was refused: the stored version is not the expected one.

    ``expected`` is the version the writer had read, ``actual`` the stored one
    (0: no record). Nothing was written.
    """

    def __init__(self, message: str, *, session_id: str, expected: int, actual: int) -> None:
        super().__init__(message, session_id=session_id)
        self.expected = expected
        self.actual = actual


class CorruptSession(StoreError, SnapshotError):
    """The stored record cannot be used: not JSON, truncated, oversized, of a foreign
    format or version, or a snapshot ``Session.restore`` refuses. The message names
    the session and what was wrong; the stored data is left exactly as it was."""


class RecordTooLarge(StoreError, ValueError):
    """A record to be written is larger than the store's ``max_bytes``; nothing was written."""


class StoreUnavailable(StoreError, ConnectionError):
    """The store's server could not be reached (down, restarting, loading its data)."""


UNREADABLE = (SessionNotFound, CorruptSession, InvalidSessionId)
"""What a read raises when the store holds no usable record of the session: a walk of
a session tree skips such a session."""


def corrupt(session_id: str, key: str, what: str) -> CorruptSession:
    """The error for a stored record whose ``key`` is wrong (``what``: how)."""
    return CorruptSession(
        f"session {session_id!r}: the stored record's {key}: {what}", session_id=session_id
    )


def oversized(session_id: str, size: int, max_bytes: int) -> CorruptSession:
    return CorruptSession(
        f"session {session_id!r}: the stored record is {size} bytes, over the store's "
        f"max_bytes ({max_bytes}); it was not read",
        session_id=session_id,
    )


def stale(
    session_id: str, expected: int, actual: int, *, another_incarnation: bool = False
) -> StoreError:
    """The error for a refused compare-and-set."""
    if another_incarnation:
        return StaleWrite(
            f"session {session_id!r}: stale write refused: the id was deleted and created "
            f"again since this state was read (version {actual} is another session's)",
            session_id=session_id,
            expected=expected,
            actual=actual,
        )
    if actual == 0 and expected > 0:
        return SessionNotFound(
            f"session {session_id!r}: no record (expected version {expected}): it was "
            "deleted, expired, or lost when the store restarted without persistence",
            session_id=session_id,
        )
    if expected == 0:
        message = f"session {session_id!r} already exists (version {actual})"
    else:
        message = (
            f"session {session_id!r}: stale write refused: expected version {expected}, "
            f"the store holds version {actual}"
        )
    return StaleWrite(message, session_id=session_id, expected=expected, actual=actual)


def not_found(session_id: str) -> SessionNotFound:
    return SessionNotFound(
        f"session {session_id!r}: no record: never created, deleted, expired, or lost "
        "when the store restarted without persistence",
        session_id=session_id,
    )
