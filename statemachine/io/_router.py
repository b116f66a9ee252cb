"""Routing tool calls to several tool providers by ``ToolCall.provider``.

The engine counts crashes and trips breakers per provider name; a router is how a
host serves several providers (MCP servers, in-process tools) as the one ``tools``
argument of the drivers::

    async with AsyncToolRouter({"files": files_mcp, "search": search_tools}) as tools:
        finish = await sm.arun_turn(turn, model=model, tools=tools, context=context)

A call for a provider the router does not know fails ``not_found``, naming the
providers it knows; it is never raised.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Generic, TypeVar

from ..core._taxonomy import ToolErrorCategory
from ..core._tool_calls import ToolCall, ToolOutcome
from ._drivers import AsyncToolProvider, ToolProvider

__all__ = ["AsyncToolRouter", "ToolRouter"]

_P = TypeVar("_P")


class _Routes(Generic[_P]):
    def __init__(self, providers: Mapping[str, _P]) -> None:
        if not isinstance(providers, Mapping):
            raise TypeError(f"providers: expected a mapping of name to provider, got {providers!r}")
        for name, provider in providers.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"providers: names must be non-empty str, got {name!r}")
            if not callable(getattr(provider, "invoke", None)):
                raise TypeError(f"providers[{name!r}]: has no invoke() method: {provider!r}")
        self.providers = dict(providers)

    def _unknown(self, call: ToolCall) -> ToolOutcome:
        known = ", ".join(sorted(self.providers)) or "none"
        return ToolOutcome(
            call.id,
            ok=False,
            content=f"no tool provider named {call.provider!r} (known: {known})",
            category=ToolErrorCategory.NOT_FOUND,
        )


class ToolRouter(_Routes[ToolProvider]):
    """A sync ``ToolProvider`` that hands each call to ``providers[call.provider]``."""

    def invoke(self, call: ToolCall) -> ToolOutcome:
        """Route ``call``; an unknown provider is a ``not_found`` outcome."""
        provider = self.providers.get(call.provider)
        return self._unknown(call) if provider is None else provider.invoke(call)


class AsyncToolRouter(_Routes[AsyncToolProvider]):
    """An asyncio ``AsyncToolProvider`` that hands each call to
    ``providers[call.provider]``; as a context manager it closes the providers that
    have ``aclose()`` (an :class:`~statemachine.mcp.MCPStdioTools` does)."""

    async def invoke(self, call: ToolCall) -> ToolOutcome:
        """Route ``call``; an unknown provider is a ``not_found`` outcome."""
        provider = self.providers.get(call.provider)
        return self._unknown(call) if provider is None else await provider.invoke(call)

    async def aclose(self) -> None:
        """Close every provider that can be closed, in order."""
        for provider in self.providers.values():
            close = getattr(provider, "aclose", None)
            if callable(close):
                result = close()
                if inspect.isawaitable(result):
                    await result

    async def __aenter__(self) -> AsyncToolRouter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
