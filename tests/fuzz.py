"""A seeded random-walk fuzzer that drives the engine through its public API only.

    python -m tests.fuzz --events 1000000 --seed 1 [--settings-mix] [--keep-going]
    python -m tests.fuzz --replay-walk WALK_SEED [--settings-mix] --script

The run is a sequence of *walks*, each seeded on its own (``FastRandom(walk_seed)``,
the walk seeds drawn from ``--seed``), so any walk replays alone with
``--replay-walk``. A walk drives one session after another (settings from a small
random mix with ``--settings-mix``, the defaults without), on an injected manual
clock and a fixed wall clock. At each step it mostly sends the legal event for the
turn's last action (``Assemble`` -> ``Assembled`` / ``CannotShrink``, ``CallModel`` ->
``ModelReplied`` / ``ModelFailed`` with every category and garbage retry-afters,
``Wait`` -> ``WaitDone`` after moving the clock, ``InvokeTools`` -> ``ToolsDone``), and
sometimes: ``Cancelled``; an illegal event (wrong type, bad tool-call ids, non-events,
``start()`` again); a stale-handle probe (a turn replaced by ``new_turn()``, finished,
or of an ended session); ``new_turn()`` while a turn runs; a snapshot round trip
through JSON text, after which the walk goes on with the restored session; a
*forged* snapshot (1-3 random mutations), which ``restore`` must refuse with
``SnapshotError`` or turn into a session on which every invariant holds, that can be
snapshotted and driven on.

Every step is checked against the public contract (``/work/shared/design/api.md``),
see :class:`Driver`. A failed check is a :class:`Violation`; the run stops at the
first one (exit status 1) and prints the seed, the step, the walk seed and the last
operations as runnable Python; ``--keep-going`` instead abandons the walk, records
one finding per violation kind and goes on. The last line is always a summary.
"""

from __future__ import annotations

import argparse
import enum
import inspect
import json
import math
import os
import random
import reprlib
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path
from typing import Any

import attrs

import statemachine as sm

WALL = 1_767_225_600.0
"""The injected wall clock (2026-01-01T00:00:00Z): HTTP-dates mean the same on every run."""
CLOCK_START = 1000.0
TURN_STEP_CAP = 10_000
"""No turn may take this many transitions, whatever the settings."""

HUGE_30 = 10**30
HUGE_400 = 10**400
HUGE_5000 = 10**5000
"""Beyond Python's 4300-digit int <-> str limit: no JSON encoder of the stdlib writes it."""
_HUGE_NAMES = {HUGE_30: "10**30", HUGE_400: "10**400", HUGE_5000: "10**5000", 2**64: "2**64"}
NEST_DEPTH = 5000


def _nest(depth: int, leaf: Any = 0) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


NESTED_LIST = _nest(NEST_DEPTH)
"""Built once (5000 levels of ``[...]``); never mutated, so it is shared."""
NESTED_DICT: Any = 0
for _ in range(NEST_DEPTH):
    NESTED_DICT = {"a": NESTED_DICT}


class FastRandom(random.Random):
    """``random.Random`` with cheap picks for the hot path (``choice`` and ``randint``
    cost a microsecond each; these a fraction of it). Seeded like its base class."""

    def pick(self, seq: Sequence[Any]) -> Any:
        """A uniform element of ``seq``."""
        return seq[int(self.random() * len(seq))]

    def between(self, low: int, high: int) -> int:
        """A uniform int in [low, high]."""
        return low + int(self.random() * (high - low + 1))

    def below(self, n: int) -> int:
        """A uniform int in [0, n)."""
        return int(self.random() * n)


class ManualClock:
    """The injected monotonic clock: time passes only when the fuzzer moves ``now``."""

    __slots__ = ("now",)

    def __init__(self, now: float = CLOCK_START) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def wall_clock() -> float:
    """The injected wall clock: always :data:`WALL`."""
    return WALL


SessionFactory = Callable[[sm.Settings, int, ManualClock], Any]


def default_factory(settings: sm.Settings, seed: int, clock: ManualClock) -> sm.Session:
    """A real session on the fuzzer's clocks."""
    return sm.Session(settings, seed, clock, wall_clock=wall_clock)


# -- violations ------------------------------------------------------------------


class Violation(Exception):
    """An invariant of the contract failed. ``kind`` is stable (no values in it), so
    findings can be grouped by it; ``detail`` says what was seen."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


REQUIREMENTS: dict[str, str] = {
    # kind (up to its first ":") -> the requirement of specs/requirements*.toml it breaks
    "illegal-accepted": "ER-27",
    "refused-changed-state": "ER-27",
    "new-turn-accepted": "ER-27",
    "new-turn-refused": "ER-27",
    "legal-event-refused": "ER-27",
    "unexpected-exception": "ER-27",
    "stale-handle-accepted": "ER-37",
    "stale-handle-changed-state": "ER-37",
    "unbounded-turn": "ER-29",
    "wait-invalid": "ER-39",
    "cost-not-finite": "ER-39",
    "constructor-undocumented-error": "ER-39",
    "snapshot-refused-accepted-state": "ER-39",
    "snapshot-not-json": "ER-39",
    "wait-below-retry-after": "ER-3",
    "wait-above-backoff": "ER-22",
    "wait-crosses-wall-clock": "ER-19",
    "limit-not-fired": "ER-19",
    "retries-over-ceiling": "ER-5",
    "attempt-over-max": "ER-5",
    "reductions-over-max": "ER-8",
    "call-after-fatal": "ER-9",
    "fatal-not-finished": "ER-9",
    "context-overflow-resent": "ER-6",
    "context-overflow-reaction": "ER-7",
    "context-cannot-shrink": "ER-8",
    "content-filtered-not-surfaced": "ER-11",
    "unknown-retried": "ER-24",
    "partial-resent": "ER-31",
    "final-answer-tools-offered": "ER-16",
    "final-answer-invoked-tools": "ER-16",
    "final-answer-retried": "ER-16",
    "session-not-ended": "ER-16",
    "limit-unset": "ER-16",
    "turns-over-max": "ER-15",
    "bound-not-fired": "ER-15",
    "cost-mismatch": "ER-15",
    "session-status-inconsistent": "ER-15",
    "tripped-provider-invoked": "ER-18",
    "breaker-not-tripped": "ER-13",
    "breaker-limit-not-fired": "ER-18",
    "doom-loop-not-fired": "ER-17",
    "tool-results-wrong": "ER-12",
    "cancel-not-finished": "ER-32",
    "protocol-broken": "ER-1",
    "turn-status-inconsistent": "ER-30",
    "restore-refused-own-snapshot": "ER-26",
    "restore-counters-differ": "ER-26",
    "restore-snapshot-differs": "ER-26",
    "restore-raised": "ER-26",
    "unreachable-state-accepted": "ER-38",
}


def requirement_of(kind: str) -> str:
    """The requirement ID a violation kind breaks. Anything a session restored from a
    forged snapshot does wrong (``forged-`` kinds) is ER-38: ``restore`` accepted a
    state the engine cannot reach (or data it cannot take)."""
    if kind.startswith(("forged-", "restore-raised:forged")):
        return "ER-38"
    if "stale-handle" in kind:
        return "ER-37"
    if kind.startswith("unexpected-exception:snapshot"):
        return "ER-39"
    return REQUIREMENTS.get(kind.split(":", 1)[0], "ER-27")


@dataclass
class Finding:
    """One violation: where it happened and how to replay it."""

    kind: str
    detail: str
    seed: int
    step: int
    walk: int
    walk_seed: int
    walk_step: int
    settings_mix: bool
    log: list[list[Any]] = field(repr=False)
    count: int = 1

    @property
    def requirement(self) -> str:
        """The requirement ID the violation breaks."""
        return requirement_of(self.kind)

    def replay_command(self) -> str:
        """The command that replays the walk and prints it as a script."""
        mix = " --settings-mix" if self.settings_mix else ""
        return f"python -m tests.fuzz --replay-walk {self.walk_seed}{mix} --script"

    def script(self, tail: int | None = None) -> str:
        """The walk's operations as runnable Python (the last ``tail`` of them only)."""
        return render_script(self.log, f"{self.kind}: {self.detail}", tail=tail)

    def describe(self, tail: int = 14) -> str:
        """A few lines: what failed, where, the replay command and the last operations."""
        return (
            f"VIOLATION {self.kind} ({self.requirement}): {self.detail}\n"
            f"  seed={self.seed} step={self.step} walk={self.walk} walk_seed={self.walk_seed} "
            f"walk_step={self.walk_step} occurrences={self.count}\n"
            f"  replay: {self.replay_command()}\n"
            f"  last operations:\n"
            + "\n".join("    " + line for line in self.script(tail=tail).splitlines())
        )


@dataclass
class Stats:
    """Counters of a run, and its findings (first one of each kind)."""

    seed: int = 0
    events: int = 0
    steps: int = 0
    walks: int = 0
    sessions: int = 0
    snapshots: int = 0
    mutated: int = 0
    mutated_refused: int = 0
    mutated_accepted: int = 0
    stale: int = 0
    illegal: int = 0
    violations: int = 0
    seconds: float = 0.0
    findings: dict[str, Finding] = field(default_factory=dict)

    def add(self, finding: Finding) -> None:
        """Record a violation (the first finding of each kind is kept)."""
        self.violations += 1
        known = self.findings.get(finding.kind)
        if known is None:
            self.findings[finding.kind] = finding
        else:
            known.count += 1

    def summary(self) -> str:
        """The one-line summary."""
        rate = self.events / self.seconds if self.seconds > 0 else 0.0
        return (
            f"fuzz: events={self.events} sessions={self.sessions} walks={self.walks} "
            f"snapshots={self.snapshots} mutated={self.mutated} "
            f"(refused={self.mutated_refused} accepted={self.mutated_accepted}) "
            f"stale={self.stale} illegal={self.illegal} violations={self.violations} "
            f"kinds={len(self.findings)} seconds={self.seconds:.2f} events/s={rate:.0f}"
        )


# -- what the fuzzer sends -----------------------------------------------------------

TRANSIENT = frozenset({sm.ErrorCategory.RATE_LIMITED, sm.ErrorCategory.OVERLOADED})
FATAL = frozenset({sm.ErrorCategory.AUTH_ERROR, sm.ErrorCategory.INVALID_REQUEST})
CATEGORIES: tuple[sm.ErrorCategory, ...] = (
    (sm.ErrorCategory.RATE_LIMITED,) * 5
    + (sm.ErrorCategory.OVERLOADED,) * 4
    + tuple(sm.ErrorCategory) * 1
    + (sm.ErrorCategory.CONTEXT_LENGTH_EXCEEDED,) * 2
)
TOOL_FAILURES: tuple[sm.ToolErrorCategory | None, ...] = (
    (sm.ToolErrorCategory.PROCESS_CRASHED,) * 6 + tuple(sm.ToolErrorCategory) + (None,)
)
PROVIDERS = ("fs", "web", "shell")
TOOL_NAMES = ("read", "write", "search")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


ARGUMENTS: tuple[tuple[Any, str], ...] = tuple(
    (value, _canonical(value))
    for value in (
        None,
        {"path": "a.md"},
        {"path": "b.md"},
        {"a": 1, "b": 2},
        {"b": 2, "a": 1},  # the same call as the one above, after canonical JSON
        {"q": [1, 2, {"z": None}]},
        {},
    )
)


def _date(offset: float) -> str:
    return formatdate(WALL + offset, usegmt=True)


