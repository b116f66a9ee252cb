"""The simulator: scripted scenarios through the real engine, on a virtual clock.

:func:`run` plays a :class:`~statemachine.dev._scenarios.Scenario` through a real
:class:`~statemachine.Session` and its turns: it sends the scripted events, honours
every ``Wait`` by moving a virtual clock (instantly; or really sleeping, for demos),
and reports each transition as a :class:`StepRecord` as it happens. The result says
how every turn and the session ended, and which of the scenario's expectations did
not hold. Nothing here decides anything: every decision in the trace is the engine's.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .. import (
    Action,
    Assemble,
    Assembled,
    CallModel,
    Cancelled,
    CannotShrink,
    Finish,
    IllegalEvent,
    InvokeTools,
    ModelError,
    ModelFailed,
    ModelReplied,
    Session,
    SessionEnded,
    ToolCall,
    ToolOutcome,
    ToolsDone,
    TraceRecord,
    Turn,
    Usage,
    Wait,
    WaitDone,
)
from ..core import _table
from ..io._trace_file import record_json
from ._scenarios import OPEN, Scenario, Step, TurnSpec

EPOCH = 1_767_225_600.0
"""The virtual wall clock's start, 2026-01-01T00:00:00Z, so HTTP-date retry-after
headers in scenarios mean the same thing on every run."""


_LARGEST = sys.float_info.max


class VirtualClock:
    """Seconds since the scenario started; only the simulator moves it, and it stops at
    the largest float (waits of 1e308 s add up to no infinity)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds`` (saturating)."""
        moved = self.now + seconds
        self.now = moved if moved < _LARGEST else _LARGEST

    def wall(self) -> float:
        """Unix time on the virtual clock (for HTTP-date retry-after headers)."""
        return EPOCH + self.now


@attrs.frozen
class StepRecord:
    """One transition of one turn, with what the simulator knows around it."""

    scenario: str
    turn: int
    final_answer: bool
    step: int
    t: float
    """The virtual clock when the event arrived, in seconds."""
    source: str
    event: str
    detail: str
    """The event's payload, in short (``size=1200``, ``rate_limited retry_after=2s``)."""
    auto: bool
    """The simulator sent the event itself (a ``WaitDone`` after a ``Wait``)."""
    guard: str
    dest: str
    action: Action
    attempt: int
    session_retries: int
    reductions: int
    cost_usd: float
    """The session's spend so far (every turn's ``ModelReplied.cost``)."""
    limit: str | None
    """The session limit that has fired, if any (its final-answer turn comes next)."""
    session_status: str | None
    turn_cost_usd: float = 0.0
    """This turn's own spend so far (its ``ModelReplied.cost``)."""
    turn_retries: int = 0
    """The session retries this turn has used so far (waits and fallbacks)."""
    record: TraceRecord = attrs.field(kw_only=True, eq=False, repr=False)
    """The engine's own record of the transition (its event, usage and times)."""


@attrs.frozen
class TurnResult:
    """How one turn of the scenario ended."""

    index: int
    status: str | None
    final_answer: bool
    fallbacks: int


