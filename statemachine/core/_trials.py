"""The trials of the table's row groups, each guard's expression written out.

Written by ``python -m statemachine.dev._write_trials`` from the table (``_table.ROWS``)
and the guards (``_engine.GUARDS``), below the mark, and checked by
``tests/test_engine_build.py`` to be what that command writes now. Each trial returns
the first row of its group whose guards all hold, as ``Group.try_rows`` does with one
call of each guard (a table the model check mutates is tried so); written out, a rate
limit's trial takes a fifth of the calls' instructions. The engine imports this module,
never the other way: a trial sees the engine's ``Core`` through the protocol below and
passes its rows on whatever they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ._taxonomy import ErrorCategory

if TYPE_CHECKING:
    from ._settings import Settings
    from ._state import SessionState, TurnState

BoundRow = TypeVar("BoundRow")
"""A row of the group tried (the engine's ``_engine.BoundRow``)."""


class Core(Protocol):
    """What a trial reads of the engine's ``_engine.Core``."""

    @property
    def state(self) -> SessionState: ...

    @property
    def settings(self) -> Settings: ...


Trial = Callable[[Core, "TurnState", Any, Any], BoundRow | None]
"""A group's trial over its rows: the first row whose guards hold, or ``None``."""

# -- written by python -m statemachine.dev._write_trials: do not edit below --


def _trial_1(r: tuple[BoundRow, ...]) -> Trial[BoundRow]:
    def choose(_core: Core, turn: TurnState, event: Any, _facts: Any) -> BoundRow | None:
        if turn.final_answer:
            return r[0]  # final_answer
        if not event.tool_calls:
            return r[1]  # no_tool_calls
        return r[2]

    return choose


def _trial_2(r: tuple[BoundRow, ...]) -> Trial[BoundRow]:
    def choose(core: Core, turn: TurnState, event: Any, facts: Any) -> BoundRow | None:
        if event.partial:
            return r[0]  # partial
        if turn.final_answer:
            return r[1]  # final_answer
        if core.state.retries >= core.settings.session_retry_ceiling:
            return r[2]  # ceiling_reached
        if turn.attempt < core.settings.max_retries and not (facts[2] or facts[3]):
            return r[3]  # retries_left & wait_fits
        if turn.model_index + 1 < len(core.settings.fallback_models):
            return r[4]  # fallback_left
        if turn.attempt < core.settings.max_retries and facts[3]:
            return r[5]  # retries_left & wait_crosses_wall_clock
        if turn.attempt < core.settings.max_retries and facts[2]:
            return r[6]  # retries_left & server_wait_too_long
        return r[7]

    return choose


def _trial_3(r: tuple[BoundRow, ...]) -> Trial[BoundRow]:
    def choose(core: Core, turn: TurnState, event: Any, _facts: Any) -> BoundRow | None:
        if event.partial:
            return r[0]  # partial
        if turn.final_answer:
            return r[1]  # final_answer
        if turn.reductions < core.settings.max_context_reductions:
            return r[2]  # reductions_left
        return r[3]

    return choose


def _trial_4(r: tuple[BoundRow, ...]) -> Trial[BoundRow]:
    def choose(_core: Core, _turn: TurnState, event: Any, _facts: Any) -> BoundRow | None:
        if event.partial:
            return r[0]  # partial
        return r[1]

    return choose


def _trial_5(r: tuple[BoundRow, ...]) -> Trial[BoundRow]:
    def choose(_core: Core, turn: TurnState, event: Any, _facts: Any) -> BoundRow | None:
        if (
            turn.overflowed_size is not None
            and event.size < turn.overflowed_size
            and bool(event.request != turn.overflowed_request)
        ):
            return r[0]  # shrank
        return r[1]

    return choose


def _trial_6(r: tuple[BoundRow, ...]) -> Trial[BoundRow]:
    def choose(_core: Core, _turn: TurnState, _event: Any, facts: Any) -> BoundRow | None:
        if bool(facts.tripped):
            return r[0]  # trips_breaker
        if facts.denied:
            return r[1]  # trips_denial_breaker
        if facts.seconds is not None:
            return r[2]  # conflict_retry
        if facts.terminal:
            return r[3]  # terminal_tool
        return r[4]

    return choose


TRIALS: dict[tuple[str, str, ErrorCategory | None], Callable[..., Trial[Any]]] = {
    ("calling", "ModelReplied", None): _trial_1,
    ("calling", "ModelFailed", ErrorCategory.RATE_LIMITED): _trial_2,
    ("calling", "ModelFailed", ErrorCategory.OVERLOADED): _trial_2,
    ("calling", "ModelFailed", ErrorCategory.CONTEXT_LENGTH_EXCEEDED): _trial_3,
    ("calling", "ModelFailed", ErrorCategory.AUTH_ERROR): _trial_4,
    ("calling", "ModelFailed", ErrorCategory.INVALID_REQUEST): _trial_4,
    ("calling", "ModelFailed", ErrorCategory.UNKNOWN): _trial_4,
    ("reducing_context", "Assembled", None): _trial_5,
    ("invoking_tools", "ToolsDone", None): _trial_6,
}
"""The trial of each group the table's rows make, by (state, trigger, category)."""
