"""The record a store keeps per session, read and written: the engine's snapshot, the
journal of steps applied since it was written, and what the workers need to share it.

::

    {"format": "statemachine.store.record", "version": 3, "session_id": "conv-42",
     "incarnation": "9f2c...",          # drawn at create: tells a re-created id apart
     "snapshot": {...},                 # Session.snapshot(), as of the last compaction
     "journal": [[op, at, wall, ...], ...],   # the steps since (see _journal.py)
     "saved_at": 1764452000.5,          # wall clock of the write (idle-time accounting)
     "keys": [[7, "evt-9"], ...],       # recent idempotency keys, with the version each made
     "claim": {"owner": "w1", "calls": ["c1"], "until": 1764452300.5} | null,
     "carried": [ToolOutcome, ...],     # interrupted outcomes waiting for re-run ones
     "elapsed_s": 12.5,                 # the session's age at the write
     "finished_s": 3.0 | null}          # seconds since its last turn finished, at the write

``elapsed_s`` is never before the journal's last step and ``finished_s`` is what the
journal says (the reader checks both against the state the journal gives).

The keys come in this order, so that the bytes of a record up to the end of its
journal's last entry (its *prefix*) stay the same while the journal grows: a writer
appends an entry to the prefix in place, and a reader that knows a prefix reads only
what follows it. Version 2 (its journal entries hold the lists of clock readings a step
made) and version 1 (no journal; the snapshot current) are still read; every record
written is version 3. Every check here raises ``CorruptSession`` naming the session and
the key.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from ..core._codec import decode, encode
from ..core._json_data import finite
from ..core._session import Session
from ..core._snapshot import write_snapshot
from ..core._state_text import json_text, number_text
from ..core._tool_calls import ToolOutcome
from ._core import decode_record
from ._errors import corrupt

RECORD_FORMAT = "statemachine.store.record"
RECORD_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
_HEAD = f'{{"format":{json_text(RECORD_FORMAT)},"version":{RECORD_VERSION},"session_id":'
_JOURNAL = b',"journal":['
TAIL_KEYS = frozenset({"saved_at", "keys", "claim", "carried", "elapsed_s", "finished_s"})
"""The keys after the journal, in every record written here."""
MAX_KEYS = 16
"""How many recent idempotency keys a record remembers."""
MAX_JOURNAL = 64
"""The most journal entries a record may hold (a writer compacts long before)."""
COMPACT_EVERY = 32
"""A record's journal holds at most this many entries: the write after that writes the
snapshot anew (so a worker that knows nothing of the session replays at most this many)."""
COMPACT_AT_START = 24
"""A turn's start writes the snapshot anew once the journal holds this many entries: the
snapshot is at its smallest then (the last turn's trace is gone)."""
REPLAY_AT_MOST = 8
"""A worker that reads more new entries than this from other workers at once writes the
snapshot anew with its next write: the session is shared by many. (Replaying a few more
costs a reader less than the restores a snapshot written anew forces on every other
worker that knows the old one: in the Redis benchmark 4 at 4 and 16 at 16 worker
processes each cost more CPU per attempt than 8.)"""


@attrs.frozen
class Claim:
    """Tool calls handed to ``owner``, who may run them until ``until`` (wall clock)."""

    owner: str
    calls: tuple[str, ...]
    until: float


@attrs.define
class Record:
    """One session's record, as read from a store or written to one. Not frozen: the
    worker that holds the record it read or wrote last, and no one else does, appends
    the next steps' entries to it in place (:func:`written`)."""

    session_id: str
    snapshot: dict[str, Any] | None
    """The base snapshot as read (``None`` once the record is written: its bytes hold it)."""
    saved_at: float
    keys: tuple[tuple[int, str], ...] = ()
    claim: Claim | None = None
    carried: tuple[ToolOutcome, ...] = ()
    incarnation: str | None = None
    """Drawn when the session is created under its id, kept by every write: a session
    deleted and created again under the same id is another incarnation, so a write
    computed from the old one is refused even at the same version."""
    elapsed_s: float = 0.0
    """The session's age (seconds on its clock) when the record was written."""
    finished_s: float | None = None
    """Seconds since the session's last turn finished, when the record was written."""
    version: int = RECORD_VERSION
    """The record format version it was read from (what is written: the current)."""
    journal: tuple[Any, ...] = attrs.field(default=(), repr=False)
    """The journal's entries as read and not applied yet (the new ones only, for a
    record :func:`extend` read)."""
    entries: int = 0
    """How many entries the journal holds."""
    payload: bytes | None = attrs.field(default=None, eq=False, repr=False)
    """The bytes a store holds for this record, when known (read, or built to write)."""
    prefix_end: int | None = attrs.field(default=None, eq=False, repr=False)
    """Where in ``payload`` the journal's last entry ends, when known: the bytes before
    it (the record's *prefix*) are what the next write appends to."""
    appendable: bool = attrs.field(default=False, eq=False, repr=False)
    """Whether the next write may append to the prefix: it is known, of this version,
    and the read found at most :data:`REPLAY_AT_MOST` entries other workers appended
    (for a session many workers share, reading a snapshot costs less than replaying
    their many steps)."""
    middle: str | None = attrs.field(default=None, eq=False, repr=False)
    """The text of ``keys``, ``claim`` and ``carried``, once written (kept while the
    three stay the same)."""

    def has_key(self, key: str | None) -> bool:
        """Whether ``key`` is among the record's recent idempotency keys."""
        return key is not None and any(k == key for _, k in self.keys)


# -- writing --------------------------------------------------------------------------


def written(
    previous: Record | None,
    session_id: str,
    session: Session,
    entries: Sequence[str],
    wall: float,
    age: float,
    finished_at: float | None,
    keys: tuple[tuple[int, str], ...],
    claim: Claim | None,
    carried: tuple[ToolOutcome, ...],
    limit: int,
    max_prefix: int,
    /,
) -> Record:
    """The record to write for ``session`` (the journal's frame), ``age`` seconds old at
    Unix time ``wall``, after the steps whose journal ``entries`` these are, its last
    turn finished at ``finished_at`` (``session.finished_at``: ``None`` while a turn
    runs), holding ``keys``, ``claim`` and ``carried``.

    ``previous``, the record the session was read from or last written as (the
    caller's alone), with the entries appended in place while it may take them
    (:attr:`~Record.appendable`, its journal then holding at most ``limit`` entries and
    its prefix at most ``max_prefix`` bytes).
    Otherwise a fresh record: the snapshot written anew, the journal empty (the
    incarnation kept, or drawn for a new session). (Every write takes this: its one
    caller, ``Held.write``, passes the arguments by position.)"""
    last = session.last_at
    elapsed = last if age < last else age
    finished = None if finished_at is None else elapsed - finished_at
    record, end, added, sep = previous, 0, ",".join(entries), ""
    if record is None or not record.appendable or record.entries + len(entries) > limit:
        record = None
    else:  # the entries appended to the journal in place, while the prefix stays short
        end = record.prefix_end  # type: ignore[assignment] # known: appendable
        if added and record.entries:
            sep = ","
        grown = end + len(sep) + (len(added) if added.isascii() else len(added.encode()))
        if grown > max_prefix:
            record = None
        else:
            record.prefix_end, record.entries = grown, record.entries + len(entries)
            record.snapshot, record.journal = None, ()  # as read: only the bytes now
    if record is None:
        record = _fresh(previous, session_id, session, elapsed, wall)
        end, added, sep = record.prefix_end, "", ""  # type: ignore[assignment] # known: written here
    middle = record.middle
    if (
        middle is None
        or keys is not record.keys
        or claim != record.claim
        or carried is not record.carried
    ):
        record.middle = middle = _middle_text(keys, claim, carried)
        record.keys, record.claim, record.carried = keys, claim, carried
    record.saved_at, record.elapsed_s, record.finished_s = wall, elapsed, finished
    # the tail: the entries added, the journal's end and the keys after it (a float's
    # repr written at once: the usual case)
    saved = f"{wall!r}" if type(wall) is float else number_text(wall)
    now = f"{elapsed!r}" if type(elapsed) is float else number_text(elapsed)
    since = "null" if finished is None else number_text(finished)
    tail = (
        f'{sep}{added}],"saved_at":{saved}{middle},"elapsed_s":{now},"finished_s":{since}}}'
    ).encode()
    record.payload = record.payload[:end] + tail  # type: ignore[index]
    return record


def _fresh(
    previous: Record | None, session_id: str, session: Session, elapsed: float, wall: float
) -> Record:
    """A record of ``session`` ``elapsed`` seconds old, written anew: its bytes up to its
    empty journal (the incarnation ``previous``'s, or drawn for a new session)."""
    text = json_text(write_snapshot(session.settings, session.state, elapsed))
    incarnation = uuid.uuid4().hex if previous is None else previous.incarnation
    head = (
        f'{_HEAD}{json_text(session_id)},"incarnation":{json_text(incarnation)},"snapshot":{text}'
    ).encode() + _JOURNAL
    record = Record(session_id, None, wall, incarnation=incarnation, payload=head)
    record.prefix_end, record.appendable = len(head), True
    return record


def _middle_text(
    keys: tuple[tuple[int, str], ...], claim: Claim | None, carried: tuple[ToolOutcome, ...]
) -> str:
    claim_text = (
        "null"
        if claim is None
        else json_text({"owner": claim.owner, "calls": claim.calls, "until": claim.until})
    )
    return (
        f',"keys":{json_text(keys) if keys else "[]"},"claim":{claim_text}'
        f',"carried":{json_text(encode(carried)) if carried else "[]"}'
    )


# -- reading ------------------------------------------------------------------------


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and finite(value)


def _header(session_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """The typed values of the keys around the snapshot and journal, checked."""
    saved_at = data.get("saved_at")
    if not _finite(saved_at):
        raise corrupt(session_id, "saved_at", f"must be a finite number, got {saved_at!r}")
    keys = data.get("keys")
    if not isinstance(keys, list) or not all(
        isinstance(pair, list)
        and len(pair) == 2
        and isinstance(pair[0], int)
        and not isinstance(pair[0], bool)
        and isinstance(pair[1], str)
        for pair in keys
    ):
        raise corrupt(session_id, "keys", f"must be a list of [version, key] pairs, got {keys!r}")
    assert isinstance(saved_at, int | float)  # noqa: S101 - narrowed by _finite above
    return {
        "saved_at": float(saved_at),
        "keys": tuple((pair[0], pair[1]) for pair in keys),
        "claim": _claim(session_id, data.get("claim")),
        "carried": _carried(session_id, data.get("carried")),
    }


def _claim(session_id: str, claim: Any) -> Claim | None:
    """A record's ``claim``, checked."""
    if claim is None:
        return None
    if (
        not isinstance(claim, dict)
        or not isinstance(claim.get("owner"), str)
        or not isinstance(claim.get("calls"), list)
        or not all(isinstance(c, str) for c in claim["calls"])
        or not _finite(claim.get("until"))
    ):
        raise corrupt(session_id, "claim", f"must be owner/calls/until, got {claim!r}")
    return Claim(claim["owner"], tuple(claim["calls"]), float(claim["until"]))


def _carried(session_id: str, carried: Any) -> tuple[ToolOutcome, ...]:
    """A record's ``carried`` outcomes, checked."""
    if not isinstance(carried, list):
        raise corrupt(session_id, "carried", f"must be a list, got {carried!r}")
    try:
        outcomes = decode(carried, "carried")
    except ValueError as exc:
        raise corrupt(session_id, "carried", str(exc)) from None
    if not all(isinstance(o, ToolOutcome) for o in outcomes):
        raise corrupt(session_id, "carried", "must hold ToolOutcome values")
    return outcomes  # type: ignore[no-any-return]


def _ages(session_id: str, data: dict[str, Any]) -> tuple[float, float | None]:
    """A record's ``elapsed_s`` and ``finished_s`` (version 2 on), checked."""
    elapsed, finished = data.get("elapsed_s"), data.get("finished_s")
    if not _finite(elapsed) or elapsed < 0:  # type: ignore[operator]
        raise corrupt(session_id, "elapsed_s", f"must be a finite number >= 0, got {elapsed!r:.40}")
    if finished is not None and (not _finite(finished) or finished < 0):
        raise corrupt(
            session_id, "finished_s", f"must be a finite number >= 0 or null, got {finished!r:.40}"
        )
    return float(elapsed), None if finished is None else float(finished)  # type: ignore[arg-type]


def read_record(session_id: str, payload: bytes, max_bytes: int) -> Record:
    """The record in ``payload`` (the bytes a store of bytes holds), or ``CorruptSession``:
    decoded in one pass when laid out as a writer lays it out, else in full."""
    split = split_record(payload) if len(payload) <= max_bytes else None
    if split is None:
        return parse_record(session_id, decode_record(session_id, payload, max_bytes), payload)
    return parse_record(session_id, split[0], payload, split[1])


def parse_record(
    session_id: str,
    data: dict[str, Any],
    payload: bytes | None = None,
    prefix_end: int | None = None,
) -> Record:
    """``data`` (a decoded record; ``payload``: the bytes it was decoded from, whose
    prefix ends at ``prefix_end`` when the caller found where) checked and typed, or
    ``CorruptSession``."""
    if data.get("format") != RECORD_FORMAT:
        raise corrupt(session_id, "format", f"{data.get('format')!r} is not {RECORD_FORMAT!r}")
    version = data.get("version")
    if version not in READABLE_VERSIONS or type(version) is not int:
        readable = ", ".join(map(str, READABLE_VERSIONS))
        raise corrupt(
            session_id,
            "version",
            f"{version!r:.40} is not supported (this engine reads {readable})",
        )
    if data.get("session_id") != session_id:
        raise corrupt(
            session_id,
            "session_id",
            f"it holds session {data.get('session_id')!r}, not this one",
        )
    header = _header(session_id, data)
    snapshot = data.get("snapshot")
    if not isinstance(snapshot, dict):
        raise corrupt(
            session_id, "snapshot", f"must be a JSON object, got {type(snapshot).__name__}"
        )
    incarnation = data.get("incarnation")  # absent in records written before it existed
    if incarnation is not None and (type(incarnation) is not str or not incarnation):
        raise corrupt(
            session_id, "incarnation", f"must be a non-empty str, got {incarnation!r:.40}"
        )
    journal: list[Any] = []
    if version == 1:  # the snapshot is current: its ages are the record's
        raw_elapsed, raw_finished = snapshot.get("elapsed_s"), snapshot.get("finished_at")
        # checked when the snapshot is restored, which a worker does before using them
        elapsed = float(raw_elapsed) if _finite(raw_elapsed) else 0.0  # type: ignore[arg-type]
        finished = float(raw_finished) if _finite(raw_finished) else None  # type: ignore[arg-type]
    else:
        elapsed, finished = _ages(session_id, data)
        journal = data.get("journal")  # type: ignore[assignment]
        if type(journal) is not list:
            raise corrupt(session_id, "journal", f"must be a list, got {type(journal).__name__}")
        if len(journal) > MAX_JOURNAL:
            raise corrupt(session_id, "journal", f"{len(journal)} entries, more than {MAX_JOURNAL}")
    if payload is None or version < 2:
        prefix_end = None
    elif prefix_end is None:
        prefix_end = _prefix_end(payload, len(journal))
    return Record(
        session_id,
        snapshot,
        incarnation=incarnation,
        version=version,
        elapsed_s=elapsed,
        finished_s=finished,
        journal=tuple(journal),
        entries=len(journal),
        prefix_end=prefix_end,
        payload=payload,
        appendable=(
            prefix_end is not None and version == RECORD_VERSION and len(journal) <= REPLAY_AT_MOST
        ),
        **header,
    )


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_not_json)


class _NoTail(Exception):
    """The bytes after a prefix are not a journal's end and a record's tail."""


def _split(payload: bytes, start: int, known: int) -> tuple[list[Any], int, dict[str, Any]]:
    """The journal entries after ``payload[:start]`` (a prefix holding ``known``
    entries), where the last of them ends, and the tail's keys; ``_NoTail`` unless the
    bytes there are exactly entries, ``]`` and an object of :data:`TAIL_KEYS`."""
    try:
        text = payload[start:].decode()
    except UnicodeDecodeError:
        raise _NoTail from None
    entries: list[Any] = []
    pos, end = 0, 0
    first = known == 0
    try:
        while True:
            char = text[pos : pos + 1]
            if char == "]":
                break
            if not first:
                if char != ",":
                    raise _NoTail
                pos += 1
            entry, pos = _DECODER.raw_decode(text, pos)
            entries.append(entry)
            end, first = pos, False
            if known + len(entries) > MAX_JOURNAL:
                raise _NoTail
        if text[pos : pos + 2] != "],":
            raise _NoTail
        tail = _DECODER.decode("{" + text[pos + 2 :])
    except (ValueError, RecursionError):
        raise _NoTail from None
    if type(tail) is not dict or tail.keys() != TAIL_KEYS:
        raise _NoTail
    return entries, start + len(text[:end].encode()), tail


_HEAD_KEYS_OUT = TAIL_KEYS | {"journal"}


def _journal_keys(payload: bytes) -> Iterator[int]:
    """Where the last four ``,"journal":[`` in ``payload`` begin, the last first (host
    data may hold the same bytes, later in the record than the record's own)."""
    at = len(payload)
    for _ in range(4):
        at = payload.rfind(_JOURNAL, 0, at)
        if at < 0:
            return
        yield at


def split_record(payload: bytes) -> tuple[dict[str, Any], int] | None:
    """``json.loads(payload)`` and where its prefix ends, decoding each byte once, for a
    record laid out as a worker writes it (the keys before the journal, the journal, then
    exactly :data:`TAIL_KEYS`); ``None`` for any other bytes (then decoded in full,
    which names what is wrong). The layout is checked so that the pieces decoded here
    are the whole record's JSON and nothing else: the text before the journal is a JSON
    object with neither the journal's nor the tail's keys, and the journal's entries and
    the tail follow it up to the end."""
    for at in _journal_keys(payload):
        try:
            head = _DECODER.decode(payload[:at].decode() + "}")
        except (ValueError, RecursionError):  # not the record's own journal key
            continue
        if type(head) is not dict or not head.keys().isdisjoint(_HEAD_KEYS_OUT):
            return None
        start = at + len(_JOURNAL)
        try:
            entries, end, tail = _split(payload, start, 0)
        except _NoTail:
            return None
        head["journal"] = entries
        head.update(tail)
        return head, end if entries else start
    return None


def _prefix_end(payload: bytes, entries: int) -> int | None:
    """Where the prefix of a record read in full ends, if its bytes show exactly where
    the journal's entries end (a record written by a worker always does)."""
    for at in _journal_keys(payload):
        start = at + len(_JOURNAL)
        try:
            found, end, _ = _split(payload, start, 0)
        except _NoTail:
            continue
        return (end if found else start) if len(found) == entries else None
    return None


def extend(record: Record, payload: bytes) -> Record | None:
    """The record in ``payload`` if its bytes begin with ``record``'s prefix: ``record``
    with the new entries and tail read from what follows (only they are decoded), or
    ``None`` if the bytes there are not a journal's end and a tail."""
    known, end = record.payload, record.prefix_end
    if known is None or end is None or len(payload) <= end:
        return None
    if not payload.startswith(memoryview(known)[:end]):
        return None
    try:
        entries, end, tail = _split(payload, end, record.entries)
    except _NoTail:
        return None
    session_id = record.session_id
    header = _header(session_id, tail)
    elapsed, finished = _ages(session_id, tail)
    return Record(
        session_id,
        record.snapshot,
        incarnation=record.incarnation,
        version=record.version,
        elapsed_s=elapsed,
        finished_s=finished,
        journal=tuple(entries),  # only the new ones: the rest are in the state it extends
        entries=record.entries + len(entries),
        prefix_end=end,
        payload=payload,
        appendable=record.version == RECORD_VERSION and len(entries) <= REPLAY_AT_MOST,
        **header,
    )
