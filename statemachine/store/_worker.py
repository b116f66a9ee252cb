"""Workers over a store: compare-and-set advances, claims and resume (see the package docstring).

A worker holds the sessions it last read or wrote, each in the journal's frame (no
clock: its times are seconds since the session started, the age the record says it has
now), and steps them with the session's public methods at that age: the step it takes
live is the step another worker replays from the journal (``_journal.apply_step``).
Every write goes one way: take or read the session, take the steps, write the record
(``_record.written``: the entries appended in place, or the snapshot anew), then the
compare-and-set. The caller of a worker never gets the worker's own session: a result
holds a copy put on the worker's clock (``Session.copy``).
"""

from __future__ import annotations

import enum
import functools
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Collection, Iterable
from typing import Any, TypeVar

import attrs

from ..core._actions import Action, Finish, InvokeTools
from ..core._builder import build_maker
from ..core._events import ModelReplied, ToolsDone
from ..core._exceptions import ConfigError, IllegalEvent, SessionEnded, TurnInProgress
from ..core._session import Session
from ..core._taxonomy import SessionStatus, ToolErrorCategory
from ..core._tool_calls import ToolCall, ToolOutcome
from ..core._trace import TraceRecord
from . import _ending as ending
from ._core import DEFAULT_MAX_BYTES, SessionStore, Stored, check_name, check_version
from ._errors import (
    CorruptSession,
    InvalidSessionId,
    RecordTooLarge,
    SessionNotFound,
    StaleWrite,
    StoreError,
    StoreUnavailable,
)
from ._journal import (
    BUDGET,
    CHILD_SPEND,
    EVENT,
    START,
    Step,
    check_record,
    read_session,
    replay_record,
    take_step,
)
from ._memory import InMemoryStore
from ._record import (
    COMPACT_AT_START,
    COMPACT_EVERY,
    MAX_KEYS,
    Claim,
    Record,
    extend,
    parse_record,
    read_record,
    written,
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
_LIVE_SESSIONS = 1024
"""How many sessions a worker remembers its last record of, by default."""
_MAX_DEPTH = 16
"""How deep a turn start settles the spend of ended sessions down a session tree."""
_ATTEMPTS = 16
"""Compare-and-set attempts of a spend report or settlement before it gives up."""

INTERRUPTED = "interrupted: worker died"
"""The content of the error outcome of a tool call whose worker died in flight."""


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
    _session: Session | Callable[[], Session] = attrs.field(alias="session", repr=False)
    """The session, or (a worker's result) how to copy it when first asked for."""
    version: int
    action: Action | None
    interrupted: tuple[ToolOutcome, ...] = ()
    ended: tuple[str, ...] = ()

    @property
    def session(self) -> Session:
        """The session as stored at ``version`` (the caller's own: changing it changes
        neither the store nor the worker)."""
        held = self._session
        if not isinstance(held, Session):
            held = held()
            object.__setattr__(self, "_session", held)  # made once, then kept
        return held

    @property
    def applied(self) -> bool:
        """Whether this call wrote the next version."""
        return self.status is AdvanceStatus.APPLIED


_make_advanced: Callable[
    [AdvanceStatus, Any, int, Action | None, tuple[ToolOutcome, ...], tuple[str, ...]], Advanced
] = build_maker(Advanced, ("status", "_session", "version", "action", "interrupted", "ended"))
"""``Advanced(status, session, version, action, interrupted, ended)``, made through its
slots (every advance makes one)."""


class _Live:
    """A session this worker holds: the ``record`` it last read or wrote, at ``version``,
    and the ``session`` that record holds (no clock, the journal's frame). Whoever takes
    one out of the worker's memory owns it until it puts it back (nothing else reads or
    steps it meanwhile)."""

    __slots__ = ("record", "session", "tree", "version")

    def __init__(self, version: int, record: Record, session: Session) -> None:
        self.version = version
        self.record = record
        self.session = session
        self.tree = session.parent_id is not None
        """Whether the session is a child: its spend is reported up the tree."""


def _default_owner() -> str:
    return f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def _spend_facts(session: Session) -> tuple[str | None, float, bool, bool]:
    """What a parent pulls of a child: its parent's id, its total spend, whether it has
    ended and whether it has children of its own."""
    return (
        session.parent_id,
        session.cost_usd,
        session.status is not None,
        bool(session.child_costs),
    )


def _charged(child_id: str, total: float) -> Callable[[Session], list[Step] | None]:
    """The steps that charge ``child_id``'s ``total`` to a parent: none once it holds
    them; ``None`` when the child is not the parent's (re-created under its id)."""

    def steps(parent: Session) -> list[Step] | None:
        known = parent.child_costs
        if child_id not in known:
            return None
        return [] if total <= known[child_id] else [(CHILD_SPEND, child_id, total)]

    return steps


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
    worker of a store should be given one, or none). The worker that takes a reply's
    step asks it where a verdict is due and sends the verdict in the reply
    (``ModelReplied.doom_verdict``), which the journal keeps with the event: a replay
    asks no check.
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
        if isinstance(remember, bool) or not isinstance(remember, int) or remember < 0:
            raise ConfigError(f"remember: must be an int >= 0, got {remember!r}")
        if doom_check is not None and not callable(doom_check):
            raise ConfigError(f"doom_check: must be a callable or None, got {doom_check!r:.60}")
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
        self._remember_at_most = remember
        self._doom_check = doom_check
        self._max_bytes: int = getattr(store, "max_bytes", DEFAULT_MAX_BYTES)
        self._max_prefix = self._max_bytes // 2
        """A record whose prefix would grow past this is written as a snapshot anew."""
        # Our own stores take and give the record as bytes: the worker appends to them,
        # and knows them again when it reads them back. Any other store (a subclass of
        # ours included) gets and gives the record as JSON data, its snapshot anew.
        self._payload_cas: Callable[..., int] | None = None
        self._payload_load: Callable[[str], tuple[int, bytes]] | None = None
        if type(store) in (InMemoryStore, RedisStore):
            self._payload_cas = store.compare_and_set_payload  # type: ignore[attr-defined]
            self._payload_load = store.load_payload  # type: ignore[attr-defined]
        self._live: dict[str, _Live] = {}
        """The last record this worker read or wrote per session, with the session it
        holds: the next advance at that version skips reading and restoring it (the
        compare-and-set still proves the store holds that version and incarnation).
        Threads share it with no lock: a session is taken out by one ``pop`` (one thread
        gets it) and put back by one assignment."""

    # -- the sessions a worker holds -----------------------------------------------

    def _age(self, record: Record, wall: float) -> float:
        """The session's age at Unix time ``wall``, as ``record`` gives it (at most the
        largest float, whatever the record's wall time)."""
        age = record.elapsed_s
        if self._count_idle and wall > record.saved_at:
            age = min(age + (wall - record.saved_at), _LARGEST)
        return age

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
            record = read_record(session_id, payload, self._max_bytes)
        legacy_start = 0.0
        if record.version < 3:  # its snapshot's retry_at may be a reading of a clock
            legacy_start = self._clock() - self._age(record, self._now())
        return _Live(version, record, read_session(record, legacy_start))

    def _known(self, session_id: str, version: int, payload: bytes) -> _Live | None:
        """The session in ``payload`` if it is the record this worker holds, or that
        record grown by journal entries (those entries replayed on the held session,
        and checked); ``None`` otherwise (it is then read in full)."""
        live = self._live.pop(session_id, None)
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
                replay_record(live.session, grown, grown.journal, record.entries)
            check_record(grown, live.session)
        except CorruptSession:
            return None  # read in full, which says what is wrong
        return _Live(version, grown, live.session)

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

    def _copy_at(
        self, session_id: str, version: int, own: Session, payload: bytes, started: float | None
    ) -> Session:
        """The session at ``version``, whose bytes are ``payload``: a copy of the worker's
        own session (``own``) if that is still at ``version``, else the bytes read again
        (see :meth:`_handout`)."""
        # taken out while it is copied, as an advance takes it: another thread's advance
        # of the session meanwhile reads the store instead of stepping this one
        live = self._live.pop(session_id, None)
        if live is not None:
            try:
                if live.version == version and live.session is own:
                    record = live.record
                    return self._on_clock(own, record.elapsed_s, record.saved_at, started)
            finally:
                self._live.setdefault(session_id, live)  # unless another was remembered
        record = read_record(session_id, payload, self._max_bytes)
        session = read_session(record)
        return self._on_clock(session, record.elapsed_s, record.saved_at, started)

    def _handout(
        self, session_id: str, live: _Live, started: float | None = None
    ) -> Session | Callable[[], Session]:
        """What a result gives as its session: a copy of the worker's own, made when the
        caller first asks for it (a result never looked at costs no copy), put on this
        worker's clock then (an ``APPLIED`` result's) or starting at ``started``."""
        record = live.record
        if record.payload is None or not self._remember_at_most:
            return self._on_clock(live.session, record.elapsed_s, record.saved_at, started)
        return functools.partial(
            self._copy_at, session_id, live.version, live.session, record.payload, started
        )

    def _on_clock_action(self, action: Action | None, elapsed: float) -> Action | None:
        """``action`` of a session ``elapsed`` seconds old now, its readings (a Finish's
        ``retry_at``) put on this worker's clock."""
        if type(action) is Finish and action.retry_at is not None:
            return attrs.evolve(action, retry_at=action.retry_at + (self._clock() - elapsed))
        return action

    def _answer(self, session_id: str, status: AdvanceStatus, live: _Live) -> Advanced:
        """A result that gives the stored session as it is (``live``, put back)."""
        record = live.record
        own = live.session
        turn = own.current_turn
        action = None if turn is None else turn.action
        started = self._started(record.elapsed_s, record.saved_at)
        session: Session | Callable[[], Session]
        if type(action) is Finish and action.retry_at is not None:
            # a reading: the copy's Finish holds it on this worker's clock
            session = self._on_clock(own, record.elapsed_s, record.saved_at, started)
            action = session.current_turn.action  # type: ignore[union-attr]
        else:  # copied when the caller first asks (many a host reads the action only)
            session = self._handout(session_id, live, started)
        if isinstance(action, InvokeTools) and record.carried:
            claimed = set(record.claim.calls) if record.claim else set()
            action = InvokeTools(tuple(c for c in action.calls if c.id in claimed))
        self._remember(session_id, live)
        return Advanced(status, session, live.version, action)

    def _lost_race(self, session_id: str, key: str | None) -> Advanced:
        live = self._read(session_id)
        mine = key is not None and any(k == key for _, k in live.record.keys)
        status = AdvanceStatus.DUPLICATE if mine else AdvanceStatus.CONFLICT
        return self._answer(session_id, status, live)

    def load(self, session_id: str) -> Advanced:
        """The stored session, its version and pending action (``UNCHANGED``)."""
        return self._answer(session_id, AdvanceStatus.UNCHANGED, self._read(session_id))

    # -- writing ------------------------------------------------------------------

    def _write(
        self,
        session_id: str,
        expected: int,
        previous: Record | None,
        session: Session,
        entries: list[str],
        *,
        wall: float,
        age: float,
        keys: tuple[tuple[int, str], ...],
        action: Action | None,
        claim: Claim | None = None,
        carried: tuple[ToolOutcome, ...] = (),
        limit: int = COMPACT_EVERY,
    ) -> tuple[int, Record]:
        """Write ``session`` (the journal's frame), ``age`` seconds old at Unix time
        ``wall`` after the steps of ``entries``, over the version ``expected`` of the
        record ``previous`` (``None``: a new session): the record
        (:func:`~._record.written`, its journal holding at most ``limit`` entries) and
        the compare-and-set; the version and record written. A pending ``action`` that
        invokes tools is claimed by this worker. ``StaleWrite`` if the store moved on
        (then ``previous`` is no more the caller's to use)."""
        if claim is None and type(action) is InvokeTools and action.calls:
            claim = Claim(self.owner, tuple(c.id for c in action.calls), wall + self.lease_s)
        cas = self._payload_cas
        record = written(
            previous,
            session_id,
            session,
            entries,
            wall=wall,
            age=age,
            keys=keys,
            claim=claim,
            carried=carried,
            limit=limit if cas is not None else -1,  # a store of JSON data: a snapshot
            max_prefix=self._max_prefix,
        )
        # a session ends with a turn's Finish (or between turns: no action then)
        ended = (action is None or type(action) is Finish) and session.status is not None
        if cas is not None:
            version = cas(
                session_id, expected, record.payload, incarnation=record.incarnation, ended=ended
            )
        else:
            data = json.loads(record.payload)  # type: ignore[arg-type]
            version = self.store.compare_and_set(session_id, expected, data, ended=ended)
        return version, record

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
        own = session.copy(started=0.0)  # the journal's frame
        version, record = self._write(
            session_id,
            0,
            None,
            own,
            [],
            wall=self._now(),
            age=session.elapsed_s,
            keys=() if key is None else ((1, key),),
            action=action,
        )
        self._remember(session_id, _Live(version, record, own))
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
        live = self._recall(session_id, expected, key)
        if live is not None:
            try:
                return self._advanced(session_id, live, event, expected, key)
            except (IllegalEvent, SessionEnded, TurnInProgress):
                pass  # maybe the store moved on: read it, and answer from there
        live = self._read(session_id)
        if key is not None and any(k == key for _, k in live.record.keys):
            return self._answer(session_id, AdvanceStatus.DUPLICATE, live)
        if live.version != expected:
            return self._answer(session_id, AdvanceStatus.CONFLICT, live)
        return self._advanced(session_id, live, event, expected, key)

    def _advanced(
        self, session_id: str, live: _Live, event: object | None, expected: int, key: str | None
    ) -> Advanced:
        """:meth:`advance` of ``live``, the session at ``expected``: its steps taken at
        its age now, the record written, the compare-and-set, the result."""
        session, record = live.session, live.record
        observers = self._observers
        wall = self._now()
        age = self._age(record, wall)
        mark = _mark(session) if observers else (0, 0)
        before = session.cost_usd if live.tree else 0.0
        entries = []
        for step in self._steps(live, event):
            action, entry = take_step(session, step, age, wall)
            entries.append(entry)
        keys = record.keys
        if key is not None:
            keys = (*keys, (expected + 1, key))[-MAX_KEYS:]
        offset = self._clock() - age if observers else 0.0
        try:
            live.version, live.record = self._write(
                session_id,
                expected,
                record,
                session,
                entries,
                wall=wall,
                age=age,
                keys=keys,
                action=action,
                limit=COMPACT_EVERY if event is not None else COMPACT_AT_START,
            )
        except StaleWrite:
            return self._lost_race(session_id, key)
        if type(action) is Finish:
            action = self._on_clock_action(action, live.record.elapsed_s)
        handout = self._handout(session_id, live)
        result = _make_advanced(AdvanceStatus.APPLIED, handout, live.version, action, (), ())
        # read the session before it is remembered: from then on another thread may
        # take it out and step it (an advance that may never be stored)
        if observers:
            self._deliver(session, mark, offset)
        report = None
        if live.tree and session.cost_usd > before:
            report = (session.parent_id, session.session_id, session.cost_usd)
        self._remember(session_id, live)
        if report is not None:
            self._report_spend(*report)
        return result

    def _steps(self, live: _Live, event: object | None) -> Iterable[Step]:
        """The steps of an advance of ``live`` with ``event``: ``None`` starts the next
        turn (the children's totals and the ancestors' budget pulled first); an event
        is sent to the turn, with the record's carried outcomes (a ``ToolsDone``) and
        this worker's doom-check verdict (a reply) in it."""
        session = live.session
        if event is None:
            return [*self._pulled_spend(session), *self._pulled_budget(session), (START,)]
        turn = session.current_turn
        if turn is None:
            raise IllegalEvent(
                f"session {live.record.session_id!r} has no turn yet: advance it with None "
                "to start one",
                event=type(event).__name__,
                state="no turn",
            )
        kind = type(event)
        if kind is ToolsDone and live.record.carried:
            event = ToolsDone((*live.record.carried, *event.outcomes))  # type: ignore[attr-defined]
        elif kind is ModelReplied and self._doom_check is not None:
            event = turn.judged(event, self._doom_check)  # type: ignore[arg-type]
        return ((EVENT, event),)

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

    def _charge(
        self, session_id: str, steps_of: Callable[[Session], list[Step] | None]
    ) -> tuple[str | None, str | None, float] | None:
        """Take ``steps_of(session)`` on the stored session ``session_id`` and write it,
        its claim and carried outcomes kept (retried on a conflict); what a spend report
        reads of it then: its parent's id, its own and its total spend. ``None`` when it
        cannot be read or written, or ``steps_of`` gives ``None`` (not to be charged)."""
        for _ in range(_ATTEMPTS):
            try:
                live = self._read(session_id)
            except (SessionNotFound, CorruptSession, InvalidSessionId):
                return None
            session, record = live.session, live.record
            steps = steps_of(session)
            if steps is None:
                self._remember(session_id, live)
                return None
            if steps:
                wall = self._now()
                try:
                    live.version, live.record = self._write(
                        session_id,
                        live.version,
                        record,
                        session,
                        [take_step(session, step, 0.0, wall)[1] for step in steps],
                        wall=wall,
                        age=self._age(record, wall),
                        keys=record.keys,
                        action=None,  # no new action: the claim and carried outcomes stay
                        claim=record.claim,
                        carried=record.carried,
                    )
                except StaleWrite:
                    continue
            # read before it is remembered: another thread may step it from then on
            facts = (session.parent_id, session.session_id, session.cost_usd)
            self._remember(session_id, live)
            return facts
        return None

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
                pulled = functools.partial(self._pulled_spend, depth=depth + 1, path=path)
                settled = self._charge(child_id, pulled)
                total = (settled[2] if settled is not None else 0.0) or total
            if total > known[child_id]:
                steps.append((CHILD_SPEND, child_id, total))
        return steps

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

    def _report_spend(self, parent_id: str | None, child_id: str | None, total: float) -> None:
        """Charge child ``child_id``'s ``total`` to the records of its parent
        ``parent_id`` and up the tree (compare-and-set, retried on a conflict; a total is
        a max-merge, so a repeat is harmless). A parent that is not in this store (or
        gone) is skipped: its next turn start pulls the total."""
        while parent_id is not None and child_id is not None:
            up = self._charge(parent_id, _charged(child_id, total))
            if up is None:
                return
            parent_id, child_id, total = up

    # -- claims and endings ---------------------------------------------------------

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
        entries: list[str] = []
        action: Action | None = InvokeTools(rerun)
        if not rerun:  # nothing left to run: the outcomes are sent now
            action, entry = take_step(session, (EVENT, ToolsDone(carried)), age, wall)
            entries.append(entry)
            carried = ()
        try:
            live.version, live.record = self._write(
                session_id,
                live.version,
                record,
                session,
                entries,
                wall=wall,
                age=age,
                keys=record.keys,
                action=action,
                carried=carried,
            )
        except StaleWrite:
            return self._lost_race(session_id, None)
        action = self._on_clock_action(action, live.record.elapsed_s)
        handout = self._handout(session_id, live)
        self._remember(session_id, live)
        return Advanced(AdvanceStatus.APPLIED, handout, live.version, action, interrupted)

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
            if session.status is not chosen:
                self._remember(session_id, live)
                raise SessionEnded(
                    f"session {session_id!r} has already ended ({session.status.value})",
                    status=session.status,
                )
            # a repeat of an ending: finish a cascade its worker may have died in
            result = self._answer(session_id, AdvanceStatus.UNCHANGED, live)
            if chosen is SessionStatus.COMPLETED:
                return result
            return attrs.evolve(
                result, ended=tuple(self._cascade(session_id, children, tree_reason))
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
            self._write_end(session_id, live, chosen, reason, keys)
        except StaleWrite:
            return self._lost_race(session_id, key)
        action = self._on_clock_action(ending.pending(session), live.record.elapsed_s)
        handout = self._handout(session_id, live)
        self._remember(session_id, live)
        # completed: a child whose turn started after the check above must not charge a
        # finished parent, so it is cancelled (its worker sees a CONFLICT)
        running_only = chosen is SessionStatus.COMPLETED
        ended = self._cascade(session_id, children, tree_reason, running_only=running_only)
        return Advanced(AdvanceStatus.APPLIED, handout, live.version, action, ended=tuple(ended))

    def _write_end(
        self,
        session_id: str,
        live: _Live,
        status: SessionStatus,
        reason: str,
        keys: tuple[tuple[int, str], ...],
    ) -> None:
        """End ``live``'s session with ``status`` and write it, its snapshot anew (the
        ending is in it, not journaled), over the version it was read at (``StaleWrite``
        if that moved on; the session is then the caller's to drop)."""
        session, record = live.session, live.record
        wall = self._now()
        age = self._age(record, wall)
        session.end(status, reason=reason, at=age)
        live.version, live.record = self._write(
            session_id,
            live.version,
            record,
            session,
            [],
            wall=wall,
            age=age,
            keys=keys,
            action=ending.pending(session),
            limit=-1,
        )

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
        self._live.pop(session_id, None)
        return self.store.delete(session_id)

    def __repr__(self) -> str:
        return f"<Worker {self.owner!r} on {self.store!r}>"
