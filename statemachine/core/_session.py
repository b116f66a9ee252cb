"""``Session``: the turns of one conversation and everything that spans them.

A session owns what must outlive a turn: the session-wide retry count, the turn
counter, the spend, the wall clock, the per-provider circuit breakers, the
doom-loop detector and the jitter stream. After every turn it checks its bounds;
when one has fired, the next turn is the *final-answer turn* (tools withheld, a
synthetic instruction, one attempt), after which the session has ended with a
:class:`SessionStatus` naming the limit. Nothing here raises for an agent failure.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._actions import Assemble, CallModel, Fallback, Finish, InvokeTools, Wait
from ._codec import decode, encode
from ._exceptions import ConfigError, SessionEnded, SnapshotError, TurnInProgress
from ._settings import Settings
from ._table import IDLE, STATES, TERMINAL_STATES
from ._taxonomy import SessionStatus, ToolErrorCategory, TurnStatus
from ._tool_calls import ToolCall, ToolOutcome
from ._trace import TraceRecord
from ._turn import Turn, row_infos

SNAPSHOT_FORMAT = "statemachine.session"
SNAPSHOT_VERSION = 1

Observer = Callable[[TraceRecord], None]

_LIMIT_TEXT = {
    SessionStatus.ERROR_MAX_TURNS: "the maximum number of turns ({settings.max_turns})",
    SessionStatus.ERROR_MAX_BUDGET_USD: "the cost budget (${settings.max_cost_usd:g})",
    SessionStatus.ERROR_MAX_WALL_CLOCK: "the wall-clock budget ({settings.max_wall_clock_s:g} s)",
    SessionStatus.ERROR_CIRCUIT_BREAKER: "a tool provider's circuit breaker (repeated crashes)",
    SessionStatus.ERROR_DOOM_LOOP: "the repeated-tool-call guard (the same call over and over)",
}


def final_answer_instruction(limit: SessionStatus, settings: Settings) -> str:
    """The synthetic instruction of the final-answer turn for ``limit``."""
    what = _LIMIT_TEXT[limit].format(settings=settings)
    return (
        f"This session has reached {what}. Tools are no longer available. "
        "Do not call any tool: reply now with your final answer, based on what "
        f"you have so far. [limit: {limit.value}]"
    )


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr
)
# json's C encoder, built once: JSONEncoder.encode builds a new one on every call,
# which is two thirds of a fingerprint's cost. Same output as _CANONICAL.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_C_CANONICAL = (
    _c_make_encoder(None, repr, json.encoder.encode_basestring, None, ":", ",", True, False, True)
    if _c_make_encoder is not None
    else None
)


def _canonical_json(value: object) -> str:
    """Canonical JSON of ``value``; its ``repr`` when JSON cannot hold it (cycles,
    keys of mixed types): a fingerprint never raises."""
    if _C_CANONICAL is not None:
        try:
            return "".join(_C_CANONICAL(value, 0))
        except (RecursionError, TypeError, ValueError):
            pass
    try:
        return _CANONICAL.encode(value)
    except (RecursionError, TypeError, ValueError):
        return repr(value)


def call_fingerprint(call: ToolCall) -> str:
    """A stable hash of (tool name, canonical JSON of the arguments).

    The provider is left out on purpose: the same call routed elsewhere is still
    the same call. Non-JSON arguments are hashed by their ``repr``.
    """
    canonical = _canonical_json([call.name, call.arguments])
    return hashlib.blake2b(canonical.encode(), digest_size=12).hexdigest()


class Session:
    """The turns of one conversation.

    ``seed`` seeds the jitter; ``clock`` is a monotonic clock in seconds (the wall
    clock bound and waits are measured on it); ``wall_clock`` is Unix time, read
    only to measure an HTTP-date ``retry-after``. ``observers`` receive every
    :class:`TraceRecord` of every turn, as it happens; an observer's exception
    propagates to the caller of ``send()``, after the transition (``turn.action``
    still holds its action).

    Same settings, same seed, same events: the same actions, bit for bit.
    """

    __slots__ = (
        "_breakers",
        "_clock",
        "_cost",
        "_current",
        "_doom_last",
        "_doom_run",
        "_draws",
        "_limit",
        "_observers",
        "_retries",
        "_seed",
        "_started",
        "_status",
        "_tripped",
        "_turns",
        "_wall_clock",
        "settings",
    )

    settings: Settings
    _seed: int
    _draws: int
    _retries: int
    _turns: int
    _cost: float
    _clock: Callable[[], float]
    _wall_clock: Callable[[], float]
    _observers: tuple[Observer, ...]
    _tripped: frozenset[str]

    def __init__(
        self,
        settings: Settings | None = None,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        *,
        wall_clock: Callable[[], float] = time.time,
        observers: Iterable[Observer] = (),
    ) -> None:
        if settings is None:
            settings = _DEFAULT_SETTINGS
        elif not isinstance(settings, Settings):
            raise ConfigError(f"settings: must be a Settings, got {settings!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"seed: must be an int, got {seed!r}")
        if not callable(clock) or not callable(wall_clock):
            raise ConfigError("clock: clock and wall_clock must be callables returning seconds")
        self.settings = settings
        self._seed = seed & 0xFFFFFFFFFFFFFFFF
        self._clock = clock
        self._wall_clock = wall_clock
        self._observers = tuple(observers)
        self._started = clock()
        self._draws = 0
        self._retries = 0
        self._turns = 0
        self._cost = 0.0
        self._breakers: dict[str, int] | None = None
        self._tripped = _NO_PROVIDERS
        self._doom_last: str | None = None
        self._doom_run = 0
        self._limit: SessionStatus | None = None
        self._status: SessionStatus | None = None
        self._current: Turn | None = None

    # -- turns -----------------------------------------------------------------

    def new_turn(self) -> Turn:
        """The next turn. If a limit has fired, it is the final-answer turn.

        Raises :class:`SessionEnded` once the session has ended, and
        :class:`TurnInProgress` while the current turn has not finished.
        """
        if self._status is not None:
            raise SessionEnded(
                f"the session has ended ({self._status.value}); it can be replayed, not continued",
                status=self._status,
            )
        current = self._current
        if current is not None and current._state == IDLE:
            # never started: nothing happened in it, so it is replaced, not counted
            self._turns -= 1
        elif current is not None and current._state not in TERMINAL_STATES:
            raise TurnInProgress(
                f"turn {current.index} is still running (state {current._state!r}); "
                "finish it or send it Cancelled() first"
            )
        self._check_bounds()
        self._turns += 1
        limit = self._limit
        if limit is None:
            turn = Turn(self, self._turns)
        else:
            instruction = final_answer_instruction(limit, self.settings)
            turn = Turn(self, self._turns, final_answer=True, instruction=instruction)
        self._current = turn
        return turn

    def _turn_finished(self, turn: Turn, finish: Finish) -> None:
        if turn.final_answer:
            self._status = self._limit
            return
        if finish.status is TurnStatus.BUDGET_EXHAUSTED:
            self._fire(SessionStatus.ERROR_MAX_WALL_CLOCK)
        self._check_bounds()

    def _fire(self, limit: SessionStatus) -> None:
        if self._limit is None:
            self._limit = limit

    def _check_bounds(self) -> None:
        if self._limit is not None:
            return
        settings = self.settings
        if settings.max_turns is not None and self._turns >= settings.max_turns:
            self._limit = SessionStatus.ERROR_MAX_TURNS
        elif settings.max_cost_usd is not None and self._cost >= settings.max_cost_usd:
            self._limit = SessionStatus.ERROR_MAX_BUDGET_USD
        elif settings.max_wall_clock_s is not None and self.elapsed_s >= settings.max_wall_clock_s:
            self._limit = SessionStatus.ERROR_MAX_WALL_CLOCK

    # -- breakers and the doom-loop detector --------------------------------------

    def _breaker_after(
        self, calls: tuple[ToolCall, ...], outcomes: tuple[ToolOutcome, ...]
    ) -> tuple[dict[str, int], list[str]]:
        """The crash counts after ``outcomes``, and the providers they would trip."""
        counts = dict(self._breakers or {})
        by_id = {outcome.call_id: outcome for outcome in outcomes}
        tripped: list[str] = []
        threshold = self.settings.breaker_threshold
        for call in calls:
            outcome = by_id[call.id]
            provider = call.provider
            if outcome.category is ToolErrorCategory.PROCESS_CRASHED:
                counts[provider] = counts.get(provider, 0) + 1
                if counts[provider] >= threshold and provider not in tripped:
                    tripped.append(provider)
            else:
                counts[provider] = 0
        return counts, tripped

    def _apply_breakers(self, counts: dict[str, int], tripped: list[str]) -> None:
        self._breakers = {p: n for p, n in counts.items() if n} or None
        if tripped:
            self._tripped = self._tripped | frozenset(tripped)
            self._fire(SessionStatus.ERROR_CIRCUIT_BREAKER)

    def _end_doom_run(self) -> None:
        """A reply with no tool call ends any run of identical calls."""
        self._doom_last = None
        self._doom_run = 0

    def _watch_doom_loop(self, calls: tuple[ToolCall, ...]) -> None:
        threshold = self.settings.doom_loop_threshold
        for call in calls:
            fingerprint = call_fingerprint(call)
            if fingerprint == self._doom_last:
                self._doom_run += 1
            else:
                self._doom_last = fingerprint
                self._doom_run = 1
            if self._doom_run >= threshold:
                self._fire(SessionStatus.ERROR_DOOM_LOOP)

    # -- what the session holds -------------------------------------------------

    @property
    def seed(self) -> int:
        """The jitter seed (as a 64-bit unsigned int)."""
        return self._seed

    @property
    def status(self) -> SessionStatus | None:
        """``None`` while the session can go on; then the limit that ended it."""
        return self._status

    @property
    def limit_reached(self) -> SessionStatus | None:
        """The limit that has fired, from the moment it fires (the final-answer turn
        may still be to come); ``None`` while no limit has fired."""
        return self._limit

    @property
    def current_turn(self) -> Turn | None:
        """The latest turn (after ``restore``: the restored one)."""
        return self._current

    @property
    def turns(self) -> int:
        """How many turns have been created, the final-answer turn included."""
        return self._turns

    @property
    def retries_used(self) -> int:
        """Retries (waits and fallbacks) taken across the session."""
        return self._retries

    @property
    def cost_usd(self) -> float:
        """The sum of ``ModelReplied.cost`` so far."""
        return self._cost

    @property
    def elapsed_s(self) -> float:
        """Seconds on the session's clock since it started."""
        return self._clock() - self._started

    @property
    def tripped_providers(self) -> frozenset[str]:
        """Tool providers whose circuit breaker is open; never invoked again."""
        return self._tripped

    @property
    def crash_counts(self) -> Mapping[str, int]:
        """Consecutive ``process_crashed`` outcomes per provider, where not zero."""
        return dict(self._breakers or {})

    def __repr__(self) -> str:
        return (
            f"<Session turns={self._turns} retries={self._retries} "
            f"status={self._status!s} limit={self._limit!s}>"
        )

    # -- snapshot ---------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The session as plain JSON data, current turn and its trace included.

        The host's own data in it (requests, replies, tool arguments and contents)
        must itself be JSON-serialisable; :class:`SnapshotError` says which is not.
        """
        data: dict[str, Any] = {
            "format": SNAPSHOT_FORMAT,
            "version": SNAPSHOT_VERSION,
            "settings": self.settings.to_dict(),
            "seed": self._seed,
            "draws": self._draws,
            "retries": self._retries,
            "turns": self._turns,
            "cost_usd": self._cost,
            "elapsed_s": self.elapsed_s,
            "breakers": dict(self._breakers or {}),
            "tripped": sorted(self._tripped),
            "doom": {"last": self._doom_last, "run": self._doom_run},
            "limit": self._limit.value if self._limit else None,
            "status": self._status.value if self._status else None,
            "turn": None if self._current is None else _turn_data(self._current),
        }
        try:
            json.dumps(data, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise SnapshotError(f"snapshot: the session holds non-JSON data: {exc}") from None
        return data

    @classmethod
    def restore(
        cls,
        data: Mapping[str, Any],
        clock: Callable[[], float] = time.monotonic,
        *,
        wall_clock: Callable[[], float] = time.time,
        observers: Iterable[Observer] = (),
    ) -> Session:
        """A session that continues exactly where ``data`` (from ``snapshot()``)
        stopped: same turn, counters, breakers and jitter stream.

        Raises :class:`SnapshotError` naming the first key that is missing, of the
        wrong type, or of a foreign format or version.
        """
        reader = _Reader(data)
        if reader.get("format", str) != SNAPSHOT_FORMAT:
            raise SnapshotError(
                f"format: not a statemachine session snapshot: {data.get('format')!r}"
            )
        version = reader.get("version", int)
        if version != SNAPSHOT_VERSION:
            raise SnapshotError(
                f"version: {version!r} is not supported (this is {SNAPSHOT_VERSION})"
            )
        try:
            settings = Settings.from_dict(reader.get("settings", dict))
        except ConfigError as exc:
            raise SnapshotError(f"settings: {exc}") from None
        session = cls(
            settings, reader.get("seed", int), clock, wall_clock=wall_clock, observers=observers
        )
        session._draws = reader.count("draws")
        session._retries = reader.count("retries")
        session._turns = reader.count("turns")
        session._cost = reader.number("cost_usd")
        session._started = clock() - reader.number("elapsed_s")
        breakers = reader.get("breakers", dict)
        for provider, count in breakers.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise SnapshotError(f"breakers.{provider}: must be an int >= 0, got {count!r}")
        session._breakers = {p: n for p, n in breakers.items() if n} or None
        tripped = reader.get("tripped", list)
        if not all(isinstance(p, str) for p in tripped):
            raise SnapshotError(f"tripped: must be a list of provider names, got {tripped!r}")
        session._tripped = frozenset(tripped)
        doom = _Reader(reader.get("doom", dict), "doom.")
        session._doom_last = doom.get("last", str, optional=True)
        session._doom_run = doom.count("run")
        session._limit = reader.enum("limit", SessionStatus)
        session._status = reader.enum("status", SessionStatus)
        turn = reader.get("turn", dict, optional=True)
        if turn is not None:
            session._current = _restore_turn(session, _Reader(turn, "turn."))
        return session


_DEFAULT_SETTINGS = Settings()
_NO_PROVIDERS: frozenset[str] = frozenset()
_ACTION_TYPES = (Assemble, CallModel, Wait, InvokeTools, Finish)


def _turn_data(turn: Turn) -> dict[str, Any]:
    return {
        "index": turn.index,
        "final_answer": turn.final_answer,
        "instruction": turn.instruction,
        "state": turn._state,
        "status": turn.status.value if turn.status else None,
        "attempt": turn._attempt,
        "reductions": turn._reductions,
        "model_index": turn._model_index,
        "request": turn._request,
        "size": turn._size,
        "overflowed_size": turn._overflowed_size,
        "overflowed_request": turn._overflowed_request,
        "calls": encode(turn._calls),
        "reply": turn._reply,
        "fallbacks": encode(turn._fallbacks),
        "retries_at_start": turn._retries_at_start,
        "trace": [
            [*info[:4], encode(action)]
            for info, action in zip(turn._path, turn._actions, strict=True)
        ],
    }


def _restore_turn(session: Session, reader: _Reader) -> Turn:
    turn = Turn(
        session,
        reader.count("index"),
        final_answer=reader.get("final_answer", bool),
        instruction=reader.get("instruction", str, optional=True),
    )
    state = reader.get("state", str)
    if state not in STATES:
        raise SnapshotError(f"turn.state: {state!r} is not a state of the machine")
    turn._state = state
    status = reader.enum("status", TurnStatus)
    if (status is None) != (state not in TERMINAL_STATES):
        raise SnapshotError(
            f"turn.status: {status!s} does not fit state {state!r} "
            "(a finished turn has a status, a running one none)"
        )
    if turn.index > session._turns:
        raise SnapshotError(
            f"turn.index: {turn.index} is beyond the session's {session._turns} turns"
        )
    turn._attempt = reader.count("attempt")
    turn._reductions = reader.count("reductions")
    turn._model_index = reader.get("model_index", int)
    if not -1 <= turn._model_index < len(session.settings.fallback_models):
        raise SnapshotError(f"turn.model_index: {turn._model_index} is out of range")
    turn._request = reader.raw("request")
    turn._size = reader.count("size")
    turn._overflowed_size = reader.get("overflowed_size", int, optional=True)
    turn._overflowed_request = reader.raw("overflowed_request")
    turn._calls = reader.values("calls", ToolCall)
    turn._reply = reader.raw("reply")
    turn._fallbacks = reader.values("fallbacks", Fallback)
    turn._retries_at_start = reader.count("retries_at_start")
    rows = row_infos()
    for i, entry in enumerate(reader.get("trace", list)):
        if not isinstance(entry, list) or len(entry) != 5:
            raise SnapshotError(f"turn.trace[{i}]: must be a list of 5 items, got {entry!r}")
        info = rows.get(tuple(entry[:4]))
        if info is None:
            raise SnapshotError(
                f"turn.trace[{i}]: {entry[:4]!r} is not a transition of this engine's table"
            )
        action = reader.decoded(f"trace[{i}]", entry[4])
        if not isinstance(action, _ACTION_TYPES):
            raise SnapshotError(f"turn.trace[{i}]: not an action: {action!r}")
        turn._path.append(info)
        turn._actions.append(action)
    if (turn._path[-1][3] if turn._path else IDLE) != state:
        raise SnapshotError(f"turn.state: {state!r} is not where the turn's trace ends")
    if turn.status != status:
        raise SnapshotError(f"turn.status: {status!s} is not the status its trace ends with")
    return turn


class _Reader:
    """Typed access to snapshot data; every failure is a SnapshotError naming the key."""

    def __init__(self, data: object, prefix: str = "") -> None:
        if not isinstance(data, Mapping):
            raise SnapshotError(
                f"{prefix or 'snapshot'}: must be a JSON object, got {type(data).__name__}"
            )
        self.data = data
        self.prefix = prefix

    def raw(self, key: str) -> Any:
        if key not in self.data:
            raise SnapshotError(f"{self.prefix}{key}: missing")
        return self.data[key]

    def get(self, key: str, kind: type, *, optional: bool = False) -> Any:
        value = self.raw(key)
        if value is None and optional:
            return None
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise SnapshotError(
                f"{self.prefix}{key}: must be {kind.__name__}, got {type(value).__name__}"
            )
        return value

    def count(self, key: str) -> int:
        value: int = self.get(key, int)
        if value < 0:
            raise SnapshotError(f"{self.prefix}{key}: must be >= 0, got {value}")
        return value

    def number(self, key: str) -> float:
        value = self.raw(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise SnapshotError(f"{self.prefix}{key}: must be a finite number >= 0, got {value!r}")
        return float(value)

    def enum(self, key: str, kind: type[Any]) -> Any:
        value = self.raw(key)
        if value is None:
            return None
        try:
            return kind(value)
        except ValueError:
            raise SnapshotError(f"{self.prefix}{key}: {value!r} is not a {kind.__name__}") from None

    def decoded(self, key: str, value: Any) -> Any:
        try:
            return decode(value, f"{self.prefix}{key}")
        except ValueError as exc:
            raise SnapshotError(str(exc)) from None

    def values(self, key: str, kind: type) -> tuple[Any, ...]:
        items = self.decoded(key, self.get(key, list))
        if not all(isinstance(item, kind) for item in items):
            raise SnapshotError(f"{self.prefix}{key}: must hold {kind.__name__} values")
        return tuple(items)
