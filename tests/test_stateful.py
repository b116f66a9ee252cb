"""The stateful suite: arbitrary legal event sequences against a small reference model.

A hypothesis ``RuleBasedStateMachine`` drives a real ``Session`` and its turns with
every error category, retry-afters (usable, garbage and in headers), tool outcomes
(crashes across providers included), clock advances, snapshot + restore mid-turn and
illegal events, and checks after every step the invariants of ``specs/invariants.md``
-- including the *local* ranking function: every step into a recovery state must
consume a bounded resource. At the end, the recorded events are replayed on a fresh
session and must give the same actions, bit for bit; and so must the trace records'
events, sent again by the documented public replay (``new_turn(at=record.made_at)``,
``start(at=record.at)``, ``send(record.caused_by, at=record.at, wall=record.wall)``) to a
session that has a wall clock, whether or not the live one had: the sessions draw both
with and without a wall clock (with an HTTP-date retry-after only a wall clock makes
usable) and turns made a while before they start (across a wall-clock bound).

Profiles: ``HYPOTHESIS_PROFILE=ci`` (default, derandomized) or ``fuzz`` (long).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from statemachine import (
    Assemble,
    Assembled,
    CallModel,
    Cancelled,
    CannotShrink,
    ErrorCategory,
    Finish,
    IllegalEvent,
    InvokeTools,
    ModelError,
    ModelFailed,
    ModelReplied,
    Session,
    SessionEnded,
    Settings,
    ToolCall,
    ToolErrorCategory,
    ToolOutcome,
    ToolsDone,
    TraceRecord,
    TurnInProgress,
    TurnStatus,
    Wait,
    WaitDone,
)
from statemachine.core._engine import DISPATCH as DEFAULT_DISPATCH
from statemachine.core._engine import Dispatch
from statemachine.dev.check import step_bound

WALL = 1_700_000_000.0
RECOVERY = ("backing_off", "reducing_context")


class Clock:
    """An injected monotonic clock the test advances by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def wall_clock() -> float:
    """A fixed Unix time: an HTTP-date retry-after is read against it."""
    return WALL


DATED = "dated"
"""The retry-after the engine must honour for :data:`DATE`: 3 s on the wall clock, none
in a session without one."""
DATE = "Tue, 14 Nov 2023 22:13:23 GMT"
"""3 s after :data:`WALL`."""


settings_strategy = st.builds(
    Settings,
    base_delay_ms=st.sampled_from([0, 100, 500]),
    backoff_factor=st.sampled_from([1.0, 2.0, 3.0]),
    max_retries=st.integers(0, 3),
    max_delay_ms=st.sampled_from([1_000, 30_000]),
    session_retry_ceiling=st.integers(0, 8),
    max_server_wait_s=st.sampled_from([0.0, 5.0, 60.0]),
    max_context_reductions=st.integers(0, 2),
    breaker_threshold=st.integers(1, 3),
    doom_loop_threshold=st.integers(2, 4),
    max_turns=st.none() | st.integers(1, 4),
    max_cost_usd=st.none() | st.just(1.0),
    max_wall_clock_s=st.none() | st.sampled_from([20.0, 200.0]),
    fallback_models=st.sampled_from([(), ("fb1",), ("fb1", "fb2")]),
)

# (ModelError keyword arguments, the retry-after the engine must honour)
retry_after_strategy = st.one_of(
    st.just(({}, None)),
    st.floats(0, 100).map(lambda s: ({"retry_after_seconds": s}, s)),
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0]).map(
        lambda s: ({"retry_after_seconds": s}, None)
    ),
    st.sampled_from(
        [
            ({"headers": {"retry-after-ms": "1500"}}, 1.5),
            ({"headers": {"Retry-After-Ms": "250"}}, 0.25),
            ({"headers": {"RETRY-AFTER": "3"}}, 3.0),
            ({"headers": {"retry-after": "120"}}, 120.0),
            ({"headers": {"retry-after": "soon"}}, None),
            ({"headers": {"retry-after": "-2"}}, None),
            ({"headers": {"retry-after-ms": "NaN", "retry-after": "2"}}, 2.0),
            ({"headers": {"retry-after-ms": "abc"}}, None),
            ({"retry_after_seconds": math.nan, "headers": {"retry-after": "4"}}, 4.0),
            ({"headers": {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}}, None),
            ({"headers": {"retry-after": DATE}}, DATED),
            ({"headers": {"retry-after": DATE}}, DATED),
        ]
    ),
)

