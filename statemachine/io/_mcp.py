"""An asyncio tool provider for MCP servers over stdio, on the official ``mcp`` SDK.

Optional extra: ``pip install 'turnstate[mcp]'``. Use it with :func:`arun_turn`::

    async with MCPStdioTools("files", ["python", "files_server.py"]) as files:
        finish = await sm.arun_turn(turn, model=model, tools=files, context=context)

The SDK's own ``stdio_client`` reports a server that dies mid-call as a bare
"Connection closed": no exit code, no signal, no stderr. So this provider spawns the
process itself (:mod:`statemachine.io._procwatch`), hands its pipes to an SDK
``ClientSession`` and races every call against the process's exit and the end of its
pipes. A server that dies, or outlives its pipes (then it is ended: SIGTERM, then
SIGKILL), fails the calls in flight at once as ``process_crashed``, naming the exit
code or signal with a redacted tail of its stderr, and is recorded in
:attr:`MCPStdioTools.crashes`. The next call restarts it, at most ``max_restarts``
times over the provider's life; the engine's breaker counts the crashes. A call never
raises; ``start()``, ``async with`` and ``list_tools()`` raise :class:`MCPStartError`.
Every stderr tail and server error message goes through :func:`redact`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

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

from ..core._exceptions import ConfigError
from ..core._taxonomy import ToolErrorCategory
from ..core._tool_calls import ToolCall, ToolOutcome
from ._procwatch import ExitInfo, Watched, race, redact, spawn, wait_until

__all__ = ["ExitInfo", "MCPStartError", "MCPStdioTools", "redact"]

_INVALID_PARAMS = -32602
_METHOD_NOT_FOUND = -32601
_SAFE_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR")
_EXIT_GRACE_S = 0.5
"""How long a closed pipe may beat the reaping of a dying server (usually a hair)."""
_END_GRACE_S = 0.25
"""After SIGTERM, how long a server that lost its transport has before SIGKILL."""
_MAX_ERROR_CHARS = 4096
"""A server's error message is clipped to this before it is redacted and reported."""


class _Unset(enum.Enum):
    UNSET = enum.auto()


class MCPStartError(RuntimeError):
    """The MCP server could not be started: it died at start-up, closed its pipes,
    failed the handshake or did not finish it within ``initialize_timeout_s``, or its
    restart limit is reached (a tool call never raises this: it fails with an outcome).

    ``exit_code`` / ``signal`` say how the process ended (both ``None`` for a process
    that was stopped alive), ``stderr_tail`` is its redacted, bounded stderr tail,
    ``info`` the full :class:`ExitInfo`.
    """

    def __init__(self, server: str, info: ExitInfo, *, restart_limit: int | None = None) -> None:
        self.server = server
        self.info = info
        self.exit_code = info.exit_code
        self.signal = info.signal
        self.stderr_tail = info.stderr_tail
        self.restart_limit = restart_limit
        if restart_limit is None:
            text = f"MCP server {server!r} (pid {info.pid}) failed to start: {info.description}"
        else:
            text = (
                f"MCP server {server!r} is down and is not restarted (restart limit "
                f"reached: {restart_limit} restarts); last failure: {info.description}"
            )
        if info.stderr_tail:
            text += f"\nstderr tail:\n{info.stderr_tail}"
        super().__init__(text)


def _timeout(field: str, value: object) -> float | None:
    """A timeout setting: a finite number of seconds > 0, or ``None`` for none."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(
            f"{field}: must be a finite number of seconds > 0, or None for no timeout; "
            f"got {value!r}"
        )
    return float(value)


def _whole(field: str, value: object, least: int) -> int:
    """A count setting: an int >= ``least``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{field}: must be an int >= {least}, got {value!r}")
    return value


class _Connection:
    """One running server: the watched process and the SDK session on its pipes."""

    def __init__(self, watched: Watched) -> None:
        self.watched = watched
        self.session: ClientSession | None = None
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.exit_task: asyncio.Task[ExitInfo] | None = None
        self.transport_closed = asyncio.Event()
        """Set when the server's stdout ends (or breaks) or its stdin refuses a write."""
        self.transport_reason: str | None = None

    def lose(self, reason: str) -> None:
        """The transport is gone (``reason``: ``closed its stdout``...)."""
        if not self.transport_closed.is_set():
            self.transport_reason = reason
            self.transport_closed.set()

    @property
    def alive(self) -> bool:
        """The process runs and its pipes are open: a server that outlived its
        transport is as dead as one that exited."""
        return not self.watched.exited.is_set() and not self.transport_closed.is_set()

    def exited(self) -> asyncio.Future[Any]:
        """A future done when the process exits (cancel it)."""
        return asyncio.ensure_future(self.watched.exited.wait())

    def down(self) -> set[asyncio.Future[Any]]:
        """Futures done when the process exits or the transport closes (cancel them)."""
        return {self.exited(), asyncio.ensure_future(self.transport_closed.wait())}


