"""A loopback model vendor: ``python -m statemachine vendor``.

:class:`LoopbackVendor` is a threaded ``http.server`` on 127.0.0.1 that answers
``POST /v1/messages`` (Anthropic Messages) and ``POST /v1/chat/completions`` (OpenAI
Chat Completions) from a script: a queue of canned responses per path, each replayed
once, in order (an exhausted script answers 418, or starts over with ``repeat``). The
official SDKs talk to it once their base URL points at it, so an example runs offline
as written. Every request is recorded.

A script file is TOML (``docs/drivers.md``; :data:`DEFAULT_SCRIPT` is the built-in
one): an ``[[anthropic]]`` and an ``[[openai]]`` array of tables, one per response,
whose keys :data:`_KEYS` checks.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import threading
import tomllib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .. import ConfigError
from ..core._json_data import json_problem

ANTHROPIC = "/v1/messages"
OPENAI = "/v1/chat/completions"
VENDORS = {"anthropic": ANTHROPIC, "openai": OPENAI}
"""A script's table name -> the path its responses answer."""

DEFAULT_SCRIPT = """\
# Each [[anthropic]] / [[openai]] table answers one request, in order; the list starts
# over when it is used up, so every run of an example sees the same story.

[[anthropic]]
status = 429                # rate limited: the engine waits out the retry-after
retry_after = 1
[[anthropic]]
status = 529                # overloaded: the engine backs off and retries
[[anthropic]]
text = "Let me look that up."
tool = "get_weather"        # the model asks for a tool
arguments = { city = "Paris" }
[[anthropic]]
text = "It is sunny in Paris, 21 °C."

[[openai]]
status = 429
retry_after = 1
[[openai]]
status = 503                # OpenAI's overloaded
[[openai]]
tool = "get_weather"
arguments = { city = "Paris" }
[[openai]]
text = "It is sunny in Paris, 21 °C."
"""


@dataclass(frozen=True)
class Canned:
    """One scripted response: status, headers and a body (JSON data or raw bytes)."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    cut: bool = False
    """Announce more bytes than are sent, then close: a connection lost mid-body."""
    stream: Canned | None = None
    """What a request that asks to stream (``"stream": true``) gets instead, if given."""


@dataclass(frozen=True)
class Seen:
    """One request the server received."""

    path: str
    headers: dict[str, str]
    body: Any


class LoopbackVendor:
    """The server; use as a context manager. ``url`` is its base URL.

    ``port`` 0 picks a free one; ``repeat`` restarts a used-up script; ``log`` (if
    given) receives one line per request answered.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        repeat: bool = False,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.scripts: dict[str, deque[Canned]] = {ANTHROPIC: deque(), OPENAI: deque()}
        self.seen: list[Seen] = []
        self.repeat = repeat
        self._played: dict[str, list[Canned]] = {ANTHROPIC: [], OPENAI: []}
        self._lock = threading.Lock()
        self._log = log
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: the Anthropic SDK's base URL (OpenAI's adds ``/v1``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, path: str, *responses: Canned) -> None:
        """Queue ``responses`` for ``path``."""
        with self._lock:
            self.scripts[path].extend(responses)

    def count(self, path: str) -> int:
        """How many requests ``path`` received."""
        return len(self.requests(path))

    def requests(self, path: str) -> list[Seen]:
        """The requests ``path`` received, in order."""
        with self._lock:
            return [seen for seen in self.seen if seen.path == path]

    def answer(self, path: str, headers: dict[str, str], body: Any) -> Canned:
        """Record a request and take its response off the script (the handler's call)."""
        with self._lock:
            self.seen.append(Seen(path, headers, body))
            script = self.scripts.get(path)
            if script is not None and not script and self.repeat:
                script.extend(self._played[path])
                self._played[path].clear()
            canned = script.popleft() if script else None
            if canned is not None:
                self._played[path].append(canned)
        if canned is None:
            canned = Canned(418, {"error": {"message": f"script exhausted for {path}"}})
        served = _served(canned, body)
        if self._log is not None:
            retry_after = canned.headers.get("retry-after")
            self._log(
                f"POST {path} -> {canned.status}"
                + (f" (retry-after: {retry_after})" if retry_after else "")
                + (" streamed" if served is not canned else "")
                + _summary(canned)
            )
        return served

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted."""
        self._server.serve_forever(poll_interval=0.1)

    def close(self) -> None:
        """Close the listening socket."""
        self._server.server_close()

    def __enter__(self) -> LoopbackVendor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _served(canned: Canned, body: Any) -> Canned:
    """``canned``, or its stream when the request ``body`` asks to stream."""
    if canned.stream is not None and isinstance(body, dict) and body.get("stream") is True:
        return canned.stream
    return canned


def _summary(canned: Canned) -> str:
    """What a log line says of a reply: its tool calls."""
    body = canned.body
    if canned.status != 200 or not isinstance(body, Mapping):
        return ""
    names = [b.get("name") for b in body.get("content") or () if b.get("type") == "tool_use"]
    for choice in body.get("choices") or ():
        calls = choice.get("message", {}).get("tool_calls") or ()
        names += [call["function"]["name"] for call in calls]
    return f" tool call: {', '.join(map(str, names))}" if names else ""


def _handler(owner: LoopbackVendor) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw
            canned = owner.answer(self.path.split("?")[0], dict(self.headers.items()), body)
            payload = (
                canned.body
                if isinstance(canned.body, bytes)
                else json.dumps(canned.body, allow_nan=False).encode()
            )
            self.send_response(canned.status)
            self.send_header("content-type", canned.content_type)
            self.send_header("content-length", str(len(payload) + (4096 if canned.cut else 0)))
            if canned.cut:
                self.close_connection = True
            for name, value in canned.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the vendor's own ``log`` says what was answered."""

    return Handler


