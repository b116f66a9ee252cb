"""Backoff delays and the counter-based jitter source they draw from.

The formula, written once here and once in ``specs/backoff.md`` (a test keeps the two
in sync)::

    delay_ms(n) = min(base_delay_ms * backoff_factor ** n, max_delay_ms)
    wait_ms(n)  = max(delay_ms(n) * (0.5 + u), 1000 * retry_after)

``n`` is the retry's number within one call (from 0), ``u`` in [0, 1) the session's
next jitter draw and ``retry_after`` the server's requested wait in seconds (0: none):
"equal jitter", which spreads a herd of clients while keeping every wait at least half
its nominal value. The jitter is SplitMix64 at (seed, draw number): a session keeps two
integers, and a guard can preview a draw without consuming it.
"""

from __future__ import annotations

_MASK = (1 << 64) - 1
_INFINITY = float("inf")
_GAMMA = 0x9E3779B97F4A7C15


def jitter(seed: int, draw: int) -> float:
    """The ``draw``-th uniform number in [0, 1) of the stream for ``seed``."""
    z = (seed + (draw + 1) * _GAMMA) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return (z >> 11) * (1.0 / (1 << 53))


def wait_seconds(
    n: int,
    u: float,
    retry_after: float | None,
    base_delay_ms: float,
    factor: float,
    max_delay_ms: float,
) -> float:
    """``wait_ms(n) / 1000``: the seconds to wait before the n-th retry, finite
    whatever the (finite) settings (a power that overflows is ``max_delay_ms``)."""
    try:
        # float(factor): an int factor would raise an exact integer to the n-th power
        delay = base_delay_ms * float(factor) ** n
    except OverflowError:
        delay = max_delay_ms
    if not delay < max_delay_ms:
        delay = max_delay_ms
    seconds = delay * (0.5 + u) / 1000.0
    if seconds == _INFINITY:
        seconds = delay / 1000.0 * (0.5 + u)
    seconds += 0.0  # a signed zero (a base delay of -0.0) is written as 0.0
    if retry_after is not None and retry_after > seconds:
        return retry_after
    return seconds
