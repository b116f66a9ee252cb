"""specs/family.md maps every normative sentence of the sibling spec pages to an ID.

The table's ``covered by`` cell is either ``out of scope`` (with the reason in the
notes) or a list of requirement IDs of ``specs/requirements*.toml``; every ID of
``specs/requirements-family.toml`` (what the sibling pages ask) appears in it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
FAMILY = SPECS / "family.md"
COLUMNS = ["page", "strength", "statement", "covered by", "notes"]
STRENGTHS = {"MUST", "MUST NOT", "SHOULD", "SHOULD NOT", "MAY", "expected", "stated"}
PAGE = re.compile(r"^[a-z0-9_-]+(/[a-z0-9_-]+)*\.md#[a-z0-9_-]+$")
ID = re.compile(r"^ER-[1-9][0-9]*$")
OUT_OF_SCOPE = "out of scope"

pytestmark = pytest.mark.requirement("ER-96")


def requirement_ids(pattern: str = "requirements*.toml") -> set[str]:
    """The IDs of the requirement files matching ``pattern``."""
    ids: set[str] = set()
    for path in sorted(SPECS.glob(pattern)):
        with path.open("rb") as handle:
            document = tomllib.load(handle)
        ids.update(str(entry["id"]) for entry in document.get("requirement", []))
    return ids


def split_row(line: str) -> list[str]:
    """The cells of one markdown table row (no cell holds a pipe)."""
    assert line.startswith("|") and line.endswith("|"), line
    return [cell.strip() for cell in line[1:-1].split("|")]


def table_rows(text: str) -> list[dict[str, str]]:
    """The rows of the one table of ``text``, as column -> cell."""
    lines = [line.rstrip() for line in text.splitlines()]
    table = [line for line in lines if line.startswith("|")]
    assert table, "specs/family.md holds no table"
    start = lines.index(table[0])
    assert lines[start : start + len(table)] == table, "the table must be one block"
    assert split_row(table[0]) == COLUMNS, split_row(table[0])
    assert all(set(cell) <= set("-: ") for cell in split_row(table[1])), table[1]
    rows = []
    for number, line in enumerate(table[2:], start=start + 3):
        cells = split_row(line)
        assert len(cells) == len(COLUMNS), f"family.md:{number}: {len(cells)} cells"
        rows.append({"line": str(number), **dict(zip(COLUMNS, cells, strict=True))})
    return rows


def covering_ids(cell: str) -> list[str]:
    """The IDs a ``covered by`` cell names (empty for ``out of scope``)."""
    if cell == OUT_OF_SCOPE:
        return []
    return [part.strip() for part in cell.split(",")]


ROWS = table_rows(FAMILY.read_text(encoding="utf-8"))


def test_every_row_is_covered_by_known_ids_or_says_why_not() -> None:
    """A row names IDs that exist in specs/requirements*.toml, or is out of scope
    with a reason; its page, strength and statement are well formed."""
    known = requirement_ids()
    for row in ROWS:
        where = f"family.md:{row['line']}"
        assert PAGE.match(row["page"]), f"{where}: page {row['page']!r}"
        assert row["strength"] in STRENGTHS, f"{where}: strength {row['strength']!r}"
        statement = row["statement"]
        assert statement, f"{where}: empty statement"
        assert len(statement.split()) <= 30, f"{where}: statement over 30 words"
        cell = row["covered by"]
        if cell == OUT_OF_SCOPE:
            assert row["notes"], f"{where}: out of scope without a reason"
            continue
        ids = covering_ids(cell)
        for requirement_id in ids:
            assert ID.match(requirement_id), f"{where}: {requirement_id!r} is not an ID"
            assert requirement_id in known, f"{where}: {requirement_id} is not a requirement"
        assert len(set(ids)) == len(ids), f"{where}: an ID is named twice"
        if "partial" in row["notes"]:
            assert row["notes"].startswith("partial"), f"{where}: 'partial' leads the note"


def test_the_table_is_complete_enough() -> None:
    """At least 50 sentences are mapped, and the error-recovery pages are there."""
    assert len(ROWS) >= 50, len(ROWS)
    pages = {row["page"].split("#")[0] for row in ROWS}
    for page in (
        "agent-loop/error-recovery.md",
        "agent-loop/turn-algorithm.md",
        "agent-loop/plan-apply-gate.md",
        "agent-loop/subagents.md",
        "agent-loop/conformance.md",
        "model/conformance.md",
        "model/protocol.md",
        "model/data-types.md",
        "tool/protocol.md",
        "tool/conformance.md",
        "tool/data-types.md",
        "configuration/settings-and-global.md",
    ):
        assert page in pages, f"no row for {page}"


def test_every_family_requirement_is_mapped() -> None:
    """Each ID of specs/requirements-family.toml covers at least one row."""
    named = {i for row in ROWS for i in covering_ids(row["covered by"])}
    family = requirement_ids("requirements-family.toml")
    assert family, "specs/requirements-family.toml holds no requirement"
    missing = sorted(family - named, key=lambda i: int(i[3:]))
    assert not missing, f"family requirements no row names: {', '.join(missing)}"


@pytest.mark.parametrize(
    ("cell", "expected"),
    [("out of scope", []), ("ER-1", ["ER-1"]), ("ER-1, ER-22", ["ER-1", "ER-22"])],
)
def test_covered_by_parser(cell: str, expected: list[str]) -> None:
    """The ``covered by`` parser reads both forms of the cell."""
    assert covering_ids(cell) == expected
