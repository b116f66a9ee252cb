"""Spend across a session tree kept in a store: each session in its own record.

A child's spend reaches its ancestors' records through their journals (a child-spend
step, a max-merge: a repeat or a late report counts nothing twice): a worker reports a
child's new total after every write that spent (:func:`report`), and a parent pulls its
children's totals when its next turn starts (:func:`pulled_spend`), so a report a worker
never made (it died after writing the child) is not lost. A child reads its ancestors'
remaining budget from its parent's record at its turn start (:func:`pulled_budget`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..core._exceptions import SessionEnded
from ..core._session import Session
from ..core._taxonomy import SessionStatus
from ._errors import UNREADABLE, StaleWrite
from ._held import Held
from ._journal import BUDGET, CHILD_SPEND, Step, take_steps

MAX_DEPTH = 16
"""How deep a turn start settles the spend of ended sessions down a session tree."""
ATTEMPTS = 16
"""Compare-and-set attempts of a report or a settlement before it gives up."""

Facts = tuple[str | None, str | None, float]
"""What a report reads of a session it charged: its parent's id, its own, its total."""


def report(held: Held, parent_id: str | None, child_id: str | None, total: float) -> None:
    """Charge child ``child_id``'s ``total`` to the records of its parent ``parent_id``
    and up the tree (compare-and-set, retried on a conflict). A parent that is not in
    this store (or gone) is skipped: its next turn start pulls the total."""
    while parent_id is not None and child_id is not None:
        up = charge(held, parent_id, _charged(child_id, total))
        if up is None:
            return
        parent_id, child_id, total = up


def _charged(child_id: str, total: float) -> Callable[[Session], list[Step] | None]:
    """The steps that charge ``child_id``'s ``total`` to a parent: none once it holds
    them; ``None`` when the child is not the parent's (re-created under its id)."""

    def steps(parent: Session) -> list[Step] | None:
        known = parent.child_costs
        if child_id not in known:
            return None
        return [] if total <= known[child_id] else [(CHILD_SPEND, child_id, total)]

    return steps


def charge(
    held: Held, session_id: str, steps_of: Callable[[Session], list[Step] | None]
) -> Facts | None:
    """Take ``steps_of(session)`` on the stored session ``session_id`` and write it, its
    claim and carried outcomes kept (retried on a conflict); what a report reads of it
    then. ``None`` when it cannot be read or written, or ``steps_of`` gives ``None``
    (not to be charged)."""
    for _ in range(ATTEMPTS):
        try:
            live = held.read(session_id)
        except UNREADABLE:
            return None
        session, record = live.session, live.record
        steps = steps_of(session)
        if steps is None:
            held.remember(session_id, live)
            return None
        if steps:
            wall = held.now()
            try:
                entries = take_steps(session, steps, 0.0, wall)[1]
                # no new action: the claim and carried outcomes stay
                held.write(
                    session_id,
                    live,
                    entries,
                    wall,
                    None,
                    claim=record.claim,
                    carried=record.carried,
                )
            except StaleWrite:
                continue
        # read before it is remembered: another thread may step it from then on
        facts = (session.parent_id, session.session_id, session.cost_usd)
        held.remember(session_id, live)
        return facts
    return None


def _child_facts(session: Session) -> tuple[str | None, float, bool, bool]:
    """What a parent pulls of a child: its parent's id, its total spend, whether it has
    ended and whether it has children of its own."""
    return (
        session.parent_id,
        session.cost_usd,
        session.status is not None,
        bool(session.child_costs),
    )


def pulled_spend(
    held: Held, session: Session, depth: int = 0, path: frozenset[str | None] = frozenset()
) -> list[Step]:
    """Before a parent's turn starts, each child's total from its record. A child that
    has ended starts no turn to pull its own children's totals: they are settled into
    its record first, down the tree (``path``: the sessions above, so forged records
    naming each other as children end the walk)."""
    steps: list[Step] = []
    known = session.child_costs
    if not known:
        return steps
    path = path | {session.session_id}
    for child_id in known:
        if child_id in path:
            continue
        facts = held.peek(child_id, _child_facts)
        if facts is None:
            continue
        parent_id, total, ended, parent = facts
        if parent_id != session.session_id:
            continue  # not this parent's child (a forged or re-created id)
        if ended and parent and depth < MAX_DEPTH:
            pulled = functools.partial(pulled_spend, held, depth=depth + 1, path=path)
            settled = charge(held, child_id, pulled)
            total = (0.0 if settled is None else settled[2]) or total
        if total > known[child_id]:
            steps.append((CHILD_SPEND, child_id, total))
    return steps


def pulled_budget(held: Held, session: Session) -> list[Step]:
    """Before a child's turn starts, its parent's remaining budget from the parent's
    record (siblings' spend included), as a live parent would give it. A parent ended
    ``cancelled`` or ``failed`` starts no child's turn (``SessionEnded``: its ending's
    cascade did not reach this child yet)."""
    parent_id = session.parent_id
    if parent_id is None:
        return []
    child_id = session.session_id
    budget = held.peek(
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
