"""Recorded traces as JSON lines: the observer that writes them and the reader.

A trace file is what ``simulate --json`` prints and what :class:`TraceWriter` (an
observer a production host attaches to its sessions) writes: one JSON object per
line. :class:`TraceWriter` starts the file with a *header*::

    {"type": "header", "format": "turnstate-trace", "version": 1,
     "engine": "<turnstate version>", "table": "<sha256 of the transition table>"}

with ``"settings"`` and ``"seed"`` (the session's, when the writer knows them) and
``"anchor"``, ``{"t": <session clock>, "wall": <Unix time>}`` at the first step. Then
one ``step`` object per transition, with ``simulate --json``'s keys for the same facts
(``turn``, ``step``, ``t``, ``state``, ``event``, ``guard``, ``next``, ``action``,
``attempt``, ``session_retries``, ``reductions``), and ``event_cost_usd`` (the cost
the event carried), ``caused_by`` (the event, encoded as a snapshot encodes values;
``null`` for a start), ``wall`` (the Unix time the step was given, or ``null``) and,
on a start, ``made_t`` (the session clock when its turn was made, where known); a
writer bound to its session adds ``limit`` and ``session_status`` after the step.
``simulate --json`` writes no header: its steps name their ``scenario``, its
``cost_usd`` is the session's running total, and a ``summary`` line, with the settings
and seed, ends each scenario.

:func:`read_trace` reads both and checks every line before anything is drawn: a
header of another format, version or table, a line that is not JSON, a step that is
not a row of this engine's table, an action that is not the one its row emits or not
as the engine writes it (a snapshot's restore checks), a ``Wait`` longer than the
trace's settings (else the defaults) allow, a string that is not valid Unicode, or
steps out of order is a :class:`TraceFileError` naming the line: a trace is never
drawn wrong. :func:`load_trace` reads a file whose last line a crash cut off up to
its last complete line, and says which line it dropped.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import attrs

from .._version import __version__
from ..core._actions import Action, Finish, Wait
from ..core._codec import decode, encode
from ..core._events import EVENT_TYPES
from ..core._exceptions import ConfigError
from ..core._json_data import MAX_COUNT, json_problem
from ..core._reachable import ACTION_OF_EFFECT
from ..core._settings import Settings
from ..core._state import _action_problem
from ..core._table import IDLE, ROWS, START
from ..core._taxonomy import ToolErrorCategory
from ..core._trace import TraceRecord

FORMAT = "turnstate-trace"
"""The ``format`` of a trace file's header."""
VERSION = 1
"""The trace format version this engine writes and reads."""

_ROW_KEYS: dict[tuple[str, str, str, str], str] = {row.key: row.effect for row in ROWS}
_ROW_STATUSES: dict[tuple[str, str, str, str], str | None] = {
    row.key: row.status or ("completed" if row.effect == "complete" else None) for row in ROWS
}
"""The status each row's Finish must carry (``None``: the row finishes nothing, or the
status comes from the event, as for ``Cancelled``)."""


