"""Workers over a store: compare-and-set advances, claims and resume (see the package docstring).

A worker holds the sessions it last read or wrote, each in the journal's frame (no
clock: its times are seconds since the session started, the age the record says it has
now), and steps them with the session's public methods at that age: the step it takes
live is the step another worker replays from the journal (``_journal.apply_step``).
The caller of a worker never gets the worker's own session: a result holds a copy put
on the worker's clock (``Session.copy``).
"""

from __future__ import annotations

import enum
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

import attrs

from ..core._actions import Action, Finish, InvokeTools
from ..core._builder import build_maker
from ..core._engine import needs_wall
from ..core._events import ModelFailed, ModelReplied, ToolsDone
from ..core._exceptions import ConfigError, IllegalEvent, SessionEnded, TurnInProgress
from ..core._session import Session
from ..core._snapshot import write_snapshot_text
from ..core._state_text import TextCache, number_text
from ..core._taxonomy import SessionStatus, ToolErrorCategory
from ..core._tool_calls import ToolCall, ToolOutcome
from ..core._trace import TraceRecord
from . import _ending as ending
from ._bytes import BytesStore
from ._core import (
    DEFAULT_MAX_BYTES,
    Stored,
    check_max_bytes,
    check_name,
    check_payload,
    check_ttl,
    check_version,
    decode_record,
    key_prefix,
)
from ._errors import (
    CorruptSession,
    InvalidSessionId,
    RecordTooLarge,
    SessionNotFound,
    StaleWrite,
    StoreError,
    StoreUnavailable,
    not_found,
    stale,
)
from ._journal import (
    BUDGET,
    CHILD_SPEND,
    COMPACT_AT_START,
    COMPACT_EVERY,
    EVENT,
    REPLAY_AT_MOST,
    START,
    Step,
    Verdicts,
    apply_step,
    check_record,
    entry_text,
    event_text,
    read_session,
    replay_record,
)
from ._record import (
    MAX_KEYS,
    RECORD_VERSION,
    Claim,
    Record,
    extend,
    head_bytes,
    middle_text,
    parse_record,
    split_record,
    tail_text,
)
from ._redis import RedisStore

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

_T = TypeVar("_T")
_LARGEST = sys.float_info.max
_KEYS_KEPT = 4096
"""How many checked session ids an InMemoryStore keeps the keys of."""
_LIVE_SESSIONS = 1024
"""How many sessions a worker remembers its last record of, by default."""
_SLICED = 1 << 16
"""Below this many bytes, a record's prefix is sliced and copied twice (for a few
kilobytes, faster than a memoryview's one copy)."""

Observer = Callable[[TraceRecord], None]

INTERRUPTED = "interrupted: worker died"
"""The content of the error outcome of a tool call whose worker died in flight."""


@runtime_checkable
class SessionStore(Protocol):
    """Where session records live. Versions start at 1; 0 means "no record".

    Implementations validate session ids, keep records as JSON with a size limit,
    and make ``compare_and_set`` atomic: of two writers that read version n, one
    writes n + 1 and the other gets :class:`StaleWrite`.
    """

    def load(self, session_id: str) -> Stored:
        """The record and its version; :class:`SessionNotFound` if there is none,
        :class:`CorruptSession` if it cannot be read (left untouched)."""
        ...

    def compare_and_set(
        self,
        session_id: str,
        expected_version: int,
        record: Mapping[str, Any],
        *,
        ended: bool = False,
    ) -> int:
        """Write ``record`` if the stored version is ``expected_version`` (0 to
        create); return the new version. ``ended`` marks an ended session (its TTL
        applies). Raises :class:`StaleWrite` / :class:`SessionNotFound`, writing nothing."""
        ...

    def delete(self, session_id: str) -> bool:
        """Remove the record; whether there was one."""
        ...