@attrs.frozen
class Result:
    """How a scenario ended, and the expectations that did not hold."""

    scenario: Scenario
    seed: int
    turns: tuple[TurnResult, ...]
    session_status: str | None
    limit: str | None
    retries_used: int
    cost_usd: float
    elapsed_s: float
    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Whether the script ran through and every expectation held."""
        return not self.failures


# -- the events a step stands for -----------------------------------------------


def _event(step: Step, turn: int, action: Action | None) -> object:
    """The engine event of ``step`` in turn ``turn`` (``action``: the one it answers)."""
    fields = step.fields
    kind = step.event
    if kind == "Assembled":
        size = fields["size"]
        return Assembled(fields.get("request", f"turn {turn} context ({size} tokens)"), size)
    if kind == "ModelFailed":
        error = ModelError(
            fields["category"],
            message=fields.get("message", ""),
            retry_after_seconds=fields.get("retry_after"),
            headers=fields.get("headers"),
            code=fields.get("code"),
            status=fields.get("status"),
        )
        return ModelFailed(
            error, partial=fields.get("partial", False), cost=fields.get("cost", 0.0)
        )
    if kind == "ModelReplied":
        calls = tuple(
            ToolCall(
                spec.id or f"c{turn}.{i}",
                spec.provider,
                spec.name,
                spec.arguments,
                terminates_turn=spec.terminates_turn,
            )
            for i, spec in enumerate(fields["tool_calls"], 1)
        )
        return ModelReplied(calls, fields.get("cost", 0.0), fields.get("reply"))
    if kind == "ToolsDone":
        invoked = action.calls if isinstance(action, InvokeTools) else ()
        return ToolsDone(
            tuple(
                ToolOutcome(
                    spec.call_id or (invoked[i].id if i < len(invoked) else f"?{i + 1}"),
                    spec.ok,
                    spec.content,
                    spec.category,
                    invoke_failed=spec.invoke_failed,
                )
                for i, spec in enumerate(fields["outcomes"])
            )
        )
    if kind == "Cancelled":
        return Cancelled(fields.get("reason", ""))
    return CannotShrink() if kind == "CannotShrink" else WaitDone()


def event_text(event: object) -> str:
    """What an event says, in short, as simulate's table, the step list and the
    timeline show it: a failure's category, retry-after, HTTP status and usage, a
    reply's tool calls and usage, an assembled size, each tool outcome, a reason."""
    if isinstance(event, ModelFailed):
        error = event.error
        headers: Mapping[str, str] = error.headers or {}
        parts = [error.category.value]
        if error.retry_after_seconds is not None:
            parts.append(f"retry_after={_number(error.retry_after_seconds)}s")
        else:
            parts += [
                f"{h}: {headers[h]}" for h in ("retry-after-ms", "retry-after") if h in headers
            ]
        if event.partial:
            parts.append("partial stream")
        if error.status is not None:
            parts.append(f"HTTP {error.status}")
        return " ".join([*parts, *_usage_parts(event.usage, event.cost)])
    if isinstance(event, ModelReplied):
        calls = ", ".join(_call_text(call) for call in event.tool_calls)
        return " ".join(
            [f"calls {calls}" if calls else "no tool call", *_usage_parts(event.usage, event.cost)]
        )
    if isinstance(event, Assembled):
        return f"size={event.size}"
    if isinstance(event, ToolsDone):
        return ", ".join(
            f"{o.call_id} {'ok' if o.ok else (o.category or 'unknown')}" for o in event.outcomes
        )
    if isinstance(event, Cancelled):
        return event.reason[:80]
    return ""


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, int | float) else repr(value)


def _usage_parts(usage: Usage | None, cost: float) -> list[str]:
    parts = []
    if usage is not None:
        if usage.input_tokens is not None or usage.output_tokens is not None:
            parts.append(f"tokens {usage.input_tokens}/{usage.output_tokens}")
        if usage.model is not None:
            parts.append(f"model {usage.model}")
    if cost:
        parts.append(f"${cost:g}")
    return parts


def _call_text(call: ToolCall) -> str:
    if call.arguments is None:
        return f"{call.provider}.{call.name}()"
    args = json.dumps(call.arguments, sort_keys=True, separators=(",", ":"), default=str)
    return f"{call.provider}.{call.name}({args})"


# -- running ---------------------------------------------------------------------


class _Failed(Exception):
    """The script stopped matching the engine: the message says where and why."""


class _Script:
    """A turn's steps, each ``repeat`` times, handed out one at a time (never built
    as a list: a repeat of thousands costs nothing until it is played)."""

    def __init__(self, steps: tuple[Step, ...]) -> None:
        self.steps = steps
        self.index = 0
        self.sent = 0
        """Times the current step has been handed out."""

    def peek(self) -> Step | None:
        return self.steps[self.index] if self.index < len(self.steps) else None

    def pop(self) -> Step:
        step = self.steps[self.index]
        self.sent += 1
        if self.sent == step.repeat:
            self.index, self.sent = self.index + 1, 0
        return step

    def left(self) -> int:
        """Steps not handed out yet, repeats counted."""
        if self.index >= len(self.steps):
            return 0
        later = sum(step.repeat for step in self.steps[self.index + 1 :])
        return self.steps[self.index].repeat - self.sent + later


