"""An MCP stdio server (official SDK, ``MCPServer``) whose tools can kill it mid-call.

Run as ``python tests/servers/mcp_crashy.py``. Tools:

* ``echo(text)`` answers ``text``;
* ``fail(text)`` returns a tool error (``isError``);
* ``hang()`` never answers (for timeouts and cancellation);
* ``die(mode)`` writes a stderr line with its own ``time.monotonic()`` (``DEATH_AT=``)
  and a fake API key (to prove redaction), then dies mid-call: ``exit`` is
  ``os._exit(3)``, ``sigkill`` sends itself SIGKILL, ``segv`` dereferences NULL.

``CRASHY_DIE_ON_START=1`` in the environment makes it exit(5) before serving.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

if os.environ.get("CRASHY_DIE_ON_START") == "1":
    sys.stderr.write("refusing to start: CRASHY_DIE_ON_START is set\n")
    sys.stderr.flush()
    os._exit(5)

# (imported after the die-on-start check, which must be quick)
import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("crashy")


@server.tool()
def echo(text: str) -> str:
    """Answer ``text``."""
    return text


@server.tool()
def fail(text: str) -> str:
    """Raise, so the server answers a tool error."""
    raise ValueError(f"failing on purpose: {text}")


@server.tool()
async def hang() -> str:
    """Never answer."""
    await anyio.sleep(3600)
    return "unreachable"


@server.tool()
def die(mode: str) -> str:
    """Die mid-call, after a stderr line stamped with the moment of death."""
    noise = "".join(f"noise line {i}\n" for i in range(200))
    os.write(2, noise.encode())
    stamp = (
        "starting risky work with api_key=sk-live-abcdefghijklmnopqrstuvwxyz012345 "
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.signature\n"
        f"DEATH_AT={time.monotonic():.9f} mode={mode}\n"
    )
    os.write(2, stamp.encode())
    if mode == "exit":
        os._exit(3)
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "segv":
        ctypes.string_at(0)
    return f"unknown mode {mode!r}"


if __name__ == "__main__":
    server.run("stdio")
