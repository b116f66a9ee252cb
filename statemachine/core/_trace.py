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
    emitted ``action``. The counters are as they stood after it; ``cost_usd`` is what
    its event cost. ``at`` is the session's clock when it was taken (``None`` only for
    a step restored from a format that did not record it).

    ``caused_by`` is the event that fired it, as the host sent it (``None`` for a start
    and for a step restored from a snapshot); ``wall`` the Unix time the step was given
    (``None``: none); ``made_at``, on a start's record only, when its turn was made on
    the session's clock (``None``: not known). Replaying a record is the live call
    again: ``turn.send(record.caused_by, at=record.at, wall=record.wall)``."""

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
