"""Small workflows the Temporal tests run beside ``SessionWorkflow``: written with the
pieces a user writes their own workflow with (``new_session``, ``run_turn``).

This module is imported inside the workflow sandbox, so it imports only
``temporalio`` and ``statemachine`` (passed through by ``smt.sandbox_runner()``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from temporalio import workflow

import statemachine as sm
from statemachine import temporal as smt


@workflow.defn(name="tests.Probe")
class ProbeWorkflow:
    """Prints engine values inside the sandbox and reads the session's clock."""

    @workflow.run
    async def run(self) -> dict[str, Any]:
        """``repr`` of every kind of engine value, and what the session holds."""
        session = smt.new_session(sm.Settings(base_delay_ms=100))
        turn = session.new_turn()
        shown = [repr(turn.start())]
        shown.append(repr(turn.send(sm.Assembled({"messages": []}, 10))))
        error = sm.ModelError("rate_limited", "slow", headers={"retry-after": "1"}, status=429)
        shown.append(repr(error))
        shown.append(repr(turn.send(sm.ModelFailed(error))))
        shown.append(repr(turn.send(sm.WaitDone())))
        call = sm.ToolCall("c1", "srv", "lookup", {"q": 1})
        shown.append(repr(turn.send(sm.ModelReplied((call,), cost=0.01))))
        outcome = sm.ToolOutcome("c1", False, "died", "process_crashed")
        shown.append(repr(outcome))
        finish = turn.send(sm.ToolsDone((outcome,)))
        shown += [repr(finish), repr(session), repr(turn), repr(session.settings)]
        shown += [repr(record) for record in turn.trace]
        return {
            "shown": shown,
            "seed": session.seed,
            "seed_of_id": smt.seed_of(workflow.info().workflow_id),
            "session_id": session.session_id,
            "elapsed_s": session.elapsed_s,
            "started_at": workflow.time(),
        }


@workflow.defn(name="tests.Illegal", failure_exception_types=list(smt.BUG_ERRORS))
class IllegalWorkflow:
    """Sends an event the turn cannot take: an engine bug error."""

    @workflow.run
    async def run(self) -> str:
        """Raises ``IllegalEvent``."""
        turn = smt.new_session().new_turn()
        turn.start()
        turn.send(sm.WaitDone())  # not legal while assembling
        return "unreachable"


@workflow.defn(name="tests.OneTurn")
class OneTurnWorkflow:
    """One turn through ``smt.run_turn``, as a user's own workflow would run it."""

    @workflow.run
    async def run(self, prompt: Any) -> str:
        """The turn's status."""
        session = smt.new_session(sm.Settings(base_delay_ms=50), seed=3)
        finish = await smt.run_turn(session.new_turn(), prompt=prompt)
        return finish.status.value


OLD_DEFAULTS: dict[str, Any] = {"base_delay_ms": 500}
"""What the previous release's ``Settings()`` said for the setting the upgrade changes."""
NEW_DEFAULTS: dict[str, Any] = {"base_delay_ms": 300}
"""The upgrade's new default (emulated: this release's engine still says 500)."""
UPGRADE = "tests-base-delay-300"
"""The ``workflow.patched`` id of the upgrade."""


@workflow.defn(name=smt.WORKFLOW, failure_exception_types=list(smt.BUG_ERRORS))
class UpgradedSession(smt.SessionWorkflow):
    """The versioning recipe of docs/temporal.md: an upgrade that changes a default
    pins the old one for the histories recorded before it (no patch marker)."""

    @workflow.run
    async def run(self, data: smt.SessionInput) -> smt.Report:
        """``SessionWorkflow.run`` with the defaults of the release that started it."""
        defaults = NEW_DEFAULTS if workflow.patched(UPGRADE) else OLD_DEFAULTS
        if data.snapshot is None:  # a continued run carries its settings in its snapshot
            data = dataclasses.replace(data, settings={**defaults, **data.settings})
        return await super().run(data)


@workflow.defn(name=smt.WORKFLOW, failure_exception_types=list(smt.BUG_ERRORS))
class NaiveUpgrade(smt.SessionWorkflow):
    """The same upgrade without the recipe: the new default for every history."""

    @workflow.run
    async def run(self, data: smt.SessionInput) -> smt.Report:
        """``SessionWorkflow.run`` with the new defaults, always."""
        if data.snapshot is None:
            data = dataclasses.replace(data, settings={**NEW_DEFAULTS, **data.settings})
        return await super().run(data)
