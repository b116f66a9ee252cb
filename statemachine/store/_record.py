"""The record a store keeps per session: the engine's snapshot plus what the workers
need to share it safely.

::

    {"format": "statemachine.store.record", "version": 1, "session_id": "conv-42",
     "saved_at": 1764452000.5,          # wall clock of the write (idle-time accounting)
     "keys": [[7, "evt-9"], ...],       # recent idempotency keys, with the version each made
     "claim": {"owner": "w1", "calls": ["c1"], "until": 1764452300.5} | null,
     "carried": [ToolOutcome, ...],     # interrupted outcomes waiting for re-run ones
     "incarnation": "9f2c...",          # drawn at create: tells a re-created id apart
     "snapshot": {...}}                 # Session.snapshot()

Every check here raises ``CorruptSession`` naming the session and the key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import attrs

from ..core._codec import decode, encode
from ..core._exceptions import SnapshotError
from ..core._session import Session
from ..core._state import TextCache, json_text
from ..core._tool_calls import ToolCall, ToolOutcome
from ..core._trace import TraceRecord
from ._core import CorruptSession

RECORD_FORMAT = "statemachine.store.record"
RECORD_VERSION = 1
_HEAD = f'{{"format":{json_text(RECORD_FORMAT)},"version":{RECORD_VERSION},"session_id":'
MAX_KEYS = 16
"""How many recent idempotency keys a record remembers."""


@attrs.frozen
class Claim:
    """Tool calls handed to ``owner``, who may run them until ``until`` (wall clock)."""

    owner: str
    calls: tuple[str, ...]
    until: float


@attrs.frozen
class Record:
    """One session's record. Read from a store it holds the decoded ``snapshot``;
    written by a :class:`~statemachine.store.Worker` it holds the snapshot's JSON
    text instead (``snapshot_text``, built from what changed since the last write)
    and the ``cache`` that built it."""

    session_id: str
    snapshot: dict[str, Any] | None
    saved_at: float
    keys: tuple[tuple[int, str], ...] = ()
    claim: Claim | None = None
    carried: tuple[ToolOutcome, ...] = ()
    incarnation: str | None = None
    """Drawn when the session is created under its id, kept by every write: a session
    deleted and created again under the same id is another incarnation, so a write
    computed from the old one is refused even at the same version."""
    snapshot_text: str | None = attrs.field(default=None, repr=False)
    cache: TextCache | None = attrs.field(default=None, eq=False, repr=False)
    """What built ``snapshot_text``: the next write of the same session reuses it."""
    payload: bytes | None = attrs.field(default=None, eq=False, repr=False)
    """The bytes a store holds for this record, when known (read, or built to write)."""
    elapsed_s: float = 0.0
    """The snapshot's ``elapsed_s``, as written."""
    finished_s: float | None = None
    """The snapshot's ``finished_at`` (seconds since the last turn finished), as written."""

    def __attrs_post_init__(self) -> None:
        if self.payload is None and self.snapshot_text is not None:  # written here: its bytes
            object.__setattr__(self, "payload", self.to_payload())

    def _header(self) -> dict[str, Any]:
        claim = self.claim
        return {
            "format": RECORD_FORMAT,
            "version": RECORD_VERSION,
            "session_id": self.session_id,
            "saved_at": self.saved_at,
            "keys": [list(pair) for pair in self.keys],
            "claim": None
            if claim is None
            else {"owner": claim.owner, "calls": list(claim.calls), "until": claim.until},
            "carried": encode(self.carried),
            "incarnation": self.incarnation,
        }

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON data."""
        snapshot = self.snapshot
        if snapshot is None:
            snapshot = json.loads(self.snapshot_text or "null")
        return {**self._header(), "snapshot": snapshot}

    def to_payload(self) -> bytes:
        """``json_text(self.to_json())`` as UTF-8: what a store keeps, byte for byte."""
        text = self.snapshot_text
        if text is None:
            text = json_text(self.snapshot)
        claim = self.claim
        return (
            f"{_HEAD}{json_text(self.session_id)}"
            f',"saved_at":{json_text(self.saved_at)}'
            f',"keys":{json_text(self.keys) if self.keys else "[]"}'
            ',"claim":'
            + (
                "null"
                if claim is None
                else json_text({"owner": claim.owner, "calls": claim.calls, "until": claim.until})
            )
            + f',"carried":{json_text(encode(self.carried)) if self.carried else "[]"}'
            f',"incarnation":{json_text(self.incarnation)},"snapshot":{text}}}'
        ).encode()

    def restore(
        self,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        observers: tuple[Callable[[TraceRecord], None], ...],
        idle_s: float,
        doom_check: Callable[[tuple[ToolCall, ...]], bool] | None = None,
    ) -> Session:
        """The session in this record; ``idle_s`` is added to its elapsed time."""
        data = self.snapshot
        if data is None:
            data = self.to_json()["snapshot"]
        if idle_s > 0:
            elapsed = data.get("elapsed_s")
            if isinstance(elapsed, int | float) and not isinstance(elapsed, bool):
                data = {**data, "elapsed_s": elapsed + idle_s}
            finished = data.get("finished_at")  # seconds since the last Finish: idle too
            if isinstance(finished, int | float) and not isinstance(finished, bool):
                data = {**data, "finished_at": finished + idle_s}
        try:
            return Session.restore(
                data, clock, wall_clock=wall_clock, observers=observers, doom_check=doom_check
            )
        except SnapshotError as exc:
            raise CorruptSession(
                f"session {self.session_id!r}: the stored snapshot is unusable: snapshot.{exc}",
                session_id=self.session_id,
            ) from None


def _bad(session_id: str, key: str, what: str) -> CorruptSession:
    return CorruptSession(
        f"session {session_id!r}: the stored record's {key}: {what}", session_id=session_id
    )


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_record(session_id: str, data: dict[str, Any], payload: bytes | None = None) -> Record:
    """``data`` (a decoded record; ``payload``: the bytes it was decoded from) checked and
    typed, or ``CorruptSession``."""
    if data.get("format") != RECORD_FORMAT:
        raise _bad(session_id, "format", f"{data.get('format')!r} is not {RECORD_FORMAT!r}")
    version = data.get("version")
    if version != RECORD_VERSION or isinstance(version, bool):
        raise _bad(
            session_id, "version", f"{version!r} is not supported (this is {RECORD_VERSION})"
        )
    if data.get("session_id") != session_id:
        raise _bad(
            session_id,
            "session_id",
            f"it holds session {data.get('session_id')!r}, not this one",
        )
    saved_at = data.get("saved_at")
    if not _finite(saved_at):
        raise _bad(session_id, "saved_at", f"must be a finite number, got {saved_at!r}")
    keys = data.get("keys")
    if not isinstance(keys, list) or not all(
        isinstance(pair, list)
        and len(pair) == 2
        and isinstance(pair[0], int)
        and not isinstance(pair[0], bool)
        and isinstance(pair[1], str)
        for pair in keys
    ):
        raise _bad(session_id, "keys", f"must be a list of [version, key] pairs, got {keys!r}")
    claim = data.get("claim")
    parsed_claim = None
    if claim is not None:
        if (
            not isinstance(claim, dict)
            or not isinstance(claim.get("owner"), str)
            or not isinstance(claim.get("calls"), list)
            or not all(isinstance(c, str) for c in claim["calls"])
            or not _finite(claim.get("until"))
        ):
            raise _bad(session_id, "claim", f"must be owner/calls/until, got {claim!r}")
        parsed_claim = Claim(claim["owner"], tuple(claim["calls"]), float(claim["until"]))
    carried = data.get("carried")
    if not isinstance(carried, list):
        raise _bad(session_id, "carried", f"must be a list, got {carried!r}")
    try:
        outcomes = decode(carried, "carried")
    except ValueError as exc:
        raise _bad(session_id, "carried", str(exc)) from None
    if not all(isinstance(o, ToolOutcome) for o in outcomes):
        raise _bad(session_id, "carried", "must hold ToolOutcome values")
    snapshot = data.get("snapshot")
    if not isinstance(snapshot, dict):
        raise _bad(session_id, "snapshot", f"must be a JSON object, got {type(snapshot).__name__}")
    incarnation = data.get("incarnation")  # absent in records written before it existed
    if incarnation is not None and (type(incarnation) is not str or not incarnation):
        raise _bad(session_id, "incarnation", f"must be a non-empty str, got {incarnation!r:.40}")
    assert isinstance(saved_at, int | float)  # noqa: S101 - narrowed by _finite above
    elapsed, finished = snapshot.get("elapsed_s"), snapshot.get("finished_at")
    return Record(
        session_id,
        snapshot,
        float(saved_at),
        tuple((pair[0], pair[1]) for pair in keys),
        parsed_claim,
        outcomes,
        incarnation,
        payload=payload,
        # checked when the snapshot is restored, which a worker does before using them
        elapsed_s=float(elapsed) if isinstance(elapsed, int | float) and _finite(elapsed) else 0.0,
        finished_s=float(finished)
        if isinstance(finished, int | float) and _finite(finished)
        else None,
    )
