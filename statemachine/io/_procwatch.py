"""Watching a child process die: exit status, signal, a redacted stderr tail.

``spawn()`` starts a child with three pipes on the running asyncio loop and
returns a :class:`Watched` whose ``exited`` event is set by the loop's
``process_exited`` callback, i.e. as soon as the child watcher reaps the child.
That is the direct signal of death: it does not wait for the pipes to close
(``asyncio.subprocess.Process.wait()`` does, and a grandchild holding a pipe would
make a dead server look alive). stderr is read continuously into a bounded ring,
so a chatty child never blocks on a full pipe and the last bytes before its
death are at hand.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

_REDACTIONS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 [REDACTED]"),
    (
        re.compile(
            r"(?i)\b([A-Za-z0-9_-]*(?:api[_-]?key|token|secret|password|passwd|credential)"
            r"[A-Za-z0-9_-]*)(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|\S+)"
        ),
        r"\1\2[REDACTED]",
    ),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{12,}"), "[REDACTED]"),
    (re.compile(r"\b(?:gh[pousr]|github_pat)_[A-Za-z0-9_]{16,}"), "[REDACTED]"),
    (re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"), "[REDACTED]"),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), "[REDACTED]"),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+"), "[REDACTED]"),
)


def redact(text: str) -> str:
    """Replace what looks like a credential (API keys, bearer tokens, JWTs,
    ``password=...``) with ``[REDACTED]``."""
    for pattern, replacement in _REDACTIONS:
        text = pattern.sub(replacement, text)
    return text


@attrs.frozen
class ExitInfo:
    """How a child process ended: ``exit_code`` for a normal exit, ``signal`` for a
    death by signal, and the redacted, bounded tail of its stderr; ``reason`` when
    it did not die but never became usable (and was stopped)."""

    pid: int
    exit_code: int | None
    signal: int | None
    stderr_tail: str
    reason: str | None = None
    """Why a process that did not die is unusable (it never finished starting)."""

    @property
    def died(self) -> bool:
        """Whether the process died (rather than failed to start and was stopped)."""
        return self.reason is None

    @property
    def description(self) -> str:
        """``exited with code 3`` / ``killed by signal SIGKILL (9)`` / the reason."""
        if self.reason is not None:
            return self.reason
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = "signal"
            return f"killed by signal {name} ({self.signal})"
        return f"exited with code {self.exit_code}"


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """The stock stream protocol, plus an event set the moment the child is reaped."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        self.exited.set()
        super().process_exited()


class Watched:
    """A spawned child: its pipes, its ``exited`` event and its stderr ring."""

    def __init__(
        self, process: asyncio.subprocess.Process, protocol: _Protocol, tail_bytes: int
    ) -> None:
        self.process = process
        self.exited = protocol.exited
        self._tail_bytes = tail_bytes
        self._ring: collections.deque[bytes] = collections.deque()
        self._ring_size = 0
        self._stderr_done = asyncio.Event()
        self._stderr_task = asyncio.get_running_loop().create_task(self._read_stderr())

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def _read_stderr(self) -> None:
        stream = self.process.stderr
        try:
            while stream is not None:
                chunk = await stream.read(65536)
                if not chunk:
                    break
                self._ring.append(chunk)
                self._ring_size += len(chunk)
                while self._ring_size - len(self._ring[0]) >= self._tail_bytes:
                    self._ring_size -= len(self._ring.popleft())
        except (OSError, ValueError):  # pragma: no cover - a broken pipe ends the tail
            pass
        finally:
            self._stderr_done.set()

    def stderr_tail(self, max_lines: int = 20) -> str:
        """The last bytes of stderr (at most ``tail_bytes``, ``max_lines`` lines), redacted."""
        raw = b"".join(self._ring)[-self._tail_bytes :]
        text = raw.decode("utf-8", errors="replace")
        lines = text.splitlines()
        if len(raw) >= self._tail_bytes and lines:
            lines = lines[1:]  # the first line was cut mid-way
        return redact("\n".join(lines[-max_lines:]))

    async def exit_info(self, exit_grace_s: float = 0.5, stderr_grace_s: float = 0.05) -> ExitInfo:
        """The exit status and stderr tail of a child that has exited (or is exiting).

        Waits at most ``exit_grace_s`` for the child to be reaped and
        ``stderr_grace_s`` for stderr to reach its end (a grandchild may hold it
        open), so the answer is prompt whatever the child left behind.
        """
        if not self.exited.is_set():  # a closed pipe can beat the reaping by a hair
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(exit_grace_s):
                    await self.exited.wait()
        if not self._stderr_done.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(stderr_grace_s):
                    await self._stderr_done.wait()
        code = self.returncode
        return ExitInfo(
            pid=self.pid,
            exit_code=code if code is None or code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
            stderr_tail=self.stderr_tail(),
        )

    async def terminate(self, grace_s: float = 0.5) -> None:
        """Stop the child (its process group) as the MCP spec asks: close its stdin,
        then SIGTERM, then SIGKILL, waiting up to ``grace_s`` after each step."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                self.process.stdin.close()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if self.exited.is_set():
                break
            if sig is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, sig)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await self.exited.wait()
        await self.close()

    async def close(self) -> None:
        """Release the stderr reader and the transport (after the child exited)."""
        self._stderr_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._stderr_task
        transport: Any = getattr(self.process, "_transport", None)
        if transport is not None:
            transport.close()


async def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    tail_bytes: int = 4096,
) -> Watched:
    """Start ``argv`` with stdin/stdout/stderr pipes in a new process group."""
    if not argv:
        raise ValueError("command: must name a program to run, got an empty command")
    loop = asyncio.get_running_loop()
    limit = 2**24  # one JSON-RPC line may be large

    def factory() -> _Protocol:
        return _Protocol(limit, loop)

    transport, protocol = await loop.subprocess_exec(
        factory,
        *argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        start_new_session=True,
    )
    process = asyncio.subprocess.Process(transport, protocol, loop)
    return Watched(process, protocol, tail_bytes)
