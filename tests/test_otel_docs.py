"""The generated telemetry and incident pages, and the README's span tree, are what
the code produces now (regenerate with ``python -m statemachine.dev._telemetry_docs``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from statemachine.dev._telemetry_docs import (
    BLOCK_END,
    BLOCK_START,
    documents,
    span_tree_block,
    write_documents,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.requirement("ER-134")
def test_the_generated_pages_have_not_drifted() -> None:
    """docs/telemetry.md, docs/incident.md, docs/incident.dot match the code, and
    docs/incident.svg records the digest of that .dot."""
    if shutil.which("dot") is None:
        pytest.fail("graphviz's dot is needed to check docs/incident.svg")
    drifted = write_documents(ROOT, check=True)
    assert not drifted, f"regenerate with `python -m statemachine.dev._telemetry_docs`: {drifted}"


@pytest.mark.requirement("ER-134")
def test_the_pages_show_a_real_run_and_a_drawn_incident() -> None:
    """The telemetry page holds a real run's span tree (session, turn, chat spans,
    waits, a fallback); the incident page the drawing and its steps."""
    files = documents()
    telemetry = files["docs/telemetry.md"]
    assert span_tree_block() in telemetry
    for needle in (
        "invoke_workflow turnstate  [",
        "invoke_agent turnstate",
        "chat primary",
        "turnstate.fallback",
        "http.response.status_code=529",
    ):
        assert needle in telemetry
    incident = files["docs/incident.md"]
    assert "![the incident drawn on the machine](incident.svg)" in incident
    assert "![the incident as a timeline](incident-timeline.svg)" in incident
    assert files["docs/incident-timeline.svg"].startswith("<svg")
    assert "retries_exhausted" in files["docs/incident-timeline.svg"]
    assert "13: ModelFailed [transient] / Finish(retries_exhausted)" in incident


@pytest.mark.requirement("ER-134")
def test_the_readme_span_tree_block_has_not_drifted() -> None:
    """README.md's marked block (<!-- otel-span-tree --> ... <!-- /otel-span-tree -->),
    once it has one, is the span tree the code produces."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    if BLOCK_START not in readme:
        pytest.skip("README.md has no otel-span-tree block yet")
    start = readme.index(BLOCK_START)
    end = readme.index(BLOCK_END, start) + len(BLOCK_END)
    assert readme[start:end] == span_tree_block(), (
        "the README's span tree drifted: paste span_tree_block() from "
        "statemachine/dev/_telemetry_docs.py (or docs/telemetry.md's block)"
    )
