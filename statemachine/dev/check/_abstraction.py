"""The abstract state: nodes over the engine's declared state, their key, the copy the
explorer steps from, counter acceleration and the ranking function."""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

import attrs

from ... import Session, Settings, Turn
from ...core import _state, _table
from ...core._state import SessionState, TurnState
from ._events import _Clock, _Ctx, _wall_clock

# -- nodes -------------------------------------------------------------------------


@attrs.define
class _Node:
    session: Session
    turn: Turn
    state: SessionState
    """The session's declared state (the session owns it; the checker reads it)."""
    clock: _Clock
    poisoned: frozenset[Any]
    """Requests that overflowed in this turn: never to be sent again."""
    fatal: bool
    """An auth_error / invalid_request came in this turn: nothing but Finish may follow."""

    @property
    def ts(self) -> TurnState:
        """The current turn's declared state (every node is made after new_turn())."""
        return self.state.turn  # type: ignore[return-value]


def _node(
    ctx: _Ctx, state: SessionState, clock: _Clock, poisoned: frozenset[Any], fatal: bool
) -> _Node:
    """A node over ``state`` (which the new session takes over)."""
    session = Session.from_state(
        ctx.settings, state, clock, wall_clock=_wall_clock, dispatch=ctx.dispatch, check=False
    )
    turn = session.current_turn
    if turn is None:  # pragma: no cover - every node is made after new_turn()
        raise RuntimeError("a node without a turn")
    return _Node(session, turn, state, clock, poisoned, fatal)


def _clone(ctx: _Ctx, node: _Node) -> _Node:
    """A copy of ``node`` to step from."""
    state = _state.copy_session_state(node.state)
    return _node(ctx, state, _Clock(node.clock.now), node.poisoned, node.fatal)


def _canon(value: int, cap: int, saturation: int | None) -> int:
    if saturation is None or value <= 0 or cap - value <= saturation:
        return value
    return max(cap - saturation, value)


_TURN_KEY = _state.key_fields(TurnState)
_TOOL_STATES = (_table.INVOKING_TOOLS, _table.BACKING_OFF_TOOLS)
_IN_CALL = (_table.CALLING, _table.BACKING_OFF, *_TOOL_STATES)
_SESSION_KEY = _state.key_fields(SessionState)


def _accelerate(ctx: _Ctx, node: _Node) -> None:
    """Jump counters far from their caps to ``cap - saturation`` (no-op when exact).

    The counters are the declared fields whose key mode is ``cap:<setting>``.
    """
    k = ctx.saturation
    if k is None:
        return
    settings = ctx.settings
    state, turn = node.state, node.ts
    for target, fields in ((turn, _TURN_KEY), (state, _SESSION_KEY)):
        for name, mode in fields:
            if not mode.startswith("cap:"):
                continue
            cap = getattr(settings, mode[4:])
            if cap is None or (name == "turns" and not ctx.tracks_turns):
                continue
            value = getattr(target, name)
            if name == "retries":
                if k < value < cap - k:
                    # the middle of a huge ceiling is one class: "some retries used, many
                    # left"; the _JUMP step takes it close to the ceiling
                    setattr(target, name, k + 1)
            else:
                setattr(target, name, _canon(value, cap, k))
    if state.breakers:
        state.breakers = {
            p: _canon(n, settings.breaker_threshold, k) for p, n in state.breakers.items()
        }
    if turn.path:
        # the trace's last counters follow the state they describe
        turn.path[-1] = _state.make_step(turn.path[-1][0], *_state.traced_counters(turn, state))


def _field_key(value: Any, mode: str) -> Any:
    if mode == "providers":  # what a tool round's future reads of its calls
        return tuple((call.provider, call.terminates_turn) for call in value)
    if type(value) is dict:
        return tuple(sorted(value.items()))
    return value