# (ModelError keyword arguments, the retry-after the Wait must honour, whether the
# backoff envelope applies: no retry-after at all, or one the contract calls garbage)
RetryAfter = tuple[dict[str, Any], float | None, bool]
RETRY_AFTERS: tuple[RetryAfter, ...] = (
    ({}, None, True),
    ({}, None, True),
    ({}, None, True),
    ({"retry_after_seconds": -1}, None, True),
    ({"retry_after_seconds": -0.5}, None, True),
    ({"retry_after_seconds": math.nan}, None, True),
    ({"retry_after_seconds": math.inf}, None, True),
    ({"retry_after_seconds": -math.inf}, None, True),
    ({"retry_after_seconds": "soon"}, None, True),
    ({"retry_after_seconds": HUGE_400}, None, False),
    ({"retry_after_seconds": HUGE_30}, float(HUGE_30), False),
    ({"retry_after_seconds": 0}, 0.0, False),
    ({"retry_after_seconds": 2}, 2.0, False),
    ({"retry_after_seconds": 400}, 400.0, False),
    ({"retry_after_seconds": True}, None, False),
    ({"retry_after_seconds": "3"}, None, False),
    ({"headers": {"retry-after": "2"}}, 2.0, False),
    ({"headers": {"Retry-After-Ms": "1500"}}, 1.5, False),
    ({"headers": {"RETRY-AFTER": _date(30)}}, 30.0, False),
    ({"headers": {"retry-after": _date(-30)}}, None, False),
    ({"headers": {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}}, None, False),
    ({"headers": {"retry-after": "soon"}}, None, False),
    ({"headers": {"retry-after": "-2"}}, None, False),
    ({"headers": {"retry-after-ms": "nan"}}, None, False),
    ({"headers": {"retry-after": "inf"}}, None, False),
    ({"headers": {"retry-after": "1e400"}}, None, False),
    ({"headers": {"retry-after": "99999999999999999999999"}}, 1e23, False),
    ({"headers": {"retry-after-ms": "abc", "retry-after": "4"}}, None, False),
    ({"retry_after_seconds": math.nan, "headers": {"retry-after": "4"}}, None, False),
    ({"headers": [("retry-after", "1")]}, 1.0, False),
)
FIXED_RETRY_AFTERS = frozenset(id(kwargs) for kwargs, _, _ in RETRY_AFTERS)
FAILURES: dict[tuple[Any, int, bool], Any] = {}
"""ModelFailed events of the fixed retry-afters, built on first use."""
RARE_RETRY_AFTERS: tuple[RetryAfter, ...] = (({"retry_after_seconds": HUGE_5000}, None, False),)

LEGAL: dict[type | None, tuple[type, ...]] = {
    None: (sm.Cancelled,),
    sm.Assemble: (sm.Assembled, sm.CannotShrink, sm.Cancelled),
    sm.CallModel: (sm.ModelReplied, sm.ModelFailed, sm.Cancelled),
    sm.Wait: (sm.WaitDone, sm.Cancelled),
    sm.InvokeTools: (sm.ToolsDone, sm.Cancelled),
    sm.Finish: (),
}
"""The event types legal after each action (``None``: a turn not started yet)."""

SAMPLE_EVENTS: tuple[Any, ...] = (
    sm.Assembled("probe", 1),
    sm.CannotShrink(),
    sm.ModelReplied(),
    sm.ModelFailed(sm.ModelError("overloaded")),
    sm.WaitDone(),
    sm.ToolsDone([sm.ToolOutcome("nope", ok=True)]),
    sm.Cancelled("probe"),
)
NOT_EVENTS: tuple[Any, ...] = (
    "not an event",
    None,
    42,
    3.5,
    b"WaitDone",
    {"event": "WaitDone"},
    ("WaitDone",),
    [sm.WaitDone()],
    sm.WaitDone,
    sm.Wait(1.0, sm.ErrorCategory.RATE_LIMITED, 0),
    sm.Finish(sm.TurnStatus.COMPLETED),
    object(),
)
REPLIES: tuple[Any, ...] = (None, "text", {"text": "done"})
WAIT_DONE = sm.WaitDone()
CANNOT_SHRINK = sm.CannotShrink()
CANCELLED = sm.Cancelled("fuzz")

try:
    SETTINGS_FIELDS = frozenset(inspect.signature(sm.Settings).parameters)
except (TypeError, ValueError):  # pragma: no cover - a Settings without a signature
    SETTINGS_FIELDS = frozenset()


def pick_settings(rng: FastRandom, mix: bool) -> dict[str, Any]:
    """Settings keyword arguments: the defaults (``{}``), or with ``mix`` a small
    random mix of caps and bounds (only fields the installed ``Settings`` has)."""
    if not mix or rng.random() < 0.15:
        return {}
    kw: dict[str, Any] = {
        "base_delay_ms": rng.pick((0, 1, 100, 500, 500)),
        "backoff_factor": rng.pick((1.0, 1.5, 2.0, 2.0, 3.0)),
        "max_retries": rng.between(0, 3),
        "max_delay_ms": rng.pick((0, 1_000, 8_000, 30_000)),
        "session_retry_ceiling": rng.between(0, 6),
        "max_server_wait_s": rng.pick((0.0, 5.0, 60.0, 300.0)),
        "max_context_reductions": rng.between(0, 3),
        "breaker_threshold": rng.between(1, 3),
        "doom_loop_threshold": rng.between(3, 5),
        "max_turns": rng.pick((None, None, 1, 2, 3, 4, 5, 6)),
        "max_cost_usd": rng.pick((None, None, 0.01, 0.05, 0.5)),
        "max_wall_clock_s": rng.pick((None, None, 1.0, 10.0, 60.0, 300.0)),
        "model": rng.pick((None, "primary")),
        "fallback_models": rng.pick(((), (), ("fb-a",), ("fb-a", "fb-b"))),
    }
    for key in ("base_delay_ms", "backoff_factor", "max_delay_ms", "max_server_wait_s", "model"):
        if rng.random() < 0.3:
            del kw[key]
    if SETTINGS_FIELDS:
        kw = {k: v for k, v in kw.items() if k in SETTINGS_FIELDS}
    return kw


def step_bound(settings: sm.Settings) -> int:
    """A generous bound on the transitions of one turn for these settings: twice the
    longest legal path (start, assemble, every retry of every model of every
    reduced request, the reductions, the tool round), plus slack; at most
    :data:`TURN_STEP_CAP`."""
    reductions = int(getattr(settings, "max_context_reductions", 3) or 0)
    fallbacks = len(settings.fallback_models)
    retries = settings.max_retries
    longest = 4 + 2 * reductions + (reductions + 1) * ((fallbacks + 1) * (2 * retries + 1) + 2)
    return min(TURN_STEP_CAP, 2 * longest + 16)


def backoff_ceiling(settings: sm.Settings, n: int) -> float:
    """The contract's upper bound (seconds) on the n-th retry's wait without a
    retry-after: 1.5 x min(base_delay_ms x factor^n, max_delay_ms) ms."""
    base = getattr(settings, "base_delay_ms", 500)
    factor = getattr(settings, "backoff_factor", 2.0)
    cap = getattr(settings, "max_delay_ms", math.inf)
    try:
        nominal = min(base * factor**n, cap)
    except OverflowError:
        nominal = cap
    try:
        return 1.5 * nominal / 1000.0
    except OverflowError:  # a cap beyond the float range (a forged snapshot's settings)
        return math.inf


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(value)
    except (OverflowError, TypeError):
        return False


_short = reprlib.Repr()
_short.maxstring = 80
_short.maxother = 80
_short.maxlevel = 3


def short(value: Any) -> str:
    """A bounded repr (safe on 5000-deep data)."""
    try:
        return _short.repr(value)
    except (RecursionError, ValueError):  # pragma: no cover - reprlib is depth-bounded
        return f"<{type(value).__name__}>"


# -- fingerprints ----------------------------------------------------------------------


def turn_print(turn: Any, *, full: bool = True) -> tuple[Any, ...]:
    """What a host can observe of a turn, for "changed nothing" (``full``: with the
    length of its trace, which costs a record per transition)."""
    if turn is None:
        return (None,)
    return (
        turn.state,
        turn.status,
        id(turn.action),
        turn.attempt,
        getattr(turn, "reductions", None),
        len(turn.trace) if full else None,
    )


def session_print(session: Any) -> tuple[Any, ...]:
    """What a host can observe of a session, for "changed nothing"."""
    return (
        session.retries_used,
        session.turns,
        session.cost_usd,
        session.status,
        session.limit_reached,
        session.tripped_providers,
        tuple(sorted(session.crash_counts.items())),
        id(session.current_turn),
    )


def public_counters(session: Any) -> tuple[Any, ...]:
    """The counters a restored session must share with the one it was taken from."""
    turn = session.current_turn
    head: tuple[Any, ...] = (
        session.retries_used,
        session.turns,
        session.cost_usd,
        session.status,
        session.limit_reached,
        session.tripped_providers,
        tuple(sorted(session.crash_counts.items())),
    )
    if turn is None:
        return (*head, None)
    return (
        *head,
        turn.state,
        turn.status,
        turn.attempt,
        getattr(turn, "reductions", None),
        _safe_repr(turn.action),
        len(turn.trace),
    )


def _safe_repr(value: Any) -> str:
    """``repr(value)``, or a marker when it cannot be written (a 5000-digit int)."""
    try:
        return repr(value)
    except (ValueError, RecursionError) as exc:
        return f"<{type(value).__name__}: {type(exc).__name__}>"


def _timeless(data: Any) -> Any:
    """``data`` without the keys that name elapsed time (top level and ``turn``)."""
    if not isinstance(data, dict):
        return data
    out = {k: v for k, v in data.items() if "elapsed" not in str(k)}
    turn = out.get("turn")
    if isinstance(turn, dict):
        out["turn"] = {k: v for k, v in turn.items() if "elapsed" not in str(k)}
    return out


def same_snapshot(a: Any, b: Any) -> bool:
    """Whether two snapshots (JSON data, no NaN) are equal but for elapsed time."""
    try:
        return bool(_timeless(a) == _timeless(b))
    except RecursionError:
        return first_difference(a, b) is None


def first_difference(a: Any, b: Any, path: str = "data", depth: int = 0) -> str | None:
    """The first path where two JSON values differ (keys naming elapsed time are
    skipped: a restored clock measures from a new start), or ``None``."""
    if depth > 40:
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if "elapsed" in str(key):
                continue
            if key not in a or key not in b:
                return f"{path}[{key!r}] only in {'the restored' if key in b else 'the original'}"
            found = first_difference(a[key], b[key], f"{path}[{key!r}]", depth + 1)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = first_difference(x, y, f"{path}[{i}]", depth + 1)
            if found:
                return found
        return None
    both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    if type(a) is not type(b) or (a != b and not both_nan):
        return f"{path}: {short(a)} vs {short(b)}"
    return None


# -- forged snapshots --------------------------------------------------------------------

STATE_NAMES = (
    "idle",
    "assembling",
    "calling",
    "backing_off",
    "reducing_context",
    "invoking_tools",
    "completed",
    "filtered",
    "breaker_open",
    "failed",
)
ENUM_FAMILIES: tuple[tuple[str, ...], ...] = (
    STATE_NAMES,
    tuple(s.value for s in sm.TurnStatus),
    tuple(s.value for s in sm.SessionStatus),
    tuple(c.value for c in sm.ErrorCategory),
    tuple(c.value for c in sm.ToolErrorCategory),
    ("Assemble", "CallModel", "Wait", "InvokeTools", "Finish", "Fallback", "ModelError"),
    ("ToolCall", "ToolOutcome", "ToolResult"),
    ("start", "Assembled", "CannotShrink", "ModelReplied", "ModelFailed", "WaitDone"),
    ("ToolsDone", "Cancelled"),
)
ENUM_WORDS: dict[str, tuple[str, ...]] = {
    word: family for family in ENUM_FAMILIES for word in family
}
ALL_WORDS: tuple[str, ...] = tuple(ENUM_WORDS)
RETYPES: tuple[Any, ...] = ("x", "", 7, 0, 2.5, None, True, False, [], {}, [1], {"k": 1})

