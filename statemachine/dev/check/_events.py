"""The checker's representative events: one per category, variant and turn boundary,
built for the node they are sent to."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import attrs

from ... import (
    Assembled,
    Cancelled,
    CannotShrink,
    ErrorCategory,
    ModelError,
    ModelFailed,
    ModelReplied,
    Settings,
    ToolCall,
    ToolErrorCategory,
    ToolOutcome,
    ToolsDone,
    Wait,
    WaitDone,
)
from ...core import _engine, _table
from ...core._state import SessionState, TurnState

RECOVERY_STATES = (_table.BACKING_OFF, _table.REDUCING_CONTEXT, _table.BACKING_OFF_TOOLS)
"""States a turn enters only to recover; with a fallback ``calling``, each entry
must consume a bounded resource."""

EXACT_BUDGET = 20_000
"""Explore counters exactly when the product of their ranges is at most this."""

DEFAULT_SATURATION = 2
"""How close to its cap an accelerated counter is explored exactly."""

MAX_NODES = 300_000
"""A hard stop: a (mutated) table whose space does not close is reported, not hung on."""

_NEW_TURN = "new_turn"
_END = "end"
"""Not an event: the host ends the session on purpose (``Session.end(variant)``)."""
_JUMP = "jump"
"""Not an event: an accelerated counter jumps close to its cap (accelerated mode)."""
_CLOCK_ZERO = 1_000.0
_SIZE = 1_000_000
_WALL = 1_700_000_000.0


# -- representative events ---------------------------------------------------------


@attrs.frozen
class Step:
    """One representative event (or turn boundary) the checker sends.

    ``kind`` is the trigger (``start``, ``new_turn`` or an event class name) and
    ``variant`` which representative of it; :meth:`describe` reads as code.
    """

    kind: str
    variant: str = ""

    def describe(self) -> str:
        """The step as a short, readable line."""
        return f"{self.kind}({self.variant})" if self.variant else self.kind


class _Clock:
    __slots__ = ("now",)

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _wall_clock() -> float:
    return _WALL


@attrs.frozen
class _Ctx:
    """What the checker derives from the settings once."""

    settings: Settings
    saturation: int | None
    tracks_turns: bool
    last_steps: frozenset[str] = frozenset()
    """Running states all of whose rows lead to a terminal state."""
    dispatch: _engine.Dispatch = _engine.DISPATCH
    """The table the sessions run (a mutated one for the mutants)."""
    errors: dict[str, tuple[ModelError, bool, float | None]] = attrs.field(factory=dict, eq=False)
    """The representative ModelErrors, built once (they are immutable)."""
    replies: dict[tuple[str, int], ModelReplied] = attrs.field(factory=dict, eq=False)
    """The representative replies by (variant, turn), built once."""
    failures: dict[str, ModelFailed] = attrs.field(factory=dict, eq=False)
    """The representative failures by variant (but ``late``), built once."""
    steps: dict[tuple[object, ...], tuple[Step, ...]] = attrs.field(factory=dict, eq=False)
    """The steps of a node, by what they depend on (:func:`_steps`), built once."""

    @property
    def server_too_long(self) -> float:
        return self.settings.max_server_wait_s + 1.0


def _steps(ctx: _Ctx, session: SessionState, turn: TurnState) -> tuple[Step, ...]:
    """The representative steps available at a node (the same for every node that
    agrees on what they depend on: built once per such class)."""
    state = turn.state
    k = ctx.saturation
    by = (
        state,
        session.status is None,
        state == _table.INVOKING_TOOLS and any(call.provider == "p" for call in turn.in_flight),
        k is not None and session.retries == k + 1 < ctx.settings.session_retry_ceiling - k,
    )
    steps = ctx.steps.get(by)
    if steps is None:
        steps = ctx.steps[by] = tuple(_new_steps(ctx, session, turn))
    return steps


def _variants(kind: str, *variants: str) -> tuple[Step, ...]:
    return tuple(Step(kind, variant) for variant in variants)


_STATE_STEPS: dict[str, tuple[Step, ...]] = {
    _table.IDLE: (Step(_table.START),),
    _table.ASSEMBLING: (Step("Assembled", "fresh"), Step("CannotShrink")),
    _table.REDUCING_CONTEXT: (
        *_variants("Assembled", "shrunk", "same_size", "same_request"),
        Step("CannotShrink"),
    ),
    _table.CALLING: (
        *_variants("ModelFailed", *(category.value for category in ErrorCategory)),
        *_variants("ModelFailed", "rate_limited:partial", "auth_error:partial"),
        *_variants("ModelFailed", "content_filtered:partial", "rate_limited:too_long"),
        *_variants("ModelFailed", "overloaded:header_ms", "rate_limited:garbage"),
        *_variants("ModelReplied", "none", "p", "pq", "doom", "terminal"),
    ),
    _table.BACKING_OFF: (Step("WaitDone"),),
    _table.BACKING_OFF_TOOLS: (Step("WaitDone"),),
    _table.INVOKING_TOOLS: _variants("ToolsDone", "ok", "fail", "conflict"),
}
"""The representative steps of a running state, before those the settings or the
node add (:func:`_new_steps`)."""


def _new_steps(ctx: _Ctx, session: SessionState, turn: TurnState) -> list[Step]:
    state = turn.state
    settings = ctx.settings
    if state in _table.TERMINAL_STATES:
        if session.status is not None:
            return []
        return [Step(_NEW_TURN), *_variants(_END, "completed", "cancelled", "failed")]
    steps = list(_STATE_STEPS.get(state, ()))
    if state == _table.CALLING:
        if settings.breaker_threshold > 1:
            steps.append(Step("ModelReplied", "p_many"))
        if settings.max_wall_clock_s is not None:
            steps += [Step("ModelFailed", "rate_limited:late"), Step("ModelReplied", "late")]
        if settings.max_cost_usd is not None:
            steps += [Step("ModelReplied", "costly"), Step("Cancelled", "costly")]
    elif state == _table.INVOKING_TOOLS:
        if settings.denial_threshold is not None or settings.denial_window is not None:
            steps.append(Step("ToolsDone", "denied"))
        if any(call.provider == "p" for call in turn.in_flight):
            steps.append(Step("ToolsDone", "crash"))
    steps.append(Step("Cancelled", "host"))
    k = ctx.saturation
    if k is not None and session.retries == k + 1 < settings.session_retry_ceiling - k:
        steps.append(Step(_JUMP, "session_retries"))
    return steps


def _model_error(ctx: _Ctx, variant: str) -> tuple[ModelError, bool, float | None]:
    """(error, partial, the retry-after the engine must honour) for a variant."""
    cached = ctx.errors.get(variant)
    if cached is None:
        cached = ctx.errors[variant] = _new_model_error(ctx, variant)
    return cached


def _new_model_error(ctx: _Ctx, variant: str) -> tuple[ModelError, bool, float | None]:
    category, _, how = variant.partition(":")
    if how == "partial":
        return ModelError(category, "stream broke"), True, None
    if how == "too_long":
        seconds = ctx.server_too_long
        return ModelError(category, "slow down", retry_after_seconds=seconds), False, seconds
    if how == "header_ms":
        error = ModelError(category, "busy", headers={"Retry-After-Ms": "1500"})
        return error, False, 1.5
    if how == "garbage":
        error = ModelError(
            category,
            "busy",
            retry_after_seconds=math.nan,
            headers={"retry-after-ms": "-5", "Retry-After": "soon"},
        )
        return error, False, None
    return ModelError(category, f"{category} error", code=category), False, None


_CANNOT_SHRINK = CannotShrink()
_WAIT_DONE = WaitDone()
_CANCELLED = Cancelled("host")
"""Events with nothing of the node in them, built once (events are immutable)."""

ILLEGAL_SAMPLES: tuple[tuple[str, object], ...] = (
    ("Assembled", Assembled("x", 1)),
    ("CannotShrink", _CANNOT_SHRINK),
    ("ModelReplied", ModelReplied()),
    ("ModelFailed", ModelFailed(ModelError("overloaded"))),
    ("WaitDone", _WAIT_DONE),
    ("ToolsDone", ToolsDone(())),
    ("Cancelled", Cancelled()),
)
"""One event of each trigger, sent where the table has no row for it (it must be refused)."""


def _event(ctx: _Ctx, step: Step, session: SessionState, turn: TurnState, clock: _Clock) -> object:
    """Build the event of ``step`` for this node (mutating the clock if it says so)."""
    build = _BUILDERS.get(step.kind)
    if build is None:  # pragma: no cover - every step kind the checker sends is here
        raise ValueError(f"step: unknown kind {step.kind!r}")
    return build(ctx, step.variant, session, turn, clock)


def _failure(
    ctx: _Ctx, variant: str, session: SessionState, _t: TurnState, clock: _Clock
) -> object:
    if variant.endswith(":late"):
        _run_out(ctx, session, clock)
    failure = ctx.failures.get(variant)
    if failure is None:
        error, partial, _ = _model_error(ctx, variant)
        failure = ctx.failures[variant] = ModelFailed(error, partial=partial)
    return failure


def _assembled(_c: _Ctx, variant: str, _s: SessionState, turn: TurnState, _k: _Clock) -> object:
    overflowed = turn.overflowed_size if turn.overflowed_size is not None else _SIZE
    if variant == "same_request":
        return Assembled(turn.overflowed_request, max(overflowed - 1, 0))
    size = {"shrunk": max(overflowed - 1, 0), "same_size": overflowed}.get(variant, _SIZE)
    return Assembled(f"t{turn.index}s{len(turn.actions)}", size)


def _replied(
    ctx: _Ctx, variant: str, session: SessionState, turn: TurnState, clock: _Clock
) -> object:
    if variant in ("late", "costly"):
        return _reply(ctx, variant, turn.index, session, clock)
    key = (variant, turn.index)
    reply = ctx.replies.get(key)
    if reply is None:
        reply = ctx.replies[key] = _reply(ctx, variant, turn.index)
    return reply


def _wait_done(_c: _Ctx, _v: str, _s: SessionState, turn: TurnState, clock: _Clock) -> object:
    action = turn.actions[-1] if turn.actions else None
    if type(action) is Wait and math.isfinite(action.seconds):
        clock.now += action.seconds
    return _WAIT_DONE


_FAILURES: dict[str, tuple[str, ToolErrorCategory, Callable[[int, ToolCall], bool]]] = {
    "conflict": ("locked", ToolErrorCategory.CONCURRENCY_CONFLICT, lambda i, _call: i == 0),
    "denied": ("denied", ToolErrorCategory.PERMISSION_DENIED, lambda _i, _call: True),
    "fail": ("it failed", ToolErrorCategory.EXECUTION_FAILED, lambda _i, _call: True),
    "crash": ("plugin died", ToolErrorCategory.PROCESS_CRASHED, lambda _i, c: c.provider == "p"),
}
"""A ``ToolsDone`` variant's failure (content, category) and which calls (index, call)
it fails; the other calls, and every call of ``ok``, succeed."""


def _tools_done(_c: _Ctx, variant: str, _s: SessionState, turn: TurnState, _k: _Clock) -> object:
    if variant not in _FAILURES:
        return ToolsDone(tuple(ToolOutcome(call.id, True, "done") for call in turn.in_flight))
    content, category, fails = _FAILURES[variant]
    return ToolsDone(
        tuple(
            ToolOutcome(call.id, False, content, category)
            if fails(i, call)
            else ToolOutcome(call.id, True, "done")
            for i, call in enumerate(turn.in_flight)
        )
    )


def _cancelled(ctx: _Ctx, variant: str, _s: SessionState, _t: TurnState, _k: _Clock) -> object:
    if variant == "costly":  # the call in flight was billed the whole budget
        return Cancelled(variant, cost=float(ctx.settings.max_cost_usd or 0.0))
    return _CANCELLED if variant == _CANCELLED.reason else Cancelled(variant)


_BUILDERS = {
    "ModelFailed": _failure,
    "Assembled": _assembled,
    "CannotShrink": lambda *_: _CANNOT_SHRINK,
    "ModelReplied": _replied,
    "WaitDone": _wait_done,
    "ToolsDone": _tools_done,
    "Cancelled": _cancelled,
}
"""Each step kind's event builder: ``(ctx, variant, session, turn, clock) -> event``."""


