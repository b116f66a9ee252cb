"""The turn's transition table: the whole behaviour of the engine, as data.

A *turn* is one pass of an agent loop: assemble the context, call the model, invoke
the tools it asked for, finish; the host sends it events and gets back actions. Each
row below says: in state ``source``, on ``event``, if every guard in ``guards`` holds,
go to ``dest`` and perform ``effect`` (which builds the action and updates the
counters). Rows are tried in the order written; the first whose guards all hold fires,
exactly as ``transitions`` tries a trigger's transitions. A (state, event) pair with
no row is illegal: ``IllegalEvent``, nothing changes.

Why the rows are ordered as they are, for a ``ModelFailed``:

* ``content_filtered`` first: a filter is surfaced distinctly even when it cut a
  stream short (a vendor's safety stop arrives mid-stream); it is never resent.
* ``partial`` next: a reply that already streamed out partly is never resent,
  whatever its category, because the user has seen half an answer.
* Non-retryable categories next, each to its own status; ``auth_error`` and
  ``invalid_request`` never reach a retry or a fallback row.
* ``context_length_exceeded`` never resends: it asks for a *reduced* assembly while
  reductions are left, else it ends ``context_exhausted``.
* Transient errors (``rate_limited``, ``overloaded``): the final-answer turn makes
  one attempt only; the session ceiling is checked before the per-call cap, so a
  spent session cannot retry even a fresh call; a wait that fits (not beyond
  ``max_server_wait_s``, not across ``max_wall_clock_s``) is taken while the call
  has retries left; otherwise the next fallback model takes over at once; with
  no fallback left, the reason the wait could not be taken (the wall clock first:
  a wait past the session's budget is ``budget_exhausted`` even if the server also
  asked for too long), or the spent per-call cap, names the status.

For a ``ToolsDone``: a tripped breaker (crashes, then denials) ends the turn
``breaker_open`` first, with every result; otherwise a ``concurrency_conflict`` is
re-invoked, serialized (one call per ``InvokeTools``, after a backoff ``Wait``), while
it has re-invocations left (``max_conflict_retries``) and the wait fits the wall clock;
then a successful terminal tool marks the loop done; else the turn completes.

A tripped breaker needs no row of its own after its turn: it fires the session's limit, so every
later turn is the final-answer turn, whose reply is never invoked. That is how no call
to a tripped provider is ever made again.

Every edge into a recovery state (``backing_off``, ``reducing_context``,
``backing_off_tools``, a fallback ``calling``) consumes a bounded resource (a per-call
retry *and* a session retry, a reduction, a fallback model, a conflicting call's
re-invocation): that ranking function is why no loop is unbounded,
and ``statemachine check`` proves it over the whole state space.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Row:
    """One transition of the table."""

    source: str
    event: str
    guards: tuple[str, ...]
    dest: str
    effect: str
    status: str | None = None
    """For the ``finish`` effect: the ``TurnStatus`` value the turn ends with."""

    @property
    def label(self) -> str:
        """The guards as a trace names them: joined by ``" & "`` (``""``: no guard)."""
        return " & ".join(self.guards)

    @property
    def key(self) -> tuple[str, str, str, str]:
        """(source, event, guard label, dest): what a trace step records of the row, and
        so how a recorded step finds its row again."""
        return (self.source, self.event, self.label, self.dest)

    @property
    def info(self) -> tuple[str, str, str, str, str]:
        """(source, event, guard label, dest, effect): the row as a trace step holds it
        (``_state.RowInfo``)."""
        return (self.source, self.event, self.label, self.dest, self.effect)


IDLE = "idle"
ASSEMBLING = "assembling"
CALLING = "calling"
BACKING_OFF = "backing_off"
REDUCING_CONTEXT = "reducing_context"
INVOKING_TOOLS = "invoking_tools"
BACKING_OFF_TOOLS = "backing_off_tools"
COMPLETED = "completed"
FILTERED = "filtered"
BREAKER_OPEN = "breaker_open"
FAILED = "failed"

RUNNING_STATES = (
    IDLE,
    ASSEMBLING,
    CALLING,
    BACKING_OFF,
    REDUCING_CONTEXT,
    INVOKING_TOOLS,
    BACKING_OFF_TOOLS,
)
TERMINAL_STATES = (COMPLETED, FILTERED, BREAKER_OPEN, FAILED)
STATES = RUNNING_STATES + TERMINAL_STATES

TERMINAL_KIND = {
    COMPLETED: "success",
    FILTERED: "surfaced",
    BREAKER_OPEN: "surfaced",
    FAILED: "failed",
}
"""How each terminal state reads to a reviewer (the diagrams colour by it)."""

START = "start"
"""The trigger ``Turn.start()`` fires; every other trigger is an event class's name."""

GUARDS: dict[str, str] = {
    "final_answer": "this is the final-answer turn of the limit-reached path",
    "no_tool_calls": "the reply asks for no tool call",
    "partial": "part of a streamed reply was already delivered",
    "auth_error": "category is auth_error",
    "invalid_request": "category is invalid_request",
    "content_filtered": "category is content_filtered",
    "unknown": "category is unknown",
    "context_length_exceeded": "category is context_length_exceeded",
    "transient": "category is rate_limited or overloaded",
    "reductions_left": "fewer than max_context_reductions reductions this turn",
    "ceiling_reached": "the session has used session_retry_ceiling retries",
    "retries_left": "this call has been retried fewer than max_retries times",
    "wait_fits": "the wait is within max_server_wait_s and max_wall_clock_s",
    "fallback_left": "fallback_models has a model after the current one",
    "server_wait_too_long": "the server asked for more than max_server_wait_s",
    "wait_crosses_wall_clock": "the wait would cross max_wall_clock_s",
    "shrank": "the new request is strictly smaller than the one that overflowed",
    "trips_breaker": (
        "a provider's crashes reached breaker_threshold in a row (or its window's count)"
    ),
    "trips_denial_breaker": "denials reached denial_threshold in a row (or the window's count)",
    "conflict_retry": "a concurrency_conflict call has re-invocations left and the wait fits",
    "terminal_tool": "a call marked terminates_turn succeeded",
}
"""Every guard a row may name, with what it means (the diagrams' legend)."""

