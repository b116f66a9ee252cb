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

_MASK = "[REDACTED]"

# -- what a credential's key is called ---------------------------------------------------

_SECRET_NAMES = frozenset(
    {
        "api_key", "apikey", "x_api_key", "access_key", "secret_key", "private_key",
        "token", "access_token", "refresh_token", "id_token", "auth_token", "bearer_token",
        "session_token", "secret", "client_secret", "password", "passwd", "pwd",
        "passphrase", "authorization", "proxy_authorization", "auth", "credential",
        "credentials", "cookie", "set_cookie",
    }
)  # fmt: skip
_SECRET_SUFFIXES = (
    "_key", "_apikey", "_token", "_secret", "_password", "_passwd", "_pwd", "_pass",
    "_passphrase", "_credential", "_credentials",
)  # fmt: skip
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def _secret_name(name: str) -> bool:
    """Whether a key called ``name`` holds a credential: ``api_key``, ``apiKey``,
    ``X-Api-Key``, ``--client-secret``, ``db.password``, ``OPENAI_API_KEY``...; not
    ``max_tokens``, ``token_type``, ``author`` or a bare ``key``."""
    last = name.lstrip("-").rsplit(".", 1)[-1]
    normal = _CAMEL.sub("_", last).lower().replace("-", "_")
    return normal in _SECRET_NAMES or normal.endswith(_SECRET_SUFFIXES)


# -- the shapes a key and its value are written in ---------------------------------------

_NAME = r"-{0,2}[A-Za-z_][A-Za-z0-9_.\-]{0,63}"
_DQ = r'"(?:[^"\\\n]|\\.)*"'
_SQ = r"'(?:[^'\\\n]|\\.)*'"
_ESC_DQ = r'\\"[^"\\\n]*\\"'  # JSON inside a JSON string: {\"token\": \"...\"}
_STR = rf"(?:[bBrRuU]{{0,2}}(?:{_DQ}|{_SQ}))"
_BARE = r"[^\s,;{}\[\]()\"'<>]+"  # up to the next separator
_SCHEMES = r"(?:Bearer|Basic|Token|Digest|Negotiate|ApiKey)"
_UNQUOTED = r"(?:\S*[^\s,;)\]}]|\S+)"  # up to whitespace, less trailing punctuation

# Each shape is a key pattern (a name and its separator) and the pattern of the value
# that follows it; the value is read only after a secret's name (see _mask_keyed).
_KEYED: tuple[tuple[re.Pattern[str], re.Pattern[str]], ...] = (
    (  # "api_key": "..." / 'password': '...' / "password": 1234 / {\"token\": \"...\"}
        re.compile(rf"""(?P<open>\\?["'])(?P<name>{_NAME})(?P=open)[ \t]*(?:=>|[:=])[ \t]*"""),
        re.compile(rf"{_ESC_DQ}|{_STR}|(?i:{_SCHEMES})[ \t]+{_BARE}|{_BARE}"),
    ),
    (  # a YAML or header line (password: two words  # comment / Authorization: Bearer x)
        re.compile(rf"(?m)^[ \t]*(?:-[ \t]+)?(?P<name>{_NAME})[ \t]*:(?:[ \t]+|$)"),
        re.compile(r"[^\n]*?(?=[ \t]+#|[ \t]*$)", re.MULTILINE),  # the rest of the line
    ),
    (  # API_KEY=... / export TOKEN=... / passwd=..., / password: ... / --api-key=...
        re.compile(rf"(?<![A-Za-z0-9_.\-])(?P<name>{_NAME})[ \t]*(?:=>|[:=])[ \t]*"),
        re.compile(rf"{_STR}|(?:(?i:{_SCHEMES})[ \t]+)?{_UNQUOTED}"),
    ),
    (  # --api-key sk-... (a command-line flag and its value)
        re.compile(r"(?<!\S)(?P<name>--?[A-Za-z][A-Za-z0-9_\-]{0,63})[ \t]+(?!-)"),
        re.compile(rf"{_STR}|{_UNQUOTED}"),
    ),
)
# scheme://user:password@host
_URL_PASSWORD = re.compile(
    r"(?P<pre>\b[A-Za-z][A-Za-z0-9+.\-]{0,31}://[^\s:/@]{0,256}:)[^\s@/]{1,256}(?=@)"
)
# a credential after its scheme word, wherever it is; it must look random (a digit,
# a symbol or a lower-upper case change), so "Basic Authentication" is prose
_SCHEME_CREDENTIAL = re.compile(
    r"\b(?P<scheme>Bearer|Basic|bearer|basic|BEARER|BASIC)(?P<sep>\s+)"
    r"(?=[A-Za-z0-9._~+/=-]*(?:[0-9+/=_.~]|[a-z][A-Z]))[A-Za-z0-9._~+/-]{8,}=*"
)
_TOKEN_SHAPES = re.compile(
    r"\bsk-[A-Za-z0-9_-]{12,}"  # OpenAI, Anthropic (sk-ant-...)
    r"|\b[rs]k_(?:live|test)_[A-Za-z0-9]{10,}"  # Stripe
    r"|\b(?:gh[pousr]|github_pat)_[A-Za-z0-9_]{16,}"  # GitHub
    r"|\bglpat-[A-Za-z0-9_-]{16,}"  # GitLab
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"  # AWS access key IDs
    r"|\bAIza[0-9A-Za-z_-]{30,}"  # Google API keys
    r"|\bhf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|\bnpm_[A-Za-z0-9]{30,}"  # npm
    r"|(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+"  # JWTs
)
_PRIVATE_KEY = re.compile(
    r"(?P<begin>-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----)[\s\S]*?"
    r"(?P<end>-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)"
)
_EMPTY = frozenset({"", '""', "''", "null", "none", "nil", "true", "false", "~"})
_LEADING_SCHEME = re.compile(rf"(?i)^(?P<scheme>{_SCHEMES}[ \t]+)\S")


