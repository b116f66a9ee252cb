"""An asyncio tool provider for MCP servers over stdio, on the official ``mcp`` SDK.

Optional extra: ``pip install 'turnstate[mcp]'``. Use it with :func:`arun_turn`::

    async with MCPStdioTools("files", ["python", "files_server.py"]) as files:
        finish = await sm.arun_turn(turn, model=model, tools=files, context=context)

**A server that dies mid-call.** The SDK's own ``stdio_client`` owns the server
process and, when the process dies, fails the in-flight request with a generic
``MCPError(-32000, "Connection closed")``: no exit code, no signal, no stderr. This
provider spawns the process itself (``statemachine.io._procwatch``), hands its pipes
to an SDK ``ClientSession`` and races every call against the process's exit,
which the event loop reports the moment the child is reaped. A death fails the
in-flight calls at once as ``ToolOutcome(ok=False, category=process_crashed)``
whose content names the exit code or signal and carries a bounded, redacted tail
of the server's stderr; :attr:`MCPStdioTools.crashes` keeps the same facts as
:class:`~statemachine.io._procwatch.ExitInfo` values.

**Restarts.** The next call after a crash starts a fresh server, at most
``max_restarts`` times over the provider's life; after that, calls fail
``process_crashed`` at once ("restart limit reached") without spawning. The
engine's circuit breaker counts the crashes (``breaker_threshold`` in a row trip
it), so a server that keeps dying ends the session on the limit-reached path.

Other failures map to the tool taxonomy: a tool result with ``isError`` is
``execution_failed``; JSON-RPC ``-32602`` (invalid params) is
``invalid_arguments``; ``-32601`` (method not found) and a call for another
provider are ``not_found``; a server that exits while *starting* is
``process_crashed`` too, one that stays alive but fails the handshake (or does not
finish it within ``start_timeout_s``) is stopped and is ``execution_failed``; each
start counts against ``max_restarts``. Asyncio only (the SDK runs on anyio's asyncio backend).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

try:
    import anyio
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp import ClientSession
    from mcp import types as mcp_types
    from mcp.shared.exceptions import MCPError
    from mcp.shared.message import SessionMessage
except ImportError as exc:  # pragma: no cover - the extra is installed in CI
    raise ImportError(
        f"statemachine.mcp needs the official MCP SDK: pip install 'turnstate[mcp]' ({exc})"
    ) from exc

from ..core._taxonomy import ToolErrorCategory
from ..core._tool_calls import ToolCall, ToolOutcome
from ._procwatch import ExitInfo, Watched, redact, spawn

__all__ = ["ExitInfo", "MCPStdioTools", "redact"]

_INVALID_PARAMS = -32602
_METHOD_NOT_FOUND = -32601
_SAFE_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR")


class _Connection:
    """One running server: the watched process and the SDK session on its pipes."""

    def __init__(self, watched: Watched) -> None:
        self.watched = watched
        self.session: ClientSession | None = None
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.exit_info: ExitInfo | None = None
        self.exit_task: asyncio.Task[ExitInfo] | None = None

    @property
    def alive(self) -> bool:
        return not self.watched.exited.is_set()


class MCPStdioTools:
    """The tools of one MCP stdio server, as an ``AsyncToolProvider`` named ``name``.

    ``command`` is the server's argv. ``env`` is added to a minimal inherited
    environment (``PATH``, ``HOME``...; never the host's API keys). A call whose
    ``provider`` is not ``name`` fails ``not_found``. ``start_timeout_s`` bounds
    spawning plus the MCP handshake; ``stderr_tail_bytes`` bounds the stderr kept
    for a crash report.
    """

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        max_restarts: int = 3,
        start_timeout_s: float = 30.0,
        stderr_tail_bytes: int = 2048,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name: must be a non-empty str, got {name!r}")
        if isinstance(command, str) or not command:
            raise ValueError(f"command: must be a non-empty list of argv strings, got {command!r}")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts: must be an int >= 0, got {max_restarts!r}")
        self.name = name
        self.command = [str(part) for part in command]
        base = {k: os.environ[k] for k in _SAFE_ENV if k in os.environ}
        self.env = {**base, **(env or {})}
        self.cwd = cwd
        self.max_restarts = max_restarts
        self.start_timeout_s = start_timeout_s
        self.stderr_tail_bytes = stderr_tail_bytes
        self.starts = 0
        """How many server processes were spawned."""
        self.crashes: list[ExitInfo] = []
        """Every unexpected death of the server, in order."""
        self._conn: _Connection | None = None
        self._last_exit: ExitInfo | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------

    async def __aenter__(self) -> MCPStdioTools:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the server (stdin closed, SIGTERM, then SIGKILL) and its tasks."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._stop(conn)

    @property
    def pid(self) -> int | None:
        """The running server's pid, or ``None``."""
        conn = self._conn
        return conn.watched.pid if conn is not None and conn.alive else None

    async def start(self) -> None:
        """Start the server now rather than on the first call."""
        await self._connection()

    async def list_tools(self) -> list[Any]:
        """The server's tools (``mcp.types.Tool``), e.g. to build the model's tool list."""
        conn = await self._connection()
        if isinstance(conn, ExitInfo):
            raise RuntimeError(  # noqa: TRY004 - a down server, not a wrong type
                f"MCP server {self.name!r} is down: {conn.description}"
            )
        assert conn.session is not None  # noqa: S101 - set before the connection is published
        result = await conn.session.list_tools()
        return list(result.tools)

    # -- the provider protocol -------------------------------------------------------

    async def invoke(self, call: ToolCall) -> ToolOutcome:
        """Run ``call`` on the server; every failure is a failed outcome, never raised."""
        if call.provider != self.name:
            return _failed(
                call,
                ToolErrorCategory.NOT_FOUND,
                f"provider {call.provider!r} is not served here (this is {self.name!r})",
            )
        conn = await self._connection()
        if isinstance(conn, ExitInfo):
            category = (
                ToolErrorCategory.PROCESS_CRASHED
                if conn.died
                else ToolErrorCategory.EXECUTION_FAILED
            )
            return _failed(call, category, self._crash_text(call, conn))
        return await self._call(conn, call)

    async def _call(self, conn: _Connection, call: ToolCall) -> ToolOutcome:
        session = conn.session
        assert session is not None  # noqa: S101 - set before the connection is published
        arguments = call.arguments if isinstance(call.arguments, dict) else None
        if call.arguments is not None and arguments is None:
            return _failed(
                call,
                ToolErrorCategory.INVALID_ARGUMENTS,
                f"arguments must be a JSON object, got {call.arguments!r}",
            )
        request = asyncio.ensure_future(session.call_tool(call.name, arguments))
        death = asyncio.ensure_future(conn.watched.exited.wait())
        try:
            await asyncio.wait({request, death}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (request, death):
                if not task.done():
                    task.cancel()
            await asyncio.gather(request, death, return_exceptions=True)
        if request.done() and not request.cancelled() and request.exception() is None:
            return _result_outcome(call, request.result())
        # The call failed or the process died first: a dead process is the cause.
        if not conn.watched.exited.is_set() and _connection_lost(request):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):  # EOF can beat the reaping by a hair
                    await conn.watched.exited.wait()
        if conn.watched.exited.is_set():
            info = await self._record_crash(conn)
            return _failed(call, ToolErrorCategory.PROCESS_CRASHED, self._crash_text(call, info))
        exc = request.exception() if not request.cancelled() else None
        return _error_outcome(call, exc)

    # -- the connection ----------------------------------------------------------------

    async def _connection(self) -> _Connection | ExitInfo:
        async with self._lock:
            if self._closed:
                raise RuntimeError(f"MCP server {self.name!r}: the provider is closed")
            conn = self._conn
            if conn is not None and conn.alive:
                return conn
            if conn is not None:
                await self._record_crash(conn)
                await self._stop(conn)
            if self.starts > self.max_restarts and self._last_exit is not None:
                return self._last_exit
            return await self._launch()

    async def _launch(self) -> _Connection | ExitInfo:
        self.starts += 1
        watched = await spawn(
            self.command, env=self.env, cwd=self.cwd, tail_bytes=self.stderr_tail_bytes
        )
        conn = _Connection(watched)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        conn.task = asyncio.get_running_loop().create_task(self._serve(conn, ready))
        death: asyncio.Future[Any] = asyncio.ensure_future(watched.exited.wait())
        try:
            async with asyncio.timeout(self.start_timeout_s):
                await asyncio.wait({ready, death}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            await self._stop(conn)
            return self._start_failed(conn, f"did not start within {self.start_timeout_s:g}s")
        except BaseException:
            await self._stop(conn)
            raise
        finally:
            if not death.done():
                death.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await death
        if ready.done() and not ready.cancelled() and ready.exception() is None and conn.alive:
            self._conn = conn
            return conn
        if not ready.done():
            ready.cancel()
        if conn.alive:  # a failed handshake: most often the process is dying
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):  # EOF can beat the reaping by a hair
                    await watched.exited.wait()
        if not conn.alive:
            info = await self._record_crash(conn)
            await self._stop(conn)
            return info
        error = ready.exception() if not ready.cancelled() else None
        await self._stop(conn)
        return self._start_failed(conn, redact(f"MCP handshake failed: {error!r}"))

    def _start_failed(self, conn: _Connection, reason: str) -> ExitInfo:
        self._last_exit = ExitInfo(conn.watched.pid, None, None, conn.watched.stderr_tail(), reason)
        return self._last_exit

    async def _record_crash(self, conn: _Connection) -> ExitInfo:
        if self._conn is conn:
            self._conn = None
        if conn.exit_task is None:  # once per connection, however many calls were in flight
            conn.exit_task = asyncio.ensure_future(self._read_exit(conn))
        return await asyncio.shield(conn.exit_task)

    async def _read_exit(self, conn: _Connection) -> ExitInfo:
        info = await conn.watched.exit_info()
        conn.exit_info = info
        self._last_exit = info
        self.crashes.append(info)
        conn.stop.set()
        return info

    async def _serve(self, conn: _Connection, ready: asyncio.Future[None]) -> None:
        """The connection's owner task: it enters and leaves the SDK session (anyio
        needs both in one task) and runs the pipe bridges until stop or death."""
        watched = conn.watched
        read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](16)
        write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](16)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(_pump_stdout, watched, read_send)
                group.start_soon(_pump_stdin, watched, write_recv)
                try:
                    async with ClientSession(read_recv, write_send) as session:
                        await session.initialize()
                        conn.session = session
                        if not ready.done():
                            ready.set_result(None)
                        stop = asyncio.ensure_future(conn.stop.wait())
                        died = asyncio.ensure_future(watched.exited.wait())
                        try:
                            await asyncio.wait({stop, died}, return_when=asyncio.FIRST_COMPLETED)
                        finally:
                            for task in (stop, died):
                                task.cancel()
                finally:
                    group.cancel_scope.cancel()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
        finally:
            for stream in (read_send, read_recv, write_send, write_recv):
                stream.close()

    async def _stop(self, conn: _Connection) -> None:
        conn.stop.set()
        await conn.watched.terminate()
        task = conn.task
        if task is not None and not task.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await asyncio.gather(task, return_exceptions=True)
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _crash_text(self, call: ToolCall, info: ExitInfo) -> str:
        restarts = max(0, self.starts - 1)
        if self.starts > self.max_restarts and self._conn is None:
            tail_note = f"; restart limit reached ({self.max_restarts} restarts)"
        else:
            tail_note = f"; restarted {restarts} time(s) so far"
        text = (
            f"MCP server {self.name!r} (pid {info.pid}) {info.description} during "
            f"tools/call {call.name!r}{tail_note}."
        )
        if info.stderr_tail:
            text += f"\nstderr tail:\n{info.stderr_tail}"
        return text