class MCPStdioTools:
    """The tools of one MCP stdio server, as an ``AsyncToolProvider`` named ``name``.

    ``command`` is the server's argv. ``env`` is added to a minimal inherited
    environment (``PATH``, ``HOME``...; never the host's API keys). A call whose
    ``provider`` is not ``name`` fails ``not_found``. ``stderr_tail_bytes`` bounds
    the stderr kept for a crash report.

    Timeouts (each a finite number of seconds > 0, or ``None`` for none; anything
    else is a :class:`~statemachine.ConfigError` naming the field):
    ``call_timeout_s`` (default 60 s) bounds one ``tools/call`` (and
    ``list_tools``): a call that exceeds it fails ``timeout`` and the server, which
    did not crash, is kept and not counted; ``initialize_timeout_s`` (default 10 s)
    bounds the MCP handshake of each start: exceeding it stops the process and
    :meth:`start` raises :class:`MCPStartError` (a call fails
    ``execution_failed``). ``start_timeout_s`` is the old name of
    ``initialize_timeout_s``. The driver's ``tool_timeout_s`` still bounds a call
    from outside; the shorter one wins.
    """

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        max_restarts: int = 3,
        call_timeout_s: float | None = 60.0,
        initialize_timeout_s: float | None = 10.0,
        start_timeout_s: float | _Unset | None = _Unset.UNSET,
        stderr_tail_bytes: int = 2048,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name: must be a non-empty str, got {name!r}")
        if isinstance(command, str) or not command:
            raise ConfigError(f"command: must be a non-empty list of argv strings, got {command!r}")
        self.max_restarts = _whole("max_restarts", max_restarts, 0)
        self.stderr_tail_bytes = _whole("stderr_tail_bytes", stderr_tail_bytes, 1)
        self.name = name
        self.command = [str(part) for part in command]
        base = {k: os.environ[k] for k in _SAFE_ENV if k in os.environ}
        self.env = {**base, **(env or {})}
        self.cwd = cwd
        self.call_timeout_s = _timeout("call_timeout_s", call_timeout_s)
        """Bound of one tools/call (seconds, ``None``: none)."""
        self.initialize_timeout_s = _timeout("initialize_timeout_s", initialize_timeout_s)
        """Bound of the MCP handshake of each start (seconds, ``None``: none)."""
        if start_timeout_s is not _Unset.UNSET:
            self.initialize_timeout_s = _timeout("start_timeout_s", start_timeout_s)
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
        """Start the server; a server that cannot start raises :class:`MCPStartError`
        here (and the provider is closed)."""
        try:
            await self.start()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
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

    @property
    def start_timeout_s(self) -> float | None:
        """The old name of :attr:`initialize_timeout_s`."""
        return self.initialize_timeout_s

    async def start(self) -> None:
        """Start the server now rather than on the first call (a no-op while it runs);
        :class:`MCPStartError` when it cannot be started."""
        await self._started()

    async def _started(self) -> _Connection:
        starts = self.starts
        conn = await self._connection()
        if isinstance(conn, ExitInfo):
            limit = self.max_restarts if self.starts == starts else None
            raise MCPStartError(self.name, conn, restart_limit=limit)
        return conn

    async def list_tools(self) -> list[Any]:
        """The server's tools (``mcp.types.Tool``), e.g. to build the model's tool list.

        Raises :class:`MCPStartError` when the server cannot be started and
        ``TimeoutError`` after ``call_timeout_s``."""
        conn = await self._started()
        assert conn.session is not None  # noqa: S101 - set before the connection is published
        async with asyncio.timeout(self.call_timeout_s):
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
            return _failed(call, category, self._crash_text(call, conn), invoke_failed=True)
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
        done = await race({request, *conn.down()}, self.call_timeout_s)
        if request in done and not request.cancelled() and request.exception() is None:
            return _result_outcome(call, request.result())
        if not done and conn.alive:  # call_timeout_s ran out: the request was cancelled
            return _failed(
                call,
                ToolErrorCategory.TIMEOUT,
                f"tools/call {call.name!r} timed out after {self.call_timeout_s:g}s "
                "(call_timeout_s); the server is still running",
                invoke_failed=True,
            )
        # The call failed, the process died or its pipes closed first: a dead
        # process (or transport) is the cause.
        info = await self._crashed(conn, _connection_lost(request))
        if info is not None:
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
        try:  # (ready is cancelled unless set: the serve task must not set it any more)
            started = await race({ready, *conn.down()}, self.initialize_timeout_s)
        except BaseException:
            await self._stop(conn)
            raise
        if not started:
            await self._stop(conn)
            timeout = f"{self.initialize_timeout_s:g}s (initialize_timeout_s)"
            return self._start_failed(conn, f"did not start within {timeout}")
        if not ready.cancelled() and ready.exception() is None and conn.alive:
            self._conn = conn
            return conn
        error = ready.exception() if not ready.cancelled() else None  # (also: retrieved)
        info = await self._crashed(conn, True)  # a failed handshake: most often a dying process
        await self._stop(conn)
        return info or self._start_failed(conn, redact(f"MCP handshake failed: {error!r}"))

    async def _crashed(self, conn: _Connection, lost: bool) -> ExitInfo | None:
        """The crash behind a failure, if the process died or its pipes closed; after
        a failure that looks ``lost``, waited for a moment (the pipe's end can beat
        the process's exit flag)."""
        if lost and conn.alive:
            await race(conn.down(), _EXIT_GRACE_S)
        return None if conn.alive else await self._record_crash(conn)

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
        watched = conn.watched
        ended = not await wait_until(watched.exited, _EXIT_GRACE_S)  # (a pipe beats the reaping)
        if ended:  # alive without its transport: a dead server, ended by us
            await watched.terminate(_END_GRACE_S, stdin_first=False)
        info = await watched.exit_info()
        if ended:
            info = attrs.evolve(info, transport=conn.transport_reason or "stopped serving")
        self._last_exit = info
        self.crashes.append(info)
        conn.stop.set()
        return info

    async def _serve(self, conn: _Connection, ready: asyncio.Future[None]) -> None:
        """The connection's owner task: it enters and leaves the SDK session (anyio
        needs both in one task) and runs the pipe bridges until stop or death."""
        read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](16)
        write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](16)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(_pump_stdout, conn, read_send)
                group.start_soon(_pump_stdin, conn, write_recv)
                try:
                    async with ClientSession(read_recv, write_send) as session:
                        await session.initialize()
                        conn.session = session
                        if not ready.done():
                            ready.set_result(None)
                        await race({asyncio.ensure_future(conn.stop.wait()), conn.exited()})
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
    conn: _Connection, sink: MemoryObjectSendStream[SessionMessage | Exception]
) -> None:
    stdout = conn.watched.process.stdout
    async with sink:
        while stdout is not None:
            try:
                line = await stdout.readline()
            except (OSError, ValueError) as exc:  # a line beyond the limit, a broken pipe
                conn.lose(f"broke its stdout ({type(exc).__name__})")
                await sink.send(exc)
                return
            if not line:
                conn.lose("closed its stdout")
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


