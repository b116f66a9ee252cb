"""Ending a stored session on purpose: :meth:`Worker.end <._worker.Worker.end>`.

A host ends a session ``completed`` (the work is done), ``cancelled`` or ``failed``
as ``Session.end`` does in one process, with compare-and-set. The store has no live
children to reach: a parent's ``cancelled`` / ``failed`` reaches each child through
the child's record, whichever worker last advanced it, by its own compare-and-set
(retried on a conflict). The worker that held the child's turn learns of it at its
next write (``CONFLICT``, the child ended), so no child's turn goes on once its parent
is torn down. ``completed`` is refused while any descendant's turn runs: the child
would go on charging a finished parent.

Each ending writes the session's snapshot anew (no journal entry): a reader of any
version of the record format reads the ended status from its snapshot.

The functions here are :class:`~._worker.Worker`'s own methods (their first argument
is the worker, ``self``), kept apart from the advance path.
"""

from __future__ import annotations

from ..core._actions import Action
from ..core._exceptions import SessionEnded, TurnInProgress
from ..core._session import Session
from ..core._table import IDLE
from ..core._taxonomy import END_STATUSES, SessionStatus
from ._core import check_version
from ._errors import CorruptSession, InvalidSessionId, SessionNotFound, StaleWrite, StoreError
from ._record import MAX_KEYS
from ._worker import Advanced, AdvanceStatus, Worker, _Live

_ATTEMPTS = 16
"""Compare-and-set attempts per child before the cascade gives up (``StoreError``)."""
_MAX_DEPTH = 16
"""How deep an ending walks a session tree (as the spend settlement does)."""


def end_status(status: object) -> SessionStatus:
    """``status`` as one of :data:`END_STATUSES`, or ``ValueError`` naming it."""
    chosen = next((s for s in END_STATUSES if status == s), None)
    if chosen is None:
        names = ", ".join(sorted(s.value for s in END_STATUSES))
        raise ValueError(
            f"status: {status!r:.60} is not a status a host ends a session with (one of {names})"
        )
    return chosen


def _running(session: Session) -> bool:
    turn = session.current_turn
    return turn is not None and turn.state != IDLE and not turn.done


def _pending(session: Session) -> Action | None:
    turn = session.current_turn
    return None if turn is None else turn.action


def _write_end(
    self: Worker,
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
    action = _pending(session)
    record.crowded = True  # the snapshot written anew: the ending is in it, not journaled
    new = self._record(session_id, live, session, action, keys, age, wall)
    version = self._write(session_id, live.version, new, session, action)
    live.version, live.record = version, new
    return version


def _facts(session: Session) -> tuple[str | None, bool, bool, tuple[str, ...]]:
    """What an ending reads of a child: its parent's id, whether it has ended, whether
    its turn runs, and its children's ids."""
    return (
        session.parent_id,
        session.status is not None,
        _running(session),
        tuple(session.child_costs),
    )


def running_descendants(
    self: Worker, parent_id: str | None, children: tuple[str, ...], depth: int = 0
) -> list[str]:
    """The ids of the descendants in the store whose turn is running (each one's record
    naming its parent's id)."""
    found: list[str] = []
    for child_id in children:
        facts = self._peek(child_id, _facts)
        if facts is None or facts[0] != parent_id or facts[1]:
            continue
        if facts[2]:
            found.append(child_id)
        if depth < _MAX_DEPTH:
            found += running_descendants(self, child_id, facts[3], depth + 1)
    return found


def cascade(
    self: Worker,
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
        for _ in range(_ATTEMPTS):
            try:
                live = self._read(child_id)
            except (SessionNotFound, CorruptSession, InvalidSessionId):
                break  # gone, or not this store's: nothing left running here
            child = live.session
            if child.parent_id != parent_id:
                self._remember(child_id, live)
                break  # not this parent's child (a re-created id)
            grandchildren = tuple(child.child_costs)
            if child.status is not None or (running_only and not _running(child)):
                self._remember(child_id, live)
                break
            try:
                _write_end(self, child_id, live, SessionStatus.CANCELLED, reason, live.record.keys)
            except StaleWrite:
                continue  # its worker moved it on: read it again and end that
            self._remember(child_id, live)
            ended.append(child_id)
            break
        else:
            raise StoreError(
                f"session {child_id!r}: {_ATTEMPTS} conflicting writes in a row while "
                f"ending it with its parent {parent_id!r}; call end again to finish the "
                "cascade",
                session_id=child_id,
            )
        if grandchildren and depth < _MAX_DEPTH:
            ended += cascade(self, child_id, grandchildren, reason, depth + 1, running_only)
    return ended


def end(
    self: Worker,
    session_id: str,
    status: object,
    *,
    expected_version: int,
    reason: str = "",
    key: str | None = None,
) -> Advanced:
    """:meth:`Worker.end <._worker.Worker.end>`."""
    chosen = end_status(status)
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
        ended = cascade(self, session_id, children, tree_reason)
        return Advanced(
            result.status, result.session, result.version, result.action, ended=tuple(ended)
        )
    if chosen is SessionStatus.COMPLETED:
        own = _running(session)
        self._remember(session_id, live)  # put back while the children are read
        running = running_descendants(self, session_id, children)
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
        version = _write_end(self, session_id, live, chosen, reason, keys)
    except StaleWrite:
        return self._lost_race(session_id, key)
    action = _pending(session)
    if action is not None:
        action = self._on_clock_action(action, live.record.elapsed_s)
    handout = self._handout(session_id, live)
    self._remember(session_id, live)
    if chosen is SessionStatus.COMPLETED:
        # a child whose turn started after the check above: it must not charge a
        # finished parent, so it is cancelled (its worker sees a CONFLICT)
        ended = cascade(self, session_id, children, tree_reason, running_only=True)
    else:
        ended = cascade(self, session_id, children, tree_reason)
    return Advanced(AdvanceStatus.APPLIED, handout, version, action, ended=tuple(ended))
