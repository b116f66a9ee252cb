"""The corpus of real provider error responses (``tests/corpus/``), classified.

Each entry is one response as a provider sends it (status, headers, body bytes),
with the source it was taken from and the category, code and retry-after that
``sm.classify`` must give it. ``specs/classification.md`` names, for each row of
its mapping, the entries that prove it, and compares the corpus with LiteLLM's
exception mapping (``tests/corpus/litellm.json``); both are checked here.
"""

from __future__ import annotations

import base64
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import statemachine as sm

C = sm.ErrorCategory
ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"
SPEC = ROOT / "specs" / "classification.md"
FIELDS = {"name", "vendor", "source", "source_kind", "status", "headers", "expected"}


def _entries() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(CORPUS.glob("*.jsonl")):
        lines = path.read_text(encoding="utf-8").splitlines()
        rows.extend(json.loads(line) for line in lines if line.strip())
    return rows


ENTRIES = _entries()
BY_NAME = {entry["name"]: entry for entry in ENTRIES}
LITELLM = {
    name: row
    for name, row in json.loads((CORPUS / "litellm.json").read_text(encoding="utf-8")).items()
    if not name.startswith("_")
}


def _body(entry: dict[str, Any]) -> bytes:
    if "body_b64" in entry:
        return base64.b64decode(entry["body_b64"])
    return entry["body"].encode("utf-8")


def _section(title: str) -> str:
    text = SPEC.read_text(encoding="utf-8")
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start : end if end != -1 else len(text)]


def test_corpus_entries_are_well_formed() -> None:
    assert len(ENTRIES) == len(BY_NAME), "entry names are unique"
    for entry in ENTRIES:
        assert entry.keys() >= FIELDS, entry["name"]
        assert ("body" in entry) != ("body_b64" in entry), entry["name"]
        assert entry["source"].strip(), entry["name"]
        assert set(entry["expected"]) == {"category", "code", "retry_after_seconds"}
        C(entry["expected"]["category"])  # a category of the taxonomy


@pytest.mark.requirement("ER-40", "ER-41", "ER-42", "ER-44")
@pytest.mark.parametrize("entry", ENTRIES, ids=[entry["name"] for entry in ENTRIES])
def test_corpus_entry_is_classified_as_expected(entry: dict[str, Any]) -> None:
    error = sm.classify((entry["status"], entry["headers"], _body(entry)))
    expected = entry["expected"]
    assert error.category is C(expected["category"])
    assert error.code == expected["code"]
    assert error.retry_after_seconds == expected["retry_after_seconds"]
    # the same bytes as str and as an (name, value) header list read the same
    again = sm.classify((entry["status"], list(entry["headers"].items()), _body(entry).decode()))
    assert (again.category, again.code) == (error.category, error.code)


def _row_table() -> dict[int, str]:
    rows: dict[int, str] = {}
    for line in _section("### Which corpus entry proves each row").splitlines():
        match = re.match(r"^\| (\d+) \| (.*) \|$", line)
        if match:
            rows[int(match.group(1))] = match.group(2)
    return rows


def _mapping_rows() -> set[int]:
    rows = set()
    for line in _section("## The mapping").splitlines():
        match = re.match(r"^\| (\d+) \|", line)
        if match:
            rows.add(int(match.group(1)))
    return rows


@pytest.mark.requirement("ER-40")
def test_every_mapping_row_is_proven_by_a_corpus_entry() -> None:
    table = _row_table()
    assert set(table) == _mapping_rows()
    covered: set[str] = set()
    for row, cell in table.items():
        names = re.findall(r"`([a-z0-9.-]+)`", cell)
        if "not an HTTP response" in cell:  # an exception, proven in test_classify.py
            assert not names, row
            continue
        assert names, f"row {row} has no corpus entry"
        unknown = [name for name in names if name not in BY_NAME]
        assert not unknown, f"row {row} names entries not in the corpus: {unknown}"
        covered.update(names)
    assert covered == set(BY_NAME), f"entries no row names: {set(BY_NAME) - covered}"


def test_litellm_comparison_counts_match_the_spec() -> None:
    assert set(LITELLM) == set(BY_NAME)
    counts: dict[str, Counter[str]] = {}
    for name, entry in BY_NAME.items():
        ours = entry["expected"]["category"]
        theirs = LITELLM[name]["category"]
        verdict = "n/a" if theirs is None else ("agree" if theirs == ours else "differ")
        counts.setdefault(ours, Counter())[verdict] += 1
    table: dict[str, tuple[int, int, int, int]] = {}
    for line in _section("### Against LiteLLM").splitlines():
        match = re.match(r"^\| `([a-z_]+)` \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|", line)
        if match:
            table[match.group(1)] = tuple(int(n) for n in match.groups()[1:])  # type: ignore[assignment]
    expected = {
        category: (sum(c.values()), c["agree"], c["differ"], c["n/a"])
        for category, c in counts.items()
    }
    assert table == expected


# -- regressions the corpus revealed ----------------------------------------------


@pytest.mark.requirement("ER-40")
def test_llamacpp_exceed_context_size_is_context_length_exceeded() -> None:
    """llama.cpp's server says ``exceed_context_size_error`` / "exceeds the available
    context size"; it was ``invalid_request`` (no phrase matched)."""
    body = {
        "error": {
            "code": 400,
            "message": "request (13392 tokens) exceeds the available context size (8192 tokens)",
            "type": "exceed_context_size_error",
        }
    }
    error = sm.classify((400, {}, body))
    assert error.category is C.CONTEXT_LENGTH_EXCEEDED
    assert error.code == "exceed_context_size_error"
    renamed = {"error": {**body["error"], "message": "too big"}}  # the type alone says so
    assert sm.classify((400, {}, renamed)).category is C.CONTEXT_LENGTH_EXCEEDED


@pytest.mark.requirement("ER-40")
def test_gemini_numeric_code_keeps_the_status_name() -> None:
    """Gemini (and vLLM, llama.cpp) echo the HTTP status as a number in ``error.code``;
    the kept code was "429". It is Gemini's ``status`` name, else the error type."""
    gemini = {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}}
    assert sm.classify((429, {}, gemini)).code == "RESOURCE_EXHAUSTED"
    vllm = {"error": {"message": "x", "type": "BadRequestError", "param": None, "code": 400}}
    assert sm.classify((400, {}, vllm)).code == "BadRequestError"
    mistral = {"object": "error", "message": "m", "type": "rate_limited", "code": "1300"}
    assert sm.classify((429, {}, mistral)).code == "1300"  # a string code is kept as is


@pytest.mark.requirement("ER-40", "ER-44")
def test_anthropic_streamed_refusal_is_content_filtered() -> None:
    """A raw Anthropic stream that ends with ``stop_reason: "refusal"`` in its
    ``message_delta`` was ``unknown`` (only ``error`` events were looked for)."""
    stream = (
        b'event: message_delta\ndata: {"type":"message_delta","delta":'
        b'{"stop_reason":"refusal","stop_sequence":null},"usage":{"output_tokens":0}}\n\n'
    )
    error = sm.classify((200, {"content-type": "text/event-stream"}, stream))
    assert (error.category, error.code) == (C.CONTENT_FILTERED, "refusal")
    chunk = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"content_filter"}]}\n\n'
    filtered = sm.classify((200, {}, chunk))  # an OpenAI-style chunk stopped by the filter
    assert (filtered.category, filtered.code) == (C.CONTENT_FILTERED, "content_filter")
    plain = b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn"}}\n\n'
    assert sm.classify((200, {}, plain)).category is C.UNKNOWN
