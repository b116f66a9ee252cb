"""Durable session state shared by many workers: stores, compare-and-set, resume.

A *store* keeps one record per session id: the engine's ``session.snapshot()`` as of
its last compaction, the journal of steps applied since (a worker appends one entry per
advance; others replay them), a little bookkeeping, and a *version* that goes up by
one on every write. Writes
are compare-and-set: a worker writes "version n+1" only if the store still holds
the version n it read, so two workers can never both advance one session from the
same state. :class:`InMemoryStore` is the embedded default (one process, no
server); :class:`RedisStore` is the shared one (``pip install turnstate[redis]``).

A :class:`Worker` drives sessions through a store, one event per call::

    from statemachine.store import RedisStore, Worker

    worker = Worker(RedisStore.from_url("redis://127.0.0.1:6379/0"), idempotent={"search"})
    r = worker.create("conv-42", sm.Session(settings, seed=7))
    r = worker.advance("conv-42", None, expected_version=r.version)   # new turn: Assemble
    r = worker.advance("conv-42", sm.Assembled(req, 900), expected_version=r.version)
    if r.status is AdvanceStatus.CONFLICT: ...   # another worker moved first: r is fresh

The idempotency key of an event is the version it was computed from
(``expected_version``): an event is applied only to that exact state, so it is
applied once, however many workers or retries send it. An optional ``key`` also
tells a retry of your own write (``DUPLICATE``) from another worker's (``CONFLICT``).

Tool calls are at-most-once. The write that records ``InvokeTools`` also records a
*claim*: the calls are handed to this worker, under a lease. If the worker dies,
:meth:`Worker.resume` in another worker turns each claimed call into an error
outcome marked ``interrupted: worker died`` (category ``cancelled``: the call may or
may not have run; it does not count toward a circuit breaker), so the model learns
of it and decides, unless the tool is declared idempotent, in which case the call
is handed out again. Model calls, waits and context assembly have no side effect
the engine counts, so a resumed worker simply repeats the pending action.
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
