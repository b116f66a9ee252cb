"""A streamed reply's usage, counted once whatever shape its chunks report it in.

The chunks of a stream (OpenAI Chat Completions chunks, or the events another API
streams) report the call's usage in one of three shapes, and none says which:

* **final**: one chunk carries the whole call's usage (OpenAI's ``include_usage`` chunk);
* **cumulative**: every chunk carries the totals so far, the last the whole call's
  (vLLM's continuous usage stats, Gemini's and Cloudflare's OpenAI-compatible streams);
* **delta**: every chunk carries what it added, so the call's usage is their sum (the
  first chunk reports the prompt, the later ones 0 input tokens).

Summing every chunk counts a cumulative stream once per chunk; keeping the last counts a
delta stream as its last chunk. So the shape is read from the numbers, one chunk at a
time (:func:`repeats_totals`): a chunk whose input tokens equal the running total's
(and are not 0) and whose output tokens are no fewer repeats the totals so far and
replaces them; any other chunk adds to them. A cumulative stream repeats the prompt on
every chunk; a delta stream reports it once; a final event comes alone, onto nothing.
Misread would be a delta stream that repeats the prompt's count on every chunk, or a
cumulative one that reports 0 input tokens: no vendor is known to.

:class:`StreamUsage` applies the rule to any usage type, given how to read its two
counts and how to add two of them; the OpenAI providers (SDK usage objects) and the
pydantic-ai integration (``RequestUsage``) use it. (It belongs with
:mod:`statemachine.core._usage`, and can move there.) An Anthropic Messages stream is
not read so: its protocol defines ``message_delta``'s counts as cumulative, and the SDK's
snapshot replaces by them; the rule would add a ``message_delta`` that reports the output
total alone (no input count, as Anthropic's own stream often sends it) to the output
count ``message_start`` reported.
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
