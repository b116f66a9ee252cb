"""The engine's output, byte for byte, against what the release before issue 29's
engine work wrote (``tests/data/engine-steps.json``, written by commit ``329bd16``).

Each scenario drives a session through one family of paths (retries, a server's
retry-after, reductions, fallbacks, tool rounds with crashes, denials and conflicts, the
doom loop, the final-answer turn, cancellation, the wall clock) on a manual clock, and
keeps, per step, the action's ``repr``; per turn, the trace records' ``repr`` and what an
observer saw; at the end, the snapshot as JSON text. A faster engine must write the same
bytes: the snapshot a store keeps, the trace a host reads, the records telemetry reads.

To rewrite the fixture (only for a change that means to change the output):
``python -m tests.test_engine_fixtures > tests/data/engine-steps.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

import statemachine as sm

FIXTURE = Path(__file__).parent / "data" / "engine-steps.json"

Step = tuple[str, Any]


class _Clock:
    """A clock that moves a quarter second on every reading."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


def _fail(category: str, **kwargs: Any) -> sm.ModelFailed:
    partial = kwargs.pop("partial", False)
    cost = kwargs.pop("cost", 0.0)
    return sm.ModelFailed(sm.ModelError(category, **kwargs), partial, cost=cost)


def _call(i: int, name: str = "search", provider: str = "mcp", **kwargs: Any) -> sm.ToolCall:
    return sm.ToolCall(f"c{i}", provider, name, {"q": i % 2}, **kwargs)


def _outcome(i: int, category: str | None = None) -> sm.ToolOutcome:
    if category is None:
        return sm.ToolOutcome(f"c{i}", ok=True, content=f"r{i}")
    return sm.ToolOutcome(f"c{i}", ok=False, content="no", category=category)


_REQUEST = {"messages": [{"role": "user", "content": "hi"}]}
_USAGE = sm.Usage(input_tokens=10, output_tokens=3)

SCENARIOS: dict[str, tuple[dict[str, Any], list[list[Step]]]] = {
    "five retries, a reply with cost and usage": (
        {},
        [
            [
                ("assembled", sm.Assembled(_REQUEST, 1000)),
                *[
                    step
                    for _ in range(5)
                    for step in (("send", _fail("rate_limited")), ("send", sm.WaitDone()))
                ],
                ("send", sm.ModelReplied(reply={"text": "done"}, cost=0.25, usage=_USAGE)),
            ]
        ],
    ),
    "retry-after headers, a billed failure, a deferred retry": (
        {"max_server_wait_s": 10.0},
        [
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", _fail("overloaded", headers={"retry-after": "3"}, cost=0.5)),
                ("send", sm.WaitDone()),
                ("wall", _fail("rate_limited", headers={"retry-after-ms": "1500"})),
                ("send", sm.WaitDone()),
                ("send", _fail("rate_limited", retry_after_seconds=60.0)),
            ],
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", sm.ModelReplied(reply="ok")),
            ],
        ],
    ),
    "reductions, then a fallback model, then retries exhausted": (
        {"fallback_models": ("b", "c"), "max_retries": 1, "max_context_reductions": 1},
        [
            [
                ("assembled", sm.Assembled(_REQUEST, 500)),
                ("send", _fail("context_length_exceeded")),
                ("send", sm.Assembled({"messages": []}, 200)),
                ("send", _fail("rate_limited")),
                ("send", sm.WaitDone()),
                ("send", _fail("rate_limited")),
                ("send", _fail("overloaded")),
                ("send", sm.WaitDone()),
                ("send", _fail("overloaded")),
                ("send", _fail("rate_limited")),
                ("send", sm.WaitDone()),
                ("send", _fail("rate_limited")),
            ],
            [
                ("assembled", sm.Assembled(_REQUEST, 500)),
                ("send", _fail("context_length_exceeded")),
                ("send", sm.Assembled(_REQUEST, 500)),
            ],
        ],
    ),
    "tool rounds: a crash, a conflict re-invoked, a terminal tool, the breaker": (
        {"breaker_threshold": 2, "max_conflict_retries": 2},
        [
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", sm.ModelReplied(tool_calls=[_call(1), _call(2, provider="p")])),
                ("send", sm.ToolsDone([_outcome(1), _outcome(2, "process_crashed")])),
            ],
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", sm.ModelReplied(tool_calls=[_call(3), _call(4, "write")])),
                ("send", sm.ToolsDone([_outcome(3, "concurrency_conflict"), _outcome(4)])),
                ("send", sm.WaitDone()),
                ("send", sm.ToolsDone([_outcome(3, "concurrency_conflict")])),
                ("send", sm.WaitDone()),
                ("send", sm.ToolsDone([_outcome(3)])),
            ],
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", sm.ModelReplied(tool_calls=[_call(5, "end", terminates_turn=True)])),
                ("send", sm.ToolsDone([_outcome(5)])),
            ],
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", sm.ModelReplied(tool_calls=[_call(6, provider="p")])),
                ("send", sm.ToolsDone([_outcome(6, "process_crashed")])),
            ],
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", sm.ModelReplied(reply="final", cost=0.125)),
            ],
        ],
    ),
    "denials, the doom loop, the final-answer turn": (
        {"denial_threshold": 2, "doom_loop_threshold": 3},
        [
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", sm.ModelReplied(tool_calls=[_call(1), _call(3), _call(5)])),
                (
                    "send",
                    sm.ToolsDone([_outcome(1), _outcome(3, "permission_denied"), _outcome(5)]),
                ),
            ],
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", sm.ModelReplied(tool_calls=[_call(7)])),
                ("send", sm.ToolsDone([_outcome(7)])),
            ],
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", _fail("rate_limited")),
                ("send", sm.WaitDone()),
                ("send", sm.ModelReplied(tool_calls=[_call(9)])),
            ],
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", _fail("rate_limited")),
            ],
        ],
    ),
    "failures that end a turn, a cancellation, the wall clock": (
        {"max_wall_clock_s": 30.0, "base_delay_ms": 4000.0},
        [
            [("assembled", sm.Assembled(_REQUEST, 10)), ("send", _fail("content_filtered"))],
            [("assembled", sm.Assembled(_REQUEST, 10)), ("send", _fail("auth_error"))],
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", _fail("rate_limited", partial=True)),
            ],
            [("assembled", sm.Assembled(_REQUEST, 10)), ("send", _fail("unknown"))],
            [("assembled", sm.Assembled(_REQUEST, 10)), ("send", _fail("invalid_request"))],
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", sm.ModelReplied(tool_calls=[_call(1), _call(2)])),
                ("send", sm.Cancelled("user left")),
            ],
            [
                ("assembled", sm.Assembled(_REQUEST, 10)),
                ("send", _fail("rate_limited")),
                ("send", sm.WaitDone()),
                ("send", _fail("rate_limited")),
                ("send", sm.WaitDone()),
                ("send", _fail("rate_limited")),
                ("send", sm.WaitDone()),
                ("send", _fail("rate_limited")),
            ],
            [("assembled", sm.CannotShrink())],
        ],
    ),
}


