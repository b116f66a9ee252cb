"""The properties: what every edge must respect (ranking, caps, per-category reactions,
the final-answer turn, breakers, tool results) and that illegal events change nothing."""

from __future__ import annotations

from collections.abc import Sequence

from ... import (
    Action,
    Assemble,
    Assembled,
    CallModel,
    Cancelled,
    CannotShrink,
    ErrorCategory,
    Finish,
    IllegalEvent,
    InvokeTools,
    ModelFailed,
    Settings,
    ToolCall,
    ToolErrorCategory,
    ToolOutcome,
    ToolsDone,
    TurnStatus,
    Wait,
    WaitDone,
)
from ...core import _table
from ...core._state import SessionState, TurnState
from ._abstraction import _clone, _key, _Node, _rank
from ._events import ILLEGAL_SAMPLES, RECOVERY_STATES, Step, _At, _Ctx, _model_error

_FIXED = {
    ErrorCategory.AUTH_ERROR: ("ER-9", TurnStatus.AUTH_ERROR, "failed"),
    ErrorCategory.INVALID_REQUEST: ("ER-9", TurnStatus.INVALID_REQUEST, "failed"),
    ErrorCategory.CONTENT_FILTERED: ("ER-11", TurnStatus.CONTENT_FILTERED, "filtered"),
    ErrorCategory.UNKNOWN: ("ER-24", TurnStatus.UNKNOWN_ERROR, "failed"),
}
"""The categories whose every failure ends the turn one way: (requirement, status, state)."""


