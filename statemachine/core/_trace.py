"""The trace: one frozen record per transition a turn takes."""

from __future__ import annotations

import attrs

from ._actions import Action
from ._events import Event
from ._usage import Usage


@attrs.frozen
class TraceRecord:
    """One transition: in ``turn`` (1-based), ``step`` (0-based) took ``source`` to
    ``dest`` on ``event`` through the table row whose guards are ``guard``, and
    emitted ``action``. The counters are as they stood after the transition:
    ``attempt`` of the current call, ``session_retries`` used so far, and the
    ``reductions`` of this turn's context; ``cost_usd`` is what this transition's
    event cost (a ``ModelReplied`` or a billed ``ModelFailed``; 0 for the others).
    ``at`` is the session's clock when the transition was taken (the injected clock, so
    a simulated or replayed turn has true durations); ``None`` only for a step restored
    from a snapshot of a format that did not record it.

    ``caused_by`` is the event that fired the transition, as the host sent it (``None``
    for ``start``, and for a step restored from a snapshot, which keeps the counters
    and the action but not the event): a failure's error (category, HTTP status,
    retry-after), a reply's tool calls and cost. ``wall`` is the Unix time the step was
    given (a failure's HTTP-date ``retry-after`` is measured against it); ``None``: the
    step had none. ``made_at``, on a start's record only, is when its turn was made
    (``new_turn``, which checks the session's bounds then), on the session's clock; a
    turn may be made before it starts. ``None``: not known (a turn restored from a
    snapshot, which keeps the turn itself; a trace written before it was recorded).

    Replaying a record is the live call again: ``turn.send(record.caused_by,
    at=record.at, wall=record.wall)``, and for a start ``session.new_turn(at=made)``
    (``made``: ``made_at``, or ``at`` where it is ``None``) then ``turn.start(at=record.at)``."""

    turn: int
    step: int
    source: str
    event: str
    guard: str
    dest: str
    action: Action
    attempt: int
    session_retries: int
    reductions: int
    cost_usd: float = 0.0
    at: float | None = None
    caused_by: Event | None = None
    wall: float | None = None
    usage: Usage | None = None
    made_at: float | None = None