class _Run:
    """One play of a scenario: the session, its virtual clock and what happened."""

    def __init__(
        self,
        scenario: Scenario,
        seed: int,
        on_step: Callable[[StepRecord], None] | None,
        sleep: Callable[[float], None] | None,
    ) -> None:
        self.scenario = scenario
        self.on_step = on_step
        self.sleep = sleep
        self.clock = VirtualClock()
        self.records: list[TraceRecord] = []
        # no clock of its own: every step is told its moment on the virtual clock
        self.session = Session(
            scenario.settings,
            seed,
            None,
            wall_clock=None,
            started=self.clock.now,
            observers=(self.records.append,),
        )
        self.turns: list[TurnResult] = []
        self.failures: list[str] = []
        self.turn_cost = 0.0
        self.retries_before = 0

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        if self.sleep is not None and seconds > 0:
            self.sleep(seconds)

    def emit(self, turn: Turn, detail: str, auto: bool) -> None:
        if self.on_step is None:
            return
        record = self.records[-1]
        limit = self.session.limit_reached
        status = self.session.status
        self.on_step(
            StepRecord(
                scenario=self.scenario.name,
                turn=turn.index,
                final_answer=turn.final_answer,
                step=record.step,
                t=self.clock.now,
                source=record.source,
                event=record.event,
                detail=detail,
                auto=auto,
                guard=record.guard,
                dest=record.dest,
                action=record.action,
                attempt=record.attempt,
                session_retries=record.session_retries,
                reductions=record.reductions,
                cost_usd=self.session.cost_usd,
                limit=limit.value if limit else None,
                session_status=status.value if status else None,
                turn_cost_usd=self.turn_cost,
                turn_retries=record.session_retries - self.retries_before,
                record=record,
            )
        )

    def play(self, spec: TurnSpec) -> Turn:
        """Play one turn of ``spec``; ``_Failed`` when the script and engine part."""
        where = self.scenario.where
        try:
            turn = self.session.new_turn(at=self.clock.now)
        except SessionEnded as exc:
            raise _Failed(
                f"{where(spec.line)}: {spec.path}: the session has already ended "
                f"({exc.status}); no more turns can be played"
            ) from None
        self.turn_cost = 0.0
        self.retries_before = self.session.retries_used
        action: Action = turn.start(at=self.clock.now)
        self.emit(turn, "", False)
        script = _Script(spec.steps)
        while not turn.done:
            upcoming = script.peek()
            if isinstance(action, Wait) and (
                upcoming is None or upcoming.event not in ("WaitDone", "Cancelled")
            ):
                seconds = action.seconds
                self.advance(seconds)
                action = turn.send(WaitDone(), at=self.clock.now)
                self.emit(turn, f"after {seconds:.3f}s", True)
                continue
            if upcoming is None:
                raise _Failed(
                    f"{where(spec.line)}: {spec.path}: the steps ran out in state "
                    f"{turn.state!r}; the engine asked for {action_text(action)}"
                )
            step = script.pop()
            if isinstance(action, Wait) and step.event == "WaitDone":
                self.advance(action.seconds)
            self.advance(step.takes)
            try:
                event = _event(step, turn.index, action)
                action = turn.send(event, at=self.clock.now, wall=self.clock.wall())
            except (IllegalEvent, TypeError, ValueError) as exc:
                raise _Failed(f"{where(step.line)}: {step.path}: {exc}") from None
            if isinstance(event, ModelReplied):
                self.turn_cost += event.cost
            self.emit(turn, event_text(event), False)
            if step.expect_action and type(action).__name__ != step.expect_action:
                raise _Failed(
                    f"{where(step.line)}: {step.path}: expected the engine to answer "
                    f"{step.expect_action}, it answered {action_text(action)}"
                )
        left = script.peek()
        if left is not None:
            raise _Failed(
                f"{where(left.line)}: {left.path}: the turn had already "
                f"finished ({turn.status}); {script.left()} step(s) left over"
            )
        return turn

    def check_turn(self, spec: TurnSpec, turn: Turn) -> None:
        finish = turn.finish
        fallbacks = len(finish.fallbacks) if finish else 0
        status = turn.status.value if turn.status else None
        self.turns.append(TurnResult(turn.index, status, turn.final_answer, fallbacks))
        where = f"{self.scenario.where(spec.line)}: {spec.path}"
        if spec.expect_status is not None and status != spec.expect_status:
            self.failures.append(
                f"{where}: turn {turn.index} ended {status}, expected {spec.expect_status.value}"
            )
        if spec.expect_fallbacks is not None and fallbacks != spec.expect_fallbacks:
            self.failures.append(
                f"{where}: turn {turn.index} fell back {fallbacks} time(s), "
                f"expected {spec.expect_fallbacks}"
            )


