"""The README and the pages under docs/ are true: every Python block runs as written, the
links resolve, the SDK example is the one the tests run, and the command table lists
every flag."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from statemachine.dev import _cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"(<!-- not-run -->\s*)?```(\w+)\n(.*?)```", re.DOTALL)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def blocks(path: Path, language: str) -> list[tuple[bool, str]]:
    """(runs, code) of each fenced ``language`` block of the page, in order; a block
    right after ``<!-- not-run -->`` does not run (it needs a server)."""
    text = path.read_text(encoding="utf-8")
    return [(not m.group(1), m.group(3)) for m in BLOCK.finditer(text) if m.group(2) == language]


def _imported_modules(code: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


@pytest.mark.requirement("ER-69")
@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_python_block_of_a_page_runs(page: Path) -> None:
    """The page's Python blocks run in order in one namespace (as a reader pasting them
    one after the other would); a not-run block compiles and everything it imports
    exists."""
    namespace: dict[str, object] = {"__name__": "docs"}
    for runs, code in blocks(page, "python"):
        compiled = compile(code, str(page), "exec")
        if runs:
            exec(compiled, namespace)  # noqa: S102 - our own documentation
        else:
            for module in _imported_modules(code):
                assert importlib.util.find_spec(module) is not None, f"{page.name}: {module}"


@pytest.mark.requirement("ER-69")
def test_the_pages_link_to_files_that_exist() -> None:
    missing = []
    for page in PAGES:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, missing


@pytest.mark.requirement("ER-69")
def test_the_readme_sdk_example_is_the_one_the_tests_run() -> None:
    """tests/servers/readme_example.py holds the README's SDK block verbatim (it is run
    against a loopback server by tests/test_sdk_e2e.py), and the block runs as a script
    with asyncio.run behind a main guard."""
    (sdk,) = [code for _, code in blocks(ROOT / "README.md", "python") if "arun_turn" in code]
    example = (ROOT / "tests" / "servers" / "readme_example.py").read_text(encoding="utf-8")
    assert example.split("# --- README snippet ---\n", 1)[1] == sdk
    assert sdk.rstrip().endswith('if __name__ == "__main__":\n    asyncio.run(main())')
    assert "ANTHROPIC_API_KEY" in sdk


@pytest.mark.requirement("ER-69")
def test_the_readme_command_table_lists_every_command_and_flag() -> None:
    """Each subcommand of the CLI has a row in the README's command table naming every
    one of its options."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = {
        m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z]+) [^|]*\|.*$", readme, re.M)
    }
    parser = _cli._parser()
    (commands,) = [
        a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"
    ]
    assert set(rows) == set(commands.choices)
    for name, sub in commands.choices.items():
        for action in sub._actions:
            for flag in action.option_strings:
                if flag in ("-h", "--help"):
                    continue
                assert flag in rows[name], f"{name}: {flag} is not in the README's table"