def _key_reader(cls: type, skip: frozenset[str] = frozenset()) -> Callable[[Any], tuple[Any, ...]]:
    """The values of ``cls``'s key fields (nested ones and ``skip`` aside) as
    :func:`_field_key` sees them: one C getter for all, then the few fields whose value
    is not its own key (calls, dictionaries)."""
    fields = [
        f
        for f in attrs.fields(cls)
        if f.metadata["key"] not in ("omit", "nested") and f.name not in skip
    ]
    get = attrgetter(*(f.name for f in fields))
    fix = tuple(
        (i, f.metadata["key"])
        for i, f in enumerate(fields)
        if f.metadata["key"] == "providers" or "dict" in str(f.type)
    )

    def read(obj: Any) -> tuple[Any, ...]:
        got: tuple[Any, ...] = get(obj)
        if not fix:
            return got
        values = list(got)
        for i, mode in fix:
            if values[i]:
                values[i] = _field_key(values[i], mode)
        return tuple(values)

    return read


_read_turn = _key_reader(TurnState)
_read_session = _key_reader(SessionState, frozenset({"turns"}))
_read_session_turns = _key_reader(SessionState)


def _key(ctx: _Ctx, node: _Node) -> tuple[Any, ...]:
    """The abstract state: the declared fields the key reads (``key_fields``), the
    turn's reduced to what its future reads once that is little, plus what the checker
    itself tracks (overflowed requests, a fatal error, a clock that has run out)."""
    state, turn = node.state, node.ts
    limit = ctx.settings.max_wall_clock_s
    late = limit is not None and node.clock.now - state.started >= limit
    where = turn.state
    if where in _table.TERMINAL_STATES:
        # a finished turn's future (the next turn) depends on the session alone
        turn_part: tuple[Any, ...] = (where, turn.status, turn.final_answer)
    elif where in _TOOL_STATES:
        # a tool round's future reads its calls, where the round is and the session:
        # not the model call's counters (no model call follows in this turn)
        position = {call.id: i for i, call in enumerate(turn.calls)}
        turn_part = (
            where,
            turn.final_answer,
            _field_key(turn.calls, "providers"),
            tuple(position[c.id] for c in turn.in_flight),
            tuple(position[i] for i in turn.pending),
            turn.conflict_attempt,
            tuple((position[o.call_id], o.ok, o.category) for o in turn.outcomes),
        )
    elif where in ctx.last_steps:
        # every row out of this state finishes the turn: only what its events read
        # (the calls in flight) and the session matter
        turn_part = (where, turn.final_answer, _field_key(turn.calls, "providers"))
    else:
        poisoned = node.poisoned
        turn_part = (
            turn.status,
            *_read_turn(turn),
            turn.request in poisoned if poisoned else False,
            node.fatal,
        )
    session_part = (_read_session_turns if ctx.tracks_turns else _read_session)(state)
    return (*turn_part, *session_part, late)


def _rank(settings: Settings, node: _Node) -> tuple[int, int, int, int, int]:
    """(session retries left, reductions left, fallbacks left, call retries left,
    minus the session's conflict re-invocations: within a turn bounded below, as each
    call of its round is re-invoked at most ``max_conflict_retries`` times)."""
    session, turn = node.state, node.ts
    in_call = turn.state in _IN_CALL
    return (
        settings.session_retry_ceiling - session.retries,
        settings.max_context_reductions - turn.reductions,
        len(settings.fallback_models) - 1 - turn.model_index,
        settings.max_retries - turn.attempt if in_call else settings.max_retries,
        -session.tool_retries,
    )


def step_bound(settings: Settings) -> int:
    """An upper bound on the events of one turn, derived from the settings.

    start + first assembly + per assembled request (1 + reductions of them): each
    model in the chain makes up to ``max_retries`` (failure, wait-done) pairs and one
    more failure, then a reply and a tools-done; plus a reduced reassembly each; plus,
    for each call of the checker's largest reply, ``max_conflict_retries``
    re-invocations (a wait-done and a tools-done each).
    """
    models = 1 + len(settings.fallback_models)
    per_request = models * (2 * settings.max_retries + 1)
    reductions = settings.max_context_reductions
    calls = max(2, settings.breaker_threshold, settings.doom_loop_threshold)
    conflicts = 2 * calls * settings.max_conflict_retries  # a (wait-done, tools-done) each
    return 2 + (reductions + 1) * per_request + reductions + 2 + conflicts
