"""``Session`` and ``Turn``: the handles a host holds.

A session owns one :class:`~statemachine.core._engine.Core`, which owns the declared
state; a :class:`Turn` is a handle onto the session's current turn, and a handle that a
later ``new_turn()`` replaced refuses every event, changing nothing. Every step takes its
moment as ``at=`` (the session's monotonic clock) and, for ``send``, ``wall=`` (Unix
time); left out, the handle reads the session's ``clock`` and ``wall_clock``. A session
built with ``clock=None`` reads no clock at all, like h11.
"""

from __future__ import annotations

import copy
import enum
import operator
import secrets
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, NoReturn, TypeVar, overload

from ._actions import Action, Finish
from ._engine import (
    DISPATCH,
    TRIGGERS,
    Core,
    Dispatch,
    DoomCheck,
    Observer,
    doom_facts,
    last_reading,
    model_of,
    refused,
    turn_record,
    wall_reading,
)
from ._events import ModelReplied
from ._exceptions import ConfigError, IllegalEvent, SessionEnded, TurnInProgress
from ._json_data import finite, json_problem
from ._model_error import ModelError
from ._reachable import check_reachable
from ._settings import Settings
from ._snapshot import read_snapshot, write_snapshot
from ._state import (
    SessionState,
    TurnState,
    copy_session_state,
    decode_state,
    encode_state,
    shift_fits,
    shift_state,
)
from ._table import CALLING, IDLE, TERMINAL_STATES
from ._taxonomy import END_STATUSES, SessionStatus, TurnStatus
from ._trace import TraceRecord

__all__ = ["Observer", "Session", "Turn"]

_DEFAULT_SETTINGS = Settings()


Clock = Callable[[], float]


def _check_hooks(clock: object, wall_clock: object, doom_check: object) -> None:
    """Refuse a clock or a doom check that is neither callable nor ``None``."""
    if (clock is not None and not callable(clock)) or (
        wall_clock is not None and not callable(wall_clock)
    ):
        raise ConfigError(
            "clock: clock and wall_clock must be callables returning seconds, or None"
        )
    if doom_check is not None and not callable(doom_check):
        raise ConfigError(f"doom_check: must be a callable or None, got {doom_check!r:.60}")


def _no_clock(what: str) -> TypeError:
    return TypeError(
        f"at: the session has no clock (clock=None), so {what} must say when it happens: "
        "pass at=<the session clock's reading, in seconds>"
    )


_SEED_MASK = 0xFFFFFFFFFFFFFFFF


class _WallClock(enum.Enum):
    """What ``Turn.send`` takes as ``wall`` when it is left out."""

    READ = "read the session's wall clock"


_READ_WALL_CLOCK = _WallClock.READ


def _moment(clock: Clock | None, core: Core, at: object, what: str) -> float:
    """The moment of ``what``: ``at``, or ``clock``'s reading; checked and clamped."""
    if at is None:
        if clock is None:
            raise _no_clock(what)
        at = clock()
    if type(at) is float and core.last <= at < core.ceiling:
        return at  # as Turn.send takes it
    return core.reading(at)