KeyPath = tuple[Any, ...]


def _paths(data: Any, max_depth: int = 9) -> list[tuple[Any, Any, KeyPath]]:
    """(container, key, path) of every value in ``data`` down to ``max_depth``
    (iterative, in a deterministic order)."""
    out: list[tuple[Any, Any, KeyPath]] = []
    stack: list[tuple[Any, KeyPath]] = [(data, ())]
    while stack:
        node, path = stack.pop()
        items: Iterable[tuple[Any, Any]]
        if isinstance(node, dict):
            items = list(node.items())
        elif isinstance(node, list):
            items = list(enumerate(node))
        else:
            continue
        for key, value in items:
            where = (*path, key)
            out.append((node, key, where))
            if len(where) < max_depth and isinstance(value, dict | list):
                stack.append((value, where))
    return out


def _where(path: KeyPath) -> str:
    return "data" + "".join(f"[{key!r}]" for key in path)


def _swap_word(data: dict[str, Any], rng: FastRandom, paths: list[Any]) -> str | None:
    """An enum-like word (state, status, category, value type) becomes another one."""
    words = [(c, k, p) for c, k, p in paths if isinstance(c[k], str) and c[k] in ENUM_WORDS]
    if not words:
        return None
    container, key, path = rng.pick(words)
    family = ENUM_WORDS[container[key]]
    value = rng.pick(family if rng.random() < 0.8 else ALL_WORDS)
    container[key] = value
    return f"{_where(path)} = {render(value)}"


def _cut_trace(data: dict[str, Any], rng: FastRandom, paths: list[Any]) -> str | None:
    """The turn's trace truncated, shortened, padded, reordered or emptied."""
    turn = data.get("turn")
    trace = turn.get("trace") if isinstance(turn, dict) else None
    if not isinstance(trace, list) or not trace:
        return None
    how = rng.below(6)
    where = _where(("turn", "trace"))
    i = rng.below(len(trace))
    if how == 0:
        del trace[i:]
        return f"del {where}[{i}:]"
    if how == 1:
        del trace[i]
        return f"del {where}[{i}]"
    if how == 2:
        trace.insert(i, json.loads(json.dumps(trace[i])))
        return f"{where}.insert({i}, {where}[{i}])"
    if how == 3 and len(trace) > 1:
        i, j = rng.sample(range(len(trace)), 2)
        trace[i], trace[j] = trace[j], trace[i]
        return f"{where}[{i}], {where}[{j}] = {where}[{j}], {where}[{i}]"
    if how == 4:
        trace.reverse()
        return f"{where}.reverse()"
    trace.clear()
    return f"{where}.clear()"


def _unknown_key(data: dict[str, Any], rng: FastRandom, paths: list[Any]) -> str | None:
    """A key no snapshot has, at the top or in any object."""
    dicts = [((), data)] + [(p, c[k]) for c, k, p in paths if isinstance(c[k], dict)]
    path, target = rng.pick(dicts)
    target["zz_unknown"] = 1
    return f"{_where(path)}['zz_unknown'] = 1"


def _delete(data: dict[str, Any], rng: FastRandom, paths: list[Any]) -> str | None:
    """A key or an item removed."""
    container, key, path = rng.pick(paths)
    del container[key]
    return f"del {_where(path)}"


def _nest_deep(data: dict[str, Any], rng: FastRandom, paths: list[Any]) -> str | None:
    """A value replaced by 5000 levels of lists or objects."""
    container, key, path = rng.pick(paths)
    value = NESTED_LIST if rng.random() < 0.6 else NESTED_DICT
    container[key] = value
    return f"{_where(path)} = {render(value)}"


def _nudge_int(data: dict[str, Any], rng: FastRandom, paths: list[Any]) -> str | None:
    """An int moved a little (plausible, maybe a state the engine cannot reach)."""
    ints = [(c, k, p) for c, k, p in paths if type(c[k]) is int]
    if not ints:
        return None
    container, key, path = rng.pick(ints)
    value = container[key] + rng.pick((1, 1, 2, -1, 5))
    container[key] = value
    return f"{_where(path)} = {render(value)}"


def _session_key(data: dict[str, Any], rng: FastRandom, paths: list[Any]) -> str | None:
    """A session-level key (counters, limit, status, turn, breakers) set to a value."""
    key = rng.pick(("retries", "turns", "draws", "limit", "status", "turn", "tripped"))
    value = rng.pick((None, 0, 3, 10**6, "error_max_turns", "error_doom_loop", ["fs"], {}, -1))
    data[key] = value
    return f"data[{key!r}] = {render(value)}"


_VALUES: tuple[Callable[[Any, FastRandom], Any], ...] = (
    lambda old, rng: rng.pick([v for v in RETYPES if type(v) is not type(old)]),
    lambda old, rng: rng.pick((HUGE_30, HUGE_5000, HUGE_5000, 2**64, HUGE_400)),
    lambda old, rng: rng.pick((-1, -(10**30), -0.5, -1e308)),
    lambda old, rng: rng.pick((math.nan, math.inf, -math.inf)),
    lambda old, rng: rng.pick((1e308, 0.0, 2**53 + 1, 1e-300)),
)
"""A new value for an old one: another type, a huge int, a negative number, a
non-finite float (as a JSON parser that accepts NaN gives them), an extreme float."""

_MUTATIONS: tuple[Callable[[dict[str, Any], FastRandom, list[Any]], str | None], ...] = (
    _swap_word,
    _swap_word,
    _cut_trace,
    _unknown_key,
    _delete,
    _nest_deep,
    _nudge_int,
    _session_key,
)


def mutate(data: dict[str, Any], rng: FastRandom) -> str:
    """Apply one random mutation to ``data`` (in place); return it as a Python statement."""
    paths = _paths(data)
    if not paths:
        data["turn"] = None
        return "data['turn'] = None"
    kind = rng.below(len(_MUTATIONS) + len(_VALUES))
    if kind < len(_MUTATIONS):
        done = _MUTATIONS[kind](data, rng, paths)
        if done is not None:
            return done
        kind = len(_MUTATIONS) + rng.below(len(_VALUES))
    container, key, path = rng.pick(paths)
    value = _VALUES[kind - len(_MUTATIONS)](container[key], rng)
    container[key] = value
    return f"{_where(path)} = {render(value)}"


# -- the replay script ---------------------------------------------------------------------

SCRIPT_PREAMBLE = f"""import json
import math

import statemachine as sm


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def wall():
    return {WALL!r}


def refused(call, *errors):
    try:
        call()
    except errors:
        return
    raise AssertionError("accepted")


def nest(depth, leaf=0):
    for _ in range(depth):
        leaf = [leaf]
    return leaf


def nest_dict(depth, leaf=0):
    for _ in range(depth):
        leaf = {{"a": leaf}}
    return leaf
"""


def render(value: Any) -> str:
    """``value`` as a Python expression using ``sm.`` names."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, enum.Enum):
        return repr(value.value)
    if isinstance(value, int):
        if abs(value) > 2**63:
            for huge, name in _HUGE_NAMES.items():
                for sign, base in ((1, huge), (-1, -huge)):
                    offset = value - base
                    if abs(offset) < 2**63:
                        text = name if sign > 0 else f"-{name}"
                        return text if not offset else f"({text} + {offset})"
            return "<a huge int>"
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "math.nan"
        if math.isinf(value):
            return "math.inf" if value > 0 else "-math.inf"
        return repr(value)
    if isinstance(value, str | bytes):
        return repr(value)
    if value is NESTED_LIST:
        return f"nest({NEST_DEPTH})"
    if value is NESTED_DICT:
        return f"nest_dict({NEST_DEPTH})"
    if isinstance(value, list):
        return "[" + ", ".join(render(v) for v in value) + "]"
    if isinstance(value, tuple):
        inner = ", ".join(render(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{render(k)}: {render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, sm.Headers):
        return render(dict(value))
    if isinstance(value, type):
        name = str(getattr(value, "__name__", ""))
        return f"sm.{name}" if getattr(sm, name, None) is value else "type"
    cls = type(value)
    if attrs.has(cls) and getattr(sm, cls.__name__, None) is cls:
        parts = []
        for f in attrs.fields(cls):
            item = getattr(value, f.name)
            default = f.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = default.factory()
            if default is not attrs.NOTHING and _same(item, default):
                continue
            parts.append(f"{f.name}={render(item)}")
        return f"sm.{cls.__name__}({', '.join(parts)})"
    if cls is object:
        return "object()"
    return short(value)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # an odd value: rendered, never skipped
        return False


_ERRORS = {
    "IllegalEvent": "sm.IllegalEvent",
    "SessionEnded": "sm.SessionEnded",
    "TurnInProgress": "sm.TurnInProgress",
    "SnapshotError": "sm.SnapshotError",
}


class _Script:
    """Turns log entries into lines of Python, naming objects as they first appear."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.counts: dict[str, int] = {}

    def name(self, obj: Any, prefix: str) -> str:
        found = self.names.get(id(obj))
        if found is None:
            self.counts[prefix] = self.counts.get(prefix, 0) + 1
            found = self.names[id(obj)] = f"{prefix}{self.counts[prefix]}"
        return found

    @staticmethod
    def guarded(call: str, outcome: str | None) -> str:
        if outcome is None:
            return call
        error = _ERRORS.get(outcome)
        if error is None:
            return f"{call}  # raised {outcome}"
        return f"refused(lambda: {call}, {error})"

    def lines(self, entry: list[Any]) -> list[str]:
        lines: list[str] = getattr(self, "op_" + entry[0])(*entry[1:])
        return lines

    def op_session(
        self, session: Any, kw: dict[str, Any], seed: int, clock: Any, now: float
    ) -> list[str]:
        lines = []
        if id(clock) not in self.names:
            lines.append(f"{self.name(clock, 'clock')} = Clock({now!r})")
        settings = ", ".join(f"{k}={render(v)}" for k, v in kw.items())
        lines.append(
            f"{self.name(session, 's')} = sm.Session(sm.Settings({settings}), seed={seed}, "
            f"clock={self.names[id(clock)]}, wall_clock=wall)"
        )
        return lines

    def op_new_turn(self, session: Any, turn: Any, outcome: str | None) -> list[str]:
        call = f"{self.name(session, 's')}.new_turn()"
        if outcome is None and turn is not None:
            return [f"{self.name(turn, 't')} = {call}"]
        return [self.guarded(call, outcome)]

    def op_start(self, turn: Any, _: None, outcome: str | None) -> list[str]:
        return [self.guarded(f"{self.name(turn, 't')}.start()", outcome)]

    def op_send(self, turn: Any, event: Any, outcome: str | None) -> list[str]:
        return [self.guarded(f"{self.name(turn, 't')}.send({render(event)})", outcome)]

    def op_clock(self, clock: Any, now: float) -> list[str]:
        return [f"{self.name(clock, 'clock')}.now = {now!r}"]

    def op_snapshot(self, session: Any, outcome: str | None) -> list[str]:
        call = f"json.dumps({self.name(session, 's')}.snapshot(), allow_nan=False)"
        return [call if outcome is None else f"{call}  # raised {outcome}"]

    def op_restore(self, old: Any, new: Any, clock: Any, outcome: str | None) -> list[str]:
        data = f"json.loads(json.dumps({self.name(old, 's')}.snapshot()))"
        call = f"sm.Session.restore({data}, clock={self.name(clock, 'clock')}, wall_clock=wall)"
        if new is not None:
            return [f"{self.name(new, 's')} = {call}"]
        return [f"{call}  # raised {outcome}"]

    def op_forge(
        self,
        old: Any,
        mutations: list[str],
        clock: Any,
        outcome: str | None,
        new: Any,
        now: float,
    ) -> list[str]:
        lines = [f"data = json.loads(json.dumps({self.name(old, 's')}.snapshot()))", *mutations]
        if id(clock) not in self.names:
            lines.append(f"{self.name(clock, 'clock')} = Clock({now!r})")
        call = f"sm.Session.restore(data, clock={self.names[id(clock)]}, wall_clock=wall)"
        if new is not None:
            lines.append(f"{self.name(new, 's')} = {call}")
        else:
            lines.append(self.guarded(call, outcome))
        return lines

    def op_build(self, call: str, exc: BaseException) -> list[str]:
        return [f"{call}  # raised {type(exc).__name__}"]

    def op_adopt(self, session: Any, turn: Any) -> list[str]:
        if turn is None:
            return []
        return [f"{self.name(turn, 't')} = {self.name(session, 's')}.current_turn"]


