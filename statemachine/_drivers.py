"""The engine with I/O attached: ``run_turn`` and ``arun_turn``.

(Placeholder signatures; the drivers land with the drivers issue.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ._actions import Assemble, CallModel, Finish
from ._events import Assembled, CannotShrink, ModelReplied
from ._tools import ToolCall, ToolOutcome
from ._turn import Turn


class ContextProvider(Protocol):
    def assemble(self, action: Assemble) -> Assembled | CannotShrink: ...


class ModelProvider(Protocol):
    def complete(self, action: CallModel) -> ModelReplied: ...


class ToolProvider(Protocol):
    def invoke(self, call: ToolCall) -> ToolOutcome: ...


class AsyncContextProvider(Protocol):
    async def assemble(self, action: Assemble) -> Assembled | CannotShrink: ...


class AsyncModelProvider(Protocol):
    async def complete(self, action: CallModel) -> ModelReplied: ...


class AsyncToolProvider(Protocol):
    async def invoke(self, call: ToolCall) -> ToolOutcome: ...


def run_turn(
    turn: Turn,
    *,
    model: ModelProvider,
    tools: ToolProvider,
    context: ContextProvider,
    sleep: Callable[[float], Any] | None = None,
) -> Finish:
    """Run ``turn`` to its ``Finish``, executing every action with the providers."""
    raise NotImplementedError("run_turn() is not implemented yet")


async def arun_turn(
    turn: Turn,
    *,
    model: AsyncModelProvider,
    tools: AsyncToolProvider,
    context: AsyncContextProvider,
    sleep: Callable[[float], Awaitable[Any]] | None = None,
) -> Finish:
    """The asyncio twin of :func:`run_turn`; the tool calls of a round run concurrently."""
    raise NotImplementedError("arun_turn() is not implemented yet")
