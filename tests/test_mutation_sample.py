"""The mutation runner, kept honest: its generator, and a fixed sample that must die.

``tools/mutate.py`` (``specs/mutation.md``) mutates a module and runs the fast tests
against each mutant. The sample test runs the real runner on five fixed mutants of
``statemachine/core/_backoff.py`` (``--sample 5 --seed 5``) and asserts every one is
killed, so a weakening of ``tests/test_backoff.py`` and
``tests/test_mutation_backoff.py`` (or of the runner) cannot pass
silently. A second sample does the same for ``classify``'s tables (four entries of
``statemachine/io/_classify.py``'s module-level tables, dropped or renamed), against
``tests/test_classification_rows.py``. The other tests check the generator on small sources, without subprocesses.
"""

from __future__ import annotations

import random

import pytest

from tools import mutate

BACKOFF = "statemachine/core/_backoff.py"
CLASSIFY = "statemachine/io/_classify.py"
ENGINE = "statemachine/core/_engine.py"
JOBS = 2
"""Mutants run two at a time: CI's machine has two cores, and these samples are the
suite's slowest tests."""


def _descriptions(source: str) -> list[str]:
    return [m.description for m in mutate.generate("snippet.py", source.encode())]


@pytest.mark.requirement("ER-22")
def test_a_fixed_sample_of_backoff_mutants_is_all_killed() -> None:
    """Five seeded mutants of the backoff module each make its tests fail."""
    report = mutate.run_module(
        BACKOFF,
        tests=["tests/test_backoff.py", "tests/test_mutation_backoff.py"],
        sample=5,
        seed=5,
        timeout=60,
        jobs=JOBS,
    )
    assert report.error is None, report.error
    assert report.generated >= 80
    assert report.run == 5
    survivors = [
        f"#{o.mutant.number} line {o.mutant.line}: {o.mutant.description}" for o in report.survivors
    ]
    assert not survivors, f"surviving mutants of {BACKOFF}: {survivors}"
    assert report.score == 100.0


@pytest.mark.requirement("ER-40")
def test_a_fixed_sample_of_classify_table_mutants_is_all_killed() -> None:
    """Four seeded mutants of classify's tables (a phrase, a code, a type or a status
    dropped or renamed) each make the one-entry-at-a-time tests fail. Picked among the
    table mutants by description, so the sample does not move when code is added."""
    mutants = mutate.generate(CLASSIFY, (mutate.REPO / CLASSIFY).read_bytes())
    tables = [m for m in mutants if m.description.startswith(("table entry", "table string"))]
    assert len(tables) >= 80
    chosen = sorted(m.number for m in random.Random(40).sample(tables, 4))
    report = mutate.run_module(
        CLASSIFY,
        tests=["tests/test_classification_rows.py", "tests/test_mutation_classify.py"],
        numbers=chosen,
        timeout=60,
        jobs=JOBS,
    )
    assert report.error is None, report.error
    assert report.run == 4
    survivors = [
        f"#{o.mutant.number} line {o.mutant.line}: {o.mutant.description}" for o in report.survivors
    ]
    assert not survivors, f"surviving mutants of {CLASSIFY}: {survivors}"


EQUIVALENT: tuple[str, ...] = ()
"""New-operator mutants that change nothing, left out of the sample (``specs/mutation.md``).
None now: the one there was, ``min(max_delay_ms, delay)`` swapped, went when the
backoff's cap became a comparison."""


@pytest.mark.requirement("ER-22")
def test_a_fixed_sample_of_deleted_statements_and_swapped_arguments_is_all_killed() -> None:
    """Seeded mutants made by the two operators added last, picked among those by
    description so the sample does not move when other operators are added: four
    statements of the backoff module deleted, and three calls of the engine with two
    arguments swapped (where a swap can type-check: not ``isinstance``). Each makes
    the module's tests fail."""
    for module, prefix, count, least, tests in (
        (
            BACKOFF,
            "statement deleted",
            4,
            12,  # the module is small: a dozen statements
            ["tests/test_backoff.py", "tests/test_mutation_backoff.py"],
        ),
        (ENGINE, "arguments", 3, 15, ["tests/test_engine.py", "tests/test_backoff.py"]),
    ):
        mutants = mutate.generate(module, (mutate.REPO / module).read_bytes())
        new = [
            m
            for m in mutants
            if m.description.startswith(prefix)
            and "isinstance" not in m.description
            and m.description not in EQUIVALENT
        ]
        assert len(new) >= least
        chosen = sorted(m.number for m in random.Random(7).sample(new, count))
        report = mutate.run_module(module, tests=tests, numbers=chosen, timeout=60, jobs=JOBS)
        assert report.error is None, report.error
        assert report.run == count
        survivors = [
            f"#{o.mutant.number} line {o.mutant.line}: {o.mutant.description}"
            for o in report.survivors
        ]
        assert not survivors, f"surviving mutants of {module}: {survivors}"


def test_every_module_of_the_engine_the_store_and_io_has_a_test_list() -> None:
    """Each private module of ``core``, ``store`` and ``io`` is mutated against tests of
    its own (not the fallback list), and every test file named exists."""
    modules = [
        str(path.relative_to(mutate.REPO))
        for layer in ("core", "store", "io")
        for path in sorted((mutate.REPO / "statemachine" / layer).glob("_*.py"))
        if path.name != "__init__.py"
    ]
    assert len(modules) >= 35
    assert [m for m in modules if m not in mutate.DEFAULT_TESTS] == []
    named = {t.split("::")[0] for tests in mutate.DEFAULT_TESTS.values() for t in tests}
    assert [t for t in sorted(named) if not (mutate.REPO / t).is_file()] == []