# -- pipes -----------------------------------------------------------------------------


async def _pump_stdout(
    watched: Watched, sink: MemoryObjectSendStream[SessionMessage | Exception]
) -> None:
    stdout = watched.process.stdout
    async with sink:
        while stdout is not None:
            try:
                line = await stdout.readline()
            except (OSError, ValueError) as exc:  # a line beyond the limit, a broken pipe
                await sink.send(exc)
                return
            if not line:
                return
            if not line.strip():
                continue
            try:
                message = _parse_message(line)
            except ValueError as exc:
                await sink.send(exc)
                continue
            await sink.send(SessionMessage(message))


def _parse_message(line: bytes) -> Any:
    """One JSON-RPC message off a stdout line (mcp 2.x adapter; 1.x root model)."""
    adapter = getattr(mcp_types, "jsonrpc_message_adapter", None)
    if adapter is not None:
        return adapter.validate_json(line, by_name=False)
    root: Any = mcp_types.JSONRPCMessage  # pragma: no cover - mcp 1.x: a pydantic root model
    return root.model_validate_json(line)  # pragma: no cover


async def _pump_stdin(watched: Watched, source: MemoryObjectReceiveStream[SessionMessage]) -> None:
    stdin = watched.process.stdin
    async with source:
        async for item in source:
            if stdin is None:
                return
            data = item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
            try:
                stdin.write(data.encode())
                await stdin.drain()
            except (OSError, RuntimeError):
                return