def _reply(
    ctx: _Ctx,
    variant: str,
    index: int,
    session: SessionState | None = None,
    clock: _Clock | None = None,
) -> ModelReplied:
    """The reply of ``variant`` in turn ``index`` (immutable: the same one is reused)."""
    calls: tuple[ToolCall, ...] = ()
    cost = 0.0
    if variant == "p":
        calls = (ToolCall(f"c{index}p", "p", "read", {"turn": index}),)
    elif variant == "pq":
        calls = (
            ToolCall(f"c{index}p", "p", "read", {"turn": index}),
            ToolCall(f"c{index}q", "q", "write", {"turn": index}),
        )
    elif variant == "p_many":
        calls = tuple(
            ToolCall(f"c{index}p{i}", "p", "read", {"turn": index, "i": i})
            for i in range(_many(ctx))
        )
    elif variant == "doom":
        threshold = ctx.settings.doom_loop_threshold
        calls = tuple(
            ToolCall(f"c{index}d{i}", "q", "again", {"same": True}) for i in range(threshold)
        )
    elif variant == "terminal":
        calls = (
            ToolCall(f"c{index}t", "p", "finish", {"turn": index}, terminates_turn=True),
            ToolCall(f"c{index}q", "q", "write", {"turn": index}),
        )
    elif variant == "costly":
        cost = float(ctx.settings.max_cost_usd or 0.0)
    elif variant == "late":
        _run_out(ctx, session, clock)  # type: ignore[arg-type]
    return ModelReplied(calls, cost=cost, reply=f"reply {index}")


def _many(ctx: _Ctx) -> int:
    """How many calls to ``p`` the ``p_many`` reply makes: enough to trip its breaker
    in one turn (accelerated: enough to leave zero, the jump does the rest)."""
    threshold = ctx.settings.breaker_threshold
    return threshold if ctx.saturation is None else min(threshold, ctx.saturation + 1)


def _run_out(ctx: _Ctx, session: SessionState, clock: _Clock) -> None:
    limit = ctx.settings.max_wall_clock_s
    if limit is not None:
        clock.now = max(clock.now, session.started + limit)


class _At(NamedTuple):
    """Where a finding is: a node, and the step taken from it (resolved lazily; one is
    made per edge, so a tuple)."""

    node: int
    step: Step | None = None