@functools.cache
def table_digest() -> str:
    """The SHA-256 (hex) of the transition table, rows in order: two engines whose
    digests agree take the same rows in the same order."""
    rows = [[r.source, r.event, list(r.guards), r.dest, r.effect, r.status] for r in ROWS]
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def header(
    settings: Settings | None = None,
    anchor: tuple[float, float] | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """The header line :class:`TraceWriter` writes first: with the session's
    ``settings``, its ``seed`` and the ``anchor`` (session clock, Unix time) when known."""
    line: dict[str, Any] = {
        "type": "header",
        "format": FORMAT,
        "version": VERSION,
        "engine": __version__,
        "table": table_digest(),
    }
    if settings is not None:
        line["settings"] = settings.to_dict()
    if seed is not None:
        line["seed"] = seed
    if anchor is not None:
        line["anchor"] = {"t": anchor[0], "wall": anchor[1]}
    return line


def record_json(record: TraceRecord) -> dict[str, Any]:
    """One transition as the ``step`` object of a trace file."""
    line = {
        "type": "step",
        "turn": record.turn,
        "step": record.step,
        "t": record.at,
        "state": record.source,
        "event": record.event,
        "guard": record.guard,
        "next": record.dest,
        "action": encode(record.action),
        "attempt": record.attempt,
        "session_retries": record.session_retries,
        "reductions": record.reductions,
        "event_cost_usd": record.cost_usd,
        "caused_by": None if record.caused_by is None else encode(record.caused_by),
        "wall": record.wall,
    }
    if record.made_at is not None:
        line["made_t"] = record.made_at
    return line


_STEP_ENCODER = json.JSONEncoder(sort_keys=True, allow_nan=False, default=str)
"""A step line's encoder, made once (``json.dumps`` with options makes one per call)."""


class TraceWriter:
    """An observer that writes every transition to ``target`` as a trace file line.

    ``target`` is a path (opened for appending; closed by :meth:`close`) or an open
    text stream (left open). The header is written before the first step, unless the
    file already has content (a restored session appends to its trace); each line is
    flushed as it is written, so a crash loses no transition taken. The host's data
    inside actions is written as it is. The header's anchor is the first step's
    session-clock time and its Unix time (the step's ``wall``, else ``wall_clock()``).

    One writer per session: ``Session(..., observers=[writer])``, then
    ``writer.bind(session)``, which records the session's settings (what the reader
    checks each ``Wait`` against) and seed (what a replay takes), and after each step
    the limit that fired and the session's status.
    """

    __slots__ = ("_bound", "_owned", "_seed", "_settings", "_started", "_stream", "_wall_clock")

    def __init__(
        self,
        target: str | Path | IO[str],
        *,
        settings: Settings | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(target, str | Path):
            self._stream: IO[str] = open(target, "a", encoding="utf-8")  # noqa: SIM115
            self._owned = True
            self._started = self._stream.tell() > 0
        else:
            self._stream = target
            self._owned = False
            self._started = False
        self._settings = settings
        self._seed: int | None = None
        self._wall_clock = wall_clock
        self._bound: Any = None

    def bind(self, session: Any) -> None:
        """Read ``session`` (a :class:`~statemachine.Session`): its settings and seed for
        the header, and after every step its limit and status."""
        self._bound = session
        self._settings = session.settings
        self._seed = session.seed

    def __call__(self, record: TraceRecord) -> None:
        stream = self._stream
        if not self._started:
            anchor = None
            if record.at is not None:
                wall = record.wall if record.wall is not None else self._wall_clock()
                anchor = (record.at, wall)
            line = header(self._settings, anchor, self._seed)
            stream.write(json.dumps(line, sort_keys=True) + "\n")
            self._started = True
        line = record_json(record)
        session = self._bound
        if session is not None:
            limit, status = session.limit_reached, session.status
            line["limit"] = None if limit is None else limit.value
            line["session_status"] = None if status is None else status.value
        stream.write(_STEP_ENCODER.encode(line) + "\n")
        stream.flush()

    def close(self) -> None:
        """Close the file, if the writer opened it."""
        if self._owned:
            self._stream.close()


class TraceFileError(ValueError):
    """A trace file that cannot be read or does not fit this engine's table; the
    message names the file and line."""


@attrs.frozen
class TracedStep:
    """One transition read from a trace file."""

    line: int
    """The line of the file it was read from (from 1)."""
    scenario: str | None
    """The scenario (``simulate --json``), or ``None`` (a :class:`TraceWriter` file)."""
    record: TraceRecord
    auto: bool = False
    """``simulate`` sent this event itself (a ``WaitDone`` after a ``Wait``)."""
    detail: str = ""
    """``simulate``'s short description of the event's payload, if any."""
    limit: str | None = None
    """The session limit that had fired after this step (``simulate``, or a bound
    writer), if any."""
    session_status: str | None = None
    """The session's status after this step, once it ended (idem)."""


@attrs.frozen
class Trace:
    """A checked trace file: its steps in order, and what its header or summaries say."""

    source: str
    steps: tuple[TracedStep, ...]
    engine: str | None
    """The engine version the header names (``None``: no header, ``simulate --json``)."""
    session_status: Mapping[str | None, str | None] = attrs.field(factory=dict)
    """The session status each scenario's ``summary`` line reports."""
    settings: Mapping[str | None, Settings] = attrs.field(factory=dict)
    """The settings each scenario ran with, as the header or its ``summary`` records
    them (absent: not recorded)."""
    anchor: float | None = None
    """The Unix time of the session clock's 0, from the header's anchor, if any."""
    seeds: Mapping[str | None, int] = attrs.field(factory=dict)
    """The jitter seed each scenario's session ran with, as the header or its
    ``summary`` records it (absent: not recorded); a replay takes it."""
    cut: int | None = None
    """The line :func:`load_trace` dropped because the file ends inside it, if any."""

    @property
    def scenarios(self) -> tuple[str | None, ...]:
        """The scenarios the steps belong to, in order of appearance."""
        return tuple(dict.fromkeys(s.scenario for s in self.steps))


_STEP_FIELDS: dict[str, type | tuple[type, ...]] = {
    "turn": int,
    "step": int,
    "state": str,
    "event": str,
    "guard": str,
    "next": str,
    "action": dict,
    "attempt": int,
    "session_retries": int,
    "reductions": int,
}


def _field(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise TraceFileError(f"{where}: a step without {key!r}")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TraceFileError(f"{where}: {key}: got {value!r:.60}")
    if isinstance(value, int) and not (1 if key == "turn" else 0) <= value <= MAX_COUNT:
        raise TraceFileError(f"{where}: {key}: must be a count the engine keeps, got {value}")
    return value


def _number(data: Mapping[str, Any], key: str, where: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceFileError(f"{where}: {key}: must be a finite number, got {value!r:.60}")
    return float(value)


def _keep_run(
    settings: dict[str | None, Settings],
    seeds: dict[str | None, int],
    scenario: str | None,
    data: Mapping[str, Any],
    where: str,
) -> None:
    """Keep for ``scenario`` the settings and the seed a header or a summary records, if
    any (the seed as the session took it: a 64-bit unsigned int)."""
    raw = data.get("settings")
    if raw is not None:
        try:
            settings[scenario] = Settings.from_dict(raw, source="settings")
        except ConfigError as exc:
            raise TraceFileError(f"{where}: {exc}") from None
    seed = data.get("seed")
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TraceFileError(f"{where}: seed: must be an int, got {seed!r:.60}")
    seeds[scenario] = seed & _SEED_MASK


_SEED_MASK = (1 << 64) - 1


def _anchor(raw: object, where: str) -> float | None:
    """The Unix time of the session clock's 0 a header's anchor gives."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TraceFileError(f"{where}: anchor: must be {{t, wall}}, got {raw!r:.60}")
    at, wall = _number(raw, "t", where), _number(raw, "wall", where)
    if at is None or wall is None or not math.isfinite(wall - at):
        raise TraceFileError(f"{where}: anchor: must be {{t, wall}}, got {raw!r:.60}")
    return wall - at


def wait_bound(settings: Settings, *, computed: bool) -> float:
    """The longest ``Wait`` the engine can emit under ``settings``: a computed backoff
    (``computed``: no server asked for the wait, or a tool conflict's) is at most
    ``1.5 * max_delay_ms`` (the largest jitter), a wait a server asked for may be its
    retry-after up to ``max_server_wait_s``, and no wait crosses ``max_wall_clock_s``."""
    bound = settings.max_delay_ms * 1.5 / 1000.0
    if not computed:
        bound = max(bound, settings.max_server_wait_s)
    if settings.max_wall_clock_s is not None:
        bound = min(bound, settings.max_wall_clock_s)
    return bound


def _check_header(data: Mapping[str, Any], where: str) -> str:
    if data.get("format") != FORMAT:
        raise TraceFileError(
            f"{where}: not a {FORMAT} file (its header's format is {data.get('format')!r:.60})"
        )
    version = data.get("version")
    engine = data.get("engine")
    if version != VERSION:
        raise TraceFileError(
            f"{where}: trace format version {version!r:.20} (written by turnstate "
            f"{engine!s:.40}); this engine reads version {VERSION} only"
        )
    if data.get("table") != table_digest():
        raise TraceFileError(
            f"{where}: written by turnstate {engine!s:.40}, whose transition table differs "
            f"from this engine's ({__version__}): its rows cannot be drawn on this machine"
        )
    return str(engine)


def read_trace(lines: Iterable[str], source: str = "<trace>") -> Trace:
    """Read and check a trace (the lines of a trace file); ``TraceFileError`` naming
    ``source`` and the line for anything this engine cannot draw truthfully."""
    steps: list[TracedStep] = []
    statuses: dict[str | None, str | None] = {}
    settings: dict[str | None, Settings] = {}
    seeds: dict[str | None, int] = {}
    anchor: float | None = None
    engine: str | None = None
    last: dict[tuple[str | None, int], TraceRecord] = {}
    previous_cost: dict[str | None, float] = {}
    seen_any = False
    for number, raw in enumerate(lines, start=1):
        where = f"{source}:{number}"
        text = raw.strip()
        if not text:
            continue
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise TraceFileError(f"{where}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise TraceFileError(f"{where}: a line must be a JSON object, got {text:.60}")
        problem = json_problem(data)
        if problem is not None:
            raise TraceFileError(f"{where}: {problem}")
        kind = data.get("type")
        if kind == "header":
            if seen_any:
                raise TraceFileError(f"{where}: a header after the first line")
            engine = _check_header(data, where)
            _keep_run(settings, seeds, None, data, where)
            anchor = _anchor(data.get("anchor"), where)
        elif kind == "summary":
            scenario = _text(data, "scenario", where)
            status = data.get("session_status")
            statuses[scenario] = status if isinstance(status, str) else None
            _keep_run(settings, seeds, scenario, data, where)
        elif kind == "step":
            step = _read_step(data, where, number, engine is not None, last, previous_cost)
            steps.append(step)
        else:
            raise TraceFileError(f"{where}: unknown line type {kind!r:.40}")
        seen_any = True
    if not steps:
        raise TraceFileError(f"{source}: no steps")
    _check_waits(steps, settings, source)
    return Trace(source, tuple(steps), engine, statuses, settings, anchor, seeds)


def _check_waits(
    steps: Iterable[TracedStep], settings: Mapping[str | None, Settings], source: str
) -> None:
    """Every ``Wait`` within what its scenario's settings allow (the defaults when the
    trace records none), as the engine could have emitted it."""
    defaults = Settings()
    for step in steps:
        action = step.record.action
        if not isinstance(action, Wait):
            continue
        chosen = settings.get(step.scenario)
        tool = action.category is ToolErrorCategory.CONCURRENCY_CONFLICT
        # the engine sets a Wait's retry_after only when a server asked for the wait
        bound = wait_bound(chosen or defaults, computed=tool or action.retry_after is None)
        server = None if tool else (chosen or defaults).max_server_wait_s
        too_long = action.seconds > bound or (
            server is not None and action.retry_after is not None and action.retry_after > server
        )
        if too_long:
            whose = "the trace's settings" if chosen else "the default settings (none recorded)"
            raise TraceFileError(
                f"{source}:{step.line}: a Wait of {action.seconds!r:.40} s (retry-after "
                f"{action.retry_after!r:.40}) is beyond what {whose} allow: at most "
                f"{bound:g} s"
            )


def _read_step(
    data: Mapping[str, Any],
    where: str,
    number: int,
    written: bool,
    last: dict[tuple[str | None, int], TraceRecord],
    previous_cost: dict[str | None, float],
) -> TracedStep:
    values = {key: _field(data, key, kind, where) for key, kind in _STEP_FIELDS.items()}
    scenario = _text(data, "scenario", where)
    action = _row_action(values, where)
    at, wall = _number(data, "t", where), _number(data, "wall", where)
    made = _number(data, "made_t", where)
    if made is not None and values["event"] != START:
        raise TraceFileError(f"{where}: made_t: only a start says when its turn was made")
    caused_by = _cause(data.get("caused_by"), values["event"], where)
    if written:
        cost = _number(data, "event_cost_usd", where) or 0.0
    else:  # simulate --json: cost_usd is the session's running total
        total = _number(data, "cost_usd", where) or 0.0
        cost = max(0.0, total - previous_cost.get(scenario, 0.0))
        previous_cost[scenario] = total
    turn_key = (scenario, values["turn"])
    _check_order(values, at, last.get(turn_key), written, where)
    record = TraceRecord(
        turn=values["turn"],
        step=values["step"],
        source=values["state"],
        event=values["event"],
        guard=values["guard"],
        dest=values["next"],
        action=action,
        attempt=values["attempt"],
        session_retries=values["session_retries"],
        reductions=values["reductions"],
        cost_usd=cost,
        at=at,
        caused_by=caused_by,
        wall=wall,
        usage=getattr(caused_by, "usage", None),
        made_at=made,
    )
    last[turn_key] = record
    detail = data.get("detail")
    return TracedStep(
        number,
        scenario,
        record,
        auto=data.get("auto") is True,
        detail=detail if isinstance(detail, str) else "",
        limit=_text(data, "limit", where),
        session_status=_text(data, "session_status", where),
    )


def _row_action(values: Mapping[str, Any], where: str) -> Action:
    """The step's action, checked against its row of the table: the action the row
    emits, as the engine writes it, finishing with the row's status."""
    key = (values["state"], values["event"], values["guard"], values["next"])
    row = f"{values['state']} -{values['event']}-> {values['next']}"
    effect = _ROW_KEYS.get(key)
    if effect is None:
        guard = f" [{values['guard']}]" if values["guard"] else ""
        raise TraceFileError(
            f"{where}: {values['state']} -{values['event']}{guard}-> {values['next']} "
            "is not a row of this engine's transition table (a trace of another engine "
            "version?): it cannot be drawn on this machine"
        )
    try:
        action: Action = decode(values["action"], "action")
    except ValueError as exc:
        raise TraceFileError(f"{where}: {exc}") from None
    expected = ACTION_OF_EFFECT[effect]
    if type(action) is not expected:
        raise TraceFileError(
            f"{where}: the row {row} emits {expected.__name__}, the step has "
            f"{type(action).__name__}"
        )
    problem = _action_problem(action)
    if problem is not None:
        raise TraceFileError(f"{where}: action: {type(action).__name__}.{problem}")
    status = _ROW_STATUSES[key]
    if isinstance(action, Finish) and status is not None and action.status.value != status:
        raise TraceFileError(
            f"{where}: the row {row} finishes {status}, the step says "
            f"{action.status.value}: it would be drawn wrong"
        )
    return action


def _check_order(
    values: Mapping[str, Any],
    at: float | None,
    before: TraceRecord | None,
    written: bool,
    where: str,
) -> None:
    """A step follows the one before it in its turn (``before``), or starts its turn."""
    turn, step = values["turn"], values["step"]
    if before is None:
        if step != 0 and not written:
            raise TraceFileError(f"{where}: turn {turn} starts at step {step}")
        if step == 0 and (values["state"], values["event"]) != (IDLE, START):
            raise TraceFileError(f"{where}: step 0 of turn {turn} must be idle -start->")
        return
    if step != before.step + 1:
        raise TraceFileError(f"{where}: turn {turn} step {step} follows step {before.step}")
    if values["state"] != before.dest:
        raise TraceFileError(
            f"{where}: turn {turn} step {step} leaves {values['state']!r}, but step "
            f"{before.step} ended in {before.dest!r}"
        )
    if before.at is not None and at is not None and at < before.at:
        raise TraceFileError(f"{where}: time runs backwards ({at} after {before.at})")


def _text(data: Mapping[str, Any], key: str, where: str) -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise TraceFileError(f"{where}: {key}: must be text or null, got {value!r:.60}")
    return value


def _cause(raw: object, trigger: str, where: str) -> Any:
    """The event a step names as its cause (``None``: not recorded), which must be of
    the step's trigger."""
    if raw is None:
        return None
    try:
        event = decode(raw, "caused_by")
    except ValueError as exc:
        raise TraceFileError(f"{where}: {exc}") from None
    if type(event).__name__ != trigger or type(event) not in EVENT_TYPES:
        raise TraceFileError(
            f"{where}: caused_by: a {type(event).__name__} cannot cause a {trigger} step"
        )
    return event


def load_trace(path: str | Path) -> Trace:
    """:func:`read_trace` of the file at ``path`` (``TraceFileError`` if unreadable or
    not UTF-8, naming the line).

    A file that does not end in a newline and whose last line (not its first) is not
    a complete record (not UTF-8 or not JSON: the writer was stopped mid-line) is read
    up to the line before; :attr:`Trace.cut` names the line dropped.
    """
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise TraceFileError(f"{path}: {exc.strerror or exc}") from None
    chunks = raw.split(b"\n")
    cut = None
    if chunks[-1] == b"":
        chunks.pop()
    elif len(chunks) > 1 and not _complete(chunks[-1]):  # a file of one line is not cut
        cut = len(chunks)
        chunks.pop()
    lines: list[str] = []
    for number, chunk in enumerate(chunks, start=1):
        try:
            lines.append(chunk.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise TraceFileError(f"{path}:{number}: not UTF-8 text ({exc.reason})") from None
    trace = read_trace(lines, str(path))
    return attrs.evolve(trace, cut=cut)


def _complete(chunk: bytes) -> bool:
    """Whether a file's last line, one without its newline, is a whole record (UTF-8
    text, blank or JSON) rather than one a crash cut off."""
    try:
        text = chunk.decode("utf-8")
        if text.strip():
            json.loads(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    return True