# -- Anthropic Messages wire format ---------------------------------------------------


def anthropic_error(status: int, etype: str, message: str, **headers: str) -> Canned:
    """An Anthropic error response (``etype``: ``rate_limit_error``, ``overloaded_error``...)."""
    return Canned(
        status,
        {"type": "error", "error": {"type": etype, "message": message}},
        {k.replace("_", "-"): v for k, v in headers.items()},
    )


def anthropic_message(
    text: str = "done",
    *,
    tool_uses: tuple[tuple[str, str, Any], ...] = (),
    stop_reason: str | None = None,
    tokens: tuple[int, int] = (10, 5),
) -> Canned:
    """An Anthropic message: ``text``, then a ``tool_use`` block per ``(id, name, input)``."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    content += [
        {"type": "tool_use", "id": call_id, "name": name, "input": args}
        for call_id, name, args in tool_uses
    ]
    return Canned(
        200,
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": content,
            "stop_reason": stop_reason or ("tool_use" if tool_uses else "end_turn"),
            "stop_sequence": None,
            "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]},
        },
    )


def anthropic_stream(*events: tuple[str, dict[str, Any]], cut: bool = False) -> Canned:
    """A server-sent-events reply with HTTP 200: ``(event name, data)`` pairs; with
    ``cut`` the connection drops after them."""
    text = "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events)
    return Canned(200, text.encode(), content_type="text/event-stream", cut=cut)


def anthropic_streamed(reply: Canned, usage: str = "cumulative") -> Canned:
    """``reply`` (an :func:`anthropic_message`) as the stream of events that answers a
    request asking to stream: each text block in pieces of a word, each tool use in one
    ``input_json_delta``, the usage in shape ``usage`` (:data:`STREAM_USAGES`; ``delta``
    is not one of Anthropic's: ``ValueError``)."""
    if usage not in ANTHROPIC_STREAM_USAGES:
        raise ValueError(
            f"usage: {usage!r} is not a shape of Anthropic's stream; "
            f"expected one of {ANTHROPIC_STREAM_USAGES}"
        )
    body = reply.body
    tokens_in, tokens_out = body["usage"]["input_tokens"], body["usage"]["output_tokens"]
    started = (0, 0) if usage == "final" else (tokens_in, min(1, tokens_out))
    message = {
        **body,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": started[0], "output_tokens": started[1]},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": message})
    ]
    for index, block in enumerate(body["content"]):
        opened: dict[str, Any]
        if block["type"] == "text":
            opened = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in _pieces(block["text"])]
        else:
            opened = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opened},
            )
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            for delta in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    ended = {"stop_reason": body["stop_reason"], "stop_sequence": None}
    totals = {"input_tokens": tokens_in, "output_tokens": tokens_out}
    events.append(("message_delta", {"type": "message_delta", "delta": ended, "usage": totals}))
    events.append(("message_stop", {"type": "message_stop"}))
    return anthropic_stream(*events)


