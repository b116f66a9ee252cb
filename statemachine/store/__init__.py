"""Durable session state shared by many workers: stores, compare-and-set, resume.

A *store* keeps one record per session id (the engine's snapshot as of its last
compaction, the journal of steps applied since, a little bookkeeping) and a *version*
that goes up by one on every write; writes are compare-and-set, so two workers never both
advance one session from the same state. :class:`InMemoryStore` is the embedded default;
:class:`RedisStore` the shared one (``pip install turnstate[redis]``). A
:class:`Worker` drives sessions through a store, one event per call; the version an
event was computed from (``expected_version``) is its idempotency key. Tool calls are
at-most-once: a claimed call whose worker died becomes an ``interrupted: worker died``
outcome on :meth:`Worker.resume`, unless its tool is idempotent. See docs/workers.md.
"""

from ._core import SessionStore, Stored
from ._errors import (
    CorruptSession,
    InvalidSessionId,
    RecordTooLarge,
    SessionNotFound,
    StaleWrite,
    StoreError,
    StoreUnavailable,
)
from ._memory import InMemoryStore
from ._redis import RedisStore
from ._worker import INTERRUPTED, Advanced, AdvanceStatus, Worker

__all__ = [
    "INTERRUPTED",
    "AdvanceStatus",
    "Advanced",
    "CorruptSession",
    "InMemoryStore",
    "InvalidSessionId",
    "RecordTooLarge",
    "RedisStore",
    "SessionNotFound",
    "SessionStore",
    "StaleWrite",
    "StoreError",
    "StoreUnavailable",
    "Stored",
    "Worker",
]
