"""Workers over a store: compare-and-set advances, claims and resume (see the package docstring)."""

from __future__ import annotations

import enum
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from ..core._actions import Action, Finish, InvokeTools
from ..core._events import ToolsDone
from ..core._exceptions import (
    ConfigError,
    IllegalEvent,
    SessionEnded,
    TurnInProgress,
)
from ..core._session import Session
from ..core._settings import Settings
from ..core._snapshot import write_snapshot_text
from ..core._state import (
    SessionState,
    TextCache,
    copy_session_state,
)
from ..core._taxonomy import ToolErrorCategory
from ..core._tool_calls import ToolCall, ToolOutcome
from ..core._trace import TraceRecord
from ._core import (
    DEFAULT_MAX_BYTES,
    BytesStore,
    CorruptSession,
    InvalidSessionId,
    RecordTooLarge,
    SessionNotFound,
    StaleWrite,
    Stored,
    StoreError,
    StoreUnavailable,
    check_max_bytes,
    check_name,
    check_payload,
    check_ttl,
    check_version,
    decode_record,
    key_prefix,
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
    Recorder,
    Step,
    base_state,
    entry_text,
    replay_record,
    run_step,
)
from ._record import (
    MAX_KEYS,
    Claim,
    Record,
    extend,
    head_bytes,
    middle_text,
    parse_record,
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

_LIVE_SESSIONS = 1024
"""How many sessions a worker remembers its last record of, by default."""

Observer = Callable[[TraceRecord], None]


class _Relay:
    """An observer that holds the records of a transition until it is stored, then
    passes them (and every later one) on to the worker's observers."""

    __slots__ = ("held", "observers")

    def __init__(self, observers: tuple[Observer, ...]) -> None:
        self.observers = observers
        self.held: list[TraceRecord] | None = []

    def __call__(self, record: TraceRecord) -> None:
        if self.held is not None:
            self.held.append(record)
            return
        for observer in self.observers:
            observer(record)

    def hold(self) -> None:
        self.held = []

    def deliver(self) -> None:
        held, self.held = self.held, None
        for record in held or ():
            for observer in self.observers:
                observer(record)


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
        return self._prefix + check_name(session_id)

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
        *,
        incarnation: str | None,
        ended: bool = False,
    ) -> int:
        """:meth:`compare_and_set` of a record already encoded as JSON bytes (what a
        :class:`Worker` writes: it builds the bytes from what changed since its last
        write). ``incarnation`` is the one the record names."""
        key = self.key(session_id)
        expected = check_version(session_id, expected_version)
        check_payload(session_id, payload, self.max_bytes)
        with self._lock:
            entry = self._get(key)
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


class _Handout:
    """The session of an ``APPLIED`` result, copied from the worker's own when first
    asked for: while the worker has not moved the session on, a copy of its state;
    after, the bytes that write stored, decoded again."""

    __slots__ = ("_session", "own", "payload", "session_id", "version", "worker")

    def __init__(
        self, worker: Worker, session_id: str, version: int, own: Session, payload: bytes
    ) -> None:
        self.worker, self.session_id, self.version = worker, session_id, version
        self.own, self.payload = own, payload
        self._session: Session | None = None

    def get(self) -> Session:
        if self._session is None:
            self._session = self.worker._hand_out(self)  # noqa: SLF001 - its own worker
            self.own = None  # type: ignore[assignment] # not kept alive by a result
        return self._session


@attrs.frozen
class Advanced:
    """The result of a :class:`Worker` call: the session as stored after it.

    ``version`` is what to pass as ``expected_version`` next. ``action`` is what
    the host owes an event for: the action the event produced (``APPLIED``) or the
    stored turn's pending one; a :class:`~statemachine.Finish` (or ``None``
    before the first turn) means the next call starts a turn. ``interrupted``
    holds the outcomes a ``resume`` synthesized for calls lost with a worker.
    """

    status: AdvanceStatus
    _session: Session | _Handout = attrs.field(alias="session", repr=False)
    version: int
    action: Action | None
    interrupted: tuple[ToolOutcome, ...] = ()

    @property
    def session(self) -> Session:
        """The session as stored at ``version`` (the caller's own: changing it changes
        neither the store nor the worker)."""
        held = self._session
        return held if isinstance(held, Session) else held.get()

    @property
    def applied(self) -> bool:
        """Whether this call wrote the next version."""
        return self.status is AdvanceStatus.APPLIED