def run(
    scenario: Scenario,
    *,
    seed: int | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> Result:
    """Play ``scenario`` through a real session; ``seed`` overrides its seed.

    ``on_step`` receives every transition as it happens; ``sleep`` (for demos)
    is called with the seconds of every wait and every step's ``takes``, which the
    virtual clock moves by in any case.
    """
    used_seed = scenario.seed if seed is None else seed
    state = _Run(scenario, used_seed, on_step, sleep)
    try:
        for spec in scenario.turns:
            for _ in range(spec.repeat):
                state.check_turn(spec, state.play(spec))
        if scenario.end is not None:
            state.session.end(scenario.end, at=state.clock.now)
    except _Failed as exc:
        state.failures.append(str(exc))
    session = state.session
    session_status = session.status.value if session.status else None
    if not state.failures:
        state.failures.extend(
            _check_scenario(scenario, state.turns, session_status, session.retries_used)
        )
    return Result(
        scenario=scenario,
        seed=used_seed,
        turns=tuple(state.turns),
        session_status=session_status,
        limit=session.limit_reached.value if session.limit_reached else None,
        retries_used=session.retries_used,
        cost_usd=session.cost_usd,
        elapsed_s=state.clock.now,
        failures=tuple(state.failures),
    )


def _check_scenario(
    scenario: Scenario, turns: list[TurnResult], session_status: str | None, retries: int
) -> list[str]:
    failures = []

    def where(key: str) -> str:
        return f"{scenario.where(scenario.expect_lines.get(key, 1))}: {key}"

    last = turns[-1].status if turns else None
    if scenario.expect_turn_status is not None and last != scenario.expect_turn_status:
        failures.append(
            f"{where('expect_turn_status')}: the last turn ended {last}, "
            f"expected {scenario.expect_turn_status.value}"
        )
    if scenario.expect_session_status is not None:
        got = session_status or OPEN
        if got != scenario.expect_session_status:
            failures.append(
                f"{where('expect_session_status')}: the session is {got}, "
                f"expected {scenario.expect_session_status}"
            )
    if scenario.expect_retries_used is not None and retries != scenario.expect_retries_used:
        failures.append(
            f"{where('expect_retries_used')}: the session used {retries} retries, "
            f"expected {scenario.expect_retries_used}"
        )
    return failures


# -- presenting ------------------------------------------------------------------


def action_text(action: Action | None) -> str:
    """An action, in short, with what a reviewer needs (the attempt and model, the
    wait's seconds and category, the calls, the status and how it came about)."""
    if isinstance(action, Assemble):
        text = "Assemble(reduce)" if action.reduce else "Assemble"
        return text + (" final-answer (no tools)" if action.withhold_tools else "")
    if isinstance(action, CallModel):
        text = f"CallModel attempt={action.attempt}"
        text += f" model={action.model}" if action.model is not None else ""
        return text + (" no tools" if action.withhold_tools else "")
    if isinstance(action, Wait):
        return f"Wait {action.seconds:.3f}s {action.category.value}"
    if isinstance(action, InvokeTools):
        calls = ", ".join(f"{c.id}={c.name}" for c in action.calls)
        return f"InvokeTools {calls or '(none)'}"
    if isinstance(action, Finish):
        text = f"Finish({action.status.value})"
        errors = sum(1 for r in action.tool_results if r.is_error)
        if action.tool_results:
            text += f" results={len(action.tool_results)}"
            text += f" ({errors} error)" if errors else ""
        if action.fallbacks:
            text += f" via {' -> '.join(f.to_model for f in action.fallbacks)}"
        if action.retry_at is not None:
            text += f" retry_at=t+{action.retry_at:.0f}s"
        return text
    return repr(action)


ROW_NUMBERS: dict[tuple[str, str, str, str], int] = {
    row.key: number for number, row in enumerate(_table.ROWS, 1)
}
"""Each table row's number, as the table under the diagram (``diagrams/turn.svg``)
numbers it: its place in the table, from 1."""


def row_number(record: StepRecord) -> int:
    """The number of the table row that fired for ``record``."""
    return ROW_NUMBERS[(record.source, record.event, record.guard, record.dest)]


ELLIPSIS = "..."
"""What ends a cell cut to its column's width (ASCII: any terminal can print it)."""


@attrs.frozen
class Layout:
    """The widths of the trace table's columns. Text cells longer than their column
    (an HTTP-date header, a reply's tool calls) are cut, ending in :data:`ELLIPSIS`,
    so every row stays aligned; the numbers get columns wide enough for the values
    the scenario's settings and script allow (``--json`` has every cell whole)."""

    step: int = 3
    time: int = 8
    move: int = max(len(f"{row.source} -> {row.dest}") for row in _table.ROWS)
    event: int = 48
    action: int = 40
    count: int = 3

    def header(self) -> str:
        """The column titles."""
        return (
            f"  {'#':>{self.step}} {'t (s)':>{self.time}}  {'state -> next':<{self.move}} "
            f"{'event':<{self.event}} {'action':<{self.action}} "
            f"{'att':>{self.count}} {'ret':>{self.count}} {'red':>{self.count}}  row"
        )


DEFAULT_LAYOUT = Layout()


def layout_for(scenario: Scenario) -> Layout:
    """Columns wide enough for every number ``scenario`` can print: steps of its
    longest turn, its virtual time, its counters' caps."""
    settings = scenario.settings
    events = max((sum(step.repeat for step in spec.steps) for spec in scenario.turns), default=0)
    steps = 2 * events + 1  # each scripted step, an auto WaitDone before it, the start
    scripted = sum(spec.repeat * sum(step.repeat for step in spec.steps) for spec in scenario.turns)
    takes = sum(
        spec.repeat * sum(step.repeat * step.takes for step in spec.steps)
        for spec in scenario.turns
    )
    longest_wait = max(settings.max_server_wait_s, 1.5 * settings.max_delay_ms / 1000.0)
    seconds = takes + scripted * longest_wait
    counts = max(
        settings.max_retries, settings.session_retry_ceiling, settings.max_context_reductions
    )
    time_width = len(f"{seconds:.3f}") if math.isfinite(seconds) else 24
    return Layout(
        step=max(3, len(str(steps))),
        time=max(8, time_width),
        count=max(3, len(str(counts))),
    )


def _cell(text: str, width: int) -> str:
    """``text`` in a column of ``width``: padded, or cut to end in the ellipsis."""
    if len(text) > width:
        text = text[: max(width - len(ELLIPSIS), 0)] + ELLIPSIS
    return text.ljust(width)


def format_scenario_header(scenario: Scenario, seed: int) -> str:
    """The lines above a scenario's trace."""
    changed = ", ".join(f"{k}={v!r}" for k, v in scenario.settings_table.items())
    lines = [
        f"== {scenario.name}: {scenario.description}".rstrip(": "),
        f"   settings: {changed or 'the defaults'}; seed {seed}",
    ]
    return "\n".join(lines)


def format_turn_header(record: StepRecord, layout: Layout = DEFAULT_LAYOUT) -> str:
    """The line that opens a turn's trace."""
    kind = " (final-answer turn: tools withheld)" if record.final_answer else ""
    return f"  turn {record.turn}{kind}\n{layout.header()}"


def format_step(record: StepRecord, layout: Layout = DEFAULT_LAYOUT) -> str:
    """One transition as a line of the trace table (long cells cut, so it aligns): its
    step counted from 1 in its turn, as people count (``--json`` has the engine's
    ``step``, from 0)."""
    event = record.event + (" (auto)" if record.auto else "")
    if record.detail:
        event += f" {record.detail}"
    move = f"{record.source} -> {record.dest}"
    guard = f"{row_number(record):>3}" + (f" [{record.guard}]" if record.guard else "")
    n = layout.count
    return (
        f"  {record.step + 1:>{layout.step}} {record.t:>{layout.time}.3f}  "
        f"{_cell(move, layout.move)} {_cell(event, layout.event)} "
        f"{_cell(action_text(record.action), layout.action)} "
        f"{record.attempt:>{n}} {record.session_retries:>{n}} {record.reductions:>{n}}  {guard}"
    ).rstrip()


def _retries(n: int) -> str:
    return f"{n} {'retry' if n == 1 else 'retries'}"


def format_turn_end(record: StepRecord) -> str:
    """The line under a finished turn: the turn's own cost and retries, then the
    session's totals so far."""
    assert isinstance(record.action, Finish)  # noqa: S101 - called for Finish only
    line = f"  => turn {record.turn}: {record.action.status.value}"
    line += (
        f"   (this turn: cost ${record.turn_cost_usd:g}, {_retries(record.turn_retries)}; "
        f"session: cost ${record.cost_usd:g}, {_retries(record.session_retries)})"
    )
    if record.session_status:
        line += f"\n  => session ended: {record.session_status}"
    elif record.limit:
        line += f"\n  => limit reached: {record.limit}; the next turn is the final-answer turn"
    return line


def format_result(result: Result) -> str:
    """The summary under a scenario's trace."""
    statuses = ", ".join(str(t.status) for t in result.turns) or "(no turn finished)"
    lines = [
        f"   turns: {statuses}",
        f"   session: {result.session_status or OPEN}; retries used {result.retries_used}; "
        f"cost ${result.cost_usd:g}; virtual time {result.elapsed_s:.3f}s",
    ]
    if result.ok:
        lines.append("   OK: every expectation held")
    else:
        lines.extend(f"   FAILED: {failure}" for failure in result.failures)
    return "\n".join(lines)


_SIMULATOR_KEYS = (
    "scenario",
    "final_answer",
    "detail",
    "auto",
    "cost_usd",
    "turn_cost_usd",
    "turn_retries",
    "limit",
    "session_status",
)
"""What ``--json`` adds to a trace file's step: the simulator's view of it."""


def step_json(record: StepRecord) -> dict[str, Any]:
    """A transition as one JSON object (``--json``): the trace file's ``step`` object
    (:func:`~statemachine.io._trace_file.record_json`: the engine's record, with the
    event that caused it) and the simulator's view of it (``cost_usd``: the session's
    spend so far)."""
    line = record_json(record.record)
    line.update((name, getattr(record, name)) for name in _SIMULATOR_KEYS)
    jsonable: dict[str, Any] = json.loads(json.dumps(line, default=str))
    return jsonable


def result_json(result: Result) -> dict[str, Any]:
    """A scenario's outcome as one JSON object (``--json``), with the settings it ran
    with (what ``trace`` checks each ``Wait`` against)."""
    return {
        "type": "summary",
        "scenario": result.scenario.name,
        "source": result.scenario.source,
        "seed": result.seed,
        "ok": result.ok,
        "turn_statuses": [t.status for t in result.turns],
        "session_status": result.session_status,
        "limit": result.limit,
        "retries_used": result.retries_used,
        "cost_usd": result.cost_usd,
        "elapsed_s": result.elapsed_s,
        "failures": list(result.failures),
        "settings": result.scenario.settings.to_dict(),
    }
