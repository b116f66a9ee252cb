"""A record's journal: the steps applied to a session since its snapshot was written.

A worker does not write the whole snapshot on every advance. It writes what it did:
one *entry* per step, appended to the record's journal, and a fresh snapshot (with an
empty journal) only now and then (:func:`compact_due`). Another worker gets the state
by restoring the snapshot and replaying the entries through the engine, which is
deterministic: the same state, the same steps and the same clock readings give the
same state again. Every replayed step goes through the engine's own checks, so a
forged journal can only take a session along paths the engine allows.

An entry is ``[op, times, walls, *args]``:

* ``["s", times, walls]``: start the next turn (``Worker.advance(id, None)``);
* ``["e", times, walls, event]``: send ``event`` (encoded as in a snapshot) to the turn;
  ``["e", times, walls, event, verdicts]`` when the host's doom-loop check was asked
  (its answers, in order: a replay reads them instead of asking again);
* ``["c", times, walls, child_id, total]``: ``record_child_spend(child_id, total)``;
* ``["b", times, walls, budget]``: the ancestors' remaining budget, read at a turn start.

``times`` are the session clock's readings the step made, in seconds since the session
started; ``walls`` the wall clock's (Unix time). Replay hands them back in order, and a
step that reads more or fewer of them than it recorded is refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from json.encoder import encode_basestring
from typing import Any

import attrs

from ..core._codec import compact, decode
from ..core._events import EVENT_TYPES, ModelFailed
from ..core._exceptions import (
    ConfigError,
    IllegalEvent,
    SessionEnded,
    SnapshotError,
    TurnInProgress,
)
from ..core._json_data import short_repr
from ..core._model_error import ModelError
from ..core._session import Session
from ..core._settings import Settings
from ..core._snapshot import read_snapshot, write_snapshot
from ..core._state import SessionState, json_text
from ._core import CorruptSession
from ._record import RECORD_VERSION, Record, parse_record

START, EVENT, CHILD_SPEND, BUDGET = "s", "e", "c", "b"

Step = tuple[Any, ...]
"""``(START,)``, ``(EVENT, event)``, ``(CHILD_SPEND, child_id, total)`` or ``(BUDGET, budget)``."""

COMPACT_EVERY = 32
"""A record's journal holds at most this many entries: the write after that writes the
snapshot anew (so a worker that knows nothing of the session replays at most this many)."""
REPLAY_AT_MOST = 4
"""A worker that reads more new entries than this from other workers at once writes the
snapshot anew with its next write: the session is shared by many."""
COMPACT_AT_START = 24
"""A turn's start writes the snapshot anew once the journal holds this many entries: the
snapshot is at its smallest then (the last turn's trace is gone)."""


class Recorder:
    """The clocks a session a worker steps runs on: each reading is
    passed through and kept (the monotonic ones as seconds since the session started)
    until :meth:`take` takes them."""

    __slots__ = ("_clock", "_doom", "_wall", "state", "times", "verdicts", "walls")

    def __init__(
        self,
        clock: Callable[[], float],
        wall: Callable[[], float],
        state: SessionState,
        doom: Callable[[Any], bool] | None = None,
    ) -> None:
        self._clock = clock
        self._wall = wall
        self._doom = doom
        self.state = state
        self.times: list[float] = []
        self.walls: list[float] = []
        self.verdicts: list[bool] = []

    def doom(self, window: Any) -> bool:
        """The host's second-tier doom-loop check, its verdict kept: a replay reads the
        verdict from the journal instead of asking again."""
        verdict = self._doom(window)  # type: ignore[misc]
        if type(verdict) is bool:
            self.verdicts.append(verdict)
        return verdict

    def clock(self) -> float:
        reading = self._clock()
        self.times.append(reading - self.state.started)
        return reading

    def wall(self) -> float:
        reading = self._wall()
        self.walls.append(reading)
        return reading

    def take(self) -> tuple[list[float], list[float], list[bool]]:
        """The readings and verdicts since the last take, and fresh lists for the next."""
        taken = self.times, self.walls, self.verdicts
        self.times, self.walls, self.verdicts = [], [], []
        return taken


def run_step(session: Session, step: Step) -> Any:
    """Apply ``step`` to ``session``; the action it produced (``None`` for spend and
    budget steps)."""
    op = step[0]
    if op == START:
        turn = session.current_turn
        if turn is not None and turn.state == "idle":
            return turn.start()
        return session.new_turn().start()
    if op == EVENT:
        turn = session.current_turn
        if turn is None:
            raise IllegalEvent(
                "the session has no turn yet: start one first",
                event=type(step[1]).__name__,
                state="no turn",
            )
        return turn.send(step[1])
    if op == CHILD_SPEND:
        session.record_child_spend(step[1], step[2])
        return None
    if op == BUDGET:
        state = session._core.state  # noqa: SLF001 - the store is the engine's own host
        if state.parent_id is None:
            raise ValueError("an ancestors' budget for a session with no parent")
        state.ancestor_budget_usd = step[1]
        state.ancestor_mark_usd = state.cost_usd
        return None
    raise ValueError(f"unknown step {op!r}")  # pragma: no cover - steps are built here


def entry_text(
    step: Step, times: list[float], walls: list[float], verdicts: list[bool] | None = None
) -> str:
    """The journal entry of ``step`` and the clock readings it made, as JSON text (the
    event encoded as a snapshot encodes values, without the fields at their default)."""
    op = step[0]
    if op != EVENT:
        return json_text([op, times, walls, *step[1:]])
    event = step[1]
    if verdicts:  # the doom check's verdicts follow the event
        return json_text([op, times, walls, compact(event), verdicts])
    kind = type(event)
    text = _FIELDLESS.get(kind)
    if text is None and kind is ModelFailed and type(event.error) is ModelError:
        text = _model_failed_text(event)
    if text is not None:  # the most frequent events, written by hand
        return f'["e",{_readings_text(times)},{_readings_text(walls)},{text}]'
    return json_text([op, times, walls, compact(event)])


def _model_failed_text(event: ModelFailed) -> str:
    """``json_text(compact(event))`` written field by field: the event of every retry."""
    error = event.error
    parts = [_FAILED_HEAD, encode_basestring(error.category.value)]
    if error.message:
        parts += [',"message":', encode_basestring(error.message)]
    if error.retry_after_seconds is not None:
        parts += [',"retry_after_seconds":', json_text(compact(error.retry_after_seconds))]
    if error.headers is not None:
        parts += [',"headers":', json_text(dict(error.headers))]
    if error.code is not None:
        parts += [',"code":', encode_basestring(error.code)]
    if error.status is not None:
        parts += [',"status":', json_text(compact(error.status))]
    if error.body is not None:
        parts += [',"body":', json_text(error.body)]
    parts.append("}")
    if event.partial:
        parts.append(',"partial":true')
    cost = event.cost
    if not (type(cost) is float and cost == 0.0):
        parts += [',"cost":', json_text(cost)]
    parts.append("}")
    return "".join(parts)


_FAILED_HEAD = '{"$type":"ModelFailed","error":{"$type":"ModelError","category":'


_FIELDLESS = {cls: json_text(compact(cls())) for cls in EVENT_TYPES if not attrs.fields(cls)}
"""The journal text of each event class with no fields."""


def _readings_text(readings: list[float]) -> str:
    if not readings:
        return "[]"
    if len(readings) == 1:
        reading = readings[0]
        if type(reading) is float and math.isfinite(reading):
            return f"[{float.__repr__(reading)}]"
    return json_text(readings)


class _Replay:
    """Clocks that give back recorded readings, in order."""

    __slots__ = ("times", "verdicts", "walls")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.walls: list[float] = []
        self.verdicts: list[bool] = []

    def doom(self, _window: Any) -> bool:
        if not self.verdicts:
            raise _Short("doom check")
        return self.verdicts.pop()

    def clock(self) -> float:
        if not self.times:
            raise _Short("session clock")
        return self.times.pop()

    def wall(self) -> float:
        if not self.walls:
            raise _Short("wall clock")
        return self.walls.pop()


class _Short(Exception):
    """A replayed step read a clock more often than the step recorded."""


def _number(value: object) -> bool:
    return type(value) in (int, float)


def _as_float(value: float) -> float:
    """``value`` as a float; an int too large for one is infinite (then refused)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _readings(raw: object, name: str) -> list[float]:
    """Clock readings as floats, or ``ValueError`` naming ``name``."""
    if type(raw) is not list:
        raise ValueError(f"{name}: must be a list of numbers")
    readings = []
    for reading in raw:
        if not _number(reading):
            raise ValueError(f"{name}: must be a list of numbers")
        value = _as_float(reading)
        if not math.isfinite(value):
            raise ValueError(f"{name}: {short_repr(reading)} is not a finite number")
        readings.append(value)
    return readings


def _amount(value: float, what: str, *, signed: bool = False) -> float:
    """A spend (a finite number >= 0) or a budget (``signed``: any finite number, as
    siblings may overspend it) read from an entry, or ``ValueError``."""
    amount = _as_float(value)
    if not math.isfinite(amount) or (amount < 0 and not signed):
        kind = "a finite amount" if signed else "a finite amount >= 0"
        raise ValueError(f"{what}: {short_repr(value)} is not {kind}")
    return amount


def _step_of(raw: object) -> tuple[Step, list[float], list[float]]:
    """An entry read from a record: its step and readings, or ``ValueError``."""
    if type(raw) is not list or len(raw) < 3:
        raise ValueError("must be a list [op, times, walls, ...]")
    op, raw_times, raw_walls, *args = raw
    times, walls = _readings(raw_times, "times"), _readings(raw_walls, "walls")
    if any(t < 0 for t in times):
        raise ValueError("times: a session clock reading before the session started")
    if op == START and not args:
        return (START,), times, walls
    if op == EVENT and len(args) in (1, 2):
        event = decode(args[0], "event")
        if type(event) not in EVENT_TYPES:
            raise ValueError(f"event: must be an encoded event, got {type(event).__name__}")
        verdicts = args[1] if len(args) == 2 else []
        if type(verdicts) is not list or not all(type(v) is bool for v in verdicts):
            raise ValueError("verdicts: must be a list of true/false")
        return (EVENT, event, verdicts), times, walls
    if op == CHILD_SPEND and len(args) == 2 and type(args[0]) is str and _number(args[1]):
        return (CHILD_SPEND, args[0], _amount(args[1], "child spend")), times, walls
    if op == BUDGET and len(args) == 1 and (args[0] is None or _number(args[0])):
        budget = None if args[0] is None else _amount(args[0], "budget", signed=True)
        return (BUDGET, budget), times, walls
    raise ValueError(f"unknown step {str(op)[:20]!r} or wrong arguments")


def replay(session: Session, entries: list[Any], first: int = 0) -> None:
    """Apply the journal's ``entries`` to ``session`` (which runs on no clock of its
    own: the entries' readings are its clocks). ``ValueError`` naming the entry
    (``first`` is the index of ``entries[0]`` in the journal) if one is not a step the
    engine takes from there."""
    core = session._core  # noqa: SLF001 - the store is the engine's own host
    clocks = _Replay()
    core.clock, core.wall_clock = clocks.clock, clocks.wall
    core.observers = ()  # the steps were taken elsewhere: no observer sees them again
    if core.doom_check is not None:  # the verdicts are the journal's, not asked again
        core.doom_check = clocks.doom
    turn = core.state.turn
    known = [] if turn is None else [t for t in turn.times if t is not None]
    last = max(known, default=0.0)
    for index, raw in enumerate(entries, first):
        try:
            step, times, walls = _step_of(raw)
            # the session clock never runs back: a reading before the last is the last
            # (a forged journal cannot make a turn's steps go back in time)
            for i, reading in enumerate(times):
                if reading < last:
                    times[i] = last
                else:
                    last = reading
            times.reverse()
            walls.reverse()
            clocks.times, clocks.walls = times, walls
            clocks.verdicts = list(reversed(step[2])) if step[0] == EVENT else []
            run_step(session, step)
        except _Short as short:
            raise ValueError(
                f"journal[{index}]: the step reads the {short} more often than it recorded"
            ) from None
        except (
            ValueError,
            TypeError,
            ConfigError,
            IllegalEvent,
            SessionEnded,
            TurnInProgress,
        ) as exc:
            raise ValueError(f"journal[{index}]: {exc}") from None
        if clocks.times or clocks.walls:
            raise ValueError(
                f"journal[{index}]: the step recorded more clock readings than it makes"
            )
        if clocks.verdicts:
            raise ValueError(
                f"journal[{index}]: the step recorded more doom-check verdicts than it asks for"
            )


def base_state(record: Record) -> tuple[Settings, SessionState]:
    """``record``'s snapshot, read with the session's start at 0 on its clock (the frame
    its journal's readings are in); ``CorruptSession`` if it is unusable."""
    snapshot = record.snapshot or {}
    elapsed: Any = snapshot.get("elapsed_s")
    try:
        return read_snapshot(snapshot, float(elapsed) if _number(elapsed) else 0.0)
    except SnapshotError as exc:
        raise CorruptSession(
            f"session {record.session_id!r}: the stored snapshot is unusable: snapshot.{exc}",
            session_id=record.session_id,
        ) from None


def replay_record(session: Session, record: Record, entries: Any, first: int = 0) -> None:
    """:func:`replay` of ``entries`` of ``record``'s journal, ``CorruptSession`` naming
    the entry if one is refused."""
    try:
        replay(session, list(entries), first)
    except ValueError as exc:
        raise CorruptSession(
            f"session {record.session_id!r}: the stored record's {exc}",
            session_id=record.session_id,
        ) from None


def current_record(session_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a decoded record) as a reader of the store API sees it: its journal
    applied, so ``"snapshot"`` is the session's current snapshot and ``"journal"`` is
    empty (what ``SessionStore.load`` returns). ``CorruptSession`` if the record or a
    step in it is unusable."""
    journal = data.get("journal")
    if data.get("version") != RECORD_VERSION or (type(journal) is list and not journal):
        return data
    record = parse_record(session_id, data)
    settings, state = base_state(record)
    # a doom check stands in for the host's when the journal holds its verdicts (or the
    # snapshot its window): the verdicts are the journal's, never asked
    asks = bool(state.doom_window) or any(
        type(e) is list and len(e) == 5 and e[0] == EVENT for e in record.journal
    )
    session = Session.from_state(
        settings,
        state,
        _not_read,
        wall_clock=_not_read,
        check=False,
        doom_check=_not_read if asks else None,
    )
    replay_record(session, record, record.journal)
    current = write_snapshot(settings, state, record.elapsed_s)
    return {**data, "snapshot": current, "journal": []}


def _not_read(*_: Any) -> Any:  # pragma: no cover - a replay gives its steps their readings
    raise AssertionError("a replay reads only what its entries recorded")