def _mark(state: SessionState) -> tuple[object, int]:
    """Where a replay starts: the current turn and how many actions it holds."""
    turn = state.turn
    return turn, 0 if turn is None else len(turn.actions)


def _reframe(state: SessionState, mark: tuple[object, int]) -> None:
    """Put the ``retry_at`` of the Finish actions a replay made (on the journal's frame,
    the session started at 0) on the worker's clock, as ``state.started`` now is."""
    turn = state.turn
    if turn is None:
        return
    actions = turn.actions
    for i in range(mark[1] if turn is mark[0] else 0, len(actions)):
        action = actions[i]
        if type(action) is Finish and action.retry_at is not None:
            actions[i] = attrs.evolve(action, retry_at=action.retry_at + state.started)


def _recorder(session: Session) -> Recorder:
    """The clocks that keep ``session``'s readings for the journal, put in place the
    first time (a session a worker steps is its own from then on: never handed out)."""
    core = session._core  # noqa: SLF001 - the store is the engine's own host
    recorder = getattr(core.clock, "__self__", None)
    if type(recorder) is not Recorder or recorder.state is not core.state:
        recorder = Recorder(core.clock, core.wall_clock, core.state, core.doom_check)
        core.clock, core.wall_clock = recorder.clock, recorder.wall
        if core.doom_check is not None:
            core.doom_check = recorder.doom
    return recorder


def _default_owner() -> str:
    return f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