def _mask(value: str) -> str:
    """``value`` with its secret part replaced: inside its quotes (a string prefix and
    escaped quotes kept), after a leading ``Bearer``/``Basic``/... scheme word; an
    empty, null or boolean value, or one already masked, is left as it is."""
    if value.strip().lower() in _EMPTY:
        return value
    quote = next((i for i, ch in enumerate(value[:3]) if ch in "\"'"), -1)
    if (
        quote >= 0
        and value[:quote].lower() in ("", "\\", "b", "r", "u", "br", "rb")
        and len(value) > quote + 1
        and value.endswith(value[quote])
    ):
        opener = value[: quote + 1]
        closer = "\\" + value[quote] if opener.endswith('\\"') else value[quote]
        inner = value[len(opener) : len(value) - len(closer)]
        return opener + _mask_bare(inner) + closer if inner else value
    return _mask_bare(value)


def _mask_bare(value: str) -> str:
    scheme = _LEADING_SCHEME.match(value)
    prefix = scheme.group("scheme") if scheme else ""
    rest = value[len(prefix) :]
    if rest.strip().lower() in _EMPTY or rest.startswith(_MASK[:-1]):
        return value
    return prefix + _MASK


def _mask_keyed(key: re.Pattern[str], value: re.Pattern[str], text: str) -> str:
    """Mask the value after every ``key`` match that names a secret. The value is
    matched only then, and a match with another name consumes only itself, so a
    secret keyed inside another value (``https://h/?api_key=...``,
    ``user=bob,password=...``) is still found and the scan stays linear."""
    pieces: list[str] = []
    pos = 0
    while (match := key.search(text, pos)) is not None:
        pieces.append(text[pos : match.end()])
        pos = match.end()
        if _secret_name(match.group("name")):
            found = value.match(text, pos)
            if found is not None and found.end() > pos:
                pieces.append(_mask(found.group()))
                pos = found.end()
    pieces.append(text[pos:])
    return "".join(pieces)


