"""Tool providers served by MCP servers over stdio, with crash detection.

The code lives in :mod:`statemachine.io._mcp`; this module is its public name.
"""

from .io._mcp import ExitInfo, MCPStartError, MCPStdioTools, python_command, redact

__all__ = ["ExitInfo", "MCPStartError", "MCPStdioTools", "python_command", "redact"]
