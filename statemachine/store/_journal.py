"""A record's journal: the steps applied to a session since its snapshot was written.

A worker does not write the whole snapshot on every advance. It writes what it did:
one *entry* per step, appended to the record's journal, and a fresh snapshot (with an
empty journal) only now and then. Another worker gets the state by restoring the
snapshot and replaying the entries. A step is an input and its moment, nothing else
(the engine reads no clock, and a doom check's verdict is a field of the reply), so
replaying an entry is the very call the worker made live: :func:`apply_step`, through
the session's public methods, with the recorded moment. Every replayed step goes
through the engine's own checks, so a forged journal can only take a session along
paths the engine allows.

Times are in the journal's frame: seconds since the session started (a snapshot is
restored with its start at 0). An entry (record version 3) is ``[op, at, wall, *args]``:

* ``["s", at, null]``: start the next turn (``Worker.advance(id, None)``);
* ``["e", at, wall, event]``: send ``event`` (encoded as in a snapshot, its fields at
  their default left out) to the turn, at ``at``, with the Unix time ``wall`` when the
  step was given one (``null`` otherwise); a reply taken with a doom check holds its
  verdict (``ModelReplied.doom_verdict``);
* ``["c", null, null, child_id, total]``: ``record_child_spend(child_id, total)``;
* ``["b", null, null, budget]``: ``record_ancestor_budget(budget)``, read at a turn start.

Records written before the verdict was a field of the reply hold
``["e", at, wall, event, verdicts]`` where the worker had a doom check: the answers it
gave, in order. Such an entry is read as the reply with its verdict in it, one verdict
where the step is due one and none elsewhere (anything else is refused, as it was).
Version 2 entries (``[op, times, walls, *args]``, the lists of clock readings a step
made when the engine still read clocks) are read as the step at the latest of its
readings, with its first wall reading; they hold verdicts only where the check gave
some, so a version 2 record's replies were taken with a check when any entry holds
verdicts or its snapshot a doom window (:func:`had_check`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from json.encoder import encode_basestring
from typing import Any

import attrs

from ..core._actions import Action, InvokeTools
from ..core._builder import build_maker
from ..core._codec import checked_decoder, compact, decode
from ..core._engine import needs_wall
from ..core._events import EVENT_TYPES, Assembled, ModelFailed, ModelReplied
from ..core._exceptions import (
    ConfigError,
    IllegalEvent,
    SessionEnded,
    SnapshotError,
    TurnInProgress,
)
from ..core._json_data import MAX_COUNT, plain_json, short_repr
from ..core._model_error import ModelError
from ..core._session import Session
from ..core._state_text import json_text, number_text
from ..core._taxonomy import ErrorCategory
from ._errors import CorruptSession, corrupt
from ._record import RECORD_VERSION, Record, parse_record

START, EVENT, CHILD_SPEND, BUDGET = "s", "e", "c", "b"

Step = tuple[Any, ...]
"""``(START,)``, ``(EVENT, event)``, ``(CHILD_SPEND, child_id, total)`` or ``(BUDGET, budget)``."""

FINISHED_TOLERANCE_S = 1e-6
"""How far a record's ``finished_s`` may lie from what its journal says (records of
version 2 were written from readings on another frame: a rounding apart)."""


def apply_step(session: Session, step: Step, at: float | None, wall: float | None) -> Any:
    """Apply ``step`` to ``session`` at the moment ``at`` (Unix time ``wall``) through the
    session's public methods: what a worker does live and what a replay does again.
    The action it produced (``None`` for spend and budget steps)."""
    op = step[0]
    if op == EVENT:
        turn = session.current_turn
        if turn is None:
            raise IllegalEvent(
                "the session has no turn yet: start one first",
                event=type(step[1]).__name__,
                state="no turn",
            )
        return turn.send(step[1], at=at, wall=wall)
    if op == START:
        turn = session.current_turn
        if turn is not None and turn.state == "idle":
            return turn.start(at=at)
        return session.new_turn(at=at).start(at=at)
    if op == CHILD_SPEND:
        session.record_child_spend(step[1], step[2])
        return None
    if op == BUDGET:
        session.record_ancestor_budget(step[1])
        return None
    raise ValueError(f"unknown step {op!r}")  # pragma: no cover - steps are built here


def take_steps(
    session: Session, steps: Iterable[Step], age: float, wall: float
) -> tuple[Any, list[str]]:
    """Take ``steps`` live, in order, on ``session``, ``age`` seconds old at Unix time
    ``wall``: each :func:`apply_step`, a turn's start and an event at ``age`` (an event
    given ``wall`` when a rule may read it), the others at no moment. The action the
    last one produced, and their journal entries."""
    action = None
    entries = []
    for step in steps:
        op = step[0]
        at: float | None = age
        given: float | None = None
        if op == EVENT:
            if needs_wall(step[1]):
                given = wall
        elif op != START:
            at = None
        action = apply_step(session, step, at, given)
        entries.append(entry_text(step, at, given))
    return action, entries


# -- writing an entry -------------------------------------------------------------


def entry_text(step: Step, at: float | None, wall: float | None) -> str:
    """The journal entry of ``step`` taken at ``at`` (Unix time ``wall``), as JSON text
    (the event encoded as a snapshot encodes values, without the fields at their
    default)."""
    op = step[0]
    if op == EVENT:
        if type(at) is not float:
            return json_text([op, at, wall, compact(step[1])])
        when = "null" if wall is None else number_text(wall)
        return f'["e",{at!r},{when},{event_text(step[1])}]'
    if op == START and type(at) is float and wall is None:
        return f'["s",{at!r},null]'
    return json_text([op, at, wall, *step[1:]])


def event_text(event: Any) -> str:
    """``json_text(compact(event))``: an event's text in an entry, the most frequent
    ones (a wait's end, a rate limit, an assembled request, a reply with no tool call)
    written by hand (a property test holds each to the general encoding)."""
    kind = type(event)
    text = _FIELDLESS.get(kind)
    if text is not None:
        return text
    if kind is ModelFailed and type(event.error) is ModelError and event.usage is None:
        return _model_failed_text(event)
    if kind is Assembled and type(event.size) is int:
        return f'{{"$type":"Assembled","request":{json_text(event.request)},"size":{event.size!r}}}'
    if (
        kind is ModelReplied
        and not event.tool_calls
        and event.usage is None
        and event.doom_verdict is None
    ):
        cost = event.cost
        text = '{"$type":"ModelReplied"'
        if not (type(cost) is float and cost == 0.0):
            text += ',"cost":' + _number_text(cost)
        data = event.reply_data
        if data is not None:
            text += ',"reply":' + json_text(data)
        return text + "}"
    return json_text(compact(event))


def _model_failed_text(event: ModelFailed) -> str:
    """``json_text(compact(event))`` written field by field: the event of every retry
    (one string grown, not a list joined: most errors have three or four fields)."""
    error = event.error
    text = _FAILED_HEADS[error.category]
    if error.message:
        text += ',"message":' + encode_basestring(error.message)
    waited = error.retry_after_seconds
    if waited is not None:
        text += ',"retry_after_seconds":' + _number_text(waited)
    if error.headers is not None:
        text += ',"headers":' + json_text(dict(error.headers))
    if error.code is not None:
        text += ',"code":' + encode_basestring(error.code)
    status = error.status
    if status is not None:
        text += ',"status":' + (f"{status!r}" if type(status) is int else _number_text(status))
    if error.body is not None:
        text += ',"body":' + json_text(error.body)
    text += '},"partial":true' if event.partial else "}"
    cost = event.cost
    if not (type(cost) is float and cost == 0.0):
        text += ',"cost":' + json_text(cost)
    return text + "}"


def _number_text(value: Any) -> str:
    """A field's number as ``json_text(compact(value))`` writes it (a non-finite float
    as the codec's ``{"$float": ...}``)."""
    if type(value) is int or (type(value) is float and math.isfinite(value)):
        return number_text(value)
    return json_text(compact(value))


_FAILED_HEADS = {
    category: '{"$type":"ModelFailed","error":{"$type":"ModelError","category":'
    + encode_basestring(category.value)
    for category in ErrorCategory
}
"""The text a failure's entry begins with, per category."""


_FIELDLESS = {cls: json_text(compact(cls())) for cls in EVENT_TYPES if not attrs.fields(cls)}
"""The journal text of each event class with no fields."""


# -- reading an entry --------------------------------------------------------------


def _number(value: object) -> bool:
    return type(value) in (int, float)


def _as_float(value: float) -> float:
    """``value`` as a float; an int too large for one is infinite (then refused)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _time(raw: object, name: str) -> float:
    """A reading of an entry: a finite number, or ``ValueError`` naming ``name``."""
    if not _number(raw):
        raise ValueError(f"{name}: must be a number, got {short_repr(raw)}")
    value = _as_float(raw)  # type: ignore[arg-type]
    if not math.isfinite(value):
        raise ValueError(f"{name}: {short_repr(raw)} is not a finite number")
    return value


def _readings(raw: object, name: str) -> list[float]:
    """A version-2 entry's clock readings as floats, or ``ValueError`` naming ``name``."""
    if type(raw) is not list:
        raise ValueError(f"{name}: must be a list of numbers")
    return [_time(reading, name) for reading in raw]


def _amount(value: float, what: str, *, signed: bool = False) -> float:
    """A spend (a finite number >= 0) or a budget (``signed``: any finite number, as
    siblings may overspend it) read from an entry, or ``ValueError``."""
    amount = _as_float(value)
    if not math.isfinite(amount) or (amount < 0 and not signed):
        kind = "a finite amount" if signed else "a finite amount >= 0"
        raise ValueError(f"{what}: {short_repr(value)} is not {kind}")
    return amount


def read_entry(
    raw: object, version: int
) -> tuple[Step, float | None, float | None, list[bool] | None]:
    """An entry of a record of ``version``: its step, moment, wall time and recorded
    doom-check verdicts (``None``: the entry holds none), or ``ValueError``."""
    if type(raw) is not list or len(raw) < 3:
        raise ValueError("must be a list [op, at, wall, ...]")
    op, raw_at, raw_wall, *args = raw
    if version >= 3:
        at = None if raw_at is None else _time(raw_at, "at")
        wall = None if raw_wall is None else _time(raw_wall, "wall")
    else:  # the readings the step made: the last is its moment, the first wall its wall
        times, walls = _readings(raw_at, "times"), _readings(raw_wall, "walls")
        at = max(times) if times else None
        wall = walls[0] if walls else None
    if at is not None and at < 0:
        raise ValueError("at: a session clock reading before the session started")
    recorded = op == EVENT and len(args) == 2  # the previous release's form: verdicts beside
    step = _step(op, args[:1] if recorded else args)
    verdicts: list[bool] | None = None
    if recorded:
        verdicts = args[1]
        if type(verdicts) is not list or not all(type(v) is bool for v in verdicts):
            raise ValueError("verdicts: must be a list of true/false")
        if getattr(step[1], "doom_verdict", None) is not None:
            raise ValueError("verdicts: beside a reply that holds its own")
    if op in (START, EVENT) and at is None:
        raise ValueError("at: the step recorded no clock reading")
    return step, at, wall, verdicts


def _step(op: object, args: list[Any]) -> Step:
    """The step of an entry's ``op`` and ``args``, or ``ValueError``."""
    if op == START and not args:
        return (START,)
    if op == EVENT and len(args) == 1:
        data = args[0]
        event = None
        if type(data) is dict and data.get("$type") == "Assembled":
            event = _fast_assembled(data, set())
        if event is None:
            event = decode(data, "event")
        if type(event) not in EVENT_TYPES:
            raise ValueError(f"event: must be an encoded event, got {type(event).__name__}")
        return (EVENT, event)
    if op == CHILD_SPEND and len(args) == 2 and type(args[0]) is str and _number(args[1]):
        return (CHILD_SPEND, args[0], _amount(args[1], "child spend"))
    if op == BUDGET and len(args) == 1 and (args[0] is None or _number(args[0])):
        return (BUDGET, None if args[0] is None else _amount(args[0], "budget", signed=True))
    raise ValueError(f"unknown step {str(op)[:20]!r} or wrong arguments")


def _size_in_range(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_COUNT


_fast_assembled = checked_decoder(
    Assembled,
    (("request", plain_json), ("size", _size_in_range)),
    make=build_maker(Assembled, ("request", "size")),
)
"""The ``Assembled`` that a journal's entry (fresh from the JSON parser) encodes with both
its fields, when its request is certainly JSON data and its size in range: made through
its slots, the request taken as it is (``Assembled`` would check it the same way, then
copy it: the parser's output is no one else's). ``None`` for anything else, which
``decode`` reads (and refuses) as it always did."""


def replay(
    session: Session,
    entries: list[Any],
    first: int = 0,
    version: int = RECORD_VERSION,
    *,
    legacy_asks: bool = False,
) -> None:
    """Apply the journal's ``entries`` (of a record of ``version``) to ``session``, a
    session with no clock in the journal's frame: each is :func:`apply_step` at its
    recorded moment (an older entry's recorded doom-check verdicts put in its reply
    first, its step taken with a check when it holds verdicts; a version 2 one when
    ``legacy_asks``, see :func:`had_check`). ``ValueError`` naming the entry
    (``first`` is the index of ``entries[0]`` in the journal) if one is not a step the
    engine takes from there."""
    for index, raw in enumerate(entries, first):
        try:
            _replay_entry(session, raw, version, legacy_asks)
        except _REFUSED as exc:
            raise ValueError(f"journal[{index}]: {exc}") from None


_REFUSED = (ValueError, TypeError, ConfigError, IllegalEvent, SessionEnded, TurnInProgress)
"""What a step the engine does not take from where a replay is raises."""


def _replay_entry(session: Session, raw: object, version: int, legacy_asks: bool) -> None:
    step, at, wall, recorded = read_entry(raw, version)
    asks = recorded is not None if version >= 3 else legacy_asks
    problem = None
    if asks or recorded:
        step, problem = _with_recorded(session, step, recorded or [], asks)
    apply_step(session, step, at, wall)
    if problem is not None:
        raise ValueError(problem)


_MORE = "the step recorded more doom-check verdicts than it asks for"


def _with_recorded(
    session: Session, step: Step, recorded: list[bool], asks: bool
) -> tuple[Step, str | None]:
    """``step``, of an older entry that recorded the doom check's verdicts in order
    (``recorded``; the step taken with a check when ``asks``), as it is taken now: a
    reply with its verdict in it, where the step is due one. And what is wrong with the
    verdicts (said once the step is applied, as when the check was asked inside it)."""
    event = step[1] if step[0] == EVENT else None
    turn = session.current_turn
    if not asks or type(event) is not ModelReplied or turn is None:
        return step, _MORE if recorded else None
    asked = 0

    def answer(_window: object) -> bool:
        nonlocal asked
        asked += 1
        return recorded[asked - 1] if asked <= len(recorded) else False

    step = (EVENT, turn.judged(event, answer))
    if asked > len(recorded):
        return step, "the step asks the doom check more often than it recorded"
    return step, _MORE if asked < len(recorded) else None


def had_check(record: Record) -> bool:
    """Whether the steps of ``record``'s journal, a version 2 one, were taken with a
    doom check: a version 2 entry holds verdicts only when the check gave some, so the
    record says it had a check when any entry holds verdicts or its snapshot a doom
    window. Every reader gets the same answer, whatever check it has itself."""
    snapshot: Any = record.snapshot or {}
    window = snapshot.get("doom_window") if type(snapshot) is dict else None
    return bool(window) or any(
        type(e) is list and len(e) == 5 and e[0] == EVENT for e in record.journal
    )


# -- a record read in full -------------------------------------------------------------


def base_session(record: Record, legacy_start: float = 0.0) -> Session:
    """``record``'s snapshot as a session with no clock in the journal's frame (its start
    at 0); ``CorruptSession`` if it is unusable.

    The previous release wrote a Finish's ``retry_at`` in a snapshot (version 4 and
    before, in a record of version 2) as a reading of its worker's clock, the clock the
    reader shares when the store's workers agree on one: ``legacy_start`` is the reading
    of the session's start on the reader's clock, where it puts such a ``retry_at``."""
    snapshot = record.snapshot or {}
    if legacy_start and record.version < 3:
        snapshot = _finishes_moved(snapshot, -legacy_start)
    elapsed: Any = snapshot.get("elapsed_s")
    at = _as_float(elapsed) if _number(elapsed) else 0.0
    try:
        return Session.restore(
            snapshot,
            None,
            wall_clock=None,
            at=at if math.isfinite(at) else 0.0,  # restore names a wrong elapsed_s
        )
    except SnapshotError as exc:
        raise CorruptSession(
            f"session {record.session_id!r}: the stored snapshot is unusable: snapshot.{exc}",
            session_id=record.session_id,
        ) from None


def _finishes_moved(snapshot: dict[str, Any], delta: float) -> dict[str, Any]:
    """A version 4 (or older) ``snapshot`` with the ``retry_at`` of its turn's Finish
    actions moved by ``delta`` (anything else left to the snapshot reader to judge)."""
    version, turn = snapshot.get("version"), snapshot.get("turn")
    if type(version) is not int or version > 4 or type(turn) is not dict:
        return snapshot
    actions = turn.get("actions")
    if type(actions) is not list:
        return snapshot
    moved = []
    for action in actions:
        if type(action) is dict and action.get("$type") == "Finish":
            retry_at: Any = action.get("retry_at")
            if _number(retry_at) and math.isfinite(_as_float(retry_at) + delta):
                moved.append({**action, "retry_at": _as_float(retry_at) + delta})
                continue
        moved.append(action)
    return {**snapshot, "turn": {**turn, "actions": moved}}


def replay_record(session: Session, record: Record, entries: Any, first: int = 0) -> None:
    """:func:`replay` of ``entries`` of ``record``'s journal, ``CorruptSession`` naming
    the entry if one is refused."""
    asks = record.version < 3 and had_check(record)
    try:
        replay(session, list(entries), first, record.version, legacy_asks=asks)
    except ValueError as exc:
        raise CorruptSession(
            f"session {record.session_id!r}: the stored record's {exc}",
            session_id=record.session_id,
        ) from None


def check_record(record: Record, session: Session) -> None:
    """``CorruptSession`` naming the key unless every field of ``record`` that its
    journal determines agrees with ``session``, the state the journal gives (in the
    journal's frame): its age is not before the last step, its last finish is the
    journal's, and a claim or carried outcomes belong to the tool calls in flight."""
    _check_ages(record, session)
    claim, carried = record.claim, record.carried
    if claim is not None or carried:
        _check_held_calls(record, session)


def _check_ages(record: Record, session: Session) -> None:
    """:func:`check_record` of ``elapsed_s`` and ``finished_s``."""
    sid = record.session_id
    last = session.last_at
    if record.elapsed_s < last:
        raise corrupt(sid, "elapsed_s", f"{record.elapsed_s!r} is before the last step ({last!r})")
    finished, said = session.finished_at, record.finished_s
    if said is None or finished is None:
        if said is not None or finished is not None:
            told = "a finish" if said is not None else "no finish"
            truth = "a turn is running" if finished is None else "the last turn has finished"
            raise corrupt(sid, "finished_s", f"the record says {told}, but {truth}")
    else:
        expected = record.elapsed_s - finished
        if abs(said - expected) > FINISHED_TOLERANCE_S * max(1.0, abs(expected)):
            raise corrupt(
                sid, "finished_s", f"{said!r}, but the last turn finished {expected!r} s before"
            )


def _check_held_calls(record: Record, session: Session) -> None:
    """:func:`check_record` of a ``claim`` and ``carried`` outcomes: the calls in flight,
    each claimed or answered once."""
    sid, claim, carried = record.session_id, record.claim, record.carried
    turn = session.current_turn
    pending: Action | None = None if turn is None else turn.action
    if turn is None or turn.state != "invoking_tools" or type(pending) is not InvokeTools:
        key = "claim" if claim is not None else "carried"
        raise corrupt(sid, key, "tool calls are held, but the session is not invoking tools")
    in_flight = {call.id for call in pending.calls}
    if claim is None:  # outcomes are carried only beside a claim on the calls re-run
        raise corrupt(sid, "carried", "holds outcomes, but no call is claimed")
    claimed = list(claim.calls)
    ids = [o.call_id for o in carried]
    if any(i not in in_flight for i in claimed) or len(set(claimed)) != len(claimed):
        raise corrupt(sid, "claim", f"names calls {claimed!r:.80} not in flight once each")
    if any(i not in in_flight for i in ids) or len(set(ids)) != len(ids):
        raise corrupt(
            sid, "carried", f"holds outcomes {ids!r:.80} for calls not in flight once each"
        )
    if set(claimed) | set(ids) != in_flight or set(claimed) & set(ids):
        raise corrupt(
            sid,
            "claim",
            f"claims {claimed!r:.60} beside outcomes for {ids!r:.60}: each call in flight "
            "is either claimed or answered, once",
        )


def read_session(record: Record, legacy_start: float = 0.0) -> Session:
    """The session ``record`` holds, read in full: its snapshot restored with no clock in
    the journal's frame, its journal replayed, every field the journal determines
    checked (``CorruptSession`` naming what was wrong). ``legacy_start``: see
    :func:`base_session`."""
    session = base_session(record, legacy_start)
    if record.journal:
        replay_record(session, record, record.journal)
    check_record(record, session)
    return session


def current_record(session_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a decoded record) as a reader of the store API sees it, read and checked
    as a worker reads it (whatever its version): its journal applied, so ``"snapshot"``
    is the session's current snapshot and ``"journal"`` is empty (what
    ``SessionStore.load`` returns). ``CorruptSession`` if the record or a step in it is
    unusable."""
    record = parse_record(session_id, data)
    current = read_session(record).snapshot(at=record.elapsed_s)
    return {**data, "snapshot": current, "journal": []}