async def _pump_stdin(conn: _Connection, source: MemoryObjectReceiveStream[SessionMessage]) -> None:
    stdin = conn.watched.process.stdin
    async with source:
        async for item in source:
            if stdin is None:
                return
            data = item.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
            try:
                stdin.write(data.encode())
                await stdin.drain()
            except (OSError, RuntimeError):
                if not conn.stop.is_set():
                    conn.lose("closed its stdin")
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


def _failed(
    call: ToolCall, category: ToolErrorCategory, text: str, invoke_failed: bool = False
) -> ToolOutcome:
    return ToolOutcome(
        call.id, ok=False, content=text, category=category, invoke_failed=invoke_failed
    )


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
    """The outcome of a ``tools/call`` that got no result: a refusal of the call itself
    (bad arguments, no such tool) is the model's to fix; any other error, a timeout or
    a lost call is an invocation that failed, which the crash breaker counts."""
    if isinstance(exc, MCPError):
        message = redact(f"MCP error {exc.code}: {_clip(str(exc.message))}")
        if exc.code == _INVALID_PARAMS:
            return _failed(call, ToolErrorCategory.INVALID_ARGUMENTS, message)
        if exc.code == _METHOD_NOT_FOUND:
            return _failed(call, ToolErrorCategory.NOT_FOUND, message)
        return _failed(call, ToolErrorCategory.EXECUTION_FAILED, message, invoke_failed=True)
    if isinstance(exc, TimeoutError):
        text = f"tools/call {call.name!r} timed out"
        return _failed(call, ToolErrorCategory.TIMEOUT, text, invoke_failed=True)
    text = (
        f"{type(exc).__name__}: {_clip(str(exc))}" if exc is not None else "the call was abandoned"
    )
    return _failed(call, ToolErrorCategory.UNKNOWN, redact(text), invoke_failed=True)


def _clip(text: str) -> str:
    """A server-supplied message, at most ``_MAX_ERROR_CHARS`` (its head kept)."""
    if len(text) <= _MAX_ERROR_CHARS:
        return text
    return f"{text[:_MAX_ERROR_CHARS]}... [{len(text) - _MAX_ERROR_CHARS} more chars]"


def python_command(script: str, *args: str) -> list[str]:
    """``[sys.executable, script, *args]``: a server script run by this interpreter."""
    return [sys.executable, script, *args]