def render_script(log: Sequence[list[Any]], violation: str, tail: int | None = None) -> str:
    """The operations of a walk as a runnable script (a ``# VIOLATION`` comment on
    the last one, where it failed). With ``tail``, only the last operations (the
    names they use are defined earlier in the full script)."""
    script = _Script()
    blocks = [script.lines(entry) for entry in log]
    while blocks and not blocks[-1]:
        blocks.pop()
    if blocks:
        blocks[-1][-1] += f"  # VIOLATION {violation}"
    if tail is not None and len(blocks) > tail:
        shown = [f"# ... {len(blocks) - tail} earlier operations (--script prints them)"]
        return "\n".join(shown + [line for block in blocks[-tail:] for line in block])
    return SCRIPT_PREAMBLE + "\n\n" + "\n".join(line for block in blocks for line in block)


# -- the walk ------------------------------------------------------------------------------


class Walk:
    """One seeded walk: sessions one after another until its event budget is spent.

    It holds what spans sessions: the RNG, the operation log (for the replay
    script), the stale-handle pool and the id counters.
    """

    def __init__(
        self,
        walk_seed: int,
        *,
        settings_mix: bool,
        stats: Stats,
        limit: int,
        session_factory: SessionFactory | None = None,
    ) -> None:
        self.rng = FastRandom(walk_seed)
        self.walk_seed = walk_seed
        self.settings_mix = settings_mix
        self.stats = stats
        self.budget = self.rng.between(50, 2500)
        self.limit = limit
        self.factory = session_factory or default_factory
        self.log: list[list[Any]] = []
        self.pool: list[tuple[Any, Any]] = []
        """(turn, its session) handles kept for stale probes."""
        self.ids = 0
        self.requests = 0
        self.clock = ManualClock()
        self.next_snapshot = stats.steps + self.rng.between(5, 600)
        """The step of the next snapshot round trip (then every 60-1000 steps)."""
        self.next_forge = stats.steps + self.rng.between(20, 800)
        """The step of the next forged snapshot (then every 100-1500 steps)."""

    def pool_add(self, turn: Any, session: Any) -> None:
        """Keep ``turn`` (of ``session``) for stale-handle probes."""
        if turn is None:
            return
        if len(self.pool) < 32:
            self.pool.append((turn, session))
        else:
            self.pool[self.rng.below(32)] = (turn, session)

    def run(self) -> None:
        """Drive sessions until the budget is spent; raises :class:`Violation`.

        An exception raised inside the engine where the fuzzer only reads a
        session or a turn (a property) is a violation too; one raised in the
        fuzzer's own code propagates, as the bug it is."""
        try:
            self._run()
        except Violation:
            raise
        except Exception as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            where = frames[-1] if frames else None
            if where is None or f"{os.sep}statemachine{os.sep}" not in where.filename:
                raise
            raise Violation(
                f"unexpected-exception:read:{type(exc).__name__}",
                f"{type(exc).__name__} from {Path(where.filename).name}:{where.lineno} "
                f"({where.name}) while reading the engine's state: {short(str(exc))}",
            ) from None

    def _run(self) -> None:
        stats = self.stats
        end = min(stats.events + self.budget, self.limit)
        while stats.events < end:
            kw = pick_settings(self.rng, self.settings_mix)
            settings = sm.Settings(**kw)
            seed = self.rng.getrandbits(self.rng.pick((8, 32, 64)))
            now = self.clock.now
            session = self.factory(settings, seed, self.clock)
            self.log.append(["session", session, kw, seed, self.clock, now])
            stats.sessions += 1
            driver = Driver(self, session, self.clock)
            while stats.events < end and driver.step():
                pass
            if driver.turn is not None:
                self.pool_add(driver.turn, driver.session)


