"""Reading the server's requested wait off a ``ModelError``.

The first *usable* value (a finite number >= 0; a date in the future) of
``ModelError.retry_after_seconds``, the ``retry-after-ms`` header, then the
``retry-after`` header as seconds or as an HTTP-date, measured against the response's
own ``date`` header, else the step's wall time (``specs/retry-after.md`` has the truth
table). Nothing here raises.
"""

from __future__ import annotations

import math
from email.utils import parsedate_to_datetime

from ._model_error import Headers, ModelError


def _seconds(raw: object) -> float | None:
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, int | float):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            return None
    else:
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return value


def _http_date(raw: str) -> float | None:
    try:
        moment = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if moment is None or moment.tzinfo is None:
        return None
    return moment.timestamp()


def header_retry_after(headers: Headers, wall: float | None) -> float | None:
    """The requested wait in ``headers`` alone (sources 2 and 3), or ``None``. ``wall``
    is the Unix time an HTTP-date is measured against when no usable ``date`` header
    stands beside it (``None``: such a date is not usable)."""
    if "retry-after-ms" in headers:
        millis = _seconds(headers["retry-after-ms"])
        if millis is not None:
            return millis / 1000.0
    if "retry-after" not in headers:
        return None
    raw = headers["retry-after"]
    seconds = _seconds(raw)
    if seconds is not None:
        return seconds
    if any(c.isalpha() for c in raw):
        when = _http_date(raw)
        if when is None:
            return None
        now = _http_date(headers["date"]) if "date" in headers else None
        if now is None:
            now = wall
        if now is None:
            return None
        delta = when - now
        if math.isfinite(delta) and delta > 0:
            return delta
    return None


def retry_after(error: ModelError, wall: float | None) -> float | None:
    """The seconds the server asked us to wait (``None``: nothing usable); ``wall`` is
    the step's Unix time, for an HTTP-date with no usable ``date`` header."""
    seconds = _seconds(error.retry_after_seconds)
    if seconds is not None:
        return seconds
    if error.headers:
        return header_retry_after(error.headers, wall)
    return None