def redact(text: str) -> str:
    """``text`` with what looks like a credential replaced by ``[REDACTED]``.

    The key names and everything around a secret stay; only the value goes. Values
    are found by their key (``api_key``, ``apikey``, ``token``, ``access_token``,
    ``refresh_token``, ``secret``, ``client_secret``, ``password``, ``passwd``,
    ``authorization``, ``auth``, ``cookie``, any name ending ``_key``, ``_token``,
    ``_secret`` or ``_password``, in snake, kebab or camel case) in JSON and Python
    dicts (``{"api_key": "..."}``, ``{'password': '...'}``, escaped JSON too), YAML
    and header lines (``password: x``, ``Authorization: Bearer x``), env and
    ``key=value`` text (``API_KEY=x``, ``export TOKEN=x``), command-line flags
    (``--api-key x``) and URL user info (``scheme://user:pass@host``); and by their
    shape: ``Bearer``/``Basic`` credentials, OpenAI/Anthropic ``sk-...``, Stripe,
    GitHub ``ghp_...``, GitLab, Slack ``xox[abprs]-...``, AWS ``AKIA...``, Google
    ``AIza...``, Hugging Face and npm tokens, JWTs and PEM private-key blocks. Empty,
    ``null`` and boolean values are left as they are.
    """
    text = _PRIVATE_KEY.sub(rf"\g<begin>\n{_MASK}\n\g<end>", text)
    for key, value in _KEYED:
        text = _mask_keyed(key, value, text)
    text = _URL_PASSWORD.sub(rf"\g<pre>{_MASK}", text)
    text = _SCHEME_CREDENTIAL.sub(rf"\g<scheme>\g<sep>{_MASK}", text)
    return _TOKEN_SHAPES.sub(_MASK, text)


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
    transport: str | None = None
    """Set when the process outlived its pipes (``closed its stdout``...): a dead
    server that was then ended, so ``exit_code``/``signal`` are of that ending."""

    @property
    def died(self) -> bool:
        """Whether the process died, or lost its transport and was ended (rather than
        failed to start and was stopped)."""
        return self.reason is None

    @property
    def description(self) -> str:
        """``exited with code 3`` / ``killed by signal SIGKILL (9)`` / the reason; for
        a lost transport, ``closed its stdout while running (transport closed) and
        was ended: killed by signal SIGTERM (15)``."""
        if self.reason is not None:
            return self.reason
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = "signal"
            ending = f"killed by signal {name} ({self.signal})"
        else:
            ending = f"exited with code {self.exit_code}"
        if self.transport is not None:
            return f"{self.transport} while running (transport closed) and was ended: {ending}"
        return ending


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
        await wait_until(self.exited, exit_grace_s)  # a closed pipe can beat the reaping
        await wait_until(self._stderr_done, stderr_grace_s)
        code = self.process.returncode
        return ExitInfo(
            pid=self.pid,
            exit_code=code if code is None or code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
            stderr_tail=self.stderr_tail(),
        )

    async def terminate(self, grace_s: float = 0.5, *, stdin_first: bool = True) -> None:
        """Stop the child (its process group) as the MCP spec asks: close its stdin,
        then SIGTERM, then SIGKILL, waiting up to ``grace_s`` after each step
        (``stdin_first=False``: no wait after closing stdin, for a child that is
        known not to be listening)."""
        if self.process.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                self.process.stdin.close()
        steps = (
            (None, signal.SIGTERM, signal.SIGKILL)
            if stdin_first
            else (signal.SIGTERM, signal.SIGKILL)
        )
        for sig in steps:
            if self.exited.is_set():
                break
            if sig is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, sig)
            await wait_until(self.exited, grace_s)
        await self.close()

    async def close(self) -> None:
        """Release the stderr reader and the transport (after the child exited)."""
        self._stderr_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._stderr_task
        transport: Any = getattr(self.process, "_transport", None)
        if transport is not None:
            transport.close()


async def wait_until(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait at most ``timeout_s`` for ``event``; whether it is set."""
    if not event.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await event.wait()
    return event.is_set()


async def race(futures: set[asyncio.Future[Any]], timeout_s: float | None = None) -> set[Any]:
    """Wait for the first of ``futures`` to be done (at most ``timeout_s``), then cancel
    the others and wait for them to end: the ones done first (none: time ran out)."""
    try:
        done, _ = await asyncio.wait(
            futures, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        for future in futures:
            if not future.done():
                future.cancel()
        await asyncio.gather(*futures, return_exceptions=True)
    return done


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
    transport, protocol = await loop.subprocess_exec(
        lambda: _Protocol(2**24, loop),  # a limit of 16 MiB: one JSON-RPC line may be large
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