def test_the_sample_is_deterministic() -> None:
    """The same seed picks the same mutants; the numbering follows the source order."""
    source = (mutate.REPO / BACKOFF).read_bytes()
    mutants = mutate.generate(BACKOFF, source)
    first = mutate.select(mutants, 5, 5)
    assert first == mutate.select(mutate.generate(BACKOFF, source), 5, 5)
    assert [m.number for m in mutants] == list(range(len(mutants)))
    assert [m.line for m in mutants] == sorted(m.line for m in mutants)
    assert mutate.select(mutants, numbers=[3, 1]) == [mutants[3], mutants[1]]
    assert mutate.select(mutants) == mutants


def test_each_operator_family_is_generated() -> None:
    """Comparisons, arithmetic, and/or, not, constants, boolean returns and ifs all mutate."""
    found = _descriptions(
        "def f(a, b):\n"
        "    if a < b and not a:\n"
        "        return a == b\n"
        "    x = a + 2\n"
        "    x *= 3\n"
        "    return x\n"
    )
    for expected in (
        "`<` -> `<=`",
        "`<` -> `>=`",
        "`and` -> `or`",
        "`not` removed from `not a`",
        "`==` -> `!=`",
        "return negated: `not (a == b)`",
        "`+` -> `-`",
        "constant 2 -> 3",
        "constant 2 -> 1",
        "constant 2 -> 0",
        "`*=` -> `/=`",
        "condition `a < b and (not a)` forced True",
        "condition `a < b and (not a)` forced False",
    ):
        assert expected in found, (expected, found)


def test_tables_lose_and_change_their_string_entries() -> None:
    """A module-level dict/tuple/frozenset: each entry dropped, each string changed."""
    found = _descriptions(
        'KIND = {"a": "x", "b": "y"}\nNAMES = ("p", "q")\nSET = frozenset({"s"})\n'
        'def f():\n    local = {"z": 1}\n    return local\n'
    )
    assert "table entry dropped: `'a'`" in found
    assert "table entry dropped: `'q'`" in found
    assert "table entry dropped: `'s'`" in found
    assert "table string 'x' -> 'x_mutant'" in found
    assert "table string 'p' -> 'p_mutant'" in found
    tables = [d for d in found if d.startswith("table")]
    assert not any("'z'" in d for d in tables), found  # not a module-level table


def test_annotations_docstrings_and_all_are_left_alone() -> None:
    """Nothing in an annotation, a docstring or ``__all__`` is mutated; every mutant compiles."""
    source = (
        '"""Doc 1."""\n__all__ = ["f"]\n'
        "def f(a: int | None = None) -> int | str:\n"
        '    """Doc 2."""\n    return 0\n'
    )
    found = mutate.generate("snippet.py", source.encode())
    assert [m.description for m in found] == [
        "statement deleted: `return 0`",
        "constant 0 -> 1",
        "constant 0 -> -1",
    ]
    for mutant in found:
        compile(mutant.apply(source.encode()), "snippet.py", "exec")
        assert mutant.source_line(source.encode()) == "return 0"


def test_statements_in_functions_are_deleted_and_neighbouring_arguments_swapped() -> None:
    """Inside a function each simple statement (at any depth of its blocks) becomes
    ``pass``; a call's neighbouring positional arguments swap when they differ. A
    module-level statement, a nested definition and identical arguments are left."""
    source = (
        "X = g(1, 2)\n"
        "def f(a, b):\n"
        "    x = g(a, b)\n"
        "    if x:\n"
        "        raise ValueError(a)\n"
        "    for i in range(a, b):\n"
        "        h(i, i)\n"
        "    def inner():\n"
        "        return 1\n"
        "    return x\n"
    )
    mutants = mutate.generate("snippet.py", source.encode())
    found = [m.description for m in mutants]
    for expected in (
        "statement deleted: `x = g(a, b)`",
        "statement deleted: `raise ValueError(a)`",
        "statement deleted: `h(i, i)`",
        "statement deleted: `return x`",
        "statement deleted: `return 1`",
        "arguments 1 and 2 swapped: `g(a, b)`",
        "arguments 1 and 2 swapped: `range(a, b)`",
        "arguments 1 and 2 swapped: `g(1, 2)`",
    ):
        assert expected in found, (expected, found)
    assert "statement deleted: `X = g(1, 2)`" not in found
    assert not any("h(i, i)" in d for d in found if d.startswith("arguments"))
    assert not any(d.startswith("statement deleted: `def") for d in found)
    deleted = next(
        m for m in mutants if m.description == "statement deleted: `raise ValueError(a)`"
    )
    mutated = deleted.apply(source.encode()).decode()
    assert "        pass\n" in mutated and "raise" not in mutated
    compile(mutated, "snippet.py", "exec")


def test_the_command_line_lists_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    """``--list`` prints each selected mutant as number, file:line, mutation and source line."""
    assert mutate.main(["--module", BACKOFF, "--list", "--sample", "2", "--seed", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert all(line.startswith("#") and f"{BACKOFF}:" in line and " | " in line for line in lines)