class Properties:
    """The properties checked on every edge and node (a base of the explorer, which
    holds the nodes and records violations)."""

    ctx: _Ctx
    nodes: list[_Node]

    def violate(self, requirement: str, message: str, at: _At | None) -> None:
        raise NotImplementedError  # pragma: no cover - the explorer records them

    def check_edge(
        self,
        source: _Node,
        node: _Node,
        step: Step,
        event: object,
        action: Action,
        before: tuple[int, int, int, int, int],
        path: _At,
    ) -> None:
        settings = self.ctx.settings
        turn, session = node.ts, node.state
        src_state, dest = source.ts.state, turn.state
        v = self.violate

        # ranking function (ER-29)
        after = _rank(settings, node)
        fell_back = src_state == _table.CALLING and dest == _table.CALLING
        if after > before and dest not in _table.TERMINAL_STATES:
            v("ER-29", f"ranking grew: {before} -> {after} on {src_state} -> {dest}", path)
        if (dest in RECOVERY_STATES or fell_back) and not after < before:
            v(
                "ER-29",
                f"recovery edge consumed nothing: {src_state} -> {dest} keeps rank {after}",
                path,
            )

        # caps (ER-5)
        if turn.attempt > settings.max_retries:
            v("ER-5", f"attempt beyond max_retries: {turn.attempt}", path)
        if session.retries > settings.session_retry_ceiling:
            v("ER-5", f"session retries beyond the ceiling: {session.retries}", path)
        if turn.reductions > settings.max_context_reductions:
            v("ER-8", f"reductions beyond max_context_reductions: {turn.reductions}", path)

        # nothing but Finish after a fatal error; never resend an overflowed request
        if source.fatal and type(action) is not Finish:
            v("ER-9", f"action after auth_error/invalid_request: {action!r}", path)
        if type(action) is CallModel and action.request in source.poisoned:
            v("ER-6", f"CallModel resends a request that overflowed: {action!r}", path)

        self.check_action(source, node, action, path)
        self.check_event(source, node, step, event, action, path)

    def check_action(self, source: _Node, node: _Node, action: Action, path: _At) -> None:
        """What any action must respect: the final-answer turn, breakers, Finish."""
        turn, dest = node.ts, node.ts.state
        v = self.violate
        problem = _final_answer_problem(action) if turn.final_answer else None
        if problem is not None:
            v("ER-16", problem, path)
        if type(action) is InvokeTools:
            blocked = [c.provider for c in action.calls if c.provider in source.state.tripped]
            if blocked:
                v("ER-18", f"InvokeTools includes a tripped provider: {blocked}", path)
            if source.ts.state == _table.BACKING_OFF_TOOLS and (
                len(action.calls) != 1 or action.calls[0].id != source.ts.pending[0]
            ):
                v(
                    "ER-86",
                    f"a re-invocation that is not the first conflict, alone: {action!r}",
                    path,
                )
        if type(action) is Finish and action.status is not turn.status:
            v("ER-30", f"Finish status {action.status} but turn status {turn.status}", path)
        if type(action) is Finish and dest not in _table.TERMINAL_STATES:
            v("ER-29", f"Finish emitted in running state {dest!r}", path)
        if dest in _table.TERMINAL_STATES and type(action) is not Finish:
            v("ER-29", f"terminal state {dest!r} reached with {action!r}", path)

    def check_event(
        self, source: _Node, node: _Node, step: Step, event: object, action: Action, path: _At
    ) -> None:
        """The required reaction to each kind of event."""
        src_state = source.ts.state
        v = self.violate
        if isinstance(event, ModelFailed):
            self.check_failure(source, node, step, event, action, path)
        elif isinstance(event, Cancelled):
            if not (type(action) is Finish and action.status is TurnStatus.CANCELLED):
                v("ER-32", f"Cancelled in {src_state!r} gave {action!r}", path)
        elif isinstance(event, ToolsDone):
            self.check_tools(source, node, event, action, path)
        elif isinstance(event, Assembled | CannotShrink) and src_state == _table.REDUCING_CONTEXT:
            shrank = (
                isinstance(event, Assembled)
                and source.ts.overflowed_size is not None
                and event.size < source.ts.overflowed_size
                and event.request != source.ts.overflowed_request
            )
            if shrank and not (type(action) is CallModel and action.attempt == 0):
                v("ER-7", f"a shrunk reassembly is not called: {action!r}", path)
            if not shrank and _status(action) is not TurnStatus.CONTEXT_EXHAUSTED:
                v("ER-8", f"a context that cannot shrink gave {action!r}", path)
        elif (
            isinstance(event, WaitDone)
            and src_state == _table.BACKING_OFF
            and not _resends(source, action)
        ):
            v("ER-1", f"WaitDone did not resend the same request, attempt+1: {action!r}", path)

    def check_failure(
        self,
        source: _Node,
        node: _Node,
        step: Step,
        event: ModelFailed,
        action: Action,
        path: _At,
    ) -> None:
        v = self.violate
        category = event.error.category
        status = action.status if type(action) is Finish else None
        if event.partial and category is not ErrorCategory.CONTENT_FILTERED:
            if status is not TurnStatus.STREAM_INTERRUPTED:
                v("ER-31", f"partial {category} failure gave {action!r}", path)
            return
        fixed = _FIXED.get(category)
        if fixed is not None:
            requirement, expected, dest = fixed
            if status is not expected or node.ts.state != dest:
                v(requirement, f"{category} gave {action!r} into {node.ts.state!r}", path)
            if type(action) in (CallModel, Wait):
                v("ER-10", f"{category} was retried or fell back: {action!r}", path)
            return
        if category is ErrorCategory.CONTEXT_LENGTH_EXCEEDED:
            if type(action) is Assemble:
                if not action.reduce:
                    v("ER-7", f"overflow answered by a non-reducing {action!r}", path)
            elif status is not TurnStatus.CONTEXT_EXHAUSTED:
                v("ER-6", f"overflow answered by {action!r}", path)
            return
        self.check_transient(source, step, action, path)

    def check_transient(self, source: _Node, step: Step, action: Action, path: _At) -> None:
        """A rate limit or an overload: wait, fall back, or one of the bounded ends."""
        settings = self.ctx.settings
        v = self.violate
        turn, session = source.ts, source.state
        _, _, honoured = _model_error(self.ctx, step.variant)
        if type(action) is Wait:
            self.check_retry_wait(source, action, honoured, path)
        elif type(action) is CallModel:
            models = settings.fallback_models
            index = turn.model_index + 1
            if (
                turn.final_answer
                or index >= len(models)
                or action.model != models[index]
                or action.attempt != 0
                or action.request != turn.request
            ):
                v("ER-23", f"transient failure answered by {action!r}", path)
            if session.retries >= settings.session_retry_ceiling:
                v("ER-5", f"fallback at the session ceiling ({session.retries})", path)
        else:
            found = _transient_end_problem(settings, turn, action, honoured)
            if found is not None:
                v(*found, path)

    def check_retry_wait(
        self, source: _Node, action: Wait, honoured: float | None, path: _At
    ) -> None:
        """A transient failure's wait: within the caps, the backoff and the clocks."""
        settings = self.ctx.settings
        v = self.violate
        turn, session = source.ts, source.state
        if turn.final_answer:
            v("ER-16", "final-answer turn retried", path)
        if turn.attempt >= settings.max_retries:
            v("ER-5", f"retry beyond max_retries at attempt {turn.attempt}", path)
        if session.retries >= settings.session_retry_ceiling:
            v("ER-5", f"retry at the session ceiling ({session.retries})", path)
        self.check_wait(action, turn.attempt, honoured, path)
        limit = settings.max_wall_clock_s
        if limit is not None and source.session.elapsed_s + action.seconds > limit:
            v("ER-19", f"a wait crossing max_wall_clock_s was taken: {action!r}", path)
        if honoured is not None and honoured > settings.max_server_wait_s:
            v("ER-20", f"a server wait beyond max_server_wait_s was taken: {action!r}", path)

    def check_wait(self, action: Wait, attempt: int, honoured: float | None, path: _At) -> None:
        settings = self.ctx.settings
        try:
            nominal = min(
                settings.base_delay_ms * settings.backoff_factor**attempt, settings.max_delay_ms
            )
        except OverflowError:
            nominal = settings.max_delay_ms
        low, high = 0.5 * nominal / 1000.0, 1.5 * nominal / 1000.0
        floor = honoured or 0.0
        ok = action.seconds >= floor and (
            action.seconds == floor or low - 1e-9 <= action.seconds < high + 1e-9
        )
        if not ok:
            v = "ER-3" if action.seconds < floor else "ER-22"
            self.violate(
                v,
                f"wait {action.seconds!r} s outside [{low}, {high}) / retry-after {honoured}",
                path,
            )

    def check_tools(
        self, source: _Node, node: _Node, event: ToolsDone, action: Action, path: _At
    ) -> None:
        """A tool round, re-derived from its outcomes: deaths (not calls) count toward
        a provider's breaker (ER-89), denials toward the denial breaker (ER-84/85), a
        conflict with re-invocations left is retried after a Wait (ER-86), and the
        Finish mirrors every call's latest outcome (ER-12) and terminal tools (ER-83)."""
        settings = self.ctx.settings
        v = self.violate
        by_call = {o.call_id: o for o in event.outcomes}
        trips = self.check_crashes(source, node, by_call, path)
        denied = _denial_trips(settings, source.state, source.ts.in_flight, by_call)
        retry = _conflict_retry(settings, source.ts, event, by_call) and not (trips or denied)
        before, after = source.state, node.state
        if type(action) is Wait:
            if not retry or action.category is not ToolErrorCategory.CONCURRENCY_CONFLICT:
                v("ER-86", f"a Wait after a tool round that has nothing to retry: {action!r}", path)
            if after.tool_retries != before.tool_retries + 1:
                v("ER-86", "a conflict's wait was not counted in tool_retries", path)
            if node.ts.conflict_attempt > settings.max_conflict_retries:
                v("ER-86", f"re-invocation {node.ts.conflict_attempt} beyond the cap", path)
            return
        if type(action) is not Finish:
            v("ER-12", f"ToolsDone gave {action!r}", path)
            return
        if retry and settings.max_wall_clock_s is None:
            v("ER-86", "a conflict with re-invocations left went to the model", path)
        expected = TurnStatus.BREAKER_OPEN if trips or denied else TurnStatus.COMPLETED
        if action.status is not expected:
            v("ER-13", f"tool outcomes gave {action.status}, expected {expected}", path)
        if trips and not after.tripped:
            v("ER-13", "a breaker tripped but no provider is open", path)
        if denied and after.limit is None:
            v("ER-84", "the denial breaker tripped but no limit fired", path)
        self.check_results(source, node, action, trips or denied, path)

    def check_crashes(
        self, source: _Node, node: _Node, by_call: dict[str, ToolOutcome], path: _At
    ) -> bool:
        """Each provider's crash count after the round (a death counts once, a round
        without one resets it: ER-89); whether a breaker trips."""
        settings = self.ctx.settings
        before, after = source.state, node.state
        died: dict[str, bool] = {}
        for call in source.ts.in_flight:
            crashed = by_call[call.id].crashed
            died[call.provider] = died.get(call.provider, False) or crashed
        trips = False
        for provider, crashed in died.items():
            count = (before.breakers or {}).get(provider, 0) + 1 if crashed else 0
            now = (after.breakers or {}).get(provider, 0)
            if now != count:
                self.violate(
                    "ER-89", f"{provider}: {count} crashes in a row, the session says {now}", path
                )
            trips = trips or (crashed and count >= settings.breaker_threshold)
            window = settings.breaker_window
            if window is not None and crashed:
                log = ((before.crash_logs or {}).get(provider, "") + "1")[-window:]
                trips = trips or log.count("1") >= (settings.breaker_window_threshold or 0)
        return trips

    def check_results(
        self, source: _Node, node: _Node, action: Finish, breaker: bool, path: _At
    ) -> None:
        """The Finish holds one result per call, mirroring its latest outcome (ER-12),
        and is done when a terminal tool succeeded and no breaker tripped (ER-83)."""
        latest = {o.call_id: o for o in node.ts.outcomes}
        calls = source.ts.calls
        if len(action.tool_results) != len(calls) or set(latest) != {c.id for c in calls}:
            self.violate(
                "ER-12", f"tool results do not mirror the calls: {action.tool_results!r}", path
            )
            return
        for result in action.tool_results:
            if result.is_error != (not latest[result.call_id].ok):
                self.violate(
                    "ER-12", f"tool result {result.call_id} does not mirror its outcome", path
                )
        terminal = not breaker and any(c.terminates_turn and latest[c.id].ok for c in calls)
        if action.done != terminal:
            self.violate(
                "ER-83", f"Finish.done is {action.done}, the terminal tools say {terminal}", path
            )

    def check_illegal(self, index: int) -> None:
        """Every event with no row in this state raises IllegalEvent, changes nothing."""
        source = self.nodes[index]
        state = source.ts.state
        legal = {trigger for (s, trigger, _) in self.ctx.dispatch.groups if s == state}
        for trigger, event in ILLEGAL_SAMPLES:
            if trigger in legal:
                continue
            node = _clone(self.ctx, source)
            before = (_key(self.ctx, node), len(node.ts.actions), node.turn.action)
            try:
                node.turn.send(event)
            except IllegalEvent:
                pass
            else:
                self.violate(
                    "ER-27", f"{trigger} in {state!r} did not raise IllegalEvent", _At(index)
                )
                continue
            after = (_key(self.ctx, node), len(node.ts.actions), node.turn.action)
            if after != before:
                self.violate(
                    "ER-27", f"an illegal {trigger} in {state!r} changed the turn", _At(index)
                )

    # -- global properties ---------------------------------------------------------