class InMemoryStore(BytesStore):
    """Session records in this process's memory: the embedded default.

    Thread-safe (one lock). Records are kept as JSON bytes, exactly as a server
    would keep them, so what a worker changes after a write never leaks into the
    store. ``clock`` (monotonic seconds) measures ``ended_ttl_s``.
    :meth:`for_tenant` gives a store on the same memory under a tenant namespace.
    """

    def __init__(
        self,
        *,
        prefix: str = "statemachine",
        tenant: str | None = None,
        ended_ttl_s: float | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._base = prefix
        self._prefix = key_prefix(prefix, tenant)
        self.ended_ttl_s = check_ttl(ended_ttl_s)
        self.max_bytes = check_max_bytes(max_bytes)
        self._clock = clock
        self._lock = threading.Lock()
        self._data: dict[str, tuple[int, bytes, float | None, str | None]] = {}
        """key -> (version, record bytes, expiry, incarnation)"""
        self._keys: dict[str, str] = {}
        """session id -> its key, for the ids checked already"""

    def for_tenant(self, tenant: str) -> InMemoryStore:
        """A store sharing this one's memory, under ``tenant``'s namespace."""
        other = InMemoryStore(
            prefix=self._base,
            tenant=tenant,
            ended_ttl_s=self.ended_ttl_s,
            max_bytes=self.max_bytes,
            clock=self._clock,
        )
        other._lock = self._lock
        other._data = self._data
        return other

    def key(self, session_id: str) -> str:
        """The key of ``session_id`` (validated)."""
        key = self._keys.get(session_id)
        if key is None:
            key = self._prefix + check_name(session_id)
            if len(self._keys) >= _KEYS_KEPT:
                self._keys.clear()
            self._keys[session_id] = key
        return key

    def _get(self, key: str) -> tuple[int, bytes, float | None, str | None] | None:
        entry = self._data.get(key)
        if entry is not None and entry[2] is not None and self._clock() >= entry[2]:
            del self._data[key]
            return None
        return entry

    def load_payload(self, session_id: str) -> tuple[int, bytes]:
        """:meth:`load` without decoding: the version and the record's bytes."""
        key = self.key(session_id)
        with self._lock:
            entry = self._get(key)
        if entry is None:
            raise not_found(session_id)
        return entry[0], entry[1]

    def compare_and_set_payload(
        self,
        session_id: str,
        expected_version: int,
        payload: bytes,
        incarnation: str | None,
        ended: bool = False,
    ) -> int:
        """:meth:`compare_and_set` of a record already encoded as JSON bytes (what a
        :class:`Worker` writes: it builds the bytes from what changed since its last
        write). ``incarnation`` is the one the record names. (A worker passes every
        argument by position: it writes on every advance.)"""
        expected = expected_version
        if type(expected) is not int or expected < 0:
            expected = check_version(session_id, expected_version)
        key = self._keys.get(session_id)
        if key is None:
            key = self.key(session_id)
        if len(payload) > self.max_bytes:
            check_payload(session_id, payload, self.max_bytes)  # raises, naming the size
        lock = self._lock
        lock.acquire()  # not `with`: half the cost, on every write
        try:
            entry = self._data.get(key)
            if entry is not None and entry[2] is not None:
                entry = self._get(key)  # it may have expired
            actual = 0 if entry is None else entry[0]
            if actual != expected:
                raise stale(session_id, expected, actual)
            if (
                entry is not None
                and incarnation is not None
                and entry[3] not in (None, incarnation)
            ):
                raise stale(session_id, expected, actual, another_incarnation=True)
            expires = None
            if ended and self.ended_ttl_s is not None:
                expires = self._clock() + self.ended_ttl_s
            self._data[key] = (actual + 1, payload, expires, incarnation)
            return actual + 1
        finally:
            lock.release()

    def delete(self, session_id: str) -> bool:
        """Remove the record; whether there was one."""
        key = self.key(session_id)
        with self._lock:
            return self._get(key) is not None and self._data.pop(key, None) is not None

    def __repr__(self) -> str:
        return f"<InMemoryStore {self._prefix}* ({len(self._data)} keys)>"


class AdvanceStatus(enum.StrEnum):
    """What a :class:`Worker` call did."""

    APPLIED = "applied"
    """This call wrote the next version: its event (or takeover) took effect."""
    DUPLICATE = "duplicate"
    """The event's ``key`` was already applied (a retry of a write that succeeded)."""
    CONFLICT = "conflict"
    """Another worker moved the session first; nothing was applied. The result
    holds the fresh state: decide again from it."""
    BUSY = "busy"
    """``resume``: another live worker holds the claim on the in-flight tool calls."""
    UNCHANGED = "unchanged"
    """``load`` / ``resume`` with nothing to take over: the stored state as it is."""


class _Live:
    """A session this worker holds: the ``record`` it last read or wrote, at ``version``,
    and the ``session`` that record holds (no clock, the journal's frame), whose doom
    check is ``verdicts``. Whoever takes one out of the worker's memory owns it until it
    puts it back (nothing else reads or steps it meanwhile)."""

    __slots__ = ("plain", "record", "session", "tree", "verdicts", "version")

    def __init__(self, version: int, record: Record, session: Session, verdicts: Verdicts) -> None:
        self.version = version
        self.record = record
        self.session = session
        self.verdicts = verdicts
        self.tree = session.parent_id is not None
        """Whether the session is a child: its spend is reported up the tree."""
        self.plain = not self.tree and verdicts.check is None
        """Neither a child nor doom-checked: what the one-piece advance takes."""


Handout = tuple[Any, str, int, Session | None, bytes | None, float, float, float | None]
"""The session of a result, not copied yet: (the worker's maker, session id, version,
the worker's own session, the bytes stored at that version, its age and wall time then,
and where on the worker's clock the copy starts: ``None`` for an ``APPLIED`` result,
whose copy is put on the clock when made). The caller's copy is made when first asked
for: while the worker has not moved the session on, from its own session; after, from
those bytes, read again."""


@attrs.frozen(weakref_slot=False)
class Advanced:
    """The result of a :class:`Worker` call: the session as stored after it.

    ``version`` is what to pass as ``expected_version`` next. ``action`` is what
    the host owes an event for: the action the event produced (``APPLIED``) or the
    stored turn's pending one; a :class:`~statemachine.Finish` (or ``None``
    before the first turn) means the next call starts a turn. ``interrupted``
    holds the outcomes a ``resume`` synthesized for calls lost with a worker;
    ``ended`` the ids of the child sessions an :meth:`Worker.end` ended with it.
    """

    status: AdvanceStatus
    _session: Session | Handout = attrs.field(alias="session", repr=False)
    version: int
    action: Action | None
    interrupted: tuple[ToolOutcome, ...] = ()
    ended: tuple[str, ...] = ()

    @property
    def session(self) -> Session:
        """The session as stored at ``version`` (the caller's own: changing it changes
        neither the store nor the worker)."""
        held = self._session
        if type(held) is tuple:
            held = held[0](held)
            object.__setattr__(self, "_session", held)  # made once, then kept
        return held  # type: ignore[return-value]

    @property
    def applied(self) -> bool:
        """Whether this call wrote the next version."""
        return self.status is AdvanceStatus.APPLIED


_make_advanced: Callable[
    [AdvanceStatus, Any, int, Action | None, tuple[ToolOutcome, ...], tuple[str, ...]], Advanced
] = build_maker(Advanced, ("status", "_session", "version", "action", "interrupted", "ended"))
"""``Advanced(status, session, version, action, interrupted, ended)``, made through its
slots (every applied advance makes one)."""


def _default_owner() -> str:
    return f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def _asked(verdicts: Verdicts, event: object) -> list[bool] | None:
    """The doom-check verdicts a step's entry holds: the ones the host's check gave, and
    for a reply an empty list when it gave none (the entry says the check was there:
    a reader replays the step with one), else ``None``."""
    if verdicts.check is None:
        return None
    asked = verdicts.take()
    return asked if asked or type(event) is ModelReplied else None


def _spend_facts(session: Session) -> tuple[str | None, float, bool, bool]:
    """What a parent pulls of a child: its parent's id, its total spend, whether it has
    ended and whether it has children of its own."""
    return (
        session.parent_id,
        session.cost_usd,
        session.status is not None,
        bool(session.child_costs),
    )


_MAX_DEPTH = 16
"""How deep a turn start settles the spend of ended sessions down a session tree."""


def _mark(session: Session) -> tuple[int, int]:
    """Where the steps about to be taken begin: the current turn and its steps so far."""
    turn = session.current_turn
    return (0, 0) if turn is None else (turn.index, turn.steps)


class Worker:
    """Advance sessions kept in ``store``, one event per call, with compare-and-set.

    ``owner`` names this worker in tool-call claims (unique per process; default
    host.pid.random). ``lease_s`` is how long its claim on handed-out tool calls
    holds before another worker may :meth:`resume` them. ``idempotent`` lists the
    tools (by name, or a predicate on the :class:`~statemachine.ToolCall`) that
    may be re-run after a worker died. ``now`` is wall-clock Unix time, shared by all
    workers, for leases, idle time and a failure's HTTP-date ``retry-after``: with
    ``count_idle`` the time a session spent in the store between two workers counts
    toward its wall-clock bound, as it would in one process. ``clock`` is the monotonic
    clock the sessions a worker hands out run on.

    A session's steps are taken at its *age*: the seconds its record says it had lived
    at its last write, plus (``count_idle``) the wall-clock seconds since. ``doom_check``
    is the sessions' second-tier doom-loop check (a host function, not data: every
    worker of a store should be given one, or none). It is asked by the worker that
    takes a step; its verdicts go into the journal, and a replay reads them from there
    instead of asking again.
    """

    def __init__(
        self,
        store: SessionStore,
        *,
        owner: str | None = None,
        lease_s: float = 300.0,
        idempotent: Collection[str] | Callable[[ToolCall], bool] = (),
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = time.time,
        count_idle: bool = True,
        observers: Iterable[Callable[[TraceRecord], None]] = (),
        remember: int = _LIVE_SESSIONS,
        doom_check: Callable[[tuple[ToolCall, ...]], bool] | None = None,
    ) -> None:
        if (
            isinstance(lease_s, bool)
            or not isinstance(lease_s, int | float)
            or not 0 < lease_s < float("inf")
        ):
            raise ConfigError(f"lease_s: must be a finite number > 0, got {lease_s!r}")
        if isinstance(idempotent, str):
            raise ConfigError(
                f"idempotent: a collection of tool names (or a predicate), not a str: "
                f"{idempotent!r}; write {{{idempotent!r}}}"
            )
        if owner is not None and (not isinstance(owner, str) or not owner):
            raise ConfigError(f"owner: must be a non-empty str, got {owner!r}")
        if not callable(clock) or not callable(now):
            raise ConfigError("clock: clock and now must be callables returning seconds")
        self.store = store
        self.owner = owner or _default_owner()
        self.lease_s = float(lease_s)
        if callable(idempotent):
            self._idempotent: Callable[[ToolCall], bool] = idempotent
        else:
            names = frozenset(idempotent)
            self._idempotent = lambda call: call.name in names
        self._clock = clock
        self._now = now
        self._count_idle = count_idle
        self._observers = tuple(observers)
        if isinstance(remember, bool) or not isinstance(remember, int) or remember < 0:
            raise ConfigError(f"remember: must be an int >= 0, got {remember!r}")
        self._remember_at_most = remember
        if doom_check is not None and not callable(doom_check):
            raise ConfigError(f"doom_check: must be a callable or None, got {doom_check!r:.60}")
        self._doom_check = doom_check
        self._compact_at = getattr(store, "max_bytes", DEFAULT_MAX_BYTES) // 2
        """A journal that would grow the record past this is written as a snapshot."""
        # Our own stores take and give the record as bytes: the worker builds them from
        # what changed, and knows them again when it reads them back. Any other store
        # (a subclass of ours included) gets and gives the record as JSON data.
        self._payload_cas: Callable[..., int] | None = None
        self._payload_load: Callable[[str], tuple[int, bytes]] | None = None
        if isinstance(store, InMemoryStore | RedisStore) and type(store) in (
            InMemoryStore,
            RedisStore,
        ):
            self._payload_cas = store.compare_and_set_payload
            self._payload_load = store.load_payload
        self._live: dict[str, _Live] = {}
        """The last record this worker read or wrote per session, with the session it
        holds: the next advance at that version skips reading and restoring it (the
        compare-and-set still proves the store holds that version and incarnation).
        Threads share it with no lock: a session is taken out by one ``pop`` (one thread
        gets it) and put back by one assignment."""
        self._lean = None if self._payload_cas is None or self._observers else self._appended
        self._lean_cas: Callable[[str, int, bytes, str | None, bool], int] = (
            store.compare_and_set_payload if type(store) is InMemoryStore else self._cas_payload
        )
        """The lean path's compare-and-set: (session id, expected version, payload,
        incarnation, ended) -> the new version."""
        """The one-piece path of the most frequent advance, where it can apply."""
        self._age_text: tuple[float | None, str] = (None, "")
        """The last step's age and its text (a record's tail writes the same age)."""

    def _cas_payload(
        self, session_id: str, expected: int, payload: bytes, incarnation: str | None, ended: bool
    ) -> int:
        return self._payload_cas(  # type: ignore[misc]
            session_id, expected, payload, incarnation=incarnation, ended=ended
        )

    # -- time ---------------------------------------------------------------------

    def _age(self, record: Record, wall: float) -> float:
        """The session's age now (Unix time ``wall``), as ``record`` gives it (at most
        the largest float, whatever the record's wall time)."""
        age = record.elapsed_s
        if self._count_idle and wall > record.saved_at:
            age += wall - record.saved_at
            age = min(age, _LARGEST)
        return age

    # -- the sessions a worker holds -----------------------------------------------

    def _verdicts(self) -> Verdicts:
        return Verdicts(self._doom_check)

    def _take(self, session_id: str) -> _Live | None:
        return self._live.pop(session_id, None)

    def _remember(self, session_id: str, live: _Live) -> None:
        """Hold ``live`` as the session's latest (its record, version and session)."""
        if not self._remember_at_most:
            return
        remembered = self._live
        # no lock: each of these dict operations is atomic, and list() copies the keys
        # at once (another thread may pop or put meanwhile: at worst one too many is kept)
        remembered.pop(session_id, None)  # put last: the least recently used go first
        remembered[session_id] = live
        over = len(remembered) - self._remember_at_most
        if over > 0:
            for oldest in list(remembered)[:over]:
                remembered.pop(oldest, None)

    def _forget(self, session_id: str) -> None:
        self._live.pop(session_id, None)

    def _recall(self, session_id: str, version: int, key: str | None) -> _Live | None:
        """The session as the store holds it at ``version``, from what this worker wrote
        or read last, if that is the version (and ``key`` is not among its keys: a
        duplicate is answered from the store), taken out of the worker's memory."""
        live = self._live.pop(session_id, None)  # atomic: taken by one thread only
        if live is None:
            return None
        if live.version != version or (
            key is not None and any(k == key for _, k in live.record.keys)
        ):
            self._live.setdefault(session_id, live)  # unless another was remembered meanwhile
            return None
        return live

    # -- reading ------------------------------------------------------------------

    def _read(self, session_id: str) -> _Live:
        """The stored version, record and session, taken out of the worker's memory (the
        caller puts it back with :meth:`_remember`). Finding in the store the very bytes
        this worker last wrote or read, it decodes nothing; finding them grown by
        journal entries (other workers' advances), it decodes and replays only those."""
        if self._payload_load is None:
            stored = self.store.load(session_id)
            version, record = stored.version, parse_record(session_id, stored.record)
        else:
            version, payload = self._payload_load(session_id)
            known = self._known(session_id, version, payload)
            if known is not None:
                return known
            record = self._parsed(session_id, payload)
        legacy_start = 0.0
        if record.version < 3:  # its snapshot's retry_at may be a reading of a clock
            legacy_start = self._clock() - self._age(record, self._now())
        session, verdicts = read_session(record, self._doom_check, legacy_start)
        record.crowded = len(record.journal) > REPLAY_AT_MOST
        return _Live(version, record, session, verdicts)

    def _parsed(self, session_id: str, payload: bytes) -> Record:
        """The record in ``payload`` (the bytes of a store of bytes), or
        ``CorruptSession``."""
        max_bytes: int = self.store.max_bytes  # type: ignore[attr-defined]
        split = split_record(payload) if len(payload) <= max_bytes else None
        if split is None:
            return parse_record(session_id, decode_record(session_id, payload, max_bytes), payload)
        return parse_record(session_id, split[0], payload, split[1])

    def _known(self, session_id: str, version: int, payload: bytes) -> _Live | None:
        """The session in ``payload`` if it is the record this worker holds, or that
        record grown by journal entries (those entries replayed on the held session,
        and checked); ``None`` otherwise (it is then read in full)."""
        live = self._take(session_id)
        if live is None:
            return None
        record = live.record
        if record.payload == payload:
            live.version = version
            return live
        grown = extend(record, payload)
        if grown is None:
            return None
        try:
            if grown.journal:
                replay_record(live.session, live.verdicts, grown, grown.journal, record.entries)
                grown.crowded = len(grown.journal) > REPLAY_AT_MOST
            check_record(grown, live.session)
        except CorruptSession:
            return None  # read in full, which says what is wrong
        return _Live(version, grown, live.session, live.verdicts)

    # -- what a caller gets -----------------------------------------------------------

    def _started(self, elapsed: float, saved_at: float) -> float:
        """Where on this worker's clock a session starts that was ``elapsed`` seconds old
        at ``saved_at``, as a read of it from the store puts it."""
        age = elapsed
        if self._count_idle:
            idle = self._now() - saved_at
            if idle > 0.0:
                age = min(age + idle, _LARGEST)
        return self._clock() - age

    def _on_clock(
        self, own: Session, elapsed: float, saved_at: float, started: float | None = None
    ) -> Session:
        """A copy of ``own`` (the journal's frame) put on this worker's clock, the session
        ``elapsed`` seconds old at ``saved_at`` (or started at ``started``), as a read of
        it from the store gives it."""
        return own.copy(
            clock=self._clock,
            wall_clock=self._now,
            started=self._started(elapsed, saved_at) if started is None else started,
            observers=self._observers,
            doom_check=self._doom_check,
        )

    def _hand_out(self, handout: Handout) -> Session:
        """The session of ``handout``: a copy of the worker's own session if that is
        still as the write left it, else the written bytes read again."""
        _, session_id, version, own, payload, elapsed, saved_at, started = handout
        # taken out while it is copied, as an advance takes it: another thread's advance
        # of the session meanwhile reads the store instead of stepping this one
        live = self._live.pop(session_id, None)
        if live is not None:
            try:
                if live.version == version and live.session is own:
                    return self._on_clock(own, elapsed, saved_at, started)
            finally:
                self._live.setdefault(session_id, live)  # unless another was remembered
        record = self._parsed(session_id, payload)  # type: ignore[arg-type]
        session, _ = read_session(record, self._doom_check)
        return self._on_clock(session, record.elapsed_s, record.saved_at, started)

    def _handout(
        self, session_id: str, live: _Live, started: float | None = None
    ) -> Session | Handout:
        """What a result gives as its session: a copy of the worker's own, taken when the
        caller first asks for it (see :data:`Handout`), put on this worker's clock then
        (an ``APPLIED`` result's) or starting at ``started``."""
        record = live.record
        if record.payload is None or not self._remember_at_most:
            return self._on_clock(live.session, record.elapsed_s, record.saved_at, started)
        return (
            self._hand_out,
            session_id,
            live.version,
            live.session,
            record.payload,
            record.elapsed_s,
            record.saved_at,
            started,
        )

    def _on_clock_action(self, action: Action, elapsed: float) -> Action:
        """``action`` of a session ``elapsed`` seconds old now, its readings (a Finish's
        ``retry_at``) put on this worker's clock."""
        if type(action) is Finish and action.retry_at is not None:
            return attrs.evolve(action, retry_at=action.retry_at + (self._clock() - elapsed))
        return action

    def _result(self, status: AdvanceStatus, live: _Live) -> Advanced:
        """A result that gives the stored session as it is (``live``, put back)."""
        record = live.record
        own = live.session
        turn = own.current_turn
        action = None if turn is None else turn.action
        started = self._started(record.elapsed_s, record.saved_at)
        session: Session | Handout
        if type(action) is Finish and action.retry_at is not None:
            # a reading: the copy's Finish holds it on this worker's clock
            session = self._on_clock(own, record.elapsed_s, record.saved_at, started)
            action = session.current_turn.action  # type: ignore[union-attr]
        else:  # copied when the caller first asks (many a host reads the action only)
            session = self._handout(record.session_id, live, started)
        if isinstance(action, InvokeTools) and record.carried:
            claimed = set(record.claim.calls) if record.claim else set()
            action = InvokeTools(tuple(c for c in action.calls if c.id in claimed))
        return Advanced(status, session, live.version, action)

    def _answer(self, session_id: str, status: AdvanceStatus, live: _Live) -> Advanced:
        result = self._result(status, live)
        self._remember(session_id, live)
        return result

    def load(self, session_id: str) -> Advanced:
        """The stored session, its version and pending action (``UNCHANGED``)."""
        return self._answer(session_id, AdvanceStatus.UNCHANGED, self._read(session_id))

    # -- writing ------------------------------------------------------------------

    def _record(
        self,
        session_id: str,
        live: _Live | None,
        session: Session,
        action: Action | None,
        keys: tuple[tuple[int, str], ...],
        elapsed: float,
        wall: float,
        claim: Claim | None = None,
        carried: tuple[ToolOutcome, ...] = (),
        entries: tuple[str, ...] | list[str] = (),
        start: bool = False,
    ) -> Record:
        """The record to write for ``session`` (the journal's frame), ``elapsed`` seconds
        old at Unix time ``wall``; ``live`` holds the record it was read from (its
        incarnation is kept) and ``entries`` are the journal entries of the steps
        applied since. To a store of bytes the entries are appended to the previous
        record's bytes, in place; every :data:`COMPACT_EVERY` entries (at a turn's
        ``start``, after :data:`COMPACT_AT_START`: its snapshot is small then), after a
        read found many other workers' entries, past half the store's ``max_bytes``, and
        for a new record, a record of an older version or a store that takes JSON data,
        the snapshot is written anew instead."""
        if claim is None and type(action) is InvokeTools and action.calls:
            claim = Claim(self.owner, tuple(c.id for c in action.calls), wall + self.lease_s)
        last = session.last_at
        elapsed = last if elapsed < last else elapsed
        finished_at = session.finished_at
        finished = None if finished_at is None else elapsed - finished_at
        previous = None if live is None else live.record
        if self._payload_cas is None:  # a store that takes JSON data: the snapshot as data
            snapshot = session.snapshot(at=elapsed)
            return Record(
                session_id,
                snapshot,
                wall,
                keys,
                claim,
                carried,
                uuid.uuid4().hex if previous is None else previous.incarnation,
                elapsed_s=snapshot["elapsed_s"],
                finished_s=snapshot["finished_at"],
            )
        if previous is not None:
            end, count, known = previous.prefix_end, previous.entries, previous.payload
            added: str | None = None
            if (
                end is not None
                and known is not None
                and not previous.crowded
                and previous.version == RECORD_VERSION
                and count + len(entries) <= (COMPACT_AT_START if start else COMPACT_EVERY)
            ):
                added = entries[0] if len(entries) == 1 else ",".join(entries)
                if added and count:
                    added = "," + added
                size = len(added) if added.isascii() else len(added.encode())
                if end + size > self._compact_at:
                    added = None  # past the size bound: the snapshot written anew
            if added is not None:
                # the entries appended to the previous record's bytes: the record is
                # the caller's alone (taken out of the worker's memory): updated in place
                middle = previous.middle
                if (
                    middle is None
                    or keys is not previous.keys
                    or claim != previous.claim
                    or carried is not previous.carried
                ):
                    middle = middle_text(keys, claim, carried)
                # the age's text, when the step's entry wrote it already
                age, text = self._age_text
                age_text = text if age is elapsed and type(elapsed) is float else None
                tail = tail_text(wall, middle, elapsed, finished, age_text)
                previous.payload = b"".join((memoryview(known)[:end], (added + tail).encode()))  # type: ignore[arg-type]
                previous.prefix_end = end + size  # type: ignore[operator]
                previous.entries = count + len(entries)
                previous.saved_at = wall
                previous.elapsed_s, previous.finished_s = elapsed, finished
                if middle is not previous.middle:
                    previous.keys, previous.claim, previous.carried = keys, claim, carried
                    previous.middle = middle
                if previous.snapshot is not None or previous.journal:
                    previous.snapshot, previous.journal = None, ()  # read: only the bytes now
                return previous
        incarnation = uuid.uuid4().hex if previous is None else previous.incarnation
        # the snapshot written anew, the journal empty
        cache = TextCache()
        old = TextCache() if previous is None or previous.cache is None else previous.cache
        text = write_snapshot_text(session.settings, session.state, elapsed, old, cache)
        prefix = head_bytes(session_id, incarnation, text)
        fresh = middle_text(keys, claim, carried)
        ending = tail_text(wall, fresh, elapsed, finished).encode()
        return Record(
            session_id,
            None,
            wall,
            keys,
            claim,
            carried,
            incarnation,
            elapsed_s=elapsed,
            finished_s=finished,
            entries=0,
            prefix_end=len(prefix),
            base_text=text,
            cache=cache,
            payload=prefix + ending,
            middle=fresh,
        )

    def _write(
        self,
        session_id: str,
        expected: int,
        record: Record,
        session: Session,
        action: Action | None = None,
    ) -> int:
        # a session ends with a turn's Finish (or between turns: no action then)
        ended = (action is None or type(action) is Finish) and session.status is not None
        if self._payload_cas is not None:
            return self._payload_cas(
                session_id,
                expected,
                record.payload,  # built with every record written to a store of bytes
                incarnation=record.incarnation,
                ended=ended,
            )
        return self.store.compare_and_set(session_id, expected, record.to_json(), ended=ended)

    def create(self, session_id: str, session: Session, *, key: str | None = None) -> Advanced:
        """Store a new session under ``session_id`` (version 1).

        Raises :class:`StaleWrite` if the id is taken. A session whose turn is
        invoking tools is recorded as this worker's claim on those calls.
        """
        check_name(session_id)
        tree = session.parent_id is not None or bool(session.child_costs)
        if (session.session_id is not None or tree) and session.session_id != session_id:
            raise ConfigError(
                f"session_id: the session's id is {session.session_id!r}, its store id "
                f"{session_id!r}: in a session tree they must be the same (spend is reported "
                "by id); create it with Session(..., session_id=<the store id>)"
            )
        turn = session.current_turn
        action = None if turn is None else turn.action
        keys = () if key is None else ((1, key),)
        elapsed = session.elapsed_s
        verdicts = self._verdicts()
        own = session.copy(started=0.0, doom_check=verdicts)  # the journal's frame
        record = self._record(session_id, None, own, action, keys, elapsed, self._now())
        version = self._write(session_id, 0, record, own)
        self._remember(session_id, _Live(version, record, own, verdicts))
        return Advanced(AdvanceStatus.APPLIED, session, version, action)

    def advance(
        self,
        session_id: str,
        event: object | None,
        *,
        expected_version: int,
        key: str | None = None,
    ) -> Advanced:
        """Apply ONE event to the session as it was at ``expected_version``.

        ``event`` is an engine event for the current turn, or ``None`` to start the
        next turn (``session.new_turn().start()``). The result is ``APPLIED`` (with
        the new action and version), or ``CONFLICT`` / ``DUPLICATE`` with the fresh
        stored state and nothing applied. Engine errors (``IllegalEvent``,
        ``SessionEnded``, ``TurnInProgress``) propagate and nothing is written.
        """
        expected = expected_version
        if type(expected) is not int or expected < 0:
            expected = check_version(session_id, expected_version)
        if key is not None and (not isinstance(key, str) or not key):
            raise ValueError(f"key: must be a non-empty str or None, got {key!r}")
        live = self._live.pop(session_id, None)  # _recall, inline: every advance takes it
        if live is not None and (
            live.version != expected
            or (key is not None and any(k == key for _, k in live.record.keys))
        ):
            self._live.setdefault(session_id, live)  # unless another was remembered meanwhile
            live = None
        applied = None
        if live is not None:
            try:
                if self._lean is not None:
                    fast = self._lean(session_id, live, event, expected, key)
                    if fast is not None:
                        return fast
                applied = self._apply(session_id, live, event)
            except (IllegalEvent, SessionEnded, TurnInProgress):
                applied = None  # maybe the store moved on: read it, and answer from there
        if applied is None:
            live = self._read(session_id)
            if key is not None and any(k == key for _, k in live.record.keys):
                return self._answer(session_id, AdvanceStatus.DUPLICATE, live)
            if live.version != expected:
                return self._answer(session_id, AdvanceStatus.CONFLICT, live)
            applied = self._apply(session_id, live, event)
        action, entries, age, wall, mark, spent = applied
        session = live.session  # type: ignore[union-attr]
        record = live.record  # type: ignore[union-attr]
        keys = record.keys
        if key is not None:
            keys = (*keys, (expected + 1, key))[-MAX_KEYS:]
        offset = self._clock() - age if self._observers else 0.0
        new = self._record(
            session_id, live, session, action, keys, age, wall, None, (), entries, event is None
        )
        cas = self._payload_cas
        try:
            if cas is None:
                version = self._write(session_id, expected, new, session, action)
            else:  # _write, inline: every advance takes it
                ended = (action is None or type(action) is Finish) and session.status is not None
                version = cas(
                    session_id, expected, new.payload, incarnation=new.incarnation, ended=ended
                )
        except StaleWrite:
            return self._lost_race(session_id, key)
        live.version, live.record = version, new  # type: ignore[union-attr]
        if type(action) is Finish:
            action = self._on_clock_action(action, new.elapsed_s)
        result = Advanced(
            AdvanceStatus.APPLIED,
            self._handout(session_id, live),  # type: ignore[arg-type]
            version,
            action,
        )
        # read the session before it is remembered: from then on another thread may
        # take it out and step it (an advance that may never be stored)
        if self._observers:
            self._deliver(session, mark, offset)
        report = (session.parent_id, session.session_id, session.cost_usd) if spent else None
        self._remember(session_id, live)  # type: ignore[arg-type]
        if report is not None:
            self._report_spend(*report)
        return result

    def _appended(  # noqa: PLR0915 - one piece on purpose: every advance takes it
        self, session_id: str, live: _Live, event: object | None, expected: int, key: str | None
    ) -> Advanced | None:
        """:meth:`advance`'s most frequent case, in one piece: an event (or a turn's start,
        ``None``) for a session this worker holds, whose record takes one more entry (or
        is written anew by :meth:`_record`), with no observer, doom check, session tree,
        child spend or carried outcome to look after; ``None`` (nothing done) for any
        other, which goes the general way. The same steps: the step at the session's age,
        its entry appended to the record's bytes, the compare-and-set, the result."""
        record = live.record
        end, count, known = record.prefix_end, record.entries, record.payload
        if (
            not live.plain
            or record.carried
            or record.crowded
            or end is None
            or known is None
            or record.version != RECORD_VERSION
        ):
            return None
        session = live.session
        turn = session.current_turn
        if event is None:
            if session.child_costs:  # the children's totals are pulled first
                return None
        elif turn is None:
            return None
        wall = self._now()
        age = record.elapsed_s
        if self._count_idle and wall > record.saved_at:
            age = min(age + (wall - record.saved_at), _LARGEST)
        if type(age) is not float:
            return None
        at = float.__repr__(age)
        sep = "," if count else ""
        # the step as apply_step takes it, its entry as entry_text writes it
        if event is None:
            if turn is not None and turn.state == "idle":
                action = turn.start(at=age)
            else:
                action = session.new_turn(at=age).start(at=age)
            added = f'{sep}["s",{at},null]'
        elif type(event) is ModelFailed and event.error.headers is not None:
            action = turn.send(event, at=age, wall=wall)  # type: ignore[union-attr]
            added = f'{sep}["e",{at},{number_text(wall)},{event_text(event)}]'
        else:
            action = turn.send(event, at=age)  # type: ignore[union-attr]
            added = f'{sep}["e",{at},null,{event_text(event)}]'
        size = len(added) if added.isascii() else len(added.encode())
        keys = record.keys
        if key is not None:
            keys = (*keys, (expected + 1, key))[-MAX_KEYS:]
        if (
            count >= (COMPACT_AT_START if event is None else COMPACT_EVERY)
            or end + size > self._compact_at
            or (type(action) is InvokeTools and action.calls)
        ):
            # the general way from here (the snapshot written anew, or a claim): the step
            # is taken, its entry written
            new = self._record(
                session_id,
                live,
                session,
                action,
                keys,
                age,
                wall,
                None,
                (),
                [added[1:] if count else added],
                event is None,
            )
            elapsed = new.elapsed_s
        else:
            # the record (the worker's alone) grown in place: its bytes, prefix, ages and
            # keys (no claim, nothing carried); the tail as tail_text writes it
            last = session.last_at
            elapsed = last if age < last else age
            finished_at = session.finished_at
            finished = None if finished_at is None else elapsed - finished_at
            middle = record.middle
            if middle is None or keys is not record.keys or record.claim is not None:
                middle = middle_text(keys, None, ())
                record.keys, record.claim, record.carried, record.middle = keys, None, (), middle
            saved = float.__repr__(wall) if type(wall) is float else number_text(wall)
            if elapsed is not age:
                at = float.__repr__(elapsed) if type(elapsed) is float else number_text(elapsed)
            tail = (
                f'{added}],"saved_at":{saved}{middle},"elapsed_s":{at},'
                f'"finished_s":{"null" if finished is None else number_text(finished)}}}'
            )
            if end < _SLICED:
                record.payload = known[:end] + tail.encode()
            else:
                record.payload = b"".join((memoryview(known)[:end], tail.encode()))
            record.prefix_end = end + size
            record.entries = count + 1
            record.saved_at = wall
            record.elapsed_s, record.finished_s = elapsed, finished
            if record.snapshot is not None or record.journal:
                record.snapshot, record.journal = None, ()  # read: only the bytes now
            new = record
        ended = type(action) is Finish and session.status is not None
        try:
            version = self._lean_cas(session_id, expected, new.payload, new.incarnation, ended)  # type: ignore[arg-type]
        except StaleWrite:
            return self._lost_race(session_id, key)
        live.version, live.record = version, new
        if type(action) is Finish and action.retry_at is not None:
            action = self._on_clock_action(action, elapsed)
        if not self._remember_at_most:
            return Advanced(
                AdvanceStatus.APPLIED, self._on_clock(session, elapsed, wall), version, action
            )
        result = _make_advanced(  # _handout, inline: its bytes taken before it is remembered
            AdvanceStatus.APPLIED,
            (self._hand_out, session_id, version, session, new.payload, elapsed, wall, None),
            version,
            action,
            (),
            (),
        )
        self._remember(session_id, live)
        return result

    def _apply(
        self, session_id: str, live: _Live, event: object | None
    ) -> tuple[Action, list[str], float, float, tuple[int, int], bool]:
        """Apply ``event`` (``None``: start the next turn) to ``live``'s session at its
        age now: the action it produced, the journal entries of its steps, the age and
        wall time they were taken at, where they began and whether they spent."""
        session, record = live.session, live.record
        wall = self._now()
        age = record.elapsed_s  # self._age(record, wall), inline: every advance takes it
        if self._count_idle and wall > record.saved_at:
            age = min(age + (wall - record.saved_at), _LARGEST)
        mark = _mark(session) if self._observers else (0, 0)
        tree = live.tree
        before = session.cost_usd if tree else 0.0
        if event is None:
            steps: list[Step] = [
                *self._pulled_spend(session),
                *self._pulled_budget(session),
                (START,),
            ]
            entries = self._steps(session, live.verdicts, steps, age, wall)
            action: Action = session.current_turn.action  # type: ignore[union-attr,assignment]
        else:
            turn = session.current_turn
            if turn is None:
                raise IllegalEvent(
                    f"session {session_id!r} has no turn yet: advance it with None to start one",
                    event=type(event).__name__,
                    state="no turn",
                )
            if record.carried and type(event) is ToolsDone:
                event = ToolsDone((*record.carried, *event.outcomes))
            # needs_wall(event), inline: every advance takes it
            failed = type(event) is ModelFailed and event.error.headers is not None
            given = wall if failed else None
            action = turn.send(event, at=age, wall=given)
            entries = []
            if self._payload_cas is not None:
                verdicts = live.verdicts
                if verdicts.check is None and type(age) is float:
                    # entry_text((EVENT, event), age, given), inline: every advance takes it
                    when = "null" if given is None else number_text(given)
                    at = float.__repr__(age)
                    self._age_text = (age, at)  # the record's tail writes it too
                    entries.append(f'["e",{at},{when},{event_text(event)}]')
                else:
                    asked = None if verdicts.check is None else _asked(verdicts, event)
                    entries.append(entry_text((EVENT, event), age, given, asked))
        return action, entries, age, wall, mark, tree and session.cost_usd > before

    def _steps(
        self,
        session: Session,
        verdicts: Verdicts,
        steps: Iterable[Step],
        age: float,
        wall: float,
    ) -> list[str]:
        """Apply ``steps`` to ``session`` at ``age`` (Unix time ``wall``, given to a step
        whose rules may read it): their journal entries (none for a store that takes
        JSON data, which is written its snapshot)."""
        entries: list[str] = []
        journaled = self._payload_cas is not None
        for step in steps:
            op = step[0]
            if op == EVENT:
                at: float | None = age
                given = wall if needs_wall(step[1]) else None
            elif op == START:
                at, given = age, None
            else:
                at = given = None
            apply_step(session, step, at, given)
            if journaled:
                asked = _asked(verdicts, step[1]) if op == EVENT else None
                entries.append(entry_text(step, at, given, asked))
        return entries

    def _deliver(self, session: Session, mark: tuple[int, int], offset: float) -> None:
        """Pass the records of the steps taken since ``mark`` to the observers, on this
        worker's clock (``offset``: its reading less the session's age)."""
        turn = session.current_turn
        if turn is None:
            return
        first = mark[1] if turn.index == mark[0] else 0
        for record in turn.trace[first:]:
            at = None if record.at is None else record.at + offset
            shifted = attrs.evolve(record, at=at)
            for observer in self._observers:
                observer(shifted)

    # -- spend across the session tree ----------------------------------------------

    def _peek(self, session_id: str, read: Callable[[Session], _T]) -> _T | None:
        """``read(session)`` of the stored session ``session_id``, taken before the
        session is put back as the latest (from then on another thread may step it);
        ``None`` when it cannot be read."""
        try:
            live = self._read(session_id)
        except (SessionNotFound, CorruptSession, InvalidSessionId):
            return None
        value = read(live.session)
        self._remember(session_id, live)
        return value

    def _pulled_spend(
        self, session: Session, depth: int = 0, path: frozenset[str | None] = frozenset()
    ) -> list[Step]:
        """Before a parent's turn starts, each child's total from its record, so a
        report a worker never made (it died after writing the child) is not lost. A
        child that has ended starts no turn to pull its own children's totals: they are
        settled into its record first, down the tree (``path``: the sessions above, so
        forged records naming each other as children end the walk)."""
        steps: list[Step] = []
        known = session.child_costs
        if not known:
            return steps
        path = path | {session.session_id}
        for child_id in known:
            if child_id in path:
                continue
            facts = self._peek(child_id, _spend_facts)
            if facts is None:
                continue
            parent_id, total, ended, parent = facts
            if parent_id != session.session_id:
                continue  # not this parent's child (a forged or re-created id)
            if ended and parent and depth < _MAX_DEPTH:
                total = self._settled(child_id, depth + 1, path) or total
            if total > known[child_id]:
                steps.append((CHILD_SPEND, child_id, total))
        return steps

    def _settled(
        self, session_id: str, depth: int, path: frozenset[str | None], attempts: int = 16
    ) -> float | None:
        """The total spend of session ``session_id`` (one that has ended) once its
        children's totals are pulled into its record and written; ``None`` when it
        cannot be read or written."""
        for _ in range(attempts):
            try:
                live = self._read(session_id)
            except (SessionNotFound, CorruptSession, InvalidSessionId):
                return None
            session, record = live.session, live.record
            steps = self._pulled_spend(session, depth, path)
            if not steps:
                total = session.cost_usd
                self._remember(session_id, live)
                return total
            wall = self._now()
            entries = self._steps(session, live.verdicts, steps, 0.0, wall)
            new = self._record(
                session_id,
                live,
                session,
                None,
                record.keys,
                self._age(record, wall),
                wall,
                claim=record.claim,
                carried=record.carried,
                entries=entries,
            )
            try:
                version = self._write(session_id, live.version, new, session)
            except StaleWrite:
                continue
            total = session.cost_usd  # read before it is remembered
            self._remember(session_id, _Live(version, new, session, live.verdicts))
            return total
        return None

    def _pulled_budget(self, session: Session) -> list[Step]:
        """Before a child's turn starts, its parent's remaining budget from the
        parent's record (siblings' spend included), as a live parent would give it. A
        parent ended ``cancelled`` or ``failed`` starts no child's turn (``SessionEnded``:
        its :meth:`end` cascade did not reach this child yet)."""
        parent_id = session.parent_id
        if parent_id is None:
            return []
        child_id = session.session_id
        budget = self._peek(
            parent_id,
            lambda parent: (
                child_id in parent.child_costs,
                parent.remaining_budget_usd,
                parent.status,
            ),
        )
        if budget is None or not budget[0]:
            return []  # not this parent's child (a forged or re-created id): keep what it has
        if budget[2] in (SessionStatus.CANCELLED, SessionStatus.FAILED):
            raise SessionEnded(
                f"session {child_id!r}: its parent {parent_id!r} has ended "
                f"({budget[2].value}): it starts no turn; end it with Worker.end",
                status=budget[2],
            )
        return [(BUDGET, budget[1])]

    def _report_spend(
        self, parent_id: str | None, child_id: str | None, total: float, attempts: int = 16
    ) -> None:
        """Charge child ``child_id``'s ``total`` to the records of its parent
        ``parent_id`` and up the tree (compare-and-set, retried on a conflict; a total is
        a max-merge, so a repeat is harmless). A parent that is not in this store (or
        gone) is skipped: its next turn start pulls the total."""
        while parent_id is not None and child_id is not None:
            up: tuple[str | None, str | None, float] | None = None
            for _ in range(attempts):
                try:
                    live = self._read(parent_id)
                except (SessionNotFound, CorruptSession, InvalidSessionId):
                    return
                parent, record = live.session, live.record
                known = parent.child_costs
                if child_id not in known:
                    self._remember(parent_id, live)
                    return  # not this parent's child (re-created under its id): nothing to charge
                if total <= known[child_id]:  # counted already: the record holds it
                    up = (parent.parent_id, parent.session_id, parent.cost_usd)
                    self._remember(parent_id, live)
                    break
                wall = self._now()
                entries = self._steps(
                    parent, live.verdicts, [(CHILD_SPEND, child_id, total)], 0.0, wall
                )
                new = self._record(
                    parent_id,
                    live,
                    parent,
                    None,  # no new action: the parent's claim and carried outcomes stay
                    record.keys,
                    self._age(record, wall),
                    wall,
                    claim=record.claim,
                    carried=record.carried,
                    entries=entries,
                )
                try:
                    version = self._write(parent_id, live.version, new, parent)
                except StaleWrite:
                    continue
                # read before it is remembered: another thread may step it from then on
                up = (parent.parent_id, parent.session_id, parent.cost_usd)
                self._remember(parent_id, _Live(version, new, parent, live.verdicts))
                break
            if up is None:
                return
            parent_id, child_id, total = up

    def _lost_race(self, session_id: str, key: str | None) -> Advanced:
        live = self._read(session_id)
        mine = key is not None and any(k == key for _, k in live.record.keys)
        status = AdvanceStatus.DUPLICATE if mine else AdvanceStatus.CONFLICT
        return self._answer(session_id, status, live)

    def resume(self, session_id: str, *, force: bool = False) -> Advanced:
        """Take over a session whose worker may have died.

        If the stored turn is invoking tools that were handed to a worker whose
        lease has run out (or that is this worker's ``owner``, or with ``force``),
        each claimed call becomes an error outcome with content
        :data:`INTERRUPTED` and category ``cancelled``, except idempotent tools,
        which are claimed again by this worker and returned as
        ``InvokeTools`` (send their ``ToolsDone`` with :meth:`advance`; the
        interrupted outcomes are added to it). With nothing left to run, the
        turn finishes at once. ``APPLIED`` on takeover; ``BUSY`` while another
        worker's lease holds; ``UNCHANGED`` (the pending action) otherwise.
        """
        live = self._read(session_id)
        session, record = live.session, live.record
        turn = session.current_turn
        claim = record.claim
        pending = None if turn is None else turn.action
        if (
            turn is None
            or turn.state != "invoking_tools"
            or claim is None
            or not isinstance(pending, InvokeTools)
        ):
            return self._answer(session_id, AdvanceStatus.UNCHANGED, live)
        wall = self._now()
        if not force and claim.owner != self.owner and wall < claim.until:
            return self._answer(session_id, AdvanceStatus.BUSY, live)
        by_id = {call.id: call for call in pending.calls}
        claimed = [by_id[i] for i in claim.calls]  # checked when the record was read
        rerun = tuple(call for call in claimed if self._idempotent(call))
        interrupted = tuple(
            ToolOutcome(call.id, False, INTERRUPTED, ToolErrorCategory.CANCELLED)
            for call in claimed
            if not self._idempotent(call)
        )
        carried = (*record.carried, *interrupted)
        age = self._age(record, wall)
        action: Action
        if rerun:
            action = InvokeTools(rerun)
            new_claim = Claim(self.owner, tuple(c.id for c in rerun), wall + self.lease_s)
            new = self._record(
                session_id,
                live,
                session,
                action,
                record.keys,
                age,
                wall,
                claim=new_claim,
                carried=carried,
            )
        else:
            entries = self._steps(session, live.verdicts, [(EVENT, ToolsDone(carried))], age, wall)
            action = session.current_turn.action  # type: ignore[union-attr,assignment]
            new = self._record(
                session_id, live, session, action, record.keys, age, wall, entries=entries
            )
        try:
            version = self._write(session_id, live.version, new, session)
        except StaleWrite:
            return self._lost_race(session_id, None)
        done = _Live(version, new, session, live.verdicts)
        action = self._on_clock_action(action, new.elapsed_s)
        handout = self._handout(session_id, done)
        self._remember(session_id, done)
        return Advanced(AdvanceStatus.APPLIED, handout, version, action, interrupted)

    def end(
        self,
        session_id: str,
        status: SessionStatus | str,
        *,
        expected_version: int,
        reason: str = "",
        key: str | None = None,
    ) -> Advanced:
        """End the session on purpose, as ``Session.end`` does in one process:
        ``completed``, ``cancelled`` or ``failed``, written over ``expected_version``
        (compare-and-set; ``CONFLICT`` / ``DUPLICATE`` as :meth:`advance`).

        ``cancelled`` / ``failed`` cancel a running turn (the result's action is its
        ``Finish``; a claim on its tool calls is dropped) and end every live child
        session in the store ``cancelled``, down the tree, whichever worker holds it
        (each by its own compare-and-set, retried on a conflict; the ids are in
        ``ended``); a worker stepping such a child gets ``CONFLICT`` with the child
        ended. ``completed`` raises ``TurnInProgress`` and writes nothing while the
        session's turn or any descendant's runs. Ending an ended session again with
        the same status is ``UNCHANGED`` and finishes a cascade a dead worker left
        half done; with another status it raises ``SessionEnded``.
        """
        chosen = ending.end_status(status)
        expected = check_version(session_id, expected_version)
        if key is not None and (not isinstance(key, str) or not key):
            raise ValueError(f"key: must be a non-empty str or None, got {key!r}")
        if not isinstance(reason, str):
            raise TypeError(f"reason: must be a str, got {reason!r:.60}")
        live = self._recall(session_id, expected, key) or self._read(session_id)
        if key is not None and any(k == key for _, k in live.record.keys):
            return self._answer(session_id, AdvanceStatus.DUPLICATE, live)
        if live.version != expected:
            return self._answer(session_id, AdvanceStatus.CONFLICT, live)
        session = live.session
        tree_reason = reason or f"parent {session_id!r} ended {chosen.value}"
        children = tuple(session.child_costs)
        if session.status is not None:
            self._remember(session_id, live)
            if session.status is not chosen:
                raise SessionEnded(
                    f"session {session_id!r} has already ended ({session.status.value})",
                    status=session.status,
                )
            # a repeat of an ending: finish a cascade its worker may have died in
            result = self._result(AdvanceStatus.UNCHANGED, live)
            if chosen is SessionStatus.COMPLETED:
                return result
            ended = self._cascade(session_id, children, tree_reason)
            return Advanced(
                result.status, result.session, result.version, result.action, ended=tuple(ended)
            )
        if chosen is SessionStatus.COMPLETED:
            own = ending.running(session)
            self._remember(session_id, live)  # put back while the children are read
            running = self._running_descendants(session_id, children)
            if running or own:
                whose = f"child session {running[0]!r}" if running else f"session {session_id!r}"
                raise TurnInProgress(
                    f"{whose} is running a turn: a session completes when no turn of its own or "
                    "of its children runs; end it cancelled or failed to abandon them"
                )
            live = self._recall(session_id, expected, None) or self._read(session_id)
            if live.version != expected:
                return self._answer(session_id, AdvanceStatus.CONFLICT, live)
            session, children = live.session, tuple(live.session.child_costs)
        keys = live.record.keys
        if key is not None:
            keys = (*keys, (expected + 1, key))[-MAX_KEYS:]
        try:
            version = self._write_end(session_id, live, chosen, reason, keys)
        except StaleWrite:
            return self._lost_race(session_id, key)
        action = ending.pending(session)
        if action is not None:
            action = self._on_clock_action(action, live.record.elapsed_s)
        handout = self._handout(session_id, live)
        self._remember(session_id, live)
        if chosen is SessionStatus.COMPLETED:
            # a child whose turn started after the check above: it must not charge a
            # finished parent, so it is cancelled (its worker sees a CONFLICT)
            ended = self._cascade(session_id, children, tree_reason, running_only=True)
        else:
            ended = self._cascade(session_id, children, tree_reason)
        return Advanced(AdvanceStatus.APPLIED, handout, version, action, ended=tuple(ended))

    def _write_end(
        self,
        session_id: str,
        live: _Live,
        status: SessionStatus,
        reason: str,
        keys: tuple[tuple[int, str], ...],
    ) -> int:
        """End ``live``'s session with ``status`` and write it over the version it was read
        at (``StaleWrite`` if that moved on; the session is then the caller's to drop)."""
        session, record = live.session, live.record
        wall = self._now()
        age = self._age(record, wall)
        session.end(status, reason=reason, at=age)
        action = ending.pending(session)
        record.crowded = True  # the snapshot written anew: the ending is in it, not journaled
        new = self._record(session_id, live, session, action, keys, age, wall)
        version = self._write(session_id, live.version, new, session, action)
        live.version, live.record = version, new
        return version

    def _running_descendants(
        self, parent_id: str | None, children: tuple[str, ...], depth: int = 0
    ) -> list[str]:
        """The ids of the descendants in the store whose turn is running (each one's record
        naming its parent's id)."""
        found: list[str] = []
        for child_id in children:
            facts = self._peek(child_id, ending.facts)
            if facts is None or facts[0] != parent_id or facts[1]:
                continue
            if facts[2]:
                found.append(child_id)
            if depth < ending.MAX_DEPTH:
                found += self._running_descendants(child_id, facts[3], depth + 1)
        return found

    def _cascade(
        self,
        parent_id: str | None,
        children: tuple[str, ...],
        reason: str,
        depth: int = 0,
        running_only: bool = False,
    ) -> list[str]:
        """End ``cancelled`` each live child (of ``children``) of session ``parent_id`` in
        the store, and theirs, down the tree (``running_only``: only those whose turn
        runs). Returns the ids ended."""
        ended: list[str] = []
        for child_id in children:
            grandchildren: tuple[str, ...] = ()
            for _ in range(ending.ATTEMPTS):
                try:
                    live = self._read(child_id)
                except (SessionNotFound, CorruptSession, InvalidSessionId):
                    break  # gone, or not this store's: nothing left running here
                child = live.session
                if child.parent_id != parent_id:
                    self._remember(child_id, live)
                    break  # not this parent's child (a re-created id)
                grandchildren = tuple(child.child_costs)
                if child.status is not None or (running_only and not ending.running(child)):
                    self._remember(child_id, live)
                    break
                try:
                    self._write_end(
                        child_id, live, SessionStatus.CANCELLED, reason, live.record.keys
                    )
                except StaleWrite:
                    continue  # its worker moved it on: read it again and end that
                self._remember(child_id, live)
                ended.append(child_id)
                break
            else:
                raise StoreError(
                    f"session {child_id!r}: {ending.ATTEMPTS} conflicting writes in a row while "
                    f"ending it with its parent {parent_id!r}; call end again to finish the "
                    "cascade",
                    session_id=child_id,
                )
            if grandchildren and depth < ending.MAX_DEPTH:
                ended += self._cascade(child_id, grandchildren, reason, depth + 1, running_only)
        return ended

    def delete(self, session_id: str) -> bool:
        """Remove the session's record; whether there was one."""
        self._forget(session_id)
        return self.store.delete(session_id)

    def __repr__(self) -> str:
        return f"<Worker {self.owner!r} on {self.store!r}>"
