"""A loopback fake model provider speaking two wire formats, for end-to-end tests.

``FakeLLM`` is a threaded ``http.server`` on 127.0.0.1 (port 0) that answers
``POST /v1/messages`` (Anthropic Messages) and ``POST /v1/chat/completions``
(OpenAI Chat Completions) from a script: a queue of canned responses per path,
each replayed once, in order. Every request is recorded (path, headers, JSON
body), so a test can assert exactly how many requests the real SDK clients sent.
An exhausted script answers 418, which no test expects.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ANTHROPIC = "/v1/messages"
OPENAI = "/v1/chat/completions"


@dataclass(frozen=True)
class Canned:
    """One scripted response: status, headers and a body (JSON data or raw bytes)."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    cut: bool = False
    """Announce more bytes than are sent, then close: a connection lost mid-body."""


@dataclass(frozen=True)
class Seen:
    """One request the server received."""

    path: str
    headers: dict[str, str]
    body: Any


class FakeLLM:
    """The server; use as a context manager. ``url`` is its base URL."""

    def __init__(self) -> None:
        self.scripts: dict[str, deque[Canned]] = {ANTHROPIC: deque(), OPENAI: deque()}
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw
                path = self.path.split("?")[0]
                with owner._lock:
                    owner.seen.append(Seen(path, dict(self.headers.items()), body))
                    script = owner.scripts.get(path)
                    canned = script.popleft() if script else None
                if canned is None:
                    canned = Canned(418, {"error": {"message": f"script exhausted for {path}"}})
                payload = (
                    canned.body
                    if isinstance(canned.body, bytes)
                    else json.dumps(canned.body).encode()
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
                """Quiet: tests read ``seen`` instead of logs."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, path: str, *responses: Canned) -> None:
        """Queue ``responses`` for ``path``."""
        with self._lock:
            self.scripts[path].extend(responses)

    def count(self, path: str) -> int:
        """How many requests ``path`` received."""
        with self._lock:
            return sum(1 for seen in self.seen if seen.path == path)

    def requests(self, path: str) -> list[Seen]:
        with self._lock:
            return [seen for seen in self.seen if seen.path == path]

    def __enter__(self) -> FakeLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# -- Anthropic Messages wire format ---------------------------------------------------


def anthropic_error(status: int, etype: str, message: str, **headers: str) -> Canned:
    return Canned(
        status,
        {"type": "error", "error": {"type": etype, "message": message}},
        {k.replace("_", "-"): v for k, v in headers.items()},
    )


def anthropic_message(
    text: str = "done",
    *,
    tool_uses: tuple[tuple[str, str, dict[str, Any]], ...] = (),
    stop_reason: str | None = None,
    tokens: tuple[int, int] = (10, 5),
) -> Canned:
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


# -- OpenAI Chat Completions wire format ----------------------------------------------


def openai_error(
    status: int, message: str, etype: str, code: str | None = None, **headers: str
) -> Canned:
    return Canned(
        status,
        {"error": {"message": message, "type": etype, "param": None, "code": code}},
        {k.replace("_", "-"): v for k, v in headers.items()},
    )


def openai_completion(
    text: str | None = "done",
    *,
    tool_calls: tuple[tuple[str, str, dict[str, Any]], ...] = (),
    finish_reason: str | None = None,
    tokens: tuple[int, int] = (10, 5),
) -> Canned:
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
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


def openai_stream(
    *deltas: dict[str, Any], finish_reason: str | None = "stop", cut: bool = False
) -> Canned:
    """A streamed chat completion: one chunk per delta, then the finish chunk and
    ``[DONE]``; with ``cut`` the connection drops after the deltas instead."""

    def chunk(delta: dict[str, Any], finish: str | None) -> str:
        body = {
            "id": "chatcmpl-s",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "gpt-test",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return f"data: {json.dumps(body)}\n\n"

    text = "".join(chunk(delta, None) for delta in deltas)
    if not cut:
        text += chunk({}, finish_reason) + "data: [DONE]\n\n"
    return Canned(200, text.encode(), content_type="text/event-stream", cut=cut)