calls_strategy = st.lists(
    st.tuples(
        st.sampled_from(["p", "q", "r"]),
        st.sampled_from(["read", "write"]),
        st.integers(0, 1),
    ),
    max_size=3,
)

category_strategy = st.sampled_from(
    [ErrorCategory.RATE_LIMITED, ErrorCategory.OVERLOADED] * 3 + list(ErrorCategory)
)

outcome_strategy = st.sampled_from(
    ["ok", "crash", "crash", "timeout", "execution_failed", "not_found"]
)


def nominal_ms(settings: Settings, n: int) -> float:
    """delay_ms(n) of specs/backoff.md, written independently of the engine."""
    try:
        return min(settings.base_delay_ms * settings.backoff_factor**n, settings.max_delay_ms)
    except OverflowError:
        return settings.max_delay_ms


class TurnMachine(RuleBasedStateMachine):
    DISPATCH: Dispatch = DEFAULT_DISPATCH
    """The table the sessions run (a subclass plants a mutant's)."""
    """A session driven by arbitrary legal events, checked against a reference model."""

    def __init__(self) -> None:
        super().__init__()
        self.session: Session
        self.settings: Settings
        self.seed = 0
        self.clock = Clock()
        self.wall_clock: Any = wall_clock
        self.turn: Any = None
        self.log: list[tuple[float, str, Any]] = []
        self.records: list[TraceRecord] = []
        self.actions: list[Any] = []
        self.requests = 0
        # the reference model
        self.poisoned: set[str] = set()
        self.fatal = False
        self.honoured: float | None = None
        self.crashes: dict[str, int] = {}
        self.tripped: set[str] = set()
        self.retries = 0
        self.steps = 0
        self.doom_last: tuple[str, int] | None = None
        self.doom_run = 0
        self.doom_fired = False

    # -- helpers -------------------------------------------------------------

    def _declared_turn(self) -> Any:
        """The current turn's declared state (a copy, read only)."""
        turn = self.session.state.turn
        assert turn is not None
        return turn

    def rank(self) -> tuple[int, int, int, int]:
        """(session retries left, reductions left, fallbacks left, call retries left)."""
        s, t = self.settings, self.turn
        in_call = t.state in ("calling", "backing_off", "invoking_tools")
        return (
            s.session_retry_ceiling - self.session.retries_used,
            s.max_context_reductions - t.reductions,
            len(s.fallback_models) - 1 - self._declared_turn().model_index,
            s.max_retries - t.attempt if in_call else s.max_retries,
        )

    def send(self, event: Any) -> Any:
        """Send a legal event, log it, and check every per-step invariant."""
        turn, settings = self.turn, self.settings
        source = turn.state
        before = self.rank()
        previous = turn.action
        self.log.append((self.clock.now, "send", event))
        action = turn.send(event)
        self.actions.append(action)
        self.steps += 1
        dest = turn.state
        after = self.rank()

        # local ranking (ER-29)
        if dest not in ("completed", "filtered", "breaker_open", "failed"):
            assert after <= before, f"ranking grew {before} -> {after}: {source} -> {dest}"
        if dest in RECOVERY or (source == "calling" and dest == "calling"):
            assert after < before, f"ranking not consumed {before} -> {after}: {source} -> {dest}"
        assert self.steps <= step_bound(settings), f"turn of {self.steps} steps"

        # caps (ER-5) and the reference retry count
        if type(action) is Wait or (type(action) is CallModel and source == "calling"):
            self.retries += 1
        assert self.session.retries_used == self.retries
        assert turn.attempt <= settings.max_retries
        assert self.session.retries_used <= settings.session_retry_ceiling

        # never resend an overflowed request (ER-6); nothing after auth/invalid (ER-9)
        if type(action) is CallModel:
            assert action.request not in self.poisoned, (
                f"resends a request that overflowed: {action}"
            )
        if self.fatal:
            assert type(action) is Finish, f"action after a fatal error: {action}"

        # Wait >= retry-after, within the documented envelope (ER-3, ER-22)
        if type(action) is Wait:
            assert isinstance(event, ModelFailed)
            n = action.attempt
            nominal = nominal_ms(settings, n) / 1000.0
            floor = self.honoured or 0.0
            assert action.seconds >= floor
            if action.seconds != floor:
                assert 0.5 * nominal - 1e-9 <= action.seconds < 1.5 * nominal + 1e-9
            if self.honoured is not None:
                assert self.honoured <= settings.max_server_wait_s
            if settings.max_wall_clock_s is not None:
                assert self.session.elapsed_s + action.seconds <= settings.max_wall_clock_s

        # breakers (ER-18) and the final-answer turn (ER-16)
        if type(action) is InvokeTools:
            assert not {c.provider for c in action.calls} & self.tripped
        if turn.final_answer:
            assert type(action) not in (Wait, InvokeTools)
            if type(action) is CallModel:
                assert action.attempt == 0 and action.withhold_tools
        if type(previous) is Wait and type(action) is CallModel:
            assert action.attempt == turn.attempt

        # the bounds are checked after every turn (ER-15, ER-19)
        if type(action) is Finish and not turn.final_answer:
            session = self.session
            fired = (
                (settings.max_turns is not None and session.turns >= settings.max_turns)
                or (settings.max_cost_usd is not None and session.cost_usd >= settings.max_cost_usd)
                or (
                    settings.max_wall_clock_s is not None
                    and session.elapsed_s >= settings.max_wall_clock_s
                )
                or action.status is TurnStatus.BUDGET_EXHAUSTED
            )
            if fired:
                assert session.limit_reached is not None, f"a bound fired but no limit: {action}"
        return action

    def fingerprint(self) -> str:
        """Everything observable about the session and its turn, for "changed nothing"."""
        session, turn = self.session, self.turn
        return repr(
            (
                session.status,
                session.limit_reached,
                session.turns,
                session.retries_used,
                session.cost_usd,
                session.crash_counts,
                session.tripped_providers,
                turn.state,
                turn.status,
                turn.action,
                turn.attempt,
                turn.reductions,
                turn.trace,
            )
        )

    # -- rules ---------------------------------------------------------------

    @initialize(settings=settings_strategy, seed=st.integers(0, 2**32), walled=st.booleans())
    def setup(self, settings: Settings, seed: int, walled: bool) -> None:
        """A fresh session, with a wall clock or none."""
        self.settings = settings
        self.seed = seed
        self.wall_clock = wall_clock if walled else None
        self.session = Session(
            settings,
            seed,
            self.clock,
            wall_clock=self.wall_clock,
            observers=[self.records.append],
            dispatch=self.DISPATCH,
        )

    def running(self) -> bool:
        return self.turn is not None and not self.turn.done

    def new_turn(self, gap: float) -> None:
        """The next turn (the final-answer one once a limit fired), started ``gap``
        seconds after it was made."""
        self.turn = self.session.new_turn()
        self.log.append((self.clock.now, "new_turn", None))
        self.clock.now += gap
        self.poisoned, self.fatal, self.steps = set(), False, 0
        before = self.rank()
        self.log.append((self.clock.now, "start", None))
        action = self.turn.start()
        self.actions.append(action)
        assert self.rank() == before
        assert type(action) is Assemble and not action.reduce
        assert action.withhold_tools == self.turn.final_answer
        if self.settings.max_turns is not None:
            assert self.session.turns <= self.settings.max_turns + 1

    def drive(self, data: st.DataObject) -> None:
        """One legal step of the host: the event the last action asks for (a new turn
        when the last one finished), drawn with its details; sometimes a cancel."""
        turn = self.turn
        if turn is None or turn.done:
            if self.session.status is None:
                self.new_turn(data.draw(st.sampled_from([0.0, 0.0, 0.0, 5.0, 30.0]), label="gap"))
            return
        if data.draw(st.integers(0, 29), label="cancel if 0") == 0:
            self.cancel()
            return
        action = turn.action
        if type(action) is Assemble:
            if data.draw(st.integers(0, 5), label="cannot shrink if 0") == 0:
                self.cannot_shrink()
            else:
                self.assembled(
                    data.draw(st.integers(0, 2000), label="size"),
                    data.draw(st.booleans(), label="reuse the overflowed request"),
                )
        elif type(action) is CallModel:
            if data.draw(st.integers(0, 4), label="reply if < 2") < 2:
                self.replied(
                    data.draw(calls_strategy, label="tool calls"),
                    data.draw(st.sampled_from([0.0, 0.0, 0.6]), label="cost"),
                )
            else:
                self.failed(
                    data.draw(category_strategy, label="category"),
                    data.draw(st.sampled_from([False] * 7 + [True]), label="partial"),
                    data.draw(retry_after_strategy, label="retry-after"),
                )
        elif type(action) is Wait:
            self.wait_done(data.draw(st.sampled_from([0.0, 0.0, 1.0, 30.0]), label="extra"))
        elif type(action) is InvokeTools:
            self.tools_done(data)

    # three rules for the same step: the host's events are most of what happens
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        """The host takes the next legal step."""
        self.drive(data)

    @rule(data=st.data())
    def step_again(self, data: st.DataObject) -> None:
        """The host takes the next legal step."""
        self.drive(data)

    @rule(data=st.data())
    def step_on(self, data: st.DataObject) -> None:
        """The host takes the next legal step."""
        self.drive(data)

    @precondition(lambda self: self.session.status is not None or self.running())
    @rule()
    def new_turn_refused(self) -> None:
        """new_turn raises SessionEnded after the final-answer turn, TurnInProgress
        while a turn runs, and changes nothing."""
        before = self.fingerprint()
        expected = SessionEnded if self.session.status is not None else TurnInProgress
        with pytest.raises(expected):
            self.session.new_turn()
        assert self.fingerprint() == before

    def assembled(self, size: int, reuse: bool) -> None:
        """The context is assembled (maybe reusing the overflowed request)."""
        if reuse and self.turn.action.reduce and self.poisoned:
            request = sorted(self.poisoned)[0]
        else:
            self.requests += 1
            request = f"req-{self.requests}"
        self.send(Assembled(request, size))

    def cannot_shrink(self) -> None:
        """The providers cannot shrink the context."""
        action = self.send(CannotShrink())
        assert type(action) is Finish and action.status is TurnStatus.CONTEXT_EXHAUSTED

    def replied(self, calls: list[tuple[str, str, int]], cost: float) -> None:
        """The model replies, maybe asking for tools."""
        tool_calls = [
            ToolCall(f"c{self.steps}-{i}", provider, name, {"x": x})
            for i, (provider, name, x) in enumerate(calls)
        ]
        final = self.turn.final_answer
        action = self.send(ModelReplied(tool_calls, cost=cost, reply="text"))
        if final or not tool_calls:
            assert type(action) is Finish and action.status is TurnStatus.COMPLETED
            if not final:  # the loop finished: a run of identical calls ends here
                self.doom_last, self.doom_run = None, 0
            return
        # the reference doom-loop detector (ER-17): identical consecutive calls
        for call in tool_calls:
            fingerprint = (call.name, call.arguments["x"])
            if fingerprint == self.doom_last:
                self.doom_run += 1
            else:
                self.doom_last, self.doom_run = fingerprint, 1
            if self.doom_run >= self.settings.doom_loop_threshold:
                self.doom_fired = True
        if self.doom_fired:
            assert self.session.limit_reached is not None, "a doom loop did not fire a limit"

    def failed(self, category: ErrorCategory, partial: bool, retry: Any) -> None:
        """The model call fails (every category, usable and garbage retry-afters)."""
        kwargs, honoured = retry
        if honoured == DATED:
            honoured = 3.0 if self.wall_clock is not None else None
        self.honoured = honoured
        request = self.turn.action.request
        action = self.send(ModelFailed(ModelError(category, "boom", **kwargs), partial=partial))
        status = action.status if type(action) is Finish else None
        if partial and category is not ErrorCategory.CONTENT_FILTERED:
            assert status is TurnStatus.STREAM_INTERRUPTED
        elif category in (ErrorCategory.AUTH_ERROR, ErrorCategory.INVALID_REQUEST):
            assert status is TurnStatus(category.value)
            self.fatal = True
        elif category is ErrorCategory.CONTENT_FILTERED:
            assert status is TurnStatus.CONTENT_FILTERED and self.turn.state == "filtered"
        elif category is ErrorCategory.UNKNOWN:
            assert status is TurnStatus.UNKNOWN_ERROR
        elif category is ErrorCategory.CONTEXT_LENGTH_EXCEEDED:
            self.poisoned.add(request)
            assert (type(action) is Assemble and action.reduce) or (
                status is TurnStatus.CONTEXT_EXHAUSTED
            ), f"the overflowed request was answered by {action}"
        elif status is TurnStatus.RETRY_DEFERRED:
            assert honoured is not None and honoured > self.settings.max_server_wait_s
            assert action.retry_at is not None

    def wait_done(self, extra: float) -> None:
        """The host slept the wait (and maybe a little more)."""
        self.clock.now += self.turn.action.seconds + extra
        request = self._declared_turn().request
        action = self.send(WaitDone())
        assert type(action) is CallModel and action.request == request

    def tools_done(self, data: st.DataObject) -> None:
        """Every tool call comes back: ok, failed, or its plugin crashed (a provider
        whose process died in this round crashed once, however many calls it had)."""
        outcomes = []
        died: dict[str, bool] = {}
        for call in self.turn.action.calls:
            kind = data.draw(outcome_strategy)
            if kind == "ok":
                outcomes.append(ToolOutcome(call.id, True, "fine"))
            else:
                category = "process_crashed" if kind == "crash" else kind
                outcomes.append(ToolOutcome(call.id, False, "bad", ToolErrorCategory(category)))
            died[call.provider] = died.get(call.provider, False) or kind == "crash"
        crashed = dict(self.crashes)
        trips = False
        for provider, crash in died.items():
            crashed[provider] = crashed.get(provider, 0) + 1 if crash else 0
            if crashed[provider] >= self.settings.breaker_threshold:
                trips = True
                self.tripped.add(provider)
        self.crashes = crashed
        action = self.send(ToolsDone(outcomes))
        assert type(action) is Finish
        assert action.status is (TurnStatus.BREAKER_OPEN if trips else TurnStatus.COMPLETED)
        assert [r.is_error for r in action.tool_results] == [not o.ok for o in outcomes]
        assert set(self.session.tripped_providers) == self.tripped

    def cancel(self) -> None:
        """The host cancels the running turn."""
        action = self.send(Cancelled("user"))
        assert type(action) is Finish and action.status is TurnStatus.CANCELLED

    @rule(seconds=st.sampled_from([0.5, 5.0, 60.0]))
    def advance_clock(self, seconds: float) -> None:
        """Time passes (a slow model call, a slow tool)."""
        self.clock.now += seconds

    @precondition(lambda self: self.turn is not None)
    @rule(
        event=st.sampled_from(
            [
                Assembled("x", 1),
                CannotShrink(),
                ModelReplied(),
                ModelFailed(ModelError("overloaded")),
                WaitDone(),
                ToolsDone([ToolOutcome("nope", True)]),
                Cancelled(),
                "not an event",
            ]
        )
    )
    def illegal(self, event: Any) -> None:
        """An event that is illegal here raises IllegalEvent and changes nothing.

        In ``invoking_tools`` the sample ``ToolsDone`` names the unknown call id
        ``"nope"``: a bad payload, illegal too."""
        legal = {
            "Assemble": (Assembled, CannotShrink),
            "CallModel": (ModelReplied, ModelFailed),
            "Wait": (WaitDone,),
        }.get(type(self.turn.action).__name__, ())
        if self.running() and isinstance(event, (*legal, Cancelled)):
            return
        before = self.fingerprint()
        with pytest.raises(IllegalEvent):
            self.turn.send(event)
        assert self.fingerprint() == before

    @precondition(lambda self: self.turn is not None)
    @rule()
    def snapshot_restore(self) -> None:
        """Snapshot through JSON and restore: the session continues from there."""
        if self.DISPATCH is not DEFAULT_DISPATCH:
            return  # a planted mutant's states are not the engine's: restore refuses them
        data = json.loads(json.dumps(self.session.snapshot(), allow_nan=False))
        restored = Session.restore(
            data, clock=self.clock, wall_clock=self.wall_clock, observers=[self.records.append]
        )
        assert restored.snapshot() == data
        self.session = restored
        self.turn = restored.current_turn

    # -- invariants and the replay ---------------------------------------------

    @invariant()
    def session_bounded(self) -> None:
        """A session with max_turns = N ends within N + 1 turns; a finished final-answer
        turn ends the session with the limit that fired; a tripped breaker has fired
        the limit-reached path."""
        if getattr(self, "settings", None) is None:
            return
        session, turn = self.session, self.turn
        if self.settings.max_turns is not None:
            assert session.turns <= self.settings.max_turns + 1
            if session.turns == self.settings.max_turns + 1 and turn.done:
                assert session.status is not None
        if turn is not None and turn.final_answer:
            assert session.limit_reached is not None
            if turn.done:
                assert session.status is session.limit_reached
        if session.tripped_providers:
            assert session.limit_reached is not None

    def teardown(self) -> None:
        """Replaying the recorded events on a fresh session gives the same actions; so
        does the public replay of the trace records."""
        if not self.log:
            return
        self.replay_the_records()
        clock = Clock()
        session = Session(
            self.settings, self.seed, clock, wall_clock=self.wall_clock, dispatch=self.DISPATCH
        )
        turn = None
        actions = []
        for now, kind, event in self.log:
            clock.now = now
            if kind == "new_turn":
                turn = session.new_turn()
            elif kind == "start":
                assert turn is not None
                actions.append(turn.start())
            else:
                assert turn is not None
                actions.append(turn.send(event))
        # repr: exact for floats, and NaN retry-afters kept on errors compare equal
        assert repr(actions) == repr(self.actions)

    def replay_the_records(self) -> None:
        """The records' events sent again at their moments (the documented replay, every
        turn made at its ``made_at``) to a session with no clock but a wall clock: the
        same actions and the same session. A step that had no wall time says so
        (``wall=None``), so the replay's wall clock is never read for it."""
        session = Session(
            self.settings,
            self.session.seed,  # the recorded seed
            None,
            wall_clock=wall_clock,
            started=self.session.started,
            dispatch=self.DISPATCH,
        )
        turn: Any = None
        actions = []
        for record in self.records:
            if record.caused_by is None:  # a start: every turn here was made in this run
                assert record.made_at is not None
                turn = session.new_turn(at=record.made_at)
                actions.append(turn.start(at=record.at))
            else:
                actions.append(turn.send(record.caused_by, at=record.at, wall=record.wall))
        assert repr(actions) == repr([record.action for record in self.records])
        assert repr(actions) == repr(self.actions)
        if self.DISPATCH is DEFAULT_DISPATCH:
            assert session.snapshot(at=self.clock.now) == self.session.snapshot()


# CI runs more examples of this suite than the profile's default (it is the one that
# explores sequences); the fuzz profile's own, much larger, count wins when selected.
_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
TurnMachine.TestCase.settings = settings(
    parent=settings.default,
    max_examples=max(settings.default.max_examples, 800 if _PROFILE == "ci" else 0),
    stateful_step_count=60,
)
TestTurnMachine = pytest.mark.requirement(
    "ER-1",
    "ER-3",
    "ER-4",
    "ER-5",
    "ER-6",
    "ER-7",
    "ER-9",
    "ER-10",
    "ER-11",
    "ER-12",
    "ER-13",
    "ER-15",
    "ER-16",
    "ER-17",
    "ER-18",
    "ER-19",
    "ER-20",
    "ER-21",
    "ER-22",
    "ER-24",
    "ER-25",
    "ER-26",
    "ER-27",
    "ER-29",
    "ER-31",
)(TurnMachine.TestCase)
