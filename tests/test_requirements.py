"""Requirement IDs are enforced: every ID has a test, every test names a known ID.

IDs come from ``specs/requirements*.toml``; markers are read from the source of
every test module (``@pytest.mark.requirement("ER-n", ...)`` anywhere: on a
function, a class, a ``pytestmark`` or a ``pytest.param``), so the check does not
depend on which tests a run selected. The markers pytest actually collected in
this run (``tests/conftest.py``) must name known IDs too.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REQUIREMENT_MARKERS

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
TESTS = ROOT / "tests"
ID = re.compile(r"^ER-[1-9][0-9]*$")


def load_requirements() -> dict[str, dict[str, str]]:
    """Every requirement of specs/requirements*.toml, by ID."""
    found: dict[str, dict[str, str]] = {}
    for path in sorted(SPECS.glob("requirements*.toml")):
        with path.open("rb") as handle:
            document = tomllib.load(handle)
        for raw in document.get("requirement", []):
            entry = {**raw, "file": path.name}
            requirement_id = entry.get("id")
            assert requirement_id not in found, f"{requirement_id} in {path.name} and " + (
                found[requirement_id]["file"] if requirement_id in found else ""
            )
            found[str(requirement_id)] = entry
    return found


def marker_ids(source: str, filename: str = "<test>") -> dict[str, list[str]]:
    """requirement ID -> places (file:line) that name it, from one module's source."""
    places: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "requirement"):
            continue
        base = func.value
        if not (isinstance(base, ast.Attribute) and base.attr == "mark"):
            continue
        for arg in node.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                places.setdefault(arg.value, []).append(f"{filename}:{node.lineno}")
            else:
                places.setdefault("<not a literal>", []).append(f"{filename}:{node.lineno}")
    return places


def all_markers() -> dict[str, list[str]]:
    """requirement ID -> places, over every test module."""
    places: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        found = marker_ids(path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix())
        for requirement_id, where in found.items():
            places.setdefault(requirement_id, []).extend(where)
    return places


REQUIREMENTS = load_requirements()
MARKERS = all_markers()


def test_requirements_are_well_formed() -> None:
    """Each requirement has an ER-n ID, a MUST/SHOULD strength, a source, a text and
    where it lives; IDs are unique across the files."""
    assert len(REQUIREMENTS) >= 36
    for requirement_id, entry in REQUIREMENTS.items():
        assert ID.match(requirement_id), f"{entry['file']}: bad id {requirement_id!r}"
        assert entry.get("strength") in {"MUST", "SHOULD"}, requirement_id
        assert str(entry.get("source", "")).strip(), requirement_id
        assert str(entry.get("text", "")).strip(), requirement_id
        assert str(entry.get("where", "")).strip(), requirement_id


def test_core_ids_are_kept() -> None:
    """ER-1..ER-36 of specs/requirements.toml all exist (IDs are stable)."""
    core = {f"ER-{n}" for n in range(1, 40)}
    assert core <= set(REQUIREMENTS)
    assert {r for r, e in REQUIREMENTS.items() if e["file"] == "requirements.toml"} == core


def test_every_requirement_has_a_test() -> None:
    """No requirement ID is without at least one test that names it."""
    missing = sorted(set(REQUIREMENTS) - set(MARKERS), key=lambda i: int(i[3:]))
    assert not missing, f"requirements with no test: {', '.join(missing)}"


def test_every_marker_names_a_known_requirement() -> None:
    """No test names an ID that is not in specs/requirements*.toml."""
    unknown = {i: where for i, where in MARKERS.items() if i not in REQUIREMENTS}
    assert not unknown, f"tests name unknown requirement IDs: {unknown}"


def test_collected_markers_name_known_requirements() -> None:
    """The markers pytest collected in this run name known IDs too."""
    unknown = {i: sorted(nodes)[:3] for i, nodes in REQUIREMENT_MARKERS.items()}
    unknown = {i: nodes for i, nodes in unknown.items() if i not in REQUIREMENTS}
    assert not unknown, f"collected tests name unknown requirement IDs: {unknown}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('@pytest.mark.requirement("ER-1", "ER-2")\ndef test(): pass\n', {"ER-1", "ER-2"}),
        ('pytestmark = pytest.mark.requirement("ER-3")\n', {"ER-3"}),
        ('X = pytest.mark.requirement("ER-4")(Case)\n', {"ER-4"}),
        ('p = pytest.param(1, marks=pytest.mark.requirement("ER-5"))\n', {"ER-5"}),
        ("@pytest.mark.requirement(NAME)\ndef test(): pass\n", {"<not a literal>"}),
        ('requirement("ER-9")\n', set()),
    ],
)
def test_marker_parser(source: str, expected: set[str]) -> None:
    """The source parser finds markers in every form tests use, and flags IDs that
    are not string literals (they could not be checked)."""
    assert set(marker_ids(source)) == expected


def test_no_marker_is_computed() -> None:
    """Every requirement marker names its IDs as string literals."""
    assert "<not a literal>" not in MARKERS, MARKERS.get("<not a literal>")


def test_the_model_check_and_stateful_suite_prove_the_loop_promise() -> None:
    """ER-29 (no illegal loop) is proved by the model check, the stateful suite and
    the mutants, not only by example tests."""
    files = {place.split(":")[0] for place in MARKERS.get("ER-29", [])}
    assert {"tests/test_check.py", "tests/test_stateful.py", "tests/test_mutants.py"} <= files
