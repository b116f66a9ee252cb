"""Small shared helpers for the engine tests: a manual clock and turn drivers."""

from __future__ import annotations

from typing import Any

import statemachine as sm


class FakeTime:
    """A clock and an async sleep that records each wait and advances the clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


class ManualClock:
    """A clock the test moves by hand; ``advance`` is the only way time passes."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def new_session(seed: int = 7, clock: ManualClock | None = None, **settings: Any) -> sm.Session:
    """A session on a manual clock with the given settings."""
    return sm.Session(sm.Settings(**settings), seed=seed, clock=clock or ManualClock())


def calling_turn(session: sm.Session, request: Any = "req-1", size: int = 1000) -> sm.Turn:
    """A new turn of ``session`` brought to the ``calling`` state."""
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled(request, size))
    return turn


def fail(category: str, **kwargs: Any) -> sm.ModelFailed:
    """A ``ModelFailed`` of ``category``."""
    return sm.ModelFailed(sm.ModelError(category, **kwargs))


def complete_turn(session: sm.Session, *, cost: float = 0.0) -> sm.Finish:
    """Run one turn of ``session`` straight to ``Finish(completed)``."""
    turn = calling_turn(session)
    action = turn.send(sm.ModelReplied(cost=cost))
    assert isinstance(action, sm.Finish)
    return action


def tool_round(
    session: sm.Session, calls: list[sm.ToolCall], outcomes: list[sm.ToolOutcome]
) -> sm.Action:
    """One turn in which the model asks for ``calls`` and the host reports ``outcomes``."""
    turn = calling_turn(session)
    action = turn.send(sm.ModelReplied(tool_calls=calls))
    if isinstance(action, sm.InvokeTools):
        return turn.send(sm.ToolsDone(outcomes))
    return action


def nested_lists(levels: int) -> list[Any]:
    """``[[[...]]]``, ``levels`` deep, built without recursion."""
    root: list[Any] = []
    node = root
    for _ in range(levels):
        child: list[Any] = []
        node.append(child)
        node = child
    return root


def list_depth(value: Any) -> tuple[int, Any]:
    """(how many first-item list levels ``value`` holds, what is at the bottom)."""
    depth = 0
    while isinstance(value, list) and value:
        depth, value = depth + 1, value[0]
    return depth, value


def nested_dicts(levels: int) -> dict[str, Any]:
    """``{"a": {"a": ... {}}}``: ``levels + 1`` dicts, built without recursion."""
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels):
        child: dict[str, Any] = {}
        node["a"] = child
        node = child
    return root


def dict_depth(value: Any) -> int:
    """How many non-empty ``"a"`` levels ``value`` holds (see :func:`nested_dicts`)."""
    depth = 0
    while isinstance(value, dict) and value:
        depth, value = depth + 1, value["a"]
    return depth
