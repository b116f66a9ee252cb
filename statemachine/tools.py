"""Tool routing: one tool provider per tool name, as the drivers expect.

The code lives in :mod:`statemachine.io._router`; this module is its public name.
"""

from .io._router import AsyncToolRouter, ToolRouter

__all__ = ["AsyncToolRouter", "ToolRouter"]