EFFECTS: dict[str, str] = {
    "assemble": "Assemble(reduce=False)",
    "call_model": "CallModel(request, attempt=0)",
    "retry": "CallModel(same request, attempt + 1)",
    "fall_back": "CallModel(same request, next fallback model, attempt=0)",
    "wait": "Wait(backoff with jitter, at least the retry-after)",
    "reduce": "Assemble(reduce=True)",
    "invoke_tools": "InvokeTools(calls)",
    "complete": "Finish(completed)",
    "finish_tools": "Finish(completed or breaker_open, tool results)",
    "tool_wait": "Wait(backoff with jitter) before a conflicting call goes again",
    "reinvoke": "InvokeTools(the first conflicting call, alone)",
    "finish": "Finish(status)",
    "cancel": "Finish(cancelled, error results for calls in flight)",
}
"""Every effect a row may name, with the action it emits."""


def _failed(source: str, event: str, guards: tuple[str, ...], status: str) -> Row:
    return Row(source, event, guards, FAILED, "finish", status)


_FAILURE = (CALLING, "ModelFailed")
_TOOLS_DONE = (INVOKING_TOOLS, "ToolsDone")

ROWS: tuple[Row, ...] = (
    Row(IDLE, START, (), ASSEMBLING, "assemble"),
    # -- assembling: the first assembly of the turn
    Row(ASSEMBLING, "Assembled", (), CALLING, "call_model"),
    _failed(ASSEMBLING, "CannotShrink", (), "context_exhausted"),
    # -- calling: a reply
    Row(CALLING, "ModelReplied", ("final_answer",), COMPLETED, "complete"),
    Row(CALLING, "ModelReplied", ("no_tool_calls",), COMPLETED, "complete"),
    Row(CALLING, "ModelReplied", (), INVOKING_TOOLS, "invoke_tools"),
    # -- calling: a failure, by category (see the essay for the order)
    Row(*_FAILURE, ("content_filtered",), FILTERED, "finish", "content_filtered"),
    _failed(*_FAILURE, ("partial",), "stream_interrupted"),
    _failed(*_FAILURE, ("auth_error",), "auth_error"),
    _failed(*_FAILURE, ("invalid_request",), "invalid_request"),
    _failed(*_FAILURE, ("unknown",), "unknown_error"),
    _failed(*_FAILURE, ("context_length_exceeded", "final_answer"), "context_exhausted"),
    Row(*_FAILURE, ("context_length_exceeded", "reductions_left"), REDUCING_CONTEXT, "reduce"),
    _failed(*_FAILURE, ("context_length_exceeded",), "context_exhausted"),
    _failed(*_FAILURE, ("transient", "final_answer"), "retries_exhausted"),
    _failed(*_FAILURE, ("transient", "ceiling_reached"), "retry_ceiling_reached"),
    Row(*_FAILURE, ("transient", "retries_left", "wait_fits"), BACKING_OFF, "wait"),
    Row(*_FAILURE, ("transient", "fallback_left"), CALLING, "fall_back"),
    _failed(
        *_FAILURE, ("transient", "retries_left", "wait_crosses_wall_clock"), "budget_exhausted"
    ),
    _failed(*_FAILURE, ("transient", "retries_left", "server_wait_too_long"), "retry_deferred"),
    _failed(*_FAILURE, ("transient",), "retries_exhausted"),
    # -- backing_off: the wait is over, the same request goes again
    Row(BACKING_OFF, "WaitDone", (), CALLING, "retry"),
    # -- reducing_context: the reduced assembly
    Row(REDUCING_CONTEXT, "Assembled", ("shrank",), CALLING, "call_model"),
    _failed(REDUCING_CONTEXT, "Assembled", (), "context_exhausted"),
    _failed(REDUCING_CONTEXT, "CannotShrink", (), "context_exhausted"),
    # -- invoking_tools: every outcome of the calls in flight is in
    Row(*_TOOLS_DONE, ("trips_breaker",), BREAKER_OPEN, "finish_tools", "breaker_open"),
    Row(*_TOOLS_DONE, ("trips_denial_breaker",), BREAKER_OPEN, "finish_tools", "breaker_open"),
    Row(*_TOOLS_DONE, ("conflict_retry",), BACKING_OFF_TOOLS, "tool_wait"),
    Row(*_TOOLS_DONE, ("terminal_tool",), COMPLETED, "finish_tools", "completed"),
    Row(*_TOOLS_DONE, (), COMPLETED, "finish_tools", "completed"),
    # -- backing_off_tools: the wait is over, the first conflicting call goes again
    Row(BACKING_OFF_TOOLS, "WaitDone", (), INVOKING_TOOLS, "reinvoke"),
    # -- the host may abandon a running turn at any point
    *(Row(state, "Cancelled", (), FAILED, "cancel", "cancelled") for state in RUNNING_STATES),
)