# -- OpenAI Chat Completions wire format ----------------------------------------------


def openai_error(
    status: int, message: str, etype: str, code: str | None = None, **headers: str
) -> Canned:
    """An OpenAI error response."""
    return Canned(
        status,
        {"error": {"message": message, "type": etype, "param": None, "code": code}},
        {k.replace("_", "-"): v for k, v in headers.items()},
    )


def openai_completion(
    text: str | None = "done",
    *,
    tool_calls: tuple[tuple[str, str, Any], ...] = (),
    finish_reason: str | None = None,
    tokens: tuple[int, int] = (10, 5),
) -> Canned:
    """An OpenAI chat completion: ``text`` and a tool call per ``(id, name, arguments)``."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, allow_nan=False)},
            }
            for call_id, name, args in tool_calls
        ]
    return Canned(
        200,
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-test",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": tokens[0],
                "completion_tokens": tokens[1],
                "total_tokens": sum(tokens),
            },
        },
    )


def _openai_chunk(delta: dict[str, Any] | None, finish: str | None = None, **fields: Any) -> str:
    """One chunk's ``data:`` line: of ``delta`` (``None``: a chunk without choices), with
    ``fields`` (``id``, ``model``, ``usage``...) over the defaults."""
    choices = (
        []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    )
    body = {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "gpt-test",
        "choices": choices,
        **fields,
    }
    return f"data: {json.dumps(body)}\n\n"


def openai_stream(
    *deltas: dict[str, Any], finish_reason: str | None = "stop", cut: bool = False
) -> Canned:
    """A streamed chat completion: one chunk per delta, then the finish chunk and
    ``[DONE]``; with ``cut`` the connection drops after the deltas instead."""
    text = "".join(_openai_chunk(delta) for delta in deltas)
    if not cut:
        text += _openai_chunk({}, finish_reason) + "data: [DONE]\n\n"
    return Canned(200, text.encode(), content_type="text/event-stream", cut=cut)


def openai_streamed(reply: Canned, usage: str = "final") -> Canned:
    """``reply`` (an :func:`openai_completion`) as the stream of chunks that answers a
    request asking to stream: a role chunk, its text in pieces of a word, each tool call
    in one chunk, the finish chunk, the usage in shape ``usage`` (:data:`STREAM_USAGES`;
    the output tokens spread over the chunks after the role chunk)."""
    if usage not in STREAM_USAGES:
        raise ValueError(f"usage: expected one of {STREAM_USAGES}, got {usage!r}")
    body = reply.body
    (choice,) = body["choices"]
    message = choice["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant"}]
    deltas += [{"content": piece} for piece in _pieces(message.get("content") or "")]
    deltas += [
        {"tool_calls": [{"index": index, **call}]}
        for index, call in enumerate(message.get("tool_calls") or ())
    ]
    finishes = [None] * len(deltas) + [choice["finish_reason"]]
    deltas.append({})
    tokens_in, tokens_out = body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]
    usages = _chunk_usages(usage, tokens_in, tokens_out, len(deltas))
    named = {"id": body["id"], "model": body["model"]}
    text = "".join(
        _openai_chunk(delta, finish, usage=counted, **named)
        for delta, finish, counted in zip(deltas, finishes, usages, strict=True)
    )
    if usage != "delta":  # the usage chunk of include_usage, after the finish chunk
        text += _openai_chunk(None, usage=_chunk_usage(tokens_in, tokens_out), **named)
    text += "data: [DONE]\n\n"
    return Canned(200, text.encode(), content_type="text/event-stream")


def _chunk_usages(
    usage: str, tokens_in: int, tokens_out: int, chunks: int
) -> list[dict[str, int] | None]:
    """The usage each of ``chunks`` chunks reports in shape ``usage``: the output tokens
    spread over the chunks after the first (the role chunk)."""
    added = [0] + [
        tokens_out * (n + 1) // (chunks - 1) - tokens_out * n // (chunks - 1)
        for n in range(chunks - 1)
    ]
    if usage == "final":
        return [None] * chunks
    if usage == "cumulative":
        return [_chunk_usage(tokens_in, sum(added[: n + 1])) for n in range(chunks)]
    return [_chunk_usage(tokens_in if n == 0 else 0, out) for n, out in enumerate(added)]


def _chunk_usage(tokens_in: int, tokens_out: int) -> dict[str, int]:
    return {
        "prompt_tokens": tokens_in,
        "completion_tokens": tokens_out,
        "total_tokens": tokens_in + tokens_out,
    }


def _pieces(text: str) -> list[str]:
    """``text`` in pieces of a word (with the spaces after it), as a stream sends it."""
    return re.findall(r"\s*\S+\s*", text) or ([text] if text else [])


# -- script files ---------------------------------------------------------------------

STREAM_USAGES = ("final", "cumulative", "delta")
"""How a streamed reply reports its usage. ``final``: once, after the content (OpenAI's
``include_usage`` chunk without choices; Anthropic: ``message_start`` reports zeros and
``message_delta`` the whole usage). ``cumulative``: the totals so far on every chunk
(vLLM's continuous usage stats, then the ``include_usage`` chunk repeating them;
Anthropic's own shape: ``message_start`` reports the prompt, ``message_delta`` the
totals). ``delta``: on every chunk, what that chunk added (the first chunk the prompt)."""
ANTHROPIC_STREAM_USAGES = ("final", "cumulative")
"""The shapes of :data:`STREAM_USAGES` an Anthropic stream can have: its protocol
defines ``message_delta``'s counts as cumulative, so it has no ``delta`` shape."""
DEFAULT_STREAM_USAGE = {"anthropic": "cumulative", "openai": "final"}
"""Each vendor's own shape, served when a script's table names none."""