def _as_written(record: sm.TraceRecord) -> str:
    """``repr(record)`` as the previous release wrote it, without ``made_at`` (added
    since: a start's says when its turn was made, the clock's reading before)."""
    if record.event == "start":
        assert record.made_at is not None and record.at is not None
        assert record.made_at < record.at  # the clock moves on at every reading
    else:
        assert record.made_at is None
    return repr(attrs.evolve(record, made_at=None)).removesuffix(", made_at=None)") + ")"


def _run(settings: dict[str, Any], turns: list[list[Step]], seed: int) -> dict[str, Any]:
    clock = _Clock()
    seen: list[str] = []
    session = sm.Session(
        sm.Settings(**settings),
        seed=seed,
        clock=clock,
        wall_clock=lambda: 1_700_000_000.0 + clock.now,
        observers=[lambda record: seen.append(_as_written(record))],
    )
    out: dict[str, Any] = {"actions": [], "traces": [], "observed": []}
    for steps in turns:
        if session.status is not None:
            break
        turn = session.new_turn()
        out["actions"].append(repr(turn.start()))
        for how, event in steps:
            if turn.done:
                break
            send: Callable[..., Any] = turn.send
            action = send(event, wall=1_800_000_000.0) if how == "wall" else send(event)
            out["actions"].append(repr(action))
        out["traces"].append([_as_written(record) for record in turn.trace])
        out["snapshot mid-session"] = json.dumps(session.snapshot(), allow_nan=False)
    out["observed"] = seen
    return out


def run_all() -> dict[str, Any]:
    """Every scenario's output, with two seeds each."""
    return {
        f"{name} (seed {seed})": _run(settings, turns, seed)
        for name, (settings, turns) in SCENARIOS.items()
        for seed in (0, 29)
    }


@pytest.mark.requirement("ER-25", "ER-26")
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_engine_writes_what_the_previous_release_wrote(name: str) -> None:
    """The same actions, traces, observed records and snapshot text, to the byte."""
    expected = json.loads(FIXTURE.read_text("utf-8"))
    settings, turns = SCENARIOS[name]
    for seed in (0, 29):
        got = json.loads(json.dumps(_run(settings, turns, seed)))
        want = expected[f"{name} (seed {seed})"]
        assert got["actions"] == want["actions"]
        assert got["traces"] == want["traces"]
        assert got["observed"] == want["observed"]
        assert got["snapshot mid-session"] == want["snapshot mid-session"]


def test_the_fixture_covers_every_row_family() -> None:
    """The scenarios reach retries, waits, reductions, fallbacks, tool rounds, breakers,
    the final-answer turn and cancellation (a fixture that lost them would pin less)."""
    expected = json.loads(FIXTURE.read_text("utf-8"))
    text = json.dumps(expected)
    for needle in (
        "Wait(seconds=",
        "attempt=5",
        "Assemble(reduce=True",
        "model='b'",
        "InvokeTools(",
        "BREAKER_OPEN",
        "withhold_tools=True",
        "CANCELLED",
        "RETRY_DEFERRED",
        "BUDGET_EXHAUSTED",
        "CONCURRENCY_CONFLICT",
        "error_doom_loop",
        "error_circuit_breaker",
    ):
        assert needle in text, needle


if __name__ == "__main__":
    print(json.dumps(run_all(), indent=1, ensure_ascii=False))
