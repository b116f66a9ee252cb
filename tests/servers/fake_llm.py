"""The loopback vendor the end-to-end tests script: ``statemachine/dev/_vendor.py``
(also ``python -m statemachine vendor``), under the names the tests use.

``FakeLLM`` answers ``POST /v1/messages`` (Anthropic Messages) and
``POST /v1/chat/completions`` (OpenAI Chat Completions) from a per-path queue of canned
responses, each replayed once, in order, and records every request (path, headers, JSON
body), so a test can assert exactly how many requests the real SDK clients sent. An
exhausted script answers 418, which no test expects.
"""

from __future__ import annotations

from statemachine.dev._vendor import (
    ANTHROPIC,
    OPENAI,
    Canned,
    Seen,
    anthropic_error,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_error,
    openai_stream,
)
from statemachine.dev._vendor import LoopbackVendor as FakeLLM

__all__ = [
    "ANTHROPIC",
    "OPENAI",
    "Canned",
    "FakeLLM",
    "Seen",
    "anthropic_error",
    "anthropic_message",
    "anthropic_stream",
    "openai_completion",
    "openai_error",
    "openai_stream",
]
