"""Workers over a store: compare-and-set advances, claims and resume (see the package docstring).

A worker holds the sessions it last read or wrote in the journal's frame (no clock: its
times are seconds since the session started) and steps them at the age their record
gives, as :func:`~._journal.apply_step` replays them. Every write goes one way: take or
read the session, take the steps, write the record, then the compare-and-set. A result
holds a copy of the session put on the worker's clock, never the worker's own.
"""

from __future__ import annotations

import enum
import functools
import os
import socket
import time
import uuid
from collections.abc import Callable, Collection, Iterable
from typing import Any

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
from . import _spend as spend
from ._core import SessionStore, check_name, check_version
from ._errors import StaleWrite
from ._held import Held, Live
from ._journal import EVENT, START, Step, read_session, take_steps
from ._record import COMPACT_AT_START, MAX_KEYS, Record, read_record

_LIVE_SESSIONS = 1024
"""How many sessions a worker remembers its last record of, by default."""

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


_APPLIED = AdvanceStatus.APPLIED
"""Read once: an enum member read off its class costs as much as a call (every advance
gives one)."""

_make_advanced: Callable[
    [AdvanceStatus, Any, int, Action | None, tuple[ToolOutcome, ...], tuple[str, ...]], Advanced
] = build_maker(Advanced, ("status", "_session", "version", "action", "interrupted", "ended"))
"""``Advanced(status, session, version, action, interrupted, ended)``, made through its
slots (every advance makes one)."""


def _default_owner() -> str:
    return f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"key: must be a non-empty str or None, got {key!r}")