# -- outcomes ----------------------------------------------------------------------------


def _connection_lost(request: asyncio.Future[Any]) -> bool:
    """Whether the call failed the way a vanished peer makes it fail."""
    if request.cancelled():
        return True
    return _lost(request.exception())


def _lost(exc: BaseException | None) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_lost(inner) for inner in exc.exceptions)
    return isinstance(exc, MCPError | OSError | EOFError | anyio.BrokenResourceError) or (
        exc is not None and "closed" in str(exc).lower()
    )


def _failed(call: ToolCall, category: ToolErrorCategory, text: str) -> ToolOutcome:
    return ToolOutcome(call.id, ok=False, content=text, category=category)


def _content_text(result: Any) -> str:
    parts = []
    for block in getattr(result, "content", None) or ():
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else repr(block))
    return "\n".join(parts)


def _result_outcome(call: ToolCall, result: Any) -> ToolOutcome:
    text = _content_text(result)
    if getattr(result, "is_error", False):
        return _failed(call, ToolErrorCategory.EXECUTION_FAILED, text)
    structured = getattr(result, "structured_content", None)
    return ToolOutcome(call.id, ok=True, content=text if structured is None else structured)


def _error_outcome(call: ToolCall, exc: BaseException | None) -> ToolOutcome:
    if isinstance(exc, MCPError):
        if exc.code == _INVALID_PARAMS:
            category = ToolErrorCategory.INVALID_ARGUMENTS
        elif exc.code == _METHOD_NOT_FOUND:
            category = ToolErrorCategory.NOT_FOUND
        else:
            category = ToolErrorCategory.EXECUTION_FAILED
        return _failed(call, category, redact(f"MCP error {exc.code}: {exc.message}"))
    if isinstance(exc, TimeoutError):
        return _failed(call, ToolErrorCategory.TIMEOUT, f"tools/call {call.name!r} timed out")
    text = f"{type(exc).__name__}: {exc}" if exc is not None else "the call was abandoned"
    return _failed(call, ToolErrorCategory.UNKNOWN, redact(text))


def python_command(script: str, *args: str) -> list[str]:
    """``[sys.executable, script, *args]``: a server script run by this interpreter."""
    return [sys.executable, script, *args]