def _denial_trips(
    settings: Settings,
    before: SessionState,
    in_flight: Sequence[ToolCall],
    by_call: dict[str, ToolOutcome],
) -> bool:
    """Whether the round's denials, in call order, trip the denial breaker (ER-84/85)."""
    denied = False
    run, log = before.denials, before.denial_log
    for call in in_flight:
        hit = by_call[call.id].category is ToolErrorCategory.PERMISSION_DENIED
        if settings.denial_threshold is not None:
            run = run + 1 if hit else 0
            denied = denied or run >= settings.denial_threshold
        if settings.denial_window is not None:
            log = (log + ("1" if hit else "0"))[-settings.denial_window :]
            denied = denied or (hit and log.count("1") >= (settings.denial_window_threshold or 0))
    return denied


def _conflict_retry(
    settings: Settings, turn: TurnState, event: ToolsDone, by_call: dict[str, ToolOutcome]
) -> bool:
    """Whether the round leaves a conflicting call to re-invoke (ER-86), breakers aside."""
    conflict = ToolErrorCategory.CONCURRENCY_CONFLICT
    if turn.pending:
        first = by_call[turn.pending[0]].category is conflict
        return (first and turn.conflict_attempt < settings.max_conflict_retries) or len(
            turn.pending
        ) > 1
    return settings.max_conflict_retries > 0 and any(o.category is conflict for o in event.outcomes)