def _with_key(
    keys: tuple[tuple[int, str], ...], version: int, key: str
) -> tuple[tuple[int, str], ...]:
    """``keys`` with ``key`` made at ``version`` (the most recent :data:`MAX_KEYS`)."""
    return (*keys, (version, key))[-MAX_KEYS:]


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
        self._observers = tuple(observers)
        self._doom_check = doom_check
        self._adjusted = frozenset(
            {type(None), ToolsDone} if doom_check is None else {type(None), ToolsDone, ModelReplied}
        )
        """The types of what an advance does not send to the turn as it is (see
        :meth:`_steps`): any other event is one step, itself."""
        self._held = Held(
            store,
            owner=self.owner,
            lease_s=self.lease_s,
            clock=clock,
            now=now,
            count_idle=count_idle,
            remember=remember,
        )

    # -- what a caller gets -----------------------------------------------------------

    def _started(self, record: Record) -> float:
        """Where on this worker's clock the session of ``record`` starts, as a read of
        it from the store puts it."""
        return self._clock() - self._held.age(record, self._now())

    def _on_clock(self, own: Session, record: Record, started: float | None = None) -> Session:
        """A copy of ``own`` (the journal's frame, as ``record`` holds it) put on this
        worker's clock (or started at ``started``), as a read of it from the store gives
        it."""
        return own.copy(
            clock=self._clock,
            wall_clock=self._now,
            started=self._started(record) if started is None else started,
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
        held = self._held.live
        live = held.pop(session_id, None)
        if live is not None:
            try:
                if live.version == version and live.session is own:
                    return self._on_clock(own, live.record, started)
            finally:
                held.setdefault(session_id, live)  # unless another was remembered meanwhile
        record = read_record(session_id, payload, self._held.max_bytes)
        session = read_session(record)
        return self._on_clock(session, record, started)

    def _handout(
        self, session_id: str, live: Live, started: float | None = None
    ) -> Session | Callable[[], Session]:
        """What a result gives as its session: a copy of the worker's own, made when the
        caller first asks for it (a result never looked at costs no copy), put on this
        worker's clock then (an ``APPLIED`` result's) or starting at ``started``."""
        record = live.record
        if record.payload is None or not self._held.remember_at_most:
            return self._on_clock(live.session, record, started)
        return functools.partial(
            self._copy_at, session_id, live.version, live.session, record.payload, started
        )

    def _on_clock_action(self, action: Action | None, elapsed: float) -> Action | None:
        """``action`` of a session ``elapsed`` seconds old now, its readings (a Finish's
        ``retry_at``) put on this worker's clock."""
        if type(action) is Finish and action.retry_at is not None:
            return attrs.evolve(action, retry_at=action.retry_at + (self._clock() - elapsed))
        return action

    def _answer(self, session_id: str, status: AdvanceStatus, live: Live) -> Advanced:
        """A result that gives the stored session as it is (``live``, put back)."""
        record = live.record
        own = live.session
        action = ending.pending(own)
        started = self._started(record)
        session: Session | Callable[[], Session]
        if type(action) is Finish and action.retry_at is not None:
            # a reading: the copy's Finish holds it on this worker's clock
            session = self._on_clock(own, record, started)
            action = session.current_turn.action  # type: ignore[union-attr]
        else:  # copied when the caller first asks (many a host reads the action only)
            session = self._handout(session_id, live, started)
        if isinstance(action, InvokeTools) and record.carried:
            claimed = set(record.claim.calls) if record.claim else set()
            action = InvokeTools(tuple(c for c in action.calls if c.id in claimed))
        self._held.remember(session_id, live)
        return Advanced(status, session, live.version, action)

    def _lost_race(self, session_id: str, key: str | None) -> Advanced:
        live = self._held.read(session_id)
        status = AdvanceStatus.DUPLICATE if live.record.has_key(key) else AdvanceStatus.CONFLICT
        return self._answer(session_id, status, live)

    def _settled(
        self, session_id: str, live: Live, expected: int, key: str | None
    ) -> Advanced | None:
        """The answer the stored session ``live`` gives already to a call at ``expected``
        with ``key``: ``DUPLICATE`` (``key`` applied) or ``CONFLICT`` (another version)."""
        if live.record.has_key(key):
            return self._answer(session_id, AdvanceStatus.DUPLICATE, live)
        if live.version != expected:
            return self._answer(session_id, AdvanceStatus.CONFLICT, live)
        return None

    def load(self, session_id: str) -> Advanced:
        """The stored session, its version and pending action (``UNCHANGED``)."""
        return self._answer(session_id, AdvanceStatus.UNCHANGED, self._held.read(session_id))

    # -- advancing ------------------------------------------------------------------

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
        wall = self._now()
        # the journal's frame; version 0: no record before it (its own is a placeholder)
        live = Live(0, Record(session_id, None, wall), session.copy(started=0.0))
        keys = () if key is None else ((1, key),)
        self._held.write(session_id, live, [], wall, action, age=session.elapsed_s, keys=keys)
        self._held.remember(session_id, live)
        return Advanced(AdvanceStatus.APPLIED, session, live.version, action)

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
        if key is not None:
            _check_key(key)
        live = self._held.recall(session_id, expected, key)
        if live is not None:
            try:
                return self._advanced(session_id, live, event, expected, key)
            except (IllegalEvent, SessionEnded, TurnInProgress):
                pass  # maybe the store moved on: read it, and answer from there
        live = self._held.read(session_id)
        settled = self._settled(session_id, live, expected, key)
        if settled is not None:
            return settled
        if event is not None and live.session.current_turn is None:
            raise IllegalEvent(
                f"session {session_id!r} has no turn yet: advance it with None to start one",
                event=type(event).__name__,
                state="no turn",
            )
        return self._advanced(session_id, live, event, expected, key)

    def _advanced(
        self, session_id: str, live: Live, event: object | None, expected: int, key: str | None
    ) -> Advanced:
        """:meth:`advance` of ``live``, the session at ``expected``: its steps taken at
        its age now, the record written, the compare-and-set, the result."""
        held = self._held
        session, record = live.session, live.record
        observers = self._observers
        wall = self._now()
        age = held.age(record, wall)
        mark = _mark(session) if observers else (0, 0)
        before = session.cost_usd if live.tree else 0.0
        steps = self._steps(live, event) if type(event) in self._adjusted else ((EVENT, event),)
        action, entries = take_steps(session, steps, age, wall)
        keys = record.keys if key is None else _with_key(record.keys, expected + 1, key)
        offset = self._clock() - age if observers else 0.0
        try:
            limit = None if event is not None else COMPACT_AT_START
            held.write(session_id, live, entries, wall, action, age=age, keys=keys, limit=limit)
        except StaleWrite:
            return self._lost_race(session_id, key)
        if type(action) is Finish:
            action = self._on_clock_action(action, live.record.elapsed_s)
        handout = self._handout(session_id, live)
        result = _make_advanced(_APPLIED, handout, live.version, action, (), ())
        # read the session before it is remembered: from then on another thread may
        # take it out and step it (an advance that may never be stored)
        if observers:
            self._deliver(session, mark, offset)
        report = None
        if live.tree and session.cost_usd > before:
            report = (session.parent_id, session.session_id, session.cost_usd)
        held.remember(session_id, live)
        if report is not None:
            self._report_spend(*report)
        return result

    def _steps(self, live: Live, event: object | None) -> Iterable[Step]:
        """The steps of an advance of ``live`` with ``event``, one of ``_adjusted``:
        ``None`` starts the next turn (the children's totals and the ancestors' budget
        pulled first, when the session is in a tree); a ``ToolsDone`` is sent with the
        record's carried outcomes in it, a reply with this worker's doom-check verdict."""
        session = live.session
        if event is None:
            if not live.tree and not session.child_costs:
                return ((START,),)
            held = self._held
            pulled = spend.pulled_spend(held, session)
            return [*pulled, *spend.pulled_budget(held, session), (START,)]
        if type(event) is ToolsDone:
            if live.record.carried:
                event = ToolsDone((*live.record.carried, *event.outcomes))
        else:  # a reply, to a worker with a doom check
            turn = session.current_turn
            if turn is not None:  # else the step is refused: no turn yet
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

    def _report_spend(self, parent_id: str | None, child_id: str | None, total: float) -> None:
        """Charge a child's spend up the tree after a write that spent
        (:func:`~._spend.report`)."""
        spend.report(self._held, parent_id, child_id, total)

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
        live = self._held.read(session_id)
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
        age = self._held.age(record, wall)
        entries: list[str] = []
        action: Action | None = InvokeTools(rerun)
        if not rerun:  # nothing left to run: the outcomes are sent now
            action, entries = take_steps(session, [(EVENT, ToolsDone(carried))], age, wall)
            carried = ()
        try:
            self._held.write(session_id, live, entries, wall, action, age=age, carried=carried)
        except StaleWrite:
            return self._lost_race(session_id, None)
        action = self._on_clock_action(action, live.record.elapsed_s)
        handout = self._handout(session_id, live)
        self._held.remember(session_id, live)
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
        if key is not None:
            _check_key(key)
        if not isinstance(reason, str):
            raise TypeError(f"reason: must be a str, got {reason!r:.60}")
        held = self._held
        tree_reason = reason or f"parent {session_id!r} ended {chosen.value}"
        live = held.recall(session_id, expected, key) or held.read(session_id)
        settled = self._settled(session_id, live, expected, key)
        if settled is not None:
            return settled
        if live.session.status is not None:
            return self._ended_again(session_id, live, chosen, tree_reason)
        if chosen is SessionStatus.COMPLETED:
            live = self._completable(session_id, live, expected)
            if live.version != expected:
                return self._answer(session_id, AdvanceStatus.CONFLICT, live)
        session, children = live.session, tuple(live.session.child_costs)
        keys = live.record.keys
        if key is not None:
            keys = _with_key(keys, expected + 1, key)
        try:
            ending.write_end(held, session_id, live, chosen, reason, keys)
        except StaleWrite:
            return self._lost_race(session_id, key)
        action = self._on_clock_action(ending.pending(session), live.record.elapsed_s)
        handout = self._handout(session_id, live)
        held.remember(session_id, live)
        # completed: a child whose turn started after the check above must not charge a
        # finished parent, so it is cancelled (its worker sees a CONFLICT)
        only = chosen is SessionStatus.COMPLETED
        ended = ending.cascade(held, session_id, children, tree_reason, running_only=only)
        return Advanced(AdvanceStatus.APPLIED, handout, live.version, action, ended=tuple(ended))

    def _ended_again(
        self, session_id: str, live: Live, chosen: SessionStatus, reason: str
    ) -> Advanced:
        """:meth:`end` of a session that has ended: ``UNCHANGED`` with the same status (a
        cascade its worker may have died in finished), else ``SessionEnded``."""
        status = live.session.status
        if status is not chosen:
            self._held.remember(session_id, live)
            raise SessionEnded(
                f"session {session_id!r} has already ended ({status.value})",  # type: ignore[union-attr]
                status=status,
            )
        children = tuple(live.session.child_costs)
        result = self._answer(session_id, AdvanceStatus.UNCHANGED, live)
        if chosen is SessionStatus.COMPLETED:
            return result
        return attrs.evolve(
            result, ended=tuple(ending.cascade(self._held, session_id, children, reason))
        )

    def _completable(self, session_id: str, live: Live, expected: int) -> Live:
        """The session ``live`` held, read again once no turn of its own or of its
        descendants runs (``TurnInProgress`` otherwise): the session is put back while
        they are read."""
        own = ending.running(live.session)
        self._held.remember(session_id, live)
        running = ending.running_descendants(
            self._held, session_id, tuple(live.session.child_costs)
        )
        if running or own:
            whose = f"child session {running[0]!r}" if running else f"session {session_id!r}"
            raise TurnInProgress(
                f"{whose} is running a turn: a session completes when no turn of its own or "
                "of its children runs; end it cancelled or failed to abandon them"
            )
        return self._held.recall(session_id, expected, None) or self._held.read(session_id)

    def delete(self, session_id: str) -> bool:
        """Remove the session's record; whether there was one."""
        self._held.live.pop(session_id, None)
        return self.store.delete(session_id)

    def __repr__(self) -> str:
        return f"<Worker {self.owner!r} on {self.store!r}>"
