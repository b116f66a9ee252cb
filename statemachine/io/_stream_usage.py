"""A streamed reply's usage, counted once whatever shape its chunks report it in.

A stream's chunks report the call's usage as **final** (one chunk carries the whole
call's: OpenAI's ``include_usage``), **cumulative** (every chunk carries the totals so
far: vLLM's continuous usage stats, Gemini's and Cloudflare's OpenAI-compatible
streams) or **delta** (every chunk what it added), and none says which. So the shape is
read from the numbers, one chunk at a time (:func:`repeats_totals`): a cumulative
stream repeats the prompt's count on every chunk, a delta stream reports it once, a
final chunk comes alone. Misread would be a delta stream that repeats the prompt's
count on every chunk, or a cumulative one that reports 0 input tokens: no vendor is
known to. An Anthropic stream is not read so: its protocol defines ``message_delta``'s
counts as cumulative, and it may report the output total alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["StreamUsage", "Tokens", "plus", "repeats_totals"]

U = TypeVar("U")

Tokens = tuple[int | None, int | None]
"""A usage's input and output token counts (``None``: not reported)."""


def repeats_totals(so_far: Tokens, chunk: Tokens) -> bool:
    """Whether a chunk reporting ``chunk`` repeats a stream's totals ``so_far`` (its
    input tokens equal theirs, which are not 0, and its output tokens are no fewer)
    rather than adding to them."""
    input_so_far, output_so_far = so_far
    chunk_input, chunk_output = chunk
    return (
        bool(input_so_far)
        and chunk_input == input_so_far
        and (chunk_output or 0) >= (output_so_far or 0)
    )


def plus(first: int | None, second: int | None) -> int | None:
    """The sum of two counts, either unknown (``None``); unknown when both are."""
    if first is None:
        return second
    return first if second is None else first + second


class StreamUsage(Generic[U]):
    """One stream's usage, from the usages its chunks report, in order.

    ``tokens`` reads a usage's input and output counts; ``add`` sums two usages.
    """

    def __init__(self, tokens: Callable[[U], Tokens], add: Callable[[U, U], U]) -> None:
        self._tokens = tokens
        self._add = add
        self.total: U | None = None
        """The stream's usage so far (``None`` before a chunk reported one)."""

    def see(self, usage: U) -> U:
        """Count the next chunk's ``usage``; returns the stream's usage so far."""
        total = self.total
        if total is None or repeats_totals(self._tokens(total), self._tokens(usage)):
            self.total = usage
        else:
            self.total = self._add(total, usage)
        return self.total
