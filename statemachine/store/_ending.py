"""Ending a stored session on purpose: the writes of :meth:`Worker.end <._worker.Worker.end>`
and what they read of a session (``Worker.end`` checks the call and answers it).

The store has no live children to reach: a parent's ``cancelled`` / ``failed`` reaches
each child through the child's record, by its own compare-and-set (retried on a
conflict); the worker that held the child's turn learns of it at its next write
(``CONFLICT``). Each ending writes the session's snapshot anew (no journal entry), so a
reader of any version of the record format reads the ended status.
"""

from __future__ import annotations

from ..core._actions import Action
from ..core._session import Session
from ..core._table import IDLE
from ..core._taxonomy import END_STATUSES, SessionStatus
from ._errors import UNREADABLE, StaleWrite, StoreError
from ._held import Held, Live

ATTEMPTS = 16
"""Compare-and-set attempts per child before the cascade gives up (``StoreError``)."""
MAX_DEPTH = 16
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


def running(session: Session) -> bool:
    turn = session.current_turn
    return turn is not None and turn.state != IDLE and not turn.done


def pending(session: Session) -> Action | None:
    turn = session.current_turn
    return None if turn is None else turn.action


def _facts(session: Session) -> tuple[str | None, bool, bool, tuple[str, ...]]:
    """What an ending reads of a child: its parent's id, whether it has ended, whether
    its turn runs, and its children's ids."""
    return (
        session.parent_id,
        session.status is not None,
        running(session),
        tuple(session.child_costs),
    )


def write_end(
    held: Held,
    session_id: str,
    live: Live,
    status: SessionStatus,
    reason: str,
    keys: tuple[tuple[int, str], ...],
) -> None:
    """End ``live``'s session with ``status`` and write it, its snapshot anew, over the
    version it was read at (``StaleWrite`` if that moved on; ``live`` is then the
    caller's to drop)."""
    session, record = live.session, live.record
    wall = held.now()
    age = held.age(record, wall)
    session.end(status, reason=reason, at=age)
    held.write(session_id, live, [], wall, pending(session), age=age, keys=keys, limit=-1)


def running_descendants(
    held: Held, parent_id: str | None, children: tuple[str, ...], depth: int = 0
) -> list[str]:
    """The ids of the descendants in the store whose turn is running (each one's record
    naming its parent's id)."""
    found: list[str] = []
    for child_id in children:
        facts = held.peek(child_id, _facts)
        if facts is None or facts[0] != parent_id or facts[1]:
            continue
        if facts[2]:
            found.append(child_id)
        if depth < MAX_DEPTH:
            found += running_descendants(held, child_id, facts[3], depth + 1)
    return found


def cascade(
    held: Held,
    parent_id: str | None,
    children: tuple[str, ...],
    reason: str,
    depth: int = 0,
    running_only: bool = False,
) -> list[str]:
    """End ``cancelled`` each live child (of ``children``) of session ``parent_id`` in the
    store, and theirs, down the tree (``running_only``: only those whose turn runs).
    Returns the ids ended."""
    ended: list[str] = []
    for child_id in children:
        grandchildren: tuple[str, ...] = ()
        for _ in range(ATTEMPTS):
            try:
                live = held.read(child_id)
            except UNREADABLE:
                break  # gone, or not this store's: nothing left running here
            child = live.session
            if child.parent_id != parent_id:
                held.remember(child_id, live)
                break  # not this parent's child (a re-created id)
            grandchildren = tuple(child.child_costs)
            if child.status is not None or (running_only and not running(child)):
                held.remember(child_id, live)
                break
            try:
                write_end(held, child_id, live, SessionStatus.CANCELLED, reason, live.record.keys)
            except StaleWrite:
                continue  # its worker moved it on: read it again and end that
            held.remember(child_id, live)
            ended.append(child_id)
            break
        else:
            raise StoreError(
                f"session {child_id!r}: {ATTEMPTS} conflicting writes in a row while ending "
                f"it with its parent {parent_id!r}; call end again to finish the cascade",
                session_id=child_id,
            )
        if grandchildren and depth < MAX_DEPTH:
            ended += cascade(held, child_id, grandchildren, reason, depth + 1, running_only)
    return ended