_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_OPENAI_ERRORS = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


def parse_script(text: str, source: str) -> dict[str, list[Canned]]:
    """The responses per path of script ``text`` (read from ``source``); a
    :class:`~statemachine.ConfigError` naming the file, the table and the key for
    anything else, and nothing is served."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    unknown = sorted(set(data) - set(VENDORS))
    if unknown:
        raise ConfigError(
            f"{source}: unknown table {unknown[0]!r}; expected [[anthropic]] or [[openai]]"
        )
    if not data:
        raise ConfigError(f"{source}: no [[anthropic]] or [[openai]] table: nothing to serve")
    scripts: dict[str, list[Canned]] = {}
    ids = itertools.count(1)
    for vendor, entries in data.items():
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise ConfigError(
                f"{source}: {vendor}: expected an array of tables ([[{vendor}]]), got {entries!r}"
            )
        scripts[VENDORS[vendor]] = [
            _canned(vendor, entry, f"{source}: {vendor}[{index}]", next(ids))
            for index, entry in enumerate(entries, 1)
        ]
    return scripts


def load_script(path: str | Path) -> dict[str, list[Canned]]:
    """:func:`parse_script` of the file at ``path`` (a missing file: ConfigError)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the script: {exc}") from None
    return parse_script(text, str(path))


def _expect(ok: Callable[[Any], bool], what: str) -> Callable[[Any], str | None]:
    return lambda value: None if ok(value) else f"expected {what}, got {value!r:.80}"


