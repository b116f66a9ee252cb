"""The sessions a worker holds: read from its store, written back with compare-and-set,
and remembered between calls.

The next call at the version held takes the session from memory instead of reading and
restoring it (the compare-and-set still proves the store holds that version and
incarnation). Reading back the very bytes it wrote, a worker decodes nothing; finding
them grown by other workers' journal entries, it replays only those.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TypeVar

from ..core._actions import Action, Finish, InvokeTools
from ..core._session import Session
from ..core._tool_calls import ToolOutcome
from ._core import DEFAULT_MAX_BYTES, SessionStore
from ._errors import UNREADABLE, CorruptSession
from ._journal import check_record, read_session, replay_record
from ._memory import InMemoryStore
from ._record import COMPACT_EVERY, Claim, Record, extend, parse_record, read_record, written
from ._redis import RedisStore

_T = TypeVar("_T")
_LARGEST = sys.float_info.max


class Live:
    """A session a worker holds: the ``record`` it last read or wrote, at ``version``,
    and the ``session`` that record holds. Whoever takes one out of the worker's memory
    owns it until it puts it back (nothing else reads or steps it meanwhile)."""

    __slots__ = ("record", "session", "tree", "version")

    def __init__(self, version: int, record: Record, session: Session) -> None:
        self.version = version
        self.record = record
        self.session = session
        self.tree = session.parent_id is not None
        """Whether the session is a child: its spend is reported up the tree."""


class Held:
    """The sessions a :class:`~statemachine.store.Worker` holds, over ``store``: read,
    written (the worker ``owner`` claims the tool calls of a write for ``lease_s``) and
    remembered (``remember`` at most, the least recently used forgotten first). A
    session's age is the seconds its record says it had lived at its last write, plus
    (``count_idle``) the Unix time (``now``) since; ``clock`` places a record of the
    previous release's readings."""

    def __init__(
        self,
        store: SessionStore,
        *,
        owner: str,
        lease_s: float,
        clock: Callable[[], float],
        now: Callable[[], float],
        count_idle: bool,
        remember: int,
    ) -> None:
        self.store = store
        self.owner = owner
        self.lease_s = lease_s
        self.clock = clock
        self.now = now
        self.count_idle = count_idle
        self.remember_at_most = remember
        self.max_bytes: int = getattr(store, "max_bytes", DEFAULT_MAX_BYTES)
        self.max_prefix = self.max_bytes // 2
        """A record whose prefix would grow past this is written as a snapshot anew."""
        # Our own stores take and give the record as bytes: a worker appends to them,
        # and knows them again when it reads them back. Any other store (a subclass of
        # ours included) gets and gives the record as JSON data, its snapshot anew.
        self.payload_cas: Callable[..., int] | None = None
        self.payload_load: Callable[[str], tuple[int, bytes]] | None = None
        if type(store) in (InMemoryStore, RedisStore):
            self.payload_cas = store.compare_and_set_payload  # type: ignore[attr-defined]
            self.payload_load = store.load_payload  # type: ignore[attr-defined]
        self.live: dict[str, Live] = {}
        """The session held per id. Threads share it with no lock: a session is taken
        out by one ``pop`` (one thread gets it) and put back by one assignment."""

    def age(self, record: Record, wall: float) -> float:
        """The session's age at Unix time ``wall``, as ``record`` gives it (at most the
        largest float, whatever the record's wall time)."""
        age = record.elapsed_s
        if self.count_idle and wall > record.saved_at:
            age = min(age + (wall - record.saved_at), _LARGEST)
        return age

    def remember(self, session_id: str, live: Live) -> None:
        """Hold ``live`` as the session's latest (its record, version and session)."""
        at_most = self.remember_at_most
        if not at_most:
            return
        remembered = self.live
        # no lock: each of these dict operations is atomic, and list() copies the keys
        # at once (another thread may pop or put meanwhile: at worst one too many is kept)
        remembered.pop(session_id, None)  # put last: the least recently used go first
        remembered[session_id] = live
        if len(remembered) > at_most:
            over = len(remembered) - at_most
            for oldest in list(remembered)[:over]:
                remembered.pop(oldest, None)

    def recall(self, session_id: str, version: int, key: str | None) -> Live | None:
        """The session as the store holds it at ``version``, if it is the one held at
        that version (and ``key`` is not among its keys: a duplicate is answered from
        the store), taken out of memory."""
        live = self.live.pop(session_id, None)  # atomic: taken by one thread only
        if live is None:
            return None
        if live.version != version or (key is not None and live.record.has_key(key)):
            self.live.setdefault(session_id, live)  # unless another was remembered meanwhile
            return None
        return live

    def read(self, session_id: str) -> Live:
        """The stored version, record and session, taken out of memory (the caller puts
        it back with :meth:`remember`)."""
        if self.payload_load is None:
            stored = self.store.load(session_id)
            version, record = stored.version, parse_record(session_id, stored.record)
        else:
            version, payload = self.payload_load(session_id)
            known = self._known(session_id, version, payload)
            if known is not None:
                return known
            record = read_record(session_id, payload, self.max_bytes)
        legacy_start = 0.0
        if record.version < 3:  # its snapshot's retry_at may be a reading of a clock
            legacy_start = self.clock() - self.age(record, self.now())
        return Live(version, record, read_session(record, legacy_start))

    def _known(self, session_id: str, version: int, payload: bytes) -> Live | None:
        """The session in ``payload`` if it is the record held, or that record grown by
        journal entries (those entries replayed on the held session, and checked);
        ``None`` otherwise (it is then read in full)."""
        live = self.live.pop(session_id, None)
        if live is None:
            return None
        record = live.record
        if record.payload == payload:
            live.version = version
            return live
        grown = extend(record, payload)
        if grown is None:
            return None
        try:
            if grown.journal:
                replay_record(live.session, grown, grown.journal, record.entries)
            check_record(grown, live.session)
        except CorruptSession:
            return None  # read in full, which says what is wrong
        return Live(version, grown, live.session)

    def peek(self, session_id: str, read: Callable[[Session], _T]) -> _T | None:
        """``read(session)`` of the stored session ``session_id``, taken before the
        session is put back (from then on another thread may step it); ``None`` when it
        cannot be read."""
        try:
            live = self.read(session_id)
        except UNREADABLE:
            return None
        value = read(live.session)
        self.remember(session_id, live)
        return value

    def write(
        self,
        session_id: str,
        live: Live,
        entries: list[str],
        wall: float,
        action: Action | None,
        *,
        age: float | None = None,
        keys: tuple[tuple[int, str], ...] | None = None,
        claim: Claim | None = None,
        carried: tuple[ToolOutcome, ...] = (),
        limit: int | None = None,
    ) -> None:
        """Write ``live``'s session (the journal's frame) after the steps of ``entries``,
        ``age`` seconds old (by default, as its record says) at Unix time ``wall``, over
        the version ``live`` holds (0: a new session): the record
        (:func:`~._record.written`, its journal holding at most ``limit`` entries,
        :data:`~._record.COMPACT_EVERY` by default; ``keys`` by default the record's) and
        the compare-and-set, ``live`` then holding the version and record written. A
        pending ``action`` that invokes tools is claimed by the worker. ``StaleWrite`` if
        the store moved on (``live`` is then the caller's to drop)."""
        previous, session = (live.record if live.version else None), live.session
        if age is None:
            age = self.age(live.record, wall)
        if type(action) is InvokeTools and claim is None and action.calls:
            claim = Claim(self.owner, tuple(c.id for c in action.calls), wall + self.lease_s)
        cas = self.payload_cas
        if cas is None:
            limit = -1  # a store of JSON data: the snapshot anew
        elif limit is None:
            limit = COMPACT_EVERY
        # no turn runs after a turn's Finish (or between turns: no action then): the
        # session may have ended, and its last turn finished
        between = type(action) is Finish or action is None
        record = written(
            previous,
            session_id,
            session,
            entries,
            wall,
            age,
            session.finished_at if between else None,
            live.record.keys if keys is None else keys,
            claim,
            carried,
            limit,
            self.max_prefix,
        )
        ended = between and session.status is not None
        if cas is not None:
            version = cas(session_id, live.version, record.payload, record.incarnation, ended)
        else:
            data = json.loads(record.payload)  # type: ignore[arg-type]
            version = self.store.compare_and_set(session_id, live.version, data, ended=ended)
        live.version, live.record = version, record
