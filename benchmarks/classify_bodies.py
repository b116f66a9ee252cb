"""Measurement 7: ``sm.classify`` on small and on hostile bodies, µs per call.

A real error body is a few hundred bytes; a host that buffered a whole stream, a
gateway that returns a page of HTML or a hostile server can hand ``classify`` ten
megabytes. ``classify`` reads at most a bounded part of any body (the first and last
64 KiB, at most 64 SSE lines parsed, a bounded copy of a huge parsed body), so every
row here should stay within a few milliseconds; before the bound, one ``json.loads``
per SSE line made the 10 MB stream take about a third of a second.

Rows: a small JSON error body (bytes, HTTP 429); 10 MB of SSE lines with the error
event last; a 10 MB body on one line (a JSON error whose message is huge); and, for
the record, 10 MB of invalid UTF-8, JSON nested 100,000 levels deep, and a parsed
body of a million values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import statemachine as sm
from statemachine.io import _classify

from ._timing import measure

_DELTA = b'data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"hello"}}\n'
_ERROR_EVENT = (
    b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
    b'"message":"Overloaded"}}\n'
)
_SMALL = (
    b'{"type":"error","error":{"type":"rate_limit_error","message":"Number of requests '
    b'has exceeded your rate limit"}}'
)

ROWS = (
    "small JSON error body (bytes, 429)",
    "10 MB SSE body, error event last (200)",
    "10 MB single-line body (503)",
    "10 MB invalid UTF-8 (400)",
    "JSON text nested 100,000 deep (400)",
    "parsed body of 1,000,000 values (200)",
)


def bodies(size: int = 10_000_000) -> dict[str, tuple[Any, str]]:
    """Each row's ``(status, headers, body)`` triple and the category it must get."""
    sse = _DELTA * (size // len(_DELTA)) + _ERROR_EVENT
    line = b'{"error": {"type": "api_error", "message": "' + b"x" * size + b'"}}'
    garbled = b"\xff\xfe\x80" * (size // 3)
    deep = "[" * (size // 100) + "]" * (size // 100)
    parsed = {"error": {"type": "overloaded_error"}, "items": list(range(size // 10))}
    return {
        ROWS[0]: ((429, {"retry-after": "2"}, _SMALL), "rate_limited"),
        ROWS[1]: ((200, {}, sse), "overloaded"),
        ROWS[2]: ((503, {}, line), "overloaded"),
        ROWS[3]: ((400, {}, garbled), "invalid_request"),
        ROWS[4]: ((400, {}, deep), "invalid_request"),
        ROWS[5]: ((200, None, parsed), "overloaded"),
    }


def _batch(triple: Any, ops: int) -> Callable[[Any], None]:
    def body(_state: Any) -> None:
        for _ in range(ops):
            sm.classify(triple)

    return body


def run(n: int = 200, big_n: int = 20, repeats: int = 7, size: int = 10_000_000) -> dict[str, Any]:
    """µs per ``classify`` call for every row, and the bounds it reads within."""
    rows: dict[str, float] = {}
    categories: dict[str, str] = {}
    for name, (triple, expected) in bodies(size).items():
        got = sm.classify(triple).category.value
        if got != expected:
            raise AssertionError(f"{name}: classified {got}, expected {expected}")
        categories[name] = got
        ops = n if name == ROWS[0] else big_n
        rows[name] = measure(lambda: None, _batch(triple, ops), ops, repeats=repeats)["median_us"]
    return {
        "unit": "µs per sm.classify((status, headers, body)) call, median of repeats",
        "body_bytes": size,
        "rows": rows,
        "categories": categories,
        "bounds": {
            "MAX_BODY": _classify.MAX_BODY,
            "MAX_SSE_LINES": _classify.MAX_SSE_LINES,
            "MAX_BODY_VALUES": _classify.MAX_BODY_VALUES,
        },
    }