class Worker:
    """Advance sessions kept in ``store``, one event per call, with compare-and-set.

    ``owner`` names this worker in tool-call claims (unique per process; default
    host.pid.random). ``lease_s`` is how long its claim on handed-out tool calls
    holds before another worker may :meth:`resume` them. ``idempotent`` lists the
    tools (by name, or a predicate on the :class:`~statemachine.ToolCall`) that
    may be re-run after a worker died. ``clock`` is the sessions' monotonic clock;
    ``now`` is wall-clock Unix time, shared by all workers, for leases and idle
    time: with ``count_idle`` the time a session spent in the store between two
    workers counts toward its wall-clock bound, as it would in one process.
    ``doom_check`` is the sessions' second-tier doom-loop check (a host function, not
    data: every worker of a store should be given one, or none). It is asked by the
    worker that takes a step; its verdicts go into the journal, and a replay reads them
    from there instead of asking again.
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
        self._fast = self._payload_cas is not None and not self._observers
        """Whether an advance with no key may take :meth:`_advance_known`."""
        self._live: dict[str, tuple[int, Record, Session]] = {}
        """The last record this worker read or wrote per session, with its decoded
        state: the next advance at that version skips reading and restoring it (the
        compare-and-set still proves the store holds that version and incarnation)."""
        self._live_lock = threading.Lock()

    # -- reading ------------------------------------------------------------------

    def _read(
        self, session_id: str, observers: tuple[Observer, ...] | None = None
    ) -> tuple[int, Record, Session]:
        """The stored version, record and session. Finding in the store the very bytes
        this worker last wrote or read for the session, it skips decoding and checking
        them again: it knows the state they hold; finding them grown by journal entries
        (another worker's advances), it decodes and replays only those."""
        if observers is None:
            observers = self._observers
        if self._payload_load is None:
            stored = self.store.load(session_id)
            version, record = stored.version, parse_record(session_id, stored.record)
        else:
            version, payload = self._payload_load(session_id)
            known = self._known(session_id, version, payload, observers)
            if known is not None:
                record, session = known
                return version, record, session
            data = decode_record(session_id, payload, self.store.max_bytes)  # type: ignore[attr-defined]
            record = parse_record(session_id, data, payload)
        session = self._restored(record, observers)
        record.crowded = len(record.journal) > REPLAY_AT_MOST
        self._remember(session_id, version, record, session)
        return version, record, session

    def _restored(self, record: Record, observers: tuple[Observer, ...]) -> Session:
        """The session in ``record`` read in full: its snapshot restored, its journal
        replayed, on this worker's clock now."""
        settings, state = self._base(record)
        mark = _mark(state)
        if record.journal:
            self._replay_on(self._over(settings, state, ()), record, record.journal, 0)
        session = self._session_of(record, settings, state, observers)
        _reframe(state, mark)
        return session

    def _base(self, record: Record) -> tuple[Settings, SessionState]:
        """The record's snapshot in the journal's frame (see ``base_state``)."""
        return base_state(record)

    def _replay_on(
        self, session: Session, record: Record, entries: tuple[object, ...], first: int
    ) -> None:
        """Apply journal ``entries`` to ``session`` (its state in the journal's frame);
        it runs on this worker's clocks again after."""
        core = session._core  # noqa: SLF001 - the store is the engine's own host
        try:
            replay_record(session, record, entries, first)
        finally:
            core.clock, core.wall_clock = self._clock, self._now
            core.doom_check = self._doom_check

    def _known(
        self, session_id: str, version: int, payload: bytes, observers: tuple[Observer, ...]
    ) -> tuple[Record, Session] | None:
        """The session in ``payload`` if it is the record this worker remembers (a copy
        of the remembered state, which stays remembered, now at ``version``), or that
        record grown by journal entries (those entries replayed on the remembered state,
        and a copy of it)."""
        with self._live_lock:  # copied under the lock: an advance may take the entry
            live = self._live.get(session_id)
            if live is None:
                return None
            _, record, own = live
            if record.payload == payload:
                del self._live[session_id]  # remembered again as the most recent, at ``version``
                self._live[session_id] = (version, record, own)
                state = copy_session_state(own._core.state)  # noqa: SLF001
                return record, self._session_of(record, own.settings, state, observers)
            del self._live[session_id]  # taken out: grown, it is remembered again below
        grown = extend(record, payload)
        if grown is None:
            return None
        state = own._core.state  # noqa: SLF001 - the worker's own session
        # the remembered state in the journal's frame: the session started at 0
        state.started = 0.0
        if record.finished_s is not None:
            state.finished_at = record.elapsed_s - record.finished_s
        mark = _mark(state)
        if grown.journal:
            self._replay_on(own, grown, grown.journal, record.entries)
            grown.crowded = len(grown.journal) > REPLAY_AT_MOST
        self._rebase(grown, state)
        _reframe(state, mark)
        self._remember(session_id, version, grown, own, own=True)
        copy = copy_session_state(state)
        return grown, self._over(own.settings, copy, observers)

    def _idle(self, record: Record) -> float:
        return max(0.0, self._now() - record.saved_at) if self._count_idle else 0.0

    def _remember(
        self, session_id: str, version: int, record: Record, session: Session, *, own: bool = False
    ) -> None:
        """Remember ``session`` as ``record`` at ``version`` holds it: the session itself
        if it is the worker's ``own`` (never handed out), else a copy (the session
        itself is the caller's to use as they like)."""
        if not self._remember_at_most:
            return
        if not own:
            state = copy_session_state(session._core.state)  # noqa: SLF001 - the engine's own host
            session = self._over(session.settings, state, ())
        with self._live_lock:
            live = self._live
            live.pop(session_id, None)
            live[session_id] = (version, record, session)
            while len(live) > self._remember_at_most:
                del live[next(iter(live))]

    def _forget(self, session_id: str) -> None:
        with self._live_lock:
            self._live.pop(session_id, None)

    def _recall(
        self, session_id: str, version: int, key: str | None, observers: tuple[Observer, ...]
    ) -> tuple[Record, Session] | None:
        """The session as :meth:`_read` would restore it at ``version``, from the last
        record this worker saw, if that is the version (and ``key`` is not among its
        keys: a duplicate is answered from the store). The entry is taken out (the
        worker's own session, which the caller never sees): what it becomes is
        remembered again once written."""
        with self._live_lock:
            live = self._live.get(session_id)
            if live is None or live[0] != version:
                return None
            _, record, session = live
            if key is not None and any(k == key for _, k in record.keys):
                return None
            del self._live[session_id]
        core = session._core  # noqa: SLF001 - the store is the engine's own host
        self._rebase(record, core.state)
        core.observers = observers
        return record, session

    def _rebase(self, record: Record, state: SessionState) -> None:
        """Put ``state``'s start (and last finish) on this worker's clock, as a read of
        ``record`` from the store has them now (idle time included)."""
        idle = self._idle(record)
        now = self._clock()
        state.started = now - (record.elapsed_s + idle)
        if record.finished_s is not None:
            state.finished_at = now - (record.finished_s + idle)

    def _over(
        self, settings: Settings, state: SessionState, observers: tuple[Observer, ...]
    ) -> Session:
        return Session.from_state(
            settings,
            state,
            self._clock,
            wall_clock=self._now,
            observers=observers,
            check=False,
            doom_check=self._doom_check,
        )

    def _session_of(
        self,
        record: Record,
        settings: Settings,
        state: SessionState,
        observers: tuple[Observer, ...],
    ) -> Session:
        """The session in ``state`` (this worker's own copy of what ``record`` holds), as
        a read of ``record`` from the store gives it now."""
        self._rebase(record, state)
        return self._over(settings, state, observers)

    def _handed_out(
        self, session_id: str, version: int, payload: bytes | None, own: Session
    ) -> Any:
        """What an ``APPLIED`` result gives as its session: a copy of the worker's ``own``,
        taken when the caller first asks for it (see :class:`_Handout`). ``payload`` is
        the bytes that write stored (read before the record was remembered: the next
        advance grows a remembered record in place)."""
        if payload is None or not self._remember_at_most:
            return self._over(own.settings, copy_session_state(own._core.state), self._observers)  # noqa: SLF001
        return _Handout(self, session_id, version, own, payload)

    def _hand_out(self, handout: _Handout) -> Session:
        """The session of ``handout``: a copy of the worker's own session if that is
        still as the write left it, else the written bytes decoded again."""
        own = handout.own  # read once: another thread's get() may let it go meanwhile
        with self._live_lock:
            live = self._live.get(handout.session_id)
            if (
                own is not None
                and live is not None
                and live[0] == handout.version
                and live[2] is own
            ):
                state = copy_session_state(own._core.state)  # noqa: SLF001 - its own session
                return self._over(own.settings, state, self._observers)
        session_id, payload = handout.session_id, handout.payload
        data = decode_record(session_id, payload, self.store.max_bytes)  # type: ignore[attr-defined]
        return self._restored(parse_record(session_id, data, payload), self._observers)

    def _result(
        self, status: AdvanceStatus, version: int, record: Record, session: Session
    ) -> Advanced:
        turn = session.current_turn
        action = None if turn is None else turn.action
        if isinstance(action, InvokeTools) and record.carried:
            claimed = set(record.claim.calls) if record.claim else set()
            action = InvokeTools(tuple(c for c in action.calls if c.id in claimed))
        return Advanced(status, session, version, action)

    def load(self, session_id: str) -> Advanced:
        """The stored session, its version and pending action (``UNCHANGED``)."""
        version, record, session = self._read(session_id)
        return self._result(AdvanceStatus.UNCHANGED, version, record, session)

    # -- writing ------------------------------------------------------------------

    def _record(
        self,
        session_id: str,
        session: Session,
        action: Action | None,
        keys: tuple[tuple[int, str], ...],
        *,
        claim: Claim | None = None,
        carried: tuple[ToolOutcome, ...] = (),
        previous: Record | None = None,
        entries: tuple[str, ...] = (),
        compact: bool = False,
    ) -> Record:
        """The record to write for ``session``; ``previous`` is the record it was read
        from (its incarnation is kept) and ``entries`` the journal entries of the steps
        applied since. To a store of bytes the entries are appended to the previous
        record's bytes; every :data:`COMPACT_EVERY` entries (at a turn's start, with
        ``compact``, after :data:`COMPACT_AT_START`: its snapshot is small then), and for a new
        record or a store that takes JSON data, the snapshot is written anew instead."""
        if claim is None and isinstance(action, InvokeTools) and action.calls:
            claim = Claim(self.owner, tuple(c.id for c in action.calls), self._now() + self.lease_s)
        core = session._core  # noqa: SLF001 - the store is the engine's own host
        state = core.state
        now = core.clock()  # the worker's, but a created session's may be its own
        elapsed = now - state.started
        finished = None if state.finished_at is None else now - state.finished_at
        incarnation = uuid.uuid4().hex if previous is None else previous.incarnation
        if self._payload_cas is None:  # a store that takes JSON data: the snapshot as data
            snapshot = session.snapshot()
            return Record(
                session_id,
                snapshot,
                self._now(),
                keys,
                claim,
                carried,
                incarnation,
                elapsed_s=snapshot["elapsed_s"],
                finished_s=snapshot["finished_at"],
            )
        saved_at = self._now()
        middle = middle_text(keys, claim, carried)
        tail = tail_text(saved_at, middle, elapsed, finished).encode()
        count = 0 if previous is None else previous.entries
        end = None if previous is None else previous.prefix_end
        known = None if previous is None else previous.payload
        added = ",".join(entries).encode()
        if (
            previous is None
            or end is None
            or known is None
            or count + len(entries) > COMPACT_EVERY
            or (compact and count >= COMPACT_AT_START)
            or previous.crowded
            or end + len(added) > self._compact_at
        ):  # the snapshot written anew, the journal empty
            cache: TextCache | None = TextCache()
            old = TextCache() if previous is None or previous.cache is None else previous.cache
            text = write_snapshot_text(session.settings, state, now, old, cache)  # type: ignore[arg-type]
            base: str | None = text
            prefix: bytes | memoryview = head_bytes(session_id, incarnation, text)
            count, added = 0, b""
        else:  # the entries appended to the previous record's bytes
            base, cache = previous.base_text, previous.cache
            prefix = memoryview(known)[:end]
            count += len(entries)
            if added and previous.entries:
                added = b"," + added
        return Record(
            session_id,
            None,
            saved_at,
            keys,
            claim,
            carried,
            incarnation,
            elapsed_s=elapsed,
            finished_s=finished,
            entries=count,
            prefix_end=len(prefix) + len(added),
            base_text=base,
            cache=cache,
            payload=b"".join((prefix, added, tail)),
            middle=middle,
        )

    def _write(self, session_id: str, expected: int, record: Record, session: Session) -> int:
        ended = session.status is not None
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
        record = self._record(session_id, session, action, keys)
        version = self._write(session_id, 0, record, session)
        self._remember(session_id, version, record, session)
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
        if key is None and self._fast and type(expected_version) is int and expected_version >= 0:
            fast = self._advance_known(session_id, event, expected_version)
            if fast is not None:
                return fast
        expected = check_version(session_id, expected_version)
        if key is not None and (not isinstance(key, str) or not key):
            raise ValueError(f"key: must be a non-empty str or None, got {key!r}")
        # observers see a transition once it is stored: records wait in the relay
        relay = _Relay(self._observers) if self._observers else None
        observers = () if relay is None else (relay,)
        applied = None
        recalled = self._recall(session_id, expected, key, observers)
        if recalled is not None:
            record, session = recalled
            before = session.cost_usd if session.parent_id is not None else 0.0
            try:
                applied = self._apply(session_id, session, record, event)
            except (IllegalEvent, SessionEnded, TurnInProgress):
                applied = None  # maybe the store moved on: read it, and answer from there
        if applied is None:
            version, record, session = self._read(session_id, observers)
            if relay is not None:
                relay.deliver()  # nothing applied yet: the session passes records on
            if key is not None and any(k == key for _, k in record.keys):
                return self._result(AdvanceStatus.DUPLICATE, version, record, session)
            if version != expected:
                return self._result(AdvanceStatus.CONFLICT, version, record, session)
            if relay is not None:
                relay.hold()
            before = session.cost_usd if session.parent_id is not None else 0.0
            applied = self._apply(session_id, session, record, event)
        action, entries = applied
        spent = session.cost_usd > before if session.parent_id is not None else False
        keys = record.keys
        if key is not None:
            keys = (*keys, (expected + 1, key))[-MAX_KEYS:]
        new = self._record(session_id, session, action, keys, previous=record, entries=entries)
        try:
            version = self._write(session_id, expected, new, session)
        except StaleWrite:
            self._forget(session_id)
            return self._lost_race(session_id, key)
        payload = new.payload  # before the record is remembered: the next advance grows it
        self._remember(session_id, version, new, session, own=True)
        if relay is not None:
            relay.deliver()
        if spent:
            self._report_spend(session)
        handout = self._handed_out(session_id, version, payload, session)
        return Advanced(AdvanceStatus.APPLIED, handout, version, action)

    def _advance_known(
        self, session_id: str, event: object | None, expected: int
    ) -> Advanced | None:
        """:meth:`advance` of a session this worker holds at ``expected``, on a store of
        bytes, with no key, observer, parent, children or carried outcomes in play: the
        same steps as the general path (recall, rebase, one step, its journal entry
        appended, compare-and-set, remember), written out because every advance takes
        it. ``None`` when it does not apply, or the engine refused the event (the
        general path reads the store and answers from there)."""
        with self._live_lock:
            live = self._live.get(session_id)
            if live is None or live[0] != expected:
                return None
            _, record, session = live
            core = session._core  # noqa: SLF001 - the store is the engine's own host
            state = core.state
            turn = session._handle  # noqa: SLF001
            if (
                state.parent_id is not None
                or record.carried
                or (turn is None if event is not None else bool(state.child_costs))
            ):
                return None
            del self._live[session_id]
        idle = self._now() - record.saved_at if self._count_idle else 0.0
        idle = max(idle, 0.0)
        now = self._clock()
        state.started = now - (record.elapsed_s + idle)
        if record.finished_s is not None:
            state.finished_at = now - (record.finished_s + idle)
        if core.observers:
            core.observers = ()
        recorder = getattr(core.clock, "__self__", None)
        if type(recorder) is not Recorder or recorder.state is not state:
            recorder = _recorder(session)
        recorder.times, recorder.walls, recorder.verdicts = [], [], []
        try:
            if event is None:
                step: Step = (START,)
                if turn is not None and turn.state == "idle":
                    action = turn.start()
                else:
                    action = session.new_turn().start()
            else:
                step = (EVENT, event)
                action = turn.send(event)  # type: ignore[union-attr]
        except (IllegalEvent, SessionEnded, TurnInProgress):
            return None
        entry = entry_text(step, recorder.times, recorder.walls, recorder.verdicts)
        new = self._appended(record, entry, state, action, start=event is None)
        if new is None:
            new = self._record(
                session_id,
                session,
                action,
                record.keys,
                previous=record,
                entries=(entry,),
                compact=event is None,
            )
        try:
            version = self._payload_cas(  # type: ignore[misc]
                session_id,
                expected,
                new.payload,
                incarnation=new.incarnation,
                ended=state.status is not None,
            )
        except StaleWrite:
            return self._lost_race(session_id, None)
        payload = new.payload  # before the record is remembered: the next advance grows it
        if self._remember_at_most:
            with self._live_lock:  # as _remember(own=True): the entry was taken out above
                remembered = self._live
                remembered[session_id] = (version, new, session)
                if len(remembered) > self._remember_at_most:
                    del remembered[next(iter(remembered))]
        return Advanced(
            AdvanceStatus.APPLIED,
            _Handout(self, session_id, version, session, payload)  # type: ignore[arg-type]
            if self._remember_at_most
            else self._handed_out(session_id, version, payload, session),
            version,
            action,
        )

    def _appended(
        self, record: Record, entry: str, state: SessionState, action: Action, *, start: bool
    ) -> Record | None:
        """``record`` made the next version's: ``entry`` appended to its bytes, its tail
        written anew (nothing else holds a record the fast path recalled). ``None``
        when the next write must do more: write the snapshot anew (see :meth:`_record`),
        or change the claim."""
        end, count, payload = record.prefix_end, record.entries, record.payload
        if (
            end is None
            or payload is None
            or record.crowded
            or record.claim is not None
            or type(action) is InvokeTools
            or count >= (COMPACT_AT_START if start else COMPACT_EVERY)
            or end + len(entry) > self._compact_at
        ):
            return None
        added = entry.encode()
        if count:
            added = b"," + added
        now = self._clock()
        record.saved_at = saved_at = self._now()
        record.elapsed_s = elapsed = now - state.started
        finished = None if state.finished_at is None else now - state.finished_at
        record.finished_s = finished
        middle = record.middle
        if middle is None:
            middle = record.middle = middle_text(record.keys, None, ())
        tail = tail_text(saved_at, middle, elapsed, finished).encode()
        record.payload = b"".join((memoryview(payload)[:end], added, tail))
        record.prefix_end = end + len(added)
        record.entries = count + 1
        return record

    def _steps(self, session: Session, steps: Iterable[Step], entries: list[str]) -> Any:
        """Apply ``steps`` to ``session``, adding their journal entries to ``entries``
        (none are kept for a store that takes JSON data); what the last produced."""
        if self._payload_cas is None:
            result = None
            for step in steps:
                result = run_step(session, step)
            return result
        recorder = _recorder(session)
        recorder.take()  # readings made since the last step (a write's) belong to no step
        result = None
        for step in steps:
            result = run_step(session, step)
            entries.append(entry_text(step, *recorder.take()))
        return result

    # -- spend across the session tree ----------------------------------------------

    def _pulled_spend(self, session: Session) -> list[Step]:
        """Before a parent's turn starts, each child's total from its record, so a
        report a worker never made (it died after writing the child) is not lost."""
        steps: list[Step] = []
        known = session.child_costs
        for child_id in known:
            try:
                _, _, child = self._read(child_id, ())
            except (SessionNotFound, CorruptSession, InvalidSessionId):
                continue
            total = child.cost_usd
            if child.parent_id == session.session_id and total > known[child_id]:
                steps.append((CHILD_SPEND, child_id, total))
        return steps

    def _pulled_budget(self, session: Session) -> list[Step]:
        """Before a child's turn starts, its parent's remaining budget from the
        parent's record (siblings' spend included), as a live parent would give it."""
        parent_id = session.parent_id
        if parent_id is None:
            return []
        try:
            _, _, parent = self._read(parent_id, ())
        except (SessionNotFound, CorruptSession, InvalidSessionId):
            return []
        if session.session_id not in parent.child_costs:
            return []  # not this parent's child (a forged or re-created id): keep what it has
        return [(BUDGET, parent.remaining_budget_usd)]

    def _report_spend(self, child: Session, attempts: int = 16) -> None:
        """Charge ``child``'s total to its ancestors' records (compare-and-set, retried
        on a conflict; a total is a max-merge, so a repeat is harmless). A parent that
        is not in this store (or gone) is skipped: its next turn start pulls the total."""
        while child.parent_id is not None:
            parent_id, child_id, total = child.parent_id, child.session_id, child.cost_usd
            parent: Session | None = None
            for _ in range(attempts):
                try:
                    parent_version, record, parent = self._read(parent_id)
                except (SessionNotFound, CorruptSession, InvalidSessionId):
                    return
                if child_id not in parent.child_costs:
                    return  # not this parent's child (re-created under its id): nothing to charge
                before = parent.cost_usd
                entries: list[str] = []
                self._steps(parent, [(CHILD_SPEND, child_id or "", total)], entries)
                if parent.cost_usd == before:
                    break  # already counted
                new = self._record(
                    parent_id,
                    parent,
                    None,  # no new action: the parent's claim and carried outcomes stay
                    record.keys,
                    claim=record.claim,
                    carried=record.carried,
                    previous=record,
                    entries=tuple(entries),
                )
                try:
                    version = self._write(parent_id, parent_version, new, parent)
                except StaleWrite:
                    self._forget(parent_id)
                    continue
                self._remember(parent_id, version, new, parent, own=True)
                break
            else:
                return
            if parent is None:
                return
            child = parent

    def _lost_race(self, session_id: str, key: str | None) -> Advanced:
        version, record, session = self._read(session_id)
        mine = key is not None and any(k == key for _, k in record.keys)
        status = AdvanceStatus.DUPLICATE if mine else AdvanceStatus.CONFLICT
        return self._result(status, version, record, session)

    def _apply(
        self, session_id: str, session: Session, record: Record, event: object | None
    ) -> tuple[Action, tuple[str, ...]]:
        """Apply ``event`` (``None``: start the next turn) to ``session``: the action it
        produced and the journal entries of its steps."""
        entries: list[str] = []
        if event is None:
            steps = [*self._pulled_spend(session), *self._pulled_budget(session), (START,)]
            return self._steps(session, steps, entries), tuple(entries)
        if session.current_turn is None:
            raise IllegalEvent(
                f"session {session_id!r} has no turn yet: advance it with None to start one",
                event=type(event).__name__,
                state="no turn",
            )
        if isinstance(event, ToolsDone) and record.carried:
            event = ToolsDone((*record.carried, *event.outcomes))
        return self._steps(session, [(EVENT, event)], entries), tuple(entries)

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
        version, record, session = self._read(session_id)
        turn = session.current_turn
        claim = record.claim
        pending = None if turn is None else turn.action
        if (
            turn is None
            or turn.state != "invoking_tools"
            or claim is None
            or not isinstance(pending, InvokeTools)
        ):
            return self._result(AdvanceStatus.UNCHANGED, version, record, session)
        if not force and claim.owner != self.owner and self._now() < claim.until:
            return self._result(AdvanceStatus.BUSY, version, record, session)
        by_id = {call.id: call for call in pending.calls}
        missing = [i for i in claim.calls if i not in by_id]
        if missing:
            raise CorruptSession(
                f"session {session_id!r}: the stored claim names calls {missing} "
                "that the turn did not hand out",
                session_id=session_id,
            )
        claimed = [by_id[i] for i in claim.calls]
        rerun = tuple(call for call in claimed if self._idempotent(call))
        interrupted = tuple(
            ToolOutcome(call.id, False, INTERRUPTED, ToolErrorCategory.CANCELLED)
            for call in claimed
            if not self._idempotent(call)
        )
        carried = (*record.carried, *interrupted)
        action: Action
        if rerun:
            action = InvokeTools(rerun)
            new_claim = Claim(self.owner, tuple(c.id for c in rerun), self._now() + self.lease_s)
            new = self._record(
                session_id,
                session,
                action,
                record.keys,
                claim=new_claim,
                carried=carried,
                previous=record,
            )
        else:
            entries: list[str] = []
            action = self._steps(session, [(EVENT, ToolsDone(carried))], entries)
            new = self._record(
                session_id, session, action, record.keys, previous=record, entries=tuple(entries)
            )
        try:
            version = self._write(session_id, version, new, session)
        except StaleWrite:
            self._forget(session_id)
            return self._lost_race(session_id, None)
        payload = new.payload  # before the record is remembered: the next advance grows it
        self._remember(session_id, version, new, session, own=True)
        handout = self._handed_out(session_id, version, payload, session)
        return Advanced(AdvanceStatus.APPLIED, handout, version, action, interrupted)

    def delete(self, session_id: str) -> bool:
        """Remove the session's record; whether there was one."""
        self._forget(session_id)
        return self.store.delete(session_id)

    def __repr__(self) -> str:
        return f"<Worker {self.owner!r} on {self.store!r}>"