def _start_reading(value: object, name: str = "started") -> float:
    """A clock reading that anchors a session (its start, a restore's now): a finite
    number of seconds, or the error that names it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not finite(value):
        raise ConfigError(f"{name}: must be a finite number of seconds, got {value!r:.60}")
    return float(value)


_T = TypeVar("_T")


class _Reads(property, Generic[_T]):
    """A read-only attribute of a handle: the value at ``path`` from it (a property
    whose getter is ``operator.attrgetter``)."""

    def __init__(self, path: str, doc: str) -> None:
        super().__init__(operator.attrgetter(path))
        self.__doc__ = doc  # a property subclass would show its own docstring

    if TYPE_CHECKING:

        @overload
        def __get__(self, handle: None, owner: type | None = None) -> _Reads[_T]: ...
        @overload
        def __get__(self, handle: object, owner: type | None = None) -> _T: ...
        def __get__(self, handle: object, owner: type | None = None) -> Any: ...


class Session:
    """The turns of one conversation.

    ``seed`` seeds the jitter (a 64-bit unsigned int; an int outside that range is
    taken modulo 2**64); left out, the session draws its own from the operating system,
    so sessions made alike do not retry in step. It is kept in the snapshot, and a
    replay takes the recorded one.

    ``clock`` is a monotonic clock in seconds and ``wall_clock`` Unix time, read only to
    measure an HTTP-date ``retry-after``. With ``clock=None`` every step must pass
    ``at=``, and ``started`` (default 0.0) is the session's start on the host's clock.
    ``observers`` receive every :class:`TraceRecord` as it happens; an observer's
    exception propagates to the caller of ``send()``, after the transition.
    ``session_id`` names the session in its tree; ``doom_check`` is the second-tier
    doom-loop check (:data:`DoomCheck`), whose ``True`` fires ``error_doom_loop``.

    Same settings, seed, events and moments (and a deterministic ``doom_check``): the
    same actions, bit for bit.
    """

    __slots__ = ("__weakref__", "_core", "_handle", "clock", "wall_clock")

    clock: Clock | None
    """The monotonic clock a step that leaves out ``at=`` is read from (``None``: none)."""
    wall_clock: Clock | None
    """The Unix-time clock a failure's step that leaves out ``wall=`` is read from."""

    def __init__(
        self,
        settings: Settings | None = None,
        seed: int | None = None,
        clock: Clock | None = time.monotonic,
        *,
        wall_clock: Clock | None = time.time,
        started: float | None = None,
        observers: Iterable[Observer] = (),
        dispatch: Dispatch = DISPATCH,
        session_id: str | None = None,
        doom_check: DoomCheck | None = None,
    ) -> None:
        if settings is None:
            settings = _DEFAULT_SETTINGS
        elif not isinstance(settings, Settings):
            raise ConfigError(f"settings: must be a Settings, got {settings!r}")
        if seed is None:
            seed = secrets.randbits(64)  # its own: sessions made alike jitter apart
        elif isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"seed: must be an int or None, got {seed!r}")
        _check_hooks(clock, wall_clock, doom_check)
        if session_id is not None and (
            not isinstance(session_id, str)
            or not session_id
            or json_problem(session_id) is not None
        ):
            raise ConfigError(
                f"session_id: must be a non-empty str or None, got {session_id!r:.60}"
            )
        if started is None:
            started = 0.0 if clock is None else clock()
        if type(started) is not float or started - started != 0.0:  # not a finite float
            started = _start_reading(started)
        state = SessionState(seed=seed & _SEED_MASK, started=started, session_id=session_id)
        self._core = Core(settings, state, tuple(observers), dispatch, doom_check, started)
        self.clock = clock
        self.wall_clock = wall_clock
        self._handle: Turn | None = None

    @classmethod
    def from_state(
        cls,
        settings: Settings,
        state: SessionState,
        clock: Clock | None,
        *,
        wall_clock: Clock | None = time.time,
        observers: Iterable[Observer] = (),
        dispatch: Dispatch = DISPATCH,
        check: bool = True,
        doom_check: DoomCheck | None = None,
    ) -> Session:
        """A session that takes over ``state`` (a declared :class:`SessionState`, such as
        a copy from :attr:`state`), as the model checker explores.

        With ``check`` (the default) the state must be one the engine can reach under
        ``settings`` (:class:`SnapshotError` naming the field otherwise); the model
        checker, which only holds states the engine made, passes ``check=False``.
        """
        if not isinstance(settings, Settings):
            raise ConfigError(f"settings: must be a Settings, got {settings!r}")
        if not isinstance(state, SessionState):
            raise ConfigError(f"state: must be a SessionState, got {type(state).__name__}")
        _check_hooks(clock, wall_clock, doom_check)
        if check:  # every field by its kind, as restore reads it, then the whole state
            now = last_reading(state)
            state = decode_state(SessionState, encode_state(state, now), now)
            check_reachable(state, settings)
        core = Core(settings, state, tuple(observers), dispatch, doom_check)
        return cls._over(core, clock, wall_clock)

    @classmethod
    def _over(cls, core: Core, clock: Clock | None, wall_clock: Clock | None) -> Session:
        """A session handle over ``core``, with a turn handle for its current turn."""
        self = cls.__new__(cls)
        self._core = core
        self.clock = clock
        self.wall_clock = wall_clock
        turn = core.state.turn
        self._handle = None if turn is None else Turn(self, core, turn)
        return self

    def _reading(self) -> float:
        """The clock's reading now (the state's last one for a session with no clock)."""
        clock = self.clock
        return self._core.last if clock is None else self._core.reading(clock())

    # -- turns -----------------------------------------------------------------

    def new_turn(self, *, at: float | None = None) -> Turn:
        """The next turn, created (and the session's bounds checked) at ``at``: the
        final-answer turn once a limit has fired. It replaces the previous handle.

        Raises :class:`SessionEnded` once the session has ended, and
        :class:`TurnInProgress` while the current turn has not finished.
        """
        core = self._core
        turn = Turn(self, core, core.new_turn(_moment(self.clock, core, at, "new_turn()")))
        self._handle = turn
        return turn

    def end(
        self,
        status: SessionStatus | str = SessionStatus.COMPLETED,
        *,
        reason: str = "",
        at: float | None = None,
    ) -> Finish | None:
        """End the session on purpose at ``at``: ``completed`` (between turns),
        ``cancelled`` (the user interrupted) or ``failed`` (the host gives up).

        For ``cancelled`` and ``failed`` a running turn is cancelled first (its
        :class:`Finish` is returned) and every live child session ends ``cancelled``.
        ``completed`` while this session's or a live descendant's turn runs raises
        :class:`TurnInProgress` and changes nothing. Ending an ended session raises
        :class:`SessionEnded`.
        """
        try:
            chosen = SessionStatus(status)
        except ValueError:
            chosen = None
        if chosen not in END_STATUSES:
            names = ", ".join(sorted(s.value for s in END_STATUSES))
            raise ValueError(
                f"status: {status!r:.60} is not a status a host ends a session with "
                f"(one of {names}); a limit's status is the engine's to set"
            )
        if not isinstance(reason, str) or json_problem(reason) is not None:
            raise ValueError(f"reason: must be valid text, got {reason!r:.60}")
        if chosen is SessionStatus.COMPLETED and self._core.state.status is None:
            running = self._running_child()
            if running is not None:
                raise TurnInProgress(
                    f"child session {running.session_id!r} is running a turn (state "
                    f"{running.current_turn.state!r}): a session completes when no child's "  # type: ignore[union-attr]
                    "turn runs; end it cancelled or failed to abandon its children's turns"
                )
        return self._core.end(chosen, reason, _moment(self.clock, self._core, at, "end()"))

    def _running_child(self, depth: int = 0) -> Session | None:
        """A live descendant whose turn is running, if any."""
        for ref in self._core.children or ():
            child: Session | None = ref()
            if child is None or child.status is not None:
                continue
            turn = child.current_turn
            if turn is not None and turn.state != IDLE and not turn.done:
                return child
            # the tree is this class's own: a child is walked as this session is
            found = Session._running_child(child, depth + 1) if depth < 64 else None
            if found is not None:
                return found
        return None

    def spawn(
        self,
        settings: Settings | None = None,
        *,
        seed: int | None = None,
        session_id: str | None = None,
        observers: Iterable[Observer] = (),
        doom_check: DoomCheck | None = None,
        at: float | None = None,
    ) -> Session:
        """A child session (a sub-agent), started at ``at``, whose spend is charged
        here and at every ancestor too.

        Its remaining budget is the smaller of its own ``max_cost_usd`` (``settings``
        default to this session's) and its ancestors' remaining budget, so it takes its
        own limit-reached path before it can outspend them. Its id defaults to
        ``"<this id>.<n>"``, its seed is derived from this session's, and it shares the
        clocks. Across processes, report a child's total with :meth:`record_child_spend`.
        """
        core = self._core
        state = core.state
        if state.status is not None:
            raise SessionEnded(
                f"the session has ended ({state.status.value}): it spawns no child",
                status=state.status,
            )
        number = state.children + 1
        parent_id = state.session_id or "session"
        taken = state.child_costs or {}
        child_id = session_id
        if child_id is None:
            serial = number
            while f"{parent_id}.{serial}" in taken:
                serial += 1
            child_id = f"{parent_id}.{serial}"
        if child_id == parent_id or child_id in taken:
            raise ConfigError(f"session_id: {child_id!r} is taken in this session's tree")
        if seed is None:
            seed = (state.seed * 0x9E3779B97F4A7C15 + number) & _SEED_MASK
        child = Session(
            settings if settings is not None else core.settings,
            seed,
            self.clock,
            wall_clock=self.wall_clock,
            started=_moment(self.clock, self._core, at, "spawn()"),
            observers=observers,
            dispatch=core.dispatch,
            session_id=child_id,
            doom_check=doom_check,
        )
        child_core = child._core
        state.session_id = parent_id
        state.children = number
        state.child_costs = {**(state.child_costs or {}), child_id: 0.0}
        child_core.parent = core
        child_core.state.parent_id = parent_id
        child_core.state.ancestor_budget_usd = core.remaining_budget_usd()
        if core.children is None:
            core.children = []
        core.children.append(weakref.ref(child))
        return child

    def record_child_spend(self, child_id: str, total_usd: float) -> None:
        """Report that child ``child_id`` has spent ``total_usd`` in all (descendants
        included): what is new since the last report is charged here and at the live
        ancestors; a total no larger changes nothing, so a report may repeat or be late."""
        if (
            isinstance(total_usd, bool)
            or not isinstance(total_usd, int | float)
            or not finite(total_usd)
            or total_usd < 0
        ):
            raise ConfigError(f"total_usd: must be a finite number >= 0, got {total_usd!r:.60}")
        if not isinstance(child_id, str) or child_id not in (self._core.state.child_costs or {}):
            raise ConfigError(
                f"child_id: {child_id!r} is not a child this session spawned "
                f"(its children: {', '.join(sorted(self._core.state.child_costs or {})) or 'none'})"
            )
        self._core.record_child_spend(child_id, float(total_usd))

    def record_ancestor_budget(self, remaining_usd: float | None) -> None:
        """Report the smallest budget left on the path to the root, as a parent in
        another process reads it now (``None``: no ancestor has one); it bounds this
        child's spend from here on. A root session has no ancestors: ``ConfigError``."""
        core = self._core
        if core.state.parent_id is None:
            raise ConfigError("remaining_usd: this session has no parent, so no ancestors' budget")
        if remaining_usd is not None and (
            isinstance(remaining_usd, bool)
            or not isinstance(remaining_usd, int | float)
            or not finite(remaining_usd)
        ):
            raise ConfigError(
                f"remaining_usd: must be a finite number or None, got {remaining_usd!r:.60}"
            )
        core.record_ancestor_budget(None if remaining_usd is None else float(remaining_usd))

    # -- what the session holds -------------------------------------------------

    settings: _Reads[Settings] = _Reads("_core.settings", "The session's settings.")

    @property
    def state(self) -> SessionState:
        """A copy of the session's declared state (changing it changes nothing)."""
        return copy_session_state(self._core.state)

    seed: _Reads[int] = _Reads("_core.state.seed", "The jitter seed (as a 64-bit unsigned int).")
    status: _Reads[SessionStatus | None] = _Reads(
        "_core.state.status", "``None`` while the session can go on; then the limit that ended it."
    )
    limit_reached: _Reads[SessionStatus | None] = _Reads(
        "_core.state.limit",
        "The limit that has fired, from the moment it fires (``None``: none has).",
    )
    current_turn: _Reads[Turn | None] = _Reads(
        "_handle", "The latest turn (after ``restore``: the restored one)."
    )
    turns: _Reads[int] = _Reads(
        "_core.state.turns", "How many turns have been created, the final-answer turn included."
    )
    retries_used: _Reads[int] = _Reads(
        "_core.state.retries", "Retries (waits and fallbacks) taken across the session."
    )
    waited_s: _Reads[float] = _Reads(
        "_core.state.waited_s",
        "Seconds of backoff the session's ``Wait`` actions asked for, summed.",
    )
    cost_usd: _Reads[float] = _Reads(
        "_core.state.cost_usd",
        "Every cost charged so far, children's included: what ``max_cost_usd`` bounds.",
    )

    @property
    def own_cost_usd(self) -> float:
        """What this session's own calls cost (``cost_usd`` less its children's)."""
        state = self._core.state
        return max(0.0, state.cost_usd - sum((state.child_costs or {}).values()))

    @property
    def child_costs(self) -> Mapping[str, float]:
        """Each child's total spend, as last reported, by child id."""
        return dict(self._core.state.child_costs or {})

    @property
    def remaining_budget_usd(self) -> float | None:
        """The smallest remaining ``max_cost_usd`` on the path to the root (``None``:
        unbounded)."""
        return self._core.remaining_budget_usd()

    session_id: _Reads[str | None] = _Reads(
        "_core.state.session_id", "The session's id in its tree."
    )
    parent_id: _Reads[str | None] = _Reads(
        "_core.state.parent_id", "The parent's id, for a child session."
    )
    tool_retries: _Reads[int] = _Reads(
        "_core.state.tool_retries", "Re-invocations of conflicting tool calls across the session."
    )
    denials: _Reads[int] = _Reads(
        "_core.state.denials",
        "Consecutive ``permission_denied`` outcomes (for the denial breaker).",
    )

    @property
    def idle_s(self) -> float:
        """Seconds the session spent between turns (a Finish to the next start), up to
        now on its clock (a session with no clock: up to its last step)."""
        return self._core.idle_s(self._reading())

    @property
    def elapsed_s(self) -> float:
        """Seconds on the session's clock since it started, up to now (a session with
        no clock: up to its last step)."""
        return self._core.elapsed_s(self._reading())

    started: _Reads[float] = _Reads(
        "_core.state.started", "The session clock's reading when the session started."
    )
    finished_at: _Reads[float | None] = _Reads(
        "_core.state.finished_at",
        "The clock's reading when the last turn finished, while no turn runs (else ``None``).",
    )
    last_at: _Reads[float] = _Reads(
        "_core.last",
        "The latest moment the session holds: a step given an earlier ``at`` is taken then.",
    )
    tripped_providers: _Reads[frozenset[str]] = _Reads(
        "_core.state.tripped", "Tool providers whose circuit breaker is open; never invoked again."
    )

    @property
    def crash_counts(self) -> Mapping[str, int]:
        """Consecutive crashes per provider, where not zero (``ToolOutcome.crashed``)."""
        return dict(self._core.state.breakers or {})

    def __repr__(self) -> str:
        state = self._core.state
        return (
            f"<Session turns={state.turns} retries={state.retries} "
            f"status={state.status!s} limit={state.limit!s}>"
        )

    # -- snapshot ---------------------------------------------------------------

    def snapshot(self, *, at: float | None = None) -> dict[str, Any]:
        """The session as plain JSON data, current turn and its trace included, taken
        at ``at`` (default: the clock's reading; with no clock: its last step), its
        times written as seconds before ``at``. ``json.dumps(session.snapshot(),
        allow_nan=False)`` always works.
        """
        core = self._core
        if core.parent is not None:
            core.remaining_budget_usd()  # a live child records its ancestors' budget as it is
        now = self._reading() if at is None else core.reading(at)
        return write_snapshot(core.settings, core.state, now)

    def copy(
        self,
        *,
        clock: Clock | None = None,
        wall_clock: Clock | None = None,
        started: float | None = None,
        observers: Iterable[Observer] = (),
        doom_check: DoomCheck | None = None,
    ) -> Session:
        """An independent copy of the session (its turn, counters and jitter stream) on
        ``clock`` and ``wall_clock``, whose start lies at ``started`` on that clock
        (default: where this one's lies); every reading it holds moves with the start.
        A child's live parent and children stay with this session."""
        core = self._core
        _check_hooks(clock, wall_clock, doom_check)
        state = copy_session_state(core.state)
        if started is not None:
            delta = _start_reading(started) - state.started
            if not finite(delta) or not finite(core.last + delta) or not shift_fits(state, delta):
                raise ConfigError(
                    f"started: {started!r:.60} puts the session's readings beyond a float "
                    "(they move with its start)"
                )
            shift_state(state, delta)
        copy = Core(core.settings, state, tuple(observers), core.dispatch, doom_check)
        return Session._over(copy, clock, wall_clock)

    @classmethod
    def restore(
        cls,
        data: Mapping[str, Any],
        clock: Clock | None = time.monotonic,
        *,
        wall_clock: Clock | None = time.time,
        at: float | None = None,
        observers: Iterable[Observer] = (),
        doom_check: DoomCheck | None = None,
    ) -> Session:
        """A session that continues exactly where ``data`` (from ``snapshot()``)
        stopped, its times put on ``clock`` as of ``at`` (required with ``clock=None``).

        Accepts exactly the states the engine can reach (snapshot formats 1 to 5);
        anything else raises :class:`SnapshotError` naming the key. ``doom_check`` is
        not data: pass it again. A restored child has no live parent: its spend reaches
        its ancestors through :meth:`record_child_spend`.
        """
        _check_hooks(clock, wall_clock, doom_check)
        if at is None:
            if clock is None:
                raise _no_clock("restore()")
            at = clock()
        settings, state = read_snapshot(data, _start_reading(at, "at"))
        core = Core(settings, state, tuple(observers), DISPATCH, doom_check)
        return cls._over(core, clock, wall_clock)


