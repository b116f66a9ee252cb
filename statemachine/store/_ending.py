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

This module holds what an ending reads of a session, and its bounds; the writes are
the worker's (``Worker.end`` and the cascade beside it).
"""

from __future__ import annotations

from ..core._actions import Action
from ..core._session import Session
from ..core._table import IDLE
from ..core._taxonomy import END_STATUSES, SessionStatus

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


def facts(session: Session) -> tuple[str | None, bool, bool, tuple[str, ...]]:
    """What an ending reads of a child: its parent's id, whether it has ended, whether
    its turn runs, and its children's ids."""
    return (
        session.parent_id,
        session.status is not None,
        running(session),
        tuple(session.child_costs),
    )