def _status(action: Action) -> TurnStatus | None:
    return action.status if type(action) is Finish else None


def _final_answer_problem(action: Action) -> str | None:
    """Why a final-answer turn may not emit ``action`` (ER-16), if it may not."""
    if type(action) is Wait:
        return "final-answer turn waits to retry"
    if type(action) is InvokeTools:
        return "final-answer turn invokes tools"
    if type(action) is CallModel and (action.attempt or not action.withhold_tools):
        return f"final-answer turn call is not one tool-less attempt: {action!r}"
    if type(action) is Assemble and (
        not action.withhold_tools or not action.instruction or action.reduce
    ):
        return f"final-answer turn assembles wrongly: {action!r}"
    return None


def _resends(source: _Node, action: Action) -> bool:
    """Whether ``action``, after a WaitDone that ends a Wait, resends the same request
    as the next attempt (ER-1)."""
    return (
        type(action) is CallModel
        and action.request == source.ts.request
        and action.attempt == source.ts.attempt + 1
        and type(source.turn.action) is Wait
    )


_BOUNDED_ENDS = (
    TurnStatus.RETRIES_EXHAUSTED,
    TurnStatus.RETRY_CEILING_REACHED,
    TurnStatus.BUDGET_EXHAUSTED,
)


def _transient_end_problem(
    settings: Settings, turn: TurnState, action: Action, honoured: float | None
) -> tuple[str, str] | None:
    """(requirement, message) when a transient failure's Finish is not one of its
    bounded ends, or is one it had no reason for."""
    status = _status(action)
    if status is TurnStatus.RETRY_DEFERRED:
        if honoured is None or honoured <= settings.max_server_wait_s:
            return "ER-20", f"retry_deferred without a too-long server wait: {action!r}"
        if type(action) is Finish and action.retry_at is None:
            return "ER-20", "retry_deferred without retry_at"
        return None
    if status not in _BOUNDED_ENDS:
        return "ER-1", f"transient failure answered by {action!r}"
    if (
        status is TurnStatus.RETRIES_EXHAUSTED
        and not turn.final_answer
        and turn.attempt < settings.max_retries
        and settings.max_wall_clock_s is None
        and honoured is None
    ):
        return "ER-5", "retries_exhausted with retries left"
    return None