class Turn:
    """One turn of a :class:`Session` (``Session.new_turn()``): ``start()``, then
    ``send(event)`` until a :class:`Finish`. An event that is not legal in the current
    state, or sent to a turn that is no longer current, raises :class:`IllegalEvent`
    and changes nothing.
    """

    __slots__ = ("_core", "_session", "_turn")

    def __init__(self, session: Session, core: Core, turn: TurnState) -> None:
        self._session = session
        self._core = core
        self._turn = turn

    # -- the protocol ------------------------------------------------------

    def start(self, *, at: float | None = None) -> Action:
        """Start the turn at ``at`` (default: the clock's reading); returns its first
        action (an :class:`Assemble`)."""
        core = self._core
        if core.state.turn is not self._turn:
            self._refuse("start")
        status = core.state.status
        if status is not None:  # ended on purpose before this turn started
            raise SessionEnded(
                f"start: turn {self._turn.index} belongs to a session that has ended "
                f"({status.value})",
                status=status,
            )
        if at is None:
            clock = self._session.clock
            if clock is None:
                raise _no_clock("start()")
            at = clock()
        if type(at) is not float or not core.last <= at < core.ceiling:  # as send takes it
            at = core.reading(at)
        return core.start(self._turn, at)

    def send(
        self,
        event: object,
        *,
        at: float | None = None,
        wall: float | _WallClock | None = _READ_WALL_CLOCK,
    ) -> Action:
        """Take ``event``, which happened at ``at`` on the session's clock and at Unix
        time ``wall``; return the next action (a :class:`Finish` at the end). A reply
        is sent as :meth:`judged` gives it.

        ``wall=None``: the step has no wall time (an HTTP-date ``retry-after`` with no
        ``date`` header is then unusable); left out, the wall clock is read, only for a
        ``ModelFailed`` with headers. So ``wall=record.wall`` replays a trace's step."""
        core = self._core
        turn = self._turn
        trigger = TRIGGERS.get(type(event))
        if trigger is None or core.state.turn is not turn:
            self._refuse_event(event)
        if at is None:
            clock = self._session.clock
            if clock is None:
                raise _no_clock("send()")
            at = clock()
        # a float at or after the last reading, a number of seconds from the start: as it
        # is (NaN, infinity and the rest go through the checks of Core.reading)
        if type(at) is not float or not core.last <= at < core.ceiling:
            at = core.reading(at)
        if trigger == "ModelReplied" and (
            core.doom_check is not None or event.doom_verdict is not None  # type: ignore[attr-defined]
        ):
            event = self.judged(event)  # type: ignore[arg-type]
        given: float | None = None
        if wall is _READ_WALL_CLOCK:
            if trigger == "ModelFailed" and event.error.headers is not None:  # type: ignore[attr-defined]
                wall_clock = self._session.wall_clock  # an HTTP-date retry-after may need it
                if wall_clock is not None:
                    given = wall_reading(wall_clock())
        elif wall is not None:
            given = wall_reading(wall)
        return core.fire(turn, trigger, event, at, given)

    def judged(self, event: ModelReplied, check: DoomCheck | None = None) -> ModelReplied:
        """``event``, a reply to this turn, as :meth:`send` gives it to the engine: where
        its calls reach the doom-loop detector and it holds no verdict, with the verdict
        of ``check`` (default: the session's ``doom_check``) in ``doom_verdict``,
        ``check`` asked only where a verdict is due (``False`` elsewhere). A verdict it
        holds already is taken as it is; ``True`` where none is due is refused
        (:class:`IllegalEvent`). Changes nothing: a ``check`` that raises or returns no
        bool (``TypeError``) leaves the turn as it was."""
        core, state = self._core, self._turn
        if type(event) is not ModelReplied:
            raise TypeError(f"judged: takes a ModelReplied, got {type(event).__name__}")
        if core.state.turn is not state:
            self._refuse("ModelReplied")
        verdict = event.doom_verdict
        facts = None
        if state.state == CALLING:  # the only state a reply is legal in (the engine says so)
            facts = doom_facts(core, state, event.tool_calls, checked=True)
        if verdict is not None:
            if verdict and (facts is None or not facts.due):
                raise refused(
                    "ModelReplied",
                    state.state,
                    "doom_verdict is True, but no second-tier doom verdict is due at this "
                    "reply (one is due when the first tier is one identical call short of "
                    "firing, and after every doom_check_window calls)",
                )
            return event
        if check is None:
            check = core.doom_check
        if check is None or facts is None:
            return event
        window = facts.window if facts.due else None
        verdict = False if window is None else check(window)
        if type(verdict) is not bool:
            raise TypeError(
                f"doom_check: must return a bool, got {type(verdict).__name__}; nothing was changed"
            )
        given = copy.copy(event)  # not evolve: the reply's JSON form is taken once
        object.__setattr__(given, "doom_verdict", verdict)
        return given

    def _refuse_event(self, event: object) -> NoReturn:
        """Refuse ``event``: sent to a turn that is no longer current, or not an event."""
        turn = self._turn
        if self._core.state.turn is not turn:
            self._refuse(type(event).__name__)
        wrap = (
            "; a model error is sent wrapped: turn.send(sm.ModelFailed(error))"
            if isinstance(event, ModelError)
            else ""
        )
        raise IllegalEvent(
            f"{event!r:.200} is not an event (expected one of "
            f"{', '.join(sorted(TRIGGERS.values()))}) in state {turn.state!r}{wrap}",
            event=type(event).__name__,
            state=turn.state,
        )

    def _refuse(self, event: str) -> None:
        turn = self._turn
        current = self._core.state.turn
        status = self._core.state.status
        if status is not None and turn.state in TERMINAL_STATES:
            raise SessionEnded(
                f"{event}: turn {turn.index} belongs to a session that has ended ({status.value})",
                status=status,
            )
        latest = current.index if current is not None else "none"
        raise IllegalEvent(
            f"{event} is not legal for turn {turn.index}: it was replaced by turn {latest}; "
            "only the session's current turn takes events",
            event=event,
            state=turn.state,
        )

    # -- what the turn holds -----------------------------------------------

    index: _Reads[int] = _Reads("_turn.index", "This turn's number in its session, from 1.")
    final_answer: _Reads[bool] = _Reads(
        "_turn.final_answer", "Whether this is the final-answer turn of the limit-reached path."
    )
    instruction: _Reads[str | None] = _Reads(
        "_turn.instruction", "The synthetic final-answer instruction (final-answer turn only)."
    )
    state: _Reads[str] = _Reads(
        "_turn.state", "The current state's name (``idle`` before ``start()``)."
    )
    status: _Reads[TurnStatus | None] = _Reads(
        "_turn.status", "``None`` while the turn runs, then the status its :class:`Finish` carries."
    )

    @property
    def done(self) -> bool:
        """Whether the turn has finished."""
        return self._turn.state in TERMINAL_STATES

    @property
    def current(self) -> bool:
        """Whether this is its session's current turn (the only one that takes events)."""
        return self._core.state.turn is self._turn

    @property
    def action(self) -> Action | None:
        """The last action emitted: what the host owes an event for."""
        actions = self._turn.actions
        return actions[-1] if actions else None

    @property
    def finish(self) -> Finish | None:
        """The :class:`Finish` the turn ended with, or ``None`` while it runs."""
        action = self.action
        return action if type(action) is Finish else None

    @property
    def steps(self) -> int:
        """How many transitions the turn has taken (the length of :attr:`trace`)."""
        return len(self._turn.path)

    attempt: _Reads[int] = _Reads(
        "_turn.attempt", "The current call's attempt number (0 for a first try)."
    )
    reductions: _Reads[int] = _Reads(
        "_turn.reductions", "How many context reductions this turn asked for."
    )

    @property
    def model(self) -> str | None:
        """The model the turn currently calls (``None``: the host's default)."""
        return model_of(self._core, self._turn)

    session: _Reads[Session] = _Reads("_session", "The session this turn belongs to.")
    calls: _Reads[tuple[Any, ...]] = _Reads(
        "_turn.calls", "The tool calls of the reply being handled (empty before any)."
    )
    in_flight: _Reads[tuple[Any, ...]] = _Reads(
        "_turn.in_flight", "The calls of the last ``InvokeTools``: what ``ToolsDone`` must answer."
    )

    @property
    def trace(self) -> tuple[TraceRecord, ...]:
        """One frozen record per transition taken so far, in order (the steps of a
        restored turn taken before its snapshot have no ``caused_by``)."""
        turn = self._turn
        started = self._core.state.started
        return tuple(turn_record(turn, i, started) for i in range(len(turn.path)))

    def __repr__(self) -> str:
        return f"<Turn {self.index} state={self.state!r} status={self.status!s}>"