def _arguments_problem(value: Any) -> str | None:
    if not isinstance(value, dict):
        return f"expected a table, got {value!r:.80}"
    found = json_problem(value)
    return None if found is None else f"not JSON data: {found}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_KEYS: dict[str, Callable[[Any], str | None]] = {
    "status": _expect(
        lambda v: type(v) is int and (v == 200 or 400 <= v <= 599),
        "200 or an error status (400..599)",
    ),
    "retry_after": _expect(
        lambda v: _is_number(v) and math.isfinite(v) and v >= 0, "seconds (a finite number >= 0)"
    ),
    "message": _expect(lambda v: isinstance(v, str), "a string"),
    "text": _expect(lambda v: isinstance(v, str), "a string"),
    "tool": _expect(lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    "arguments": _arguments_problem,
    "stream_usage": _expect(
        lambda v: v in STREAM_USAGES, f"one of {', '.join(map(repr, STREAM_USAGES))}"
    ),
}
"""Each key a script's table may have, and why a value of it is refused (``None``: it
is not). An ``arguments`` table must be JSON data: no NaN, infinity or TOML date."""
_REPLY_ONLY = ("text", "tool", "arguments", "stream_usage")
_ERROR_ONLY = ("retry_after", "message")


def _canned(vendor: str, entry: dict[str, Any], where: str, number: int) -> Canned:
    for key, value in entry.items():
        if key not in _KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}; expected one of {', '.join(_KEYS)}")
        problem = _KEYS[key](value)
        if problem is not None:
            raise ConfigError(f"{where}: {key}: {problem}")
    if "arguments" in entry and "tool" not in entry:
        raise ConfigError(f"{where}: arguments: given without a tool")
    status: int = entry.get("status", 200)
    for key in _ERROR_ONLY if status == 200 else _REPLY_ONLY:
        if key in entry:
            only = "an error (status >= 400)" if status == 200 else "a reply (status 200)"
            raise ConfigError(f"{where}: {key}: only {only} has one")
    if status == 200:
        return _reply(vendor, entry, where, number)
    headers = {}
    if "retry_after" in entry:
        headers["retry_after"] = f"{entry['retry_after']:g}"
    message = entry.get("message", f"scripted {status}")
    if vendor == "anthropic":
        return anthropic_error(
            status, _ANTHROPIC_ERRORS.get(status, "api_error"), message, **headers
        )
    return openai_error(status, message, _OPENAI_ERRORS.get(status, "server_error"), **headers)


def _reply(vendor: str, entry: dict[str, Any], where: str, number: int) -> Canned:
    """The reply of a status-200 table, answering a request that asks to stream with
    the stream of its ``stream_usage`` shape."""
    tool = entry.get("tool")
    calls = () if tool is None else ((f"call_{number}", tool, entry.get("arguments", {})),)
    shape = entry.get("stream_usage", DEFAULT_STREAM_USAGE[vendor])
    if vendor == "anthropic":
        if shape not in ANTHROPIC_STREAM_USAGES:
            raise ConfigError(
                f"{where}: stream_usage: {shape!r} is not a shape of Anthropic's stream (its "
                f"message_delta counts are cumulative); expected "
                f"{' or '.join(map(repr, ANTHROPIC_STREAM_USAGES))}"
            )
        ids = tuple((f"toolu_{n}", name, args) for n, name, args in calls)
        reply = anthropic_message(entry.get("text", ""), tool_uses=ids)
        return dataclasses.replace(reply, stream=anthropic_streamed(reply, shape))
    reply = openai_completion(entry.get("text"), tool_calls=calls)
    return dataclasses.replace(reply, stream=openai_streamed(reply, shape))


def serve(
    script: Mapping[str, list[Canned]],
    *,
    port: int,
    out: Callable[[str], None],
    ready: Callable[[LoopbackVendor], None] | None = None,
) -> None:
    """Serve ``script`` (repeating) on ``port`` until interrupted, logging each answer
    to ``out``; ``ready`` is called once the socket listens."""
    vendor = LoopbackVendor(port=port, repeat=True, log=out)
    for path, responses in script.items():
        vendor.script(path, *responses)
    url = vendor.url
    out(f"loopback vendor on {url}: Anthropic {ANTHROPIC}, OpenAI {OPENAI} (Ctrl-C stops it)")
    out("point the SDKs at it (in another shell):")
    out(f"  export ANTHROPIC_BASE_URL={url} ANTHROPIC_API_KEY=loopback")
    out(f"  export OPENAI_BASE_URL={url}/v1 OPENAI_API_KEY=loopback")
    if ready is not None:
        ready(vendor)
    try:
        vendor.serve_forever()
    finally:
        vendor.close()