class Driver:
    """Drives one session with legal events and probes, and checks every step.

    What is checked (each failure a :class:`Violation` kind, see :data:`REQUIREMENTS`):

    * a refused call (illegal event, stale handle, ``new_turn()`` while a turn runs
      or after the end) raises the documented error and changes nothing observable;
      a legal event is taken; no other exception type escapes ``send``, ``start``,
      ``new_turn``, ``snapshot``, ``restore`` (or a property);
    * a turn takes at most :func:`step_bound` transitions;
    * a ``Wait`` is finite and >= 0, >= a usable retry-after, within the backoff
      envelope when there is none, and does not cross ``max_wall_clock_s``;
    * retries <= the ceiling, attempt <= ``max_retries``, reductions <= their cap,
      turns <= ``max_turns`` + 1, cost = the sum of the accepted costs, finite;
    * nothing but ``Finish`` after auth/invalid errors, content filters, unknown
      errors and partial streams; ``Assemble(reduce=True)`` or ``Finish`` after an
      overflow, whose request is never sent again; ``WaitDone`` retries the same
      request with attempt + 1;
    * once a limit fired, the next turn withholds tools (with an instruction), calls
      the model once, never waits or invokes tools, and then the session has ended
      with that limit and ``new_turn()`` raises ``SessionEnded``; a bound that
      fired after a turn makes the next turn the final-answer one;
    * a breaker trips at ``breaker_threshold`` consecutive crashes (that turn ends
      ``breaker_open``), its provider is never invoked again; a doom loop fires its
      limit; every tool outcome comes back as a result, failed ones error-flagged;
    * snapshots are JSON (``allow_nan=False``) and restore with the same counters
      and snapshot; a forged one is refused with ``SnapshotError`` or restores into
      a session that passes all of the above.

    The reference it keeps: the sum of accepted costs, a lower bound of each
    provider's consecutive crashes (and the breakers that must have tripped), a
    lower bound of the run of identical tool calls, the bounds seen after the last
    turn, and per turn: the requests that overflowed, a fatal error, the waits and
    model calls so far, the last ``CallModel``. Where the contract leaves room (a
    sliding-window breaker, what ends a run of identical calls) the reference is a
    lower bound, so only what the contract requires is flagged. ``forged`` drivers
    run a session restored from a forged snapshot: their reference starts from what
    the session shows, and their violation kinds start with ``forged-``.
    """

    def __init__(  # noqa: PLR0915 - the reference model's state, field by field
        self, walk: Walk, session: Any, clock: ManualClock, *, forged: bool = False
    ) -> None:
        self.w = walk
        self.rng = walk.rng
        self.stats = walk.stats
        self.log = walk.log
        self.clock = clock
        self.forged = forged
        self.p = "forged-" if forged else ""
        self.session = session
        settings = session.settings
        self.settings = settings
        self.ceiling = settings.session_retry_ceiling
        self.max_retries = settings.max_retries
        self.max_turns = settings.max_turns
        self.max_cost = settings.max_cost_usd
        self.max_wall = settings.max_wall_clock_s
        self.max_reductions = getattr(settings, "max_context_reductions", None)
        self.threshold = settings.breaker_threshold
        self.doom_threshold = settings.doom_loop_threshold
        self.fallbacks = tuple(settings.fallback_models)
        self.bound = step_bound(settings)
        # session reference
        self.cost: float = session.cost_usd
        self.crashes: dict[str, int] = {}
        self.must_trip: set[str] = set()
        self.denials = getattr(session, "denials", 0)
        self.denied = False
        self.tool_retry = False
        self.round: dict[str, Any] = {}
        self.doom_key: tuple[str, str] | None = None
        self.doom_run = 0
        self.after_finish: tuple[int, float, float | None] | None = None
        # turn reference
        self.turn: Any = session.current_turn
        self.limit: Any = session.limit_reached
        self.final = False
        self.steps = 0
        self.poisoned: list[Any] = []
        self.fatal = False
        self.waits: int | None = 0
        self.model_calls = 0
        self.last_call: Any = None
        self.last_size: int | None = None
        self.overflow_size: int | None = None
        self.doom_due = False
        self.tripped_before: frozenset[str] = frozenset()
        self.floor: float | None = None
        self.enveloped = False
        self.done = True
        """Whether the current turn has finished (or there is none yet)."""
        self.invoked = False
        """Whether the current turn has asked for tools."""
        if self.turn is not None:
            self.adopt_turn(self.turn)

    def adopt_turn(self, turn: Any) -> None:
        """Take over a turn whose history the driver did not see (restored from a
        forged snapshot): the per-turn reference starts unknown."""
        session = self.session
        self.turn = turn
        self.limit = session.limit_reached
        fa = getattr(turn, "final_answer", None)
        self.final = bool(fa) if fa is not None else False
        trace = turn.trace
        self.steps = len(trace)
        self.waits = None
        self.model_calls = sum(
            1 for record in trace if type(getattr(record, "action", None)) is sm.CallModel
        )
        self.last_call = None
        self.last_size = None
        self.overflow_size = None
        self.check_held_action(turn.action)
        self.done = turn.status is not None
        if self.done and not self.final:
            self.after_finish = (session.turns, session.cost_usd, None)

    def check_held_action(self, action: Any) -> None:
        """The action a restored turn holds is one the engine could have given."""
        kind = type(action)
        problem = None
        if action is None or kind is sm.Finish:
            return
        if kind is sm.Wait:
            seconds = action.seconds
            if isinstance(seconds, bool) or not isinstance(seconds, int | float):
                problem = "a Wait whose seconds are not a number"
            elif not _finite(seconds) or seconds < 0:
                raise Violation(self.p + "wait-invalid", f"the restored turn holds {short(action)}")
        elif kind is sm.InvokeTools:
            calls = action.calls
            if not isinstance(calls, tuple) or not all(type(c) is sm.ToolCall for c in calls):
                problem = "an InvokeTools whose calls are not ToolCalls"
            elif not calls:
                problem = "an InvokeTools with no call"
        elif kind is sm.Assemble:
            if type(action.reduce) is not bool:
                problem = "an Assemble whose reduce is not a bool"
        elif kind is sm.CallModel:
            if type(action.attempt) is not int or action.attempt < 0:
                problem = "a CallModel whose attempt is not an int >= 0"
        else:
            problem = f"not an action ({type(action).__name__})"
        if problem:
            raise Violation(
                self.p + "unreachable-state-accepted:action", f"{problem}: {short(action)}"
            )

    # -- one step ------------------------------------------------------------------

    def step(self) -> bool:
        """One operation; ``False`` once the session has ended (and was checked)."""
        self.stats.steps += 1
        if self.done:
            return self.between_turns()
        if not self.forged:
            w = self.w
            if self.stats.steps >= w.next_snapshot:
                w.next_snapshot = self.stats.steps + self.rng.between(60, 1000)
                self.round_trip()
                return True
            if self.stats.steps >= w.next_forge:
                w.next_forge = self.stats.steps + self.rng.between(100, 1500)
                self.forge()
                return True
            r = self.rng.random()
            if r < 0.055:  # 2 % illegal, 1.3 % stale, 1.5 % cancel, 0.7 % new_turn
                if r < 0.02:
                    self.illegal_probe()
                elif r < 0.033:
                    self.stale_probe()
                elif r < 0.048:
                    self.cancel()
                else:
                    self.new_turn_while_running()
                return True
        self.legal()
        return True

    def legal(self) -> None:
        """Send the legal event for the turn's last action."""
        action = self.turn.action
        kind = type(action)
        if kind is sm.CallModel:
            self.on_call_model(action)
        elif kind is sm.Assemble:
            self.on_assemble(action)
        elif kind is sm.Wait:
            self.on_wait(action)
        elif kind is sm.InvokeTools:
            self.on_invoke(action)
        elif action is None:
            self.start()
        else:
            raise Violation(
                self.p + "turn-status-inconsistent",
                f"the turn runs (status None, state {short(self.turn.state)}) after {short(action)}",
            )

    # -- engine calls ------------------------------------------------------------------

    def send(self, event: Any, *, refusable: bool = False) -> Any:
        """Send a legal event; any refusal or exception is a violation. With
        ``refusable`` (an event the contract lets the engine refuse, such as a cost
        that would take the spend past the float range) an IllegalEvent that
        changes nothing is allowed, and gives ``None``."""
        turn = self.turn
        entry = ["send", turn, event, None]
        self.log.append(entry)
        self.stats.events += 1
        before = (session_print(self.session), turn_print(turn)) if refusable else None
        try:
            action = turn.send(event)
        except (sm.IllegalEvent, sm.SessionEnded, sm.TurnInProgress) as exc:
            entry[3] = type(exc).__name__
            if refusable and type(exc) is sm.IllegalEvent:
                after = (session_print(self.session), turn_print(turn))
                if after != before:
                    raise Violation(
                        f"{self.p}refused-changed-state:{type(event).__name__}",
                        f"{short(event)} raised IllegalEvent but changed "
                        f"{short(before)} -> {short(after)}",
                    ) from None
                return None
            raise Violation(
                f"{self.p}legal-event-refused:{type(event).__name__}",
                f"{short(event)} after {short(turn.action)} in state {short(turn.state)}: {exc}",
            ) from None
        except Exception as exc:
            entry[3] = type(exc).__name__
            raise Violation(
                f"{self.p}unexpected-exception:send:{type(event).__name__}:{type(exc).__name__}",
                f"{short(event)} in state {short(turn.state)}: {short(str(exc))}",
            ) from None
        self.after(action)
        return action

    def start(self) -> Any:
        """Start the current turn: its first action must be ``Assemble``."""
        turn = self.turn
        entry = ["start", turn, None, None]
        self.log.append(entry)
        self.stats.events += 1
        try:
            action = turn.start()
        except (sm.IllegalEvent, sm.SessionEnded, sm.TurnInProgress) as exc:
            entry[3] = type(exc).__name__
            raise Violation(
                f"{self.p}legal-event-refused:start", f"start() of a new turn: {exc}"
            ) from None
        except Exception as exc:
            entry[3] = type(exc).__name__
            raise Violation(
                f"{self.p}unexpected-exception:start:{type(exc).__name__}", short(str(exc))
            ) from None
        if type(action) is not sm.Assemble or action.reduce:
            raise Violation(self.p + "protocol-broken:start", f"start() gave {short(action)}")
        self.after(action)
        return action

    def new_turn(self, *, idle_replace: bool = False) -> Any:
        """``session.new_turn()`` where it must succeed (``idle_replace``: the current
        turn was never started; replacing it or refusing with TurnInProgress are
        both allowed). Returns the turn, or ``None`` if refused as allowed."""
        session = self.session
        entry = ["new_turn", session, None, None]
        self.log.append(entry)
        try:
            turn = session.new_turn()
        except sm.TurnInProgress as exc:
            entry[3] = "TurnInProgress"
            if idle_replace:
                return None
            raise Violation(self.p + "new-turn-refused", f"after a finished turn: {exc}") from None
        except sm.SessionEnded as exc:
            entry[3] = "SessionEnded"
            raise Violation(
                self.p + "new-turn-refused", f"SessionEnded while status is None: {exc}"
            ) from None
        except Exception as exc:
            entry[3] = type(exc).__name__
            raise Violation(
                f"{self.p}unexpected-exception:new_turn:{type(exc).__name__}", short(str(exc))
            ) from None
        entry[2] = turn
        return turn

    # -- between turns ------------------------------------------------------------------

    def between_turns(self) -> bool:
        session = self.session
        rng = self.rng
        previous = self.turn
        if session.status is not None or (self.final and previous is not None):
            if session.status is None:
                raise Violation(
                    self.p + "session-not-ended", "the final-answer turn finished, status is None"
                )
            self.refused_new_turn(sm.SessionEnded, "after the session ended")
            return False
        if rng.random() < 0.3:
            self.advance(rng.pick((0.0, 0.25, 1.0, 7.5, 45.0, 400.0)))
        limit_before = session.limit_reached
        turn = self.new_turn()
        if previous is not None and turn is not previous and not self.forged:
            self.w.pool_add(previous, session)
        if not self.forged and rng.random() < 0.03:
            replacement = self.new_turn(idle_replace=True)
            if replacement is not None:
                self.w.pool_add(turn, session)
                turn = replacement
        self.begin_turn(turn, limit_before)
        if not self.forged and rng.random() < 0.01:
            self.round_trip()
        self.start()
        return True

    def begin_turn(self, turn: Any, limit_before: Any) -> None:
        """The per-turn reference for a new turn, and the checks of ``new_turn``."""
        session = self.session
        p = self.p
        self.turn = turn
        limit = session.limit_reached
        if limit_before is not None and limit is None:
            raise Violation(p + "limit-unset", f"limit {limit_before} vanished at new_turn()")
        self.limit = limit
        self.final = limit is not None
        if not self.final:
            if self.max_turns is not None and session.turns > self.max_turns:
                raise Violation(
                    p + "turns-over-max",
                    f"turn {short(session.turns)} is a regular turn with max_turns={short(self.max_turns)}",
                )
            after = self.after_finish
            if after is not None:
                _, cost, elapsed = after
                if self.max_cost is not None and cost > self.max_cost:
                    raise Violation(
                        p + "bound-not-fired:max_cost_usd",
                        f"cost {short(cost)} > {short(self.max_cost)} after the last turn, "
                        "and the next turn is a regular one",
                    )
                if (
                    self.max_wall is not None
                    and elapsed is not None
                    and elapsed > self.max_wall + 1e-9
                ):
                    raise Violation(
                        p + "bound-not-fired:max_wall_clock_s",
                        f"elapsed {short(elapsed)} s > {short(self.max_wall)} after the last turn, "
                        "and the next turn is a regular one",
                    )
        self.done = False
        self.invoked = False
        self.steps = 0
        self.poisoned = []
        self.fatal = False
        self.waits = 0
        self.model_calls = 0
        self.last_call = None
        self.last_size = None
        self.overflow_size = None
        self.doom_due = False

    def refused_new_turn(self, expected: type[Exception], when: str) -> None:
        session = self.session
        self.probe(
            "new-turn-accepted",
            session.new_turn,
            ["new_turn", session, None, None],
            (expected,),
            [session],
            f"new_turn() {when}",
        )

    def new_turn_while_running(self) -> None:
        """``new_turn()`` while the turn runs: TurnInProgress, nothing changes."""
        self.refused_new_turn(sm.TurnInProgress, f"while the turn runs ({short(self.turn.state)})")

    # -- checks after every accepted step ---------------------------------------------------

    def after(self, action: Any) -> None:
        """The checks of every accepted step. The counters are read where they can
        move (a wait or a model call: the retries and the attempt; a reply: the cost;
        a finish: everything) and on every 8th step whatever happened."""
        steps = self.steps = self.steps + 1
        p = self.p
        if steps > self.bound:
            raise Violation(
                p + "unbounded-turn",
                f"{short(steps)} transitions in one turn (bound {short(self.bound)} for these settings)",
            )
        kind = type(action)
        if kind is sm.CallModel:
            self.check_call(action)
            self.check_counters(action)
            return
        if kind is sm.Wait:
            self.check_wait(action)
            self.check_counters(action)
            return
        if kind is sm.Finish:
            self.done = True
            self.check_counters(action)
            self.check_finish(action)
            return
        if kind is sm.InvokeTools:
            self.invoked = True
            if self.final:
                raise Violation(p + "final-answer-invoked-tools", short(action))
            tripped = self.tripped_before
            if tripped:
                for call in action.calls:
                    if call.provider in tripped:
                        raise Violation(
                            p + "tripped-provider-invoked",
                            f"{call.provider!r} is open ({sorted(tripped)}): {short(action)}",
                        )
        elif kind is sm.Assemble:
            if self.final and (
                not action.withhold_tools
                or not isinstance(action.instruction, str)
                or not action.instruction
            ):
                raise Violation(p + "final-answer-tools-offered", short(action))
        else:
            raise Violation(p + "protocol-broken:action", f"not an action: {short(action)}")
        if not steps & 7:
            self.check_counters(action)

    def check_counters(self, action: Any) -> None:
        """The session's and the turn's counters: within their caps, the cost the sum
        of the accepted ones, the status set exactly by a Finish."""
        p = self.p
        session = self.session
        turn = self.turn
        if (turn.status is not None) != (type(action) is sm.Finish):
            raise Violation(
                p + "turn-status-inconsistent", f"status {turn.status} after {short(action)}"
            )
        if session.retries_used > self.ceiling:
            raise Violation(
                p + "retries-over-ceiling",
                f"retries_used={short(session.retries_used)} > session_retry_ceiling={short(self.ceiling)}",
            )
        if turn.attempt > self.max_retries:
            raise Violation(
                p + "attempt-over-max",
                f"attempt={short(turn.attempt)} > max_retries={short(self.max_retries)}",
            )
        if self.max_turns is not None and session.turns > self.max_turns + 1:
            raise Violation(
                p + "turns-over-max",
                f"turns={short(session.turns)} > max_turns + 1 = {short(self.max_turns + 1)}",
            )
        self.check_cost()

    def check_cost(self) -> None:
        """``cost_usd`` is the sum of the accepted costs, and finite."""
        cost = self.session.cost_usd
        if cost != self.cost:
            p = self.p
            ref = self.cost
            if not (_finite(cost) and _finite(ref) and abs(cost - ref) <= 1e-9 * max(1.0, ref)):
                if not _finite(cost):
                    raise Violation(
                        p + "cost-not-finite", f"cost_usd={short(cost)} (reference {short(ref)})"
                    )
                raise Violation(
                    p + "cost-mismatch",
                    f"cost_usd={short(cost)}, the accepted costs sum to {short(ref)}",
                )
            self.cost = cost

    def check_call(self, action: Any) -> None:
        p = self.p
        if self.fatal:
            raise Violation(p + "call-after-fatal", short(action))
        self.model_calls += 1
        if self.final:
            if not action.withhold_tools:
                raise Violation(p + "final-answer-tools-offered", short(action))
            if self.model_calls > 1:
                raise Violation(
                    p + "final-answer-retried",
                    f"model call {short(self.model_calls)}: {short(action)}",
                )
        if action.attempt > self.max_retries:
            raise Violation(
                p + "attempt-over-max",
                f"{short(action)} with max_retries={short(self.max_retries)}",
            )
        if self.poisoned and not self.forged:
            request = action.request
            for bad in self.poisoned:
                if request == bad:
                    raise Violation(
                        p + "context-overflow-resent",
                        f"{short(action)} carries a request that overflowed",
                    )
        self.last_call = action

    def check_wait(self, action: Any) -> None:
        p = self.p
        seconds = action.seconds
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not _finite(seconds)
            or seconds < 0
        ):
            raise Violation(p + "wait-invalid", short(action))
        if self.final:
            raise Violation(p + "final-answer-retried", f"a wait: {short(action)}")
        floor = self.floor
        if floor is not None and seconds + 1e-9 < floor:
            raise Violation(
                p + "wait-below-retry-after",
                f"{short(action)} but the server asked for {short(floor)} s",
            )
        waits = self.waits
        if self.enveloped and waits is not None:
            ceiling = backoff_ceiling(self.settings, waits)
            if seconds > ceiling * (1 + 1e-9) + 1e-9:
                raise Violation(
                    p + "wait-above-backoff",
                    f"{short(action)} is above 1.5 x delay({short(waits)}) = {short(ceiling)} s "
                    "with no retry-after",
                )
        if self.max_wall is not None:
            elapsed = self.session.elapsed_s
            if elapsed + seconds > self.max_wall + 1e-9:
                raise Violation(
                    p + "wait-crosses-wall-clock",
                    f"{short(action)} at elapsed {short(elapsed)} s crosses max_wall_clock_s="
                    f"{short(self.max_wall)}",
                )
        if waits is not None:
            self.waits = waits + 1

    def check_finish(self, action: Any) -> None:
        p = self.p
        session = self.session
        turn = self.turn
        if turn.status is None or turn.status != action.status:
            raise Violation(
                p + "turn-status-inconsistent", f"turn.status={turn.status} after {short(action)}"
            )
        if self.final:
            if session.status is None or session.status != self.limit:
                raise Violation(
                    p + "session-not-ended",
                    f"the final-answer turn finished ({action.status}); session.status="
                    f"{session.status}, the limit that fired: {self.limit}",
                )
        else:
            self.after_finish = (session.turns, session.cost_usd, session.elapsed_s)
            if not self.invoked:  # conservative: a turn without a tool round may end a run
                self.doom_key, self.doom_run = None, 0
            if action.status is sm.TurnStatus.BUDGET_EXHAUSTED and session.limit_reached is None:
                raise Violation(
                    p + "limit-not-fired:budget_exhausted",
                    "the turn ended budget_exhausted, limit_reached is None",
                )
        if self.final or self.rng.random() < 0.3 or session.limit_reached is not None:
            self.check_static()

    def check_static(self) -> None:
        """The invariants any reachable session holds, whatever led to it."""
        p = self.p
        session = self.session
        retries = session.retries_used
        if retries > self.ceiling:
            raise Violation(
                p + "retries-over-ceiling",
                f"retries_used={short(retries)} > session_retry_ceiling={short(self.ceiling)}",
            )
        turns = session.turns
        if self.max_turns is not None and turns > self.max_turns + 1:
            raise Violation(
                p + "turns-over-max",
                f"turns={short(turns)} > max_turns + 1 = {short(self.max_turns + 1)}",
            )
        cost = session.cost_usd
        if not _finite(cost) or cost < 0:
            raise Violation(p + "cost-not-finite", f"cost_usd={short(cost)}")
        status, limit = session.status, session.limit_reached
        if status is not None and status != limit:
            raise Violation(
                p + "session-status-inconsistent", f"status={status} but limit_reached={limit}"
            )
        tripped = session.tripped_providers
        if tripped and limit is None:
            raise Violation(
                p + "breaker-limit-not-fired", f"tripped {sorted(tripped)}, limit_reached is None"
            )
        for provider, count in session.crash_counts.items():
            if count >= self.threshold and provider not in tripped:
                raise Violation(
                    p + "breaker-not-tripped",
                    f"{provider!r} crashed {short(count)} times in a row (threshold {short(self.threshold)}) "
                    "and is not open",
                )
        turn = session.current_turn
        if turn is None:
            if status is not None or turns != 0:
                raise Violation(
                    p + "unreachable-state-accepted:no-turn",
                    f"no current turn, turns={short(turns)}, status={status}",
                )
            return
        if turn.attempt > self.max_retries:
            raise Violation(
                p + "attempt-over-max",
                f"attempt={short(turn.attempt)} > max_retries={short(self.max_retries)}",
            )
        reductions = getattr(turn, "reductions", None)
        if (
            self.max_reductions is not None
            and reductions is not None
            and reductions > self.max_reductions
        ):
            raise Violation(
                p + "reductions-over-max",
                f"reductions={short(reductions)} > max_context_reductions={short(self.max_reductions)}",
            )
        done = turn.status is not None
        if status is not None and not done:
            raise Violation(
                p + "session-status-inconsistent",
                f"ended ({status}) mid-turn ({short(turn.state)})",
            )
        final = getattr(turn, "final_answer", None)
        if final and limit is None:
            raise Violation(
                p + "unreachable-state-accepted:final-without-limit",
                "a final-answer turn while no limit fired",
            )
        if status is not None and final is False:
            raise Violation(
                p + "unreachable-state-accepted:ended-by-regular-turn",
                f"session ended ({status}) and its last turn is not the final-answer turn",
            )
        if final:
            action = turn.action
            kind = type(action)
            if kind in (sm.Wait, sm.InvokeTools):
                raise Violation(p + "final-answer-retried", f"holds {short(action)}")
            if kind in (sm.Assemble, sm.CallModel) and not action.withhold_tools:
                raise Violation(p + "final-answer-tools-offered", f"holds {short(action)}")
        if self.forged and done and not final and limit is None:
            if self.max_turns is not None and turns > self.max_turns:
                raise Violation(
                    p + "unreachable-state-accepted:turns",
                    f"{short(turns)} finished turns > max_turns={short(self.max_turns)}, no limit",
                )
            if self.max_cost is not None and cost > self.max_cost:
                raise Violation(
                    p + "unreachable-state-accepted:cost",
                    f"cost {short(cost)} > max_cost_usd={short(self.max_cost)} after a turn, no limit",
                )

    # -- legal events ---------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        if seconds:
            self.clock.now += seconds
            self.log.append(["clock", self.clock, self.clock.now])

    def new_request(self) -> Any:
        self.w.requests += 1
        n = self.w.requests
        if n % 10:
            return f"req-{n}"
        return {"messages": [{"role": "user", "content": f"m{n}"}], "n": n}

    def on_assemble(self, action: Any) -> None:
        rng = self.rng
        reduce = action.reduce
        if rng.random() < (0.12 if reduce else 0.03):
            result = self.send(CANNOT_SHRINK)
            if reduce and (
                type(result) is not sm.Finish
                or result.status is not sm.TurnStatus.CONTEXT_EXHAUSTED
            ):
                raise Violation(
                    self.p + "context-cannot-shrink",
                    f"CannotShrink after a reduction: {short(result)}",
                )
            return
        if reduce and self.poisoned and not self.forged and rng.random() < 0.25:
            request = self.poisoned[-1]
        else:
            request = self.new_request()
        overflowed = self.overflow_size
        r = rng.random()
        if r < 0.002:
            size: int = rng.pick((HUGE_30, HUGE_5000))
        elif reduce and overflowed is not None:
            if r >= 0.8:
                size = overflowed + rng.between(0, 3)
            elif overflowed > 2**52:  # a huge size the engine took: exact ints
                size = rng.randrange(overflowed)
            else:
                size = rng.between(0, max(0, overflowed - 1))
        else:
            size = rng.between(0, 5000)
        try:
            event = sm.Assembled(request, size)
        except (TypeError, ValueError):  # refused by its constructor, naming the field
            size = rng.between(0, 5000)
            event = sm.Assembled(request, size)
        except Exception as exc:
            self.log.append(["build", f"sm.Assembled({render(request)}, {render(size)})", exc])
            raise Violation(
                f"{self.p}constructor-undocumented-error:Assembled:{type(exc).__name__}",
                f"Assembled(size={render(size)}) raised {short(str(exc))}",
            ) from None
        result = self.send(event)
        kind = type(result)
        if kind is sm.CallModel:
            if result.attempt != 0 or result.request != request:
                raise Violation(
                    self.p + "protocol-broken:assembled",
                    f"Assembled({short(request)}) gave {short(result)}",
                )
            self.last_size = size
            return
        if kind is not sm.Finish:
            raise Violation(self.p + "protocol-broken:assembled", f"gave {short(result)}")
        if not reduce:
            raise Violation(
                self.p + "protocol-broken:assembled", f"a fresh Assembled gave {short(result)}"
            )
        smaller = overflowed is not None and size < overflowed
        if smaller and not self.forged and all(request != bad for bad in self.poisoned):
            raise Violation(
                self.p + "context-cannot-shrink",
                f"a strictly smaller, new request ({short(size)} < {short(overflowed)}) ended {result.status}",
            )
        if result.status is not sm.TurnStatus.CONTEXT_EXHAUSTED:
            raise Violation(
                self.p + "context-cannot-shrink",
                f"a reduction that did not shrink ended {result.status}",
            )

    def make_calls(self) -> list[tuple[sm.ToolCall, tuple[str, str]]]:
        rng = self.rng
        r = rng.random()
        if r < 0.4:
            return []
        count = 1 if r < 0.7 else rng.between(2, 3)
        repeat = self.doom_key is not None and rng.random() < 0.3
        calls = []
        for _ in range(count):
            self.w.ids += 1
            if repeat and self.doom_key is not None:
                name, canon = self.doom_key
                args = next(value for value, c in ARGUMENTS if c == canon)
                if rng.random() < 0.5:
                    args = json.loads(canon)
            else:
                name = rng.pick(TOOL_NAMES)
                args, canon = ARGUMENTS[rng.below(len(ARGUMENTS))]
            provider = PROVIDERS[0] if rng.random() < 0.5 else rng.pick(PROVIDERS)
            calls.append((sm.ToolCall(f"c{self.w.ids}", provider, name, args), (name, canon)))
        return calls

    def make_cost(self) -> Any:
        r = self.rng.random()
        if r < 0.5:
            return 0.0
        if r < 0.9:
            return self.rng.pick((0.001, 0.002, 0.01, 0.02, 0.3, 1e-9, 0))
        if r < 0.998:
            return self.rng.uniform(0, 0.05)
        return self.rng.pick((1e308, HUGE_400))

    def on_call_model(self, action: Any) -> None:
        rng = self.rng
        if rng.random() < 0.1:
            self.advance(rng.pick((0.5, 3.0, 20.0)))
        if rng.random() < 0.45:
            self.reply()
        else:
            self.fail(action)

    def reply(self) -> None:
        p = self.p
        calls = self.make_calls()
        cost = self.make_cost()
        reply = self.rng.pick(REPLIES)
        try:
            event = sm.ModelReplied([c for c, _ in calls], cost=cost, reply=reply)
        except (TypeError, ValueError):
            return  # refused by its constructor, naming the field: the host's problem
        except Exception as exc:
            call = f"sm.ModelReplied({render([c for c, _ in calls])}, cost={render(cost)})"
            self.log.append(["build", call, exc])
            raise Violation(
                f"{p}constructor-undocumented-error:ModelReplied:{type(exc).__name__}",
                f"ModelReplied(cost={render(cost)}) raised {short(str(exc))}",
            ) from None
        before = self.cost
        self.cost += event.cost
        self.tripped_before = self.session.tripped_providers
        result = self.send(event, refusable=not _finite(self.cost))
        if result is None:  # refused: the spend would have left the float range
            self.cost = before
            return
        self.check_cost()
        kind = type(result)
        if not calls or self.final:
            if kind is not sm.Finish or (
                not calls and result.status is not sm.TurnStatus.COMPLETED
            ):
                raise Violation(
                    p + "protocol-broken:reply",
                    f"a reply {'in the final-answer turn' if self.final else 'without tool calls'}"
                    f" gave {short(result)}",
                )
            if not self.final:
                self.doom_key, self.doom_run = None, 0
            return
        if kind is not sm.InvokeTools:
            raise Violation(
                p + "protocol-broken:reply", f"a reply with tool calls gave {short(result)}"
            )
        ids = [c.id for c, _ in calls]
        got = [c.id for c in result.calls]
        if got != ids and sorted(got) != sorted(ids):
            raise Violation(
                p + "protocol-broken:reply", f"invoked {short(result.calls)} for {short(calls)}"
            )
        for _, key in calls:
            if key == self.doom_key:
                self.doom_run += 1
            else:
                self.doom_key, self.doom_run = key, 1
            if self.doom_run >= self.doom_threshold:
                self.doom_due = True

    def pick_retry_after(self) -> RetryAfter:
        rng = self.rng
        r = rng.random()
        if r < 0.25:
            value = rng.pick((rng.uniform(0, 5), rng.uniform(0, 500), float(rng.between(0, 3))))
            return ({"retry_after_seconds": value}, value, False)
        if r < 0.3:
            millis = rng.between(0, 5000)
            return ({"headers": {"retry-after-ms": str(millis)}}, millis / 1000.0, False)
        if r < 0.3005:
            rare: RetryAfter = rng.pick(RARE_RETRY_AFTERS)
            return rare
        return RETRY_AFTERS[rng.below(len(RETRY_AFTERS))]

    def make_failure(
        self, category: sm.ErrorCategory, kwargs: dict[str, Any], partial: bool
    ) -> Any:
        """The ModelFailed event (``None`` if its constructor refused the values with
        TypeError or ValueError, as it may)."""
        key = (category, id(kwargs), partial)
        event = FAILURES.get(key)
        if event is not None:
            return event
        try:
            event = sm.ModelFailed(sm.ModelError(category, "boom", **kwargs), partial=partial)
        except (TypeError, ValueError):
            return None
        except Exception as exc:
            args = ", ".join(f"{k}={render(v)}" for k, v in kwargs.items())
            call = f"sm.ModelFailed(sm.ModelError({category.value!r}, 'boom', {args}))"
            self.log.append(["build", call, exc])
            raise Violation(
                f"{self.p}constructor-undocumented-error:ModelError:{type(exc).__name__}",
                f"ModelError({category.value!r}, **{render(kwargs)}) raised {short(str(exc))}",
            ) from None
        if id(kwargs) in FIXED_RETRY_AFTERS:
            FAILURES[key] = event  # events are values: a fixed one is built once
        return event

    def fail(self, action: Any) -> None:
        rng = self.rng
        category = CATEGORIES[rng.below(len(CATEGORIES))]
        kwargs, floor, enveloped = self.pick_retry_after()
        partial = rng.random() < 0.05
        event = self.make_failure(category, kwargs, partial)
        if event is None:
            return
        transient = category in TRANSIENT
        self.floor = floor if transient and not partial else None
        self.enveloped = enveloped and transient and not partial
        try:
            result = self.send(event)
        finally:
            self.floor = None
            self.enveloped = False
        self.check_failure(category, partial, action, result)

    def check_failure(
        self, category: sm.ErrorCategory, partial: bool, action: Any, result: Any
    ) -> None:
        """The reaction the contract requires to a ``category`` failure of ``action``."""
        p = self.p
        kind = type(result)
        if partial:
            if kind is not sm.Finish:
                raise Violation(p + "partial-resent", f"partial {category.value}: {short(result)}")
        elif category in FATAL:
            self.fatal = True
            if kind is not sm.Finish or result.status.value != category.value:
                raise Violation(p + "fatal-not-finished", f"{category.value}: {short(result)}")
        elif category is sm.ErrorCategory.CONTENT_FILTERED:
            if kind is not sm.Finish or result.status is not sm.TurnStatus.CONTENT_FILTERED:
                raise Violation(p + "content-filtered-not-surfaced", short(result))
        elif category is sm.ErrorCategory.UNKNOWN:
            if kind is not sm.Finish or result.status is not sm.TurnStatus.UNKNOWN_ERROR:
                raise Violation(p + "unknown-retried", short(result))
        elif category is sm.ErrorCategory.CONTEXT_LENGTH_EXCEEDED:
            self.poisoned.append(action.request)
            self.overflow_size = self.last_size
            if not (kind is sm.Finish or (kind is sm.Assemble and result.reduce)):
                raise Violation(p + "context-overflow-reaction", short(result))
        elif kind is sm.CallModel:  # a fallback
            if result.model not in self.fallbacks or (
                not self.forged and result.request != action.request
            ):
                raise Violation(
                    p + "protocol-broken:fallback", f"{category.value} gave {short(result)}"
                )
        elif kind not in (sm.Wait, sm.Finish):
            raise Violation(p + "protocol-broken:transient", f"{category.value}: {short(result)}")

    def on_wait(self, action: Any) -> None:
        rng = self.rng
        extra = rng.pick((0.0, 0.0, 0.0, 0.0, 0.0, 0.01, 1.0, 30.0))
        self.advance(action.seconds + extra)
        previous = self.last_call
        result = self.send(WAIT_DONE)
        if isinstance(action.category, sm.ToolErrorCategory):  # a conflict's re-invocation
            if type(result) is not sm.InvokeTools or len(result.calls) != 1:
                raise Violation(
                    self.p + "protocol-broken:wait_done", f"WaitDone gave {short(result)}"
                )
            return
        if type(result) is not sm.CallModel:
            raise Violation(self.p + "protocol-broken:wait_done", f"WaitDone gave {short(result)}")
        if (
            previous is not None
            and not self.forged
            and (result.attempt != previous.attempt + 1 or result.request != previous.request)
        ):
            raise Violation(
                self.p + "protocol-broken:wait_done",
                f"after {short(previous)} the retry is {short(result)}",
            )

    def on_invoke(self, action: Any) -> None:  # noqa: PLR0915 - one oracle, read top to bottom
        rng = self.rng
        outcomes = []
        newly: list[str] = []
        crashes = self.crashes
        threshold = self.threshold
        if not self.tool_retry:
            self.round = {}
        self.tool_retry = False
        died: dict[str, bool] = {}
        denied = False
        deny_at = self.settings.denial_threshold
        for call in action.calls:
            r = rng.random()
            if r < 0.55:
                outcome = sm.ToolOutcome(call.id, ok=True, content="ok")
            else:
                category = TOOL_FAILURES[rng.below(len(TOOL_FAILURES))]
                outcome = sm.ToolOutcome(call.id, ok=False, content="err", category=category)
            outcomes.append(outcome)
            self.round[call.id] = outcome
            crashed = outcome.category is sm.ToolErrorCategory.PROCESS_CRASHED
            died[call.provider] = died.get(call.provider, False) or crashed
            if deny_at is not None:
                hit = outcome.category is sm.ToolErrorCategory.PERMISSION_DENIED
                self.denials = self.denials + 1 if hit else 0
                denied = denied or self.denials >= deny_at
        for provider, crashed in died.items():  # one death per provider per round (ER-89)
            count = crashes.get(provider, 0) + 1 if crashed else 0
            crashes[provider] = count
            if count >= threshold and provider not in self.must_trip:
                self.must_trip.add(provider)
                newly.append(provider)
        if len(outcomes) > 1 and rng.random() < 0.1:
            rng.shuffle(outcomes)
        result = self.send(sm.ToolsDone(outcomes))
        p = self.p
        conflicted = any(  # in this round, or still waiting from an earlier one
            o.category is sm.ToolErrorCategory.CONCURRENCY_CONFLICT for o in self.round.values()
        )
        if type(result) is sm.Wait:
            if not conflicted or newly or denied:
                raise Violation(p + "protocol-broken:tools_done", f"ToolsDone gave {short(result)}")
            self.tool_retry = True
            return
        if type(result) is not sm.Finish:
            raise Violation(p + "protocol-broken:tools_done", f"ToolsDone gave {short(result)}")
        got = {r.call_id: r.is_error for r in result.tool_results}
        want = {call_id: not o.ok for call_id, o in self.round.items()}
        if got != want or len(result.tool_results) != len(self.turn.calls):
            raise Violation(
                p + "tool-results-wrong", f"results {short(got)} for outcomes {short(want)}"
            )
        session = self.session
        tripped = session.tripped_providers
        if newly:
            missing = [q for q in newly if q not in tripped]
            if missing or result.status is not sm.TurnStatus.BREAKER_OPEN:
                raise Violation(
                    p + "breaker-not-tripped",
                    f"{newly} reached {short(threshold)} consecutive crashes; tripped={sorted(tripped)}, "
                    f"the turn ended {result.status}",
                )
        if result.status is sm.TurnStatus.BREAKER_OPEN and not (tripped or denied or self.denied):
            raise Violation(p + "breaker-not-tripped", "breaker_open with no breaker tripped")
        self.denied = self.denied or denied
        if (tripped or self.doom_due or denied) and session.limit_reached is None:
            raise Violation(
                p + ("doom-loop-not-fired" if self.doom_due else "breaker-limit-not-fired"),
                f"doom run {short(self.doom_run)} (threshold {short(self.doom_threshold)}), tripped "
                f"{sorted(tripped)}, denied {denied}; limit_reached is None",
            )

    def cancel(self) -> None:
        action = self.turn.action
        result = self.send(CANCELLED)
        if type(result) is not sm.Finish or result.status is not sm.TurnStatus.CANCELLED:
            raise Violation(self.p + "cancel-not-finished", short(result))
        self.tool_retry = False
        if type(action) is sm.InvokeTools:
            for call in action.calls:
                self.crashes[call.provider] = 0
                if self.settings.denial_threshold is not None:
                    self.denials = 0
            cancelled = [
                r for r in result.tool_results if r.call_id in {c.id for c in action.calls}
            ]
            if len(result.tool_results) != len(self.turn.calls) or not all(
                r.is_error for r in cancelled
            ):
                raise Violation(
                    self.p + "cancel-not-finished",
                    f"in-flight calls {short(action.calls)} came back as {short(result.tool_results)}",
                )
        self.doom_key, self.doom_run = None, 0

    # -- probes: every refusal must change nothing --------------------------------------------

    def probe(
        self,
        what: str,
        call: Callable[[], Any],
        entry: list[Any],
        expected: tuple[type[Exception], ...],
        sessions: list[Any],
        description: str,
        handle: Any = None,
    ) -> None:
        """Make a call that must be refused with one of ``expected`` and change nothing
        observable of ``handle`` and ``sessions`` (and the walk's current turn)."""
        p = self.p
        probed = handle if handle is not None else self.turn
        others = {id(t): t for t in (self.turn, *(s.current_turn for s in sessions))}
        others.pop(id(None), None)
        others.pop(id(probed), None)

        full = self.rng.random() < 0.1  # the trace's length costs a record per step

        def observe() -> list[Any]:
            return [
                *(session_print(s) for s in sessions),
                turn_print(probed, full=full),
                *(turn_print(t, full=False) for t in others.values()),
            ]

        before = observe()
        self.log.append(entry)
        try:
            result = call()
        except expected as exc:
            entry[-1] = type(exc).__name__
        except Exception as exc:
            entry[-1] = type(exc).__name__
            raise Violation(
                f"{p}unexpected-exception:{what}:{type(exc).__name__}",
                f"{description}: {short(str(exc))}",
            ) from None
        else:
            raise Violation(
                f"{p}{what}", f"{description} was accepted and returned {short(result)}"
            )
        after = observe()
        if after != before:
            changed = (
                "stale-handle-changed-state" if handle is not None else "refused-changed-state"
            )
            raise Violation(
                f"{p}{changed}:{what}",
                f"{description} raised {entry[-1]} but changed {short(before)} -> {short(after)}",
            )

    def illegal_probe(self) -> None:
        """An event the current turn must refuse with IllegalEvent."""
        self.stats.illegal += 1
        self.stats.events += 1
        rng = self.rng
        turn = self.turn
        action = turn.action
        kind = type(action) if action is not None else None
        r = rng.random()
        if r < 0.12:
            self.probe(
                "illegal-accepted:start",
                turn.start,
                ["start", turn, None, None],
                (sm.IllegalEvent,),
                [self.session],
                f"start() in state {short(turn.state)}",
            )
            return
        if r < 0.32:
            event = NOT_EVENTS[rng.below(len(NOT_EVENTS))]
        elif r < 0.6 and kind is sm.CallModel:
            self.w.ids += 1
            n = self.w.ids
            name = rng.pick(TOOL_NAMES)
            event = sm.ModelReplied(
                [sm.ToolCall(f"dup{n}", "fs", name), sm.ToolCall(f"dup{n}", "web", name, {})]
            )
        elif r < 0.6 and kind is sm.InvokeTools:
            event = self.bad_tools_done(action.calls)
        else:
            legal = LEGAL.get(kind, ())
            options = [e for e in SAMPLE_EVENTS if type(e) not in legal]
            event = options[rng.below(len(options))]
        self.probe(
            f"illegal-accepted:{type(event).__name__}",
            lambda: turn.send(event),
            ["send", turn, event, None],
            (sm.IllegalEvent,),
            [self.session],
            f"{short(event)} in state {short(turn.state)} after {short(action)}",
        )

    def bad_tools_done(self, calls: Sequence[sm.ToolCall]) -> sm.ToolsDone:
        """A ToolsDone with an unknown, a missing or a duplicate call id."""
        good = [sm.ToolOutcome(c.id, ok=True) for c in calls]
        how = self.rng.below(5)
        if how == 0:
            outcomes = [*good, sm.ToolOutcome("unknown-id", ok=True)]
        elif how == 1:
            outcomes = [sm.ToolOutcome("unknown-id", ok=True)]
        elif how == 2:
            outcomes = good[:-1]
        elif how == 3:
            outcomes = [*good, good[0]]
        else:
            outcomes = [sm.ToolOutcome(calls[0].id, ok=False, category="timeout"), *good]
        return sm.ToolsDone(outcomes)

    def stale_probe(self) -> None:
        """A turn handle that is not its session's current turn, or whose session has
        ended: every event and start() must be refused and change nothing."""
        pool = self.w.pool
        if not pool:
            return
        rng = self.rng
        handle, owner = pool[rng.below(len(pool))]
        if handle is owner.current_turn and owner.status is None:
            return  # not stale (the current turn of a session that goes on)
        self.stats.stale += 1
        self.stats.events += 1
        action = handle.action
        r = rng.random()
        sessions = [owner] if owner is self.session else [owner, self.session]
        if r < 0.35 or (action is None and r < 0.7):
            self.probe(
                "stale-handle-accepted:start",
                handle.start,
                ["start", handle, None, None],
                (sm.IllegalEvent, sm.SessionEnded),
                sessions,
                f"start() of a stale turn (state {short(handle.state)})",
                handle,
            )
            return
        event = self.tempting_event(action) if r < 0.8 else rng.pick(SAMPLE_EVENTS)
        self.probe(
            f"stale-handle-accepted:{type(event).__name__}",
            lambda: handle.send(event),
            ["send", handle, event, None],
            (sm.IllegalEvent, sm.SessionEnded),
            sessions,
            f"{short(event)} to a stale turn (state {short(handle.state)}, after {short(action)})",
            handle,
        )

    def tempting_event(self, action: Any) -> Any:
        """The event a stale handle's last action asks for: what would spend, retry or
        invoke if the handle were (wrongly) live."""
        kind = type(action)
        if kind is sm.Assemble:
            return sm.Assembled("stale", 10)
        if kind is sm.CallModel:
            if self.rng.random() < 0.5:
                return sm.ModelFailed(sm.ModelError("rate_limited"))
            return sm.ModelReplied([sm.ToolCall("stale-1", "fs", "read")], cost=0.5)
        if kind is sm.Wait:
            return WAIT_DONE
        if kind is sm.InvokeTools:
            return sm.ToolsDone(
                [sm.ToolOutcome(c.id, ok=False, category="process_crashed") for c in action.calls]
            )
        return CANCELLED if self.rng.random() < 0.5 else self.rng.pick(SAMPLE_EVENTS)

    # -- snapshots ------------------------------------------------------------------------

    def take_snapshot(self, session: Any, what: str) -> Any:
        """``session.snapshot()`` through JSON text; it must not fail."""
        p = self.p
        entry = ["snapshot", session, None]
        self.log.append(entry)
        try:
            data = session.snapshot()
        except sm.SnapshotError as exc:
            entry[2] = "SnapshotError"
            raise Violation(
                p + "snapshot-refused-accepted-state",
                f"snapshot() of {what} raised SnapshotError: {short(str(exc))}",
            ) from None
        except Exception as exc:
            entry[2] = type(exc).__name__
            raise Violation(
                f"{p}unexpected-exception:snapshot:{type(exc).__name__}",
                f"snapshot() of {what}: {short(str(exc))}",
            ) from None
        try:
            text = json.dumps(data, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            entry[2] = type(exc).__name__
            raise Violation(
                p + "snapshot-not-json",
                f"snapshot() of {what} is not JSON: {type(exc).__name__}: {short(str(exc))}",
            ) from None
        return json.loads(text)

    def restore(self, data: Any, clock: ManualClock, entry: list[Any], what: str) -> Any:
        try:
            return sm.Session.restore(data, clock=clock, wall_clock=wall_clock)
        except sm.SnapshotError as exc:
            entry[4] = "SnapshotError"
            if what == "forged":
                return None
            raise Violation(
                self.p + "restore-refused-own-snapshot", f"restore() raised {short(str(exc))}"
            ) from None
        except Exception as exc:
            entry[4] = type(exc).__name__
            raise Violation(
                f"{self.p}restore-raised:{what}:{type(exc).__name__}",
                f"restore() of a {what} snapshot raised {type(exc).__name__}: {short(str(exc))}",
            ) from None

    def round_trip(self) -> None:
        """Snapshot through JSON, restore, compare, and go on with the restored one."""
        session = self.session
        data = self.take_snapshot(session, "the session")
        self.stats.snapshots += 1
        entry = ["restore", session, None, self.clock, None]
        self.log.append(entry)
        restored = self.restore(data, self.clock, entry, "genuine")
        entry[2] = restored
        if public_counters(restored) != public_counters(session):
            raise Violation(
                self.p + "restore-counters-differ",
                f"{short(public_counters(session))} -> {short(public_counters(restored))}",
            )
        again = self.take_snapshot(restored, "the restored session")
        if not same_snapshot(data, again):
            diff = first_difference(data, again) or "a difference under an elapsed-time key"
            raise Violation(self.p + "restore-snapshot-differs", diff)
        self.session = restored
        self.turn = restored.current_turn
        self.log.append(["adopt", restored, self.turn])

    def forge(self) -> None:
        """Restore a mutated snapshot: SnapshotError, or a session on which every
        invariant holds, that snapshots, restores again and can be driven on."""
        rng = self.rng
        data = self.take_snapshot(self.session, "the session")
        mutations = [mutate(data, rng) for _ in range(rng.between(1, 3))]
        self.stats.mutated += 1
        clock = ManualClock(self.clock.now)
        entry = ["forge", self.session, mutations, clock, None, None, clock.now]
        self.log.append(entry)
        restored = self.restore(data, clock, entry, "forged")
        if restored is None:
            self.stats.mutated_refused += 1
            return
        self.stats.mutated_accepted += 1
        entry[5] = restored
        self.log.append(["adopt", restored, restored.current_turn])
        sub = Driver(self.w, restored, clock, forged=True)
        sub.check_static()
        again = sub.take_snapshot(restored, "a session restored from a forged snapshot")
        twice = ManualClock(clock.now)
        entry2 = ["restore", restored, None, twice, None]
        self.log.append(entry2)
        second = sub.restore(again, twice, entry2, "re-snapshotted-forged")
        if second is None:  # pragma: no cover - restore() raises a Violation for it
            return
        entry2[2] = second
        third = sub.take_snapshot(second, "its second restore")
        if not same_snapshot(again, third):
            diff = first_difference(again, third) or "a difference under an elapsed-time key"
            raise Violation("forged-restore-snapshot-differs", diff)
        for _ in range(rng.between(0, 16)):
            if not sub.step():
                break


# -- the run --------------------------------------------------------------------------------


def run(
    events: int,
    seed: int,
    *,
    settings_mix: bool = False,
    keep_going: bool = False,
    walk_seed: int | None = None,
    session_factory: SessionFactory | None = None,
) -> Stats:
    """Run walks until ``events`` events were sent (``walk_seed``: that one walk
    only). Stops at the first violation unless ``keep_going``."""
    stats = Stats(seed=seed)
    master = random.Random(seed)
    started = time.perf_counter()
    while stats.events < events:
        ws = walk_seed if walk_seed is not None else master.getrandbits(63)
        stats.walks += 1
        walk = Walk(
            ws,
            settings_mix=settings_mix,
            stats=stats,
            limit=events,
            session_factory=session_factory,
        )
        if walk_seed is not None:
            walk.limit = 10**15  # the walk's own budget, as in the run it came from
        try:
            walk.run()
        except Violation as violation:
            stats.add(
                Finding(
                    kind=violation.kind,
                    detail=violation.detail,
                    seed=seed,
                    step=stats.steps,
                    walk=stats.walks,
                    walk_seed=ws,
                    walk_step=len(walk.log),
                    settings_mix=settings_mix,
                    log=walk.log,
                )
            )
            if not keep_going:
                break
        if walk_seed is not None:
            break
    stats.seconds = time.perf_counter() - started
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: run, print findings and the summary; 1 on any violation."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.fuzz", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--events", type=int, default=100_000, help="events to send (default 100000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    parser.add_argument(
        "--settings-mix", action="store_true", help="random small settings instead of the defaults"
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="after a violation abandon the walk and go on; report each kind once",
    )
    parser.add_argument("--replay-walk", type=int, metavar="WALK_SEED", help="run that walk only")
    parser.add_argument(
        "--script", action="store_true", help="print the violating walk as a full Python script"
    )
    args = parser.parse_args(argv)
    stats = run(
        args.events,
        args.seed,
        settings_mix=args.settings_mix,
        keep_going=args.keep_going,
        walk_seed=args.replay_walk,
    )
    for finding in stats.findings.values():
        if args.script:
            print(finding.script())
            print()
        print(finding.describe())
    print(stats.summary())
    return 1 if stats.violations else 0


if __name__ == "__main__":
    sys.exit(main())
