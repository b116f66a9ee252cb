"""An MCP stdio server (official SDK, ``MCPServer``) that misbehaves at the edges.

Run as ``python tests/servers/mcp_hostile.py [mode]``. Modes, all decided before
the SDK is imported (so the quick ones are quick):

* ``serve`` (the default) serves the tools below;
* ``exit3`` writes its config, with secrets in JSON and Python-dict form, to stderr
  and exits 3 at once (a server that dies at start-up);
* ``mute`` reads stdin and never answers, not even ``initialize``;
* ``close-stdout`` closes its stdout at once and sleeps (alive, transport gone).

Tools: ``echo(text)`` answers ``text``; ``close_stdout()`` closes the server's
stdout and sleeps without answering, keeping the process alive;
SIGUSR1 makes a serving server close its stdout while idle (between calls) and keep
running: the test picks the moment, so no timer races the client. ``HOSTILE_IGNORE_TERM=1`` in the environment makes the server ignore SIGTERM, so
only SIGKILL ends it.
"""

from __future__ import annotations

import os
import signal
import sys
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "serve"
IGNORE_TERM = os.environ.get("HOSTILE_IGNORE_TERM") == "1"
if IGNORE_TERM:  # (in the main thread: the SDK runs sync tools in worker threads)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
SECRET = "sk-proj-startupsecret0123456789abcdef"  # noqa: S105 - fake, to prove redaction
CONFIG = (
    '{"server": "hostile", "api_key": "' + SECRET + '", "retries": 3}\n'
    "{'password': 'hunter2-dict-secret', 'user': 'svc'}\n"
    "fatal: cannot reach the upstream service\n"
)


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


_WIRE = os.fstat(1)  # the stdout pipe, however many descriptors end up holding it


def _close_the_wire() -> None:
    """Close every descriptor of the stdout pipe: fd 1 and the private duplicate the
    SDK's stdio server writes the protocol to (it diverts fd 1 to stderr)."""
    fds = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    for fd in sorted(int(name) for name in os.listdir(fds)):
        try:
            info = os.fstat(fd)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == (_WIRE.st_dev, _WIRE.st_ino):
            os.close(fd)


if MODE == "exit3":
    os.write(2, CONFIG.encode())
    os._exit(3)
if MODE == "mute":
    sys.stdin.read()
    _sleep_forever()
if MODE == "close-stdout":
    _close_the_wire()
    os.write(2, b"closed stdout at start, sleeping\n")
    _sleep_forever()

# (imported after the quick modes, which must be quick)
from mcp.server.mcpserver import MCPServer  # noqa: E402

server = MCPServer("hostile")


@server.tool()
def echo(text: str) -> str:
    """Answer ``text``."""
    return text


@server.tool()
def close_stdout() -> str:
    """Close stdout and sleep, never answering; the process stays alive."""
    _close_the_wire()
    os.write(2, f"closed stdout mid-call (ignore_term={IGNORE_TERM}), sleeping\n".encode())
    _sleep_forever()
    return "unreachable"


def _close_while_idle(signum: int, frame: object) -> None:
    """SIGUSR1: say so on stderr first (so the line is written before the client can
    see the close and end the server), then close stdout and go on idling."""
    del signum, frame
    os.write(2, b"closing stdout while idle, then sleeping\n")
    _close_the_wire()


signal.signal(signal.SIGUSR1, _close_while_idle)


if __name__ == "__main__":
    server.run("stdio")
