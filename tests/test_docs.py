"""The README and the pages under docs/ are true: every Python block runs as written, the
links resolve, the SDK example is the one the tests run, and the command table lists
every flag."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

import statemachine as sm
from statemachine.dev import _cli, _vendor

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


def _marked(page: Path, name: str) -> str:
    """The body of the fenced block between ``<!-- name -->`` and ``<!-- /name -->``."""
    text = page.read_text(encoding="utf-8")
    found = re.search(rf"<!-- {name} -->\n```\w*\n(.*?)```\n<!-- /{name} -->", text, re.S)
    assert found, f"{page.name}: no <!-- {name} --> block"
    return found.group(1)


def _agent_loop() -> str:
    (code,) = [code for _, code in blocks(ROOT / "README.md", "python") if "arun_turn" in code]
    return code


class _Waits:
    """The driver's sleep, recorded instead of slept (the session's clock is real)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.seconds.append(seconds)


def _vendor_env(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "loopback")
    monkeypatch.setenv("OPENAI_BASE_URL", url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "loopback")


def _run_example(
    code: str, monkeypatch: pytest.MonkeyPatch, waits: _Waits, entry: str = "main"
) -> None:
    """Run a page's example as its own module would, its driver's waits recorded."""
    import asyncio
    import functools
    import inspect

    monkeypatch.setattr(sm, "arun_turn", functools.partial(sm.arun_turn, sleep=waits.sleep))
    monkeypatch.setattr(sm, "run_turn", functools.partial(sm.run_turn, sleep=waits.seconds.append))
    namespace: dict[str, object] = {"__name__": "example"}
    exec(compile(code, "example.py", "exec"), namespace)  # noqa: S102 - our own documentation
    result = namespace[entry]()  # type: ignore[operator]
    if inspect.iscoroutine(result):
        asyncio.run(result)


@pytest.mark.requirement("ER-69", "ER-53")
def test_the_readme_agent_loop_runs_offline_as_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's agent loop, run as written against the loopback vendor's default
    script (the SDK finds it through ANTHROPIC_BASE_URL): the first turn waits out the
    429's retry-after and the 529, and runs the tool; the second sends the tool result
    and ends done. It prints what the README shows, and the loop is under 30 lines."""
    code = _agent_loop()
    assert sum(1 for line in code.splitlines() if line.strip()) < 30
    loop = code[code.index("async def main") : code.index('if __name__ == "__main__"')]
    assert sum(1 for line in loop.splitlines() if line.strip()) < 30
    assert code.rstrip().endswith('if __name__ == "__main__":\n    asyncio.run(main())')
    script = _vendor.parse_script(_vendor.DEFAULT_SCRIPT, "default")
    waits = _Waits()
    with _vendor.LoopbackVendor(repeat=True) as vendor:
        for path, responses in script.items():
            vendor.script(path, *responses)
        _vendor_env(monkeypatch, vendor.url)
        _run_example(code, monkeypatch, waits)
        sent = vendor.requests(_vendor.ANTHROPIC)
    assert capsys.readouterr().out == _marked(ROOT / "README.md", "readme-example-output")
    assert len(sent) == 4
    assert len(waits.seconds) == 2
    assert waits.seconds[0] >= 1.0  # the 429's retry-after
    last = sent[-1].body["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user"]
    (result,) = last[2]["content"]
    assert result["type"] == "tool_result"
    assert result["content"] == "Paris: sunny, 21 °C"
    assert result["tool_use_id"] == last[1]["content"][1]["id"]


@pytest.mark.requirement("ER-69", "ER-63")
def test_the_readme_simulate_sample_is_what_simulate_prints() -> None:
    """The README's sample is the first turn of `simulate rate-limit-storm`, and
    docs/simulate.md's excerpt that turn with the scenario's header, as it prints now
    (columns, the start step, the row numbers and guards)."""
    import io

    out = io.StringIO()
    assert _cli.main(["simulate", "rate-limit-storm"], stdout=out) == 0
    lines = out.getvalue().splitlines()
    start = lines.index("  turn 1")
    end = next(i for i, line in enumerate(lines) if line.startswith("  => turn 1"))
    expected = "\n".join(lines[start : end + 1]) + "\n"
    assert _marked(ROOT / "README.md", "simulate-sample") == expected, (
        "regenerate the README's simulate-sample block"
    )
    excerpt = "\n".join(lines[: end + 1]) + "\n"
    assert _marked(ROOT / "docs" / "simulate.md", "simulate-excerpt") == excerpt, (
        "regenerate docs/simulate.md's simulate-excerpt block"
    )


@pytest.mark.requirement("ER-69")
def test_the_pages_count_the_multiplied_retries_alike() -> None:
    """docs/comparison.md and docs/drivers.md give the same count of requests an SDK
    that retries on its own makes under the engine, from both defaults as they are."""
    import anthropic
    import openai

    assert anthropic.DEFAULT_MAX_RETRIES == openai.DEFAULT_MAX_RETRIES
    sdk = anthropic.DEFAULT_MAX_RETRIES + 1
    engine = sm.Settings().max_retries + 1
    claim = f"up to {sdk * engine}\nrequests for one call"
    for name in ("comparison.md", "drivers.md"):
        text = (ROOT / "docs" / name).read_text(encoding="utf-8")
        assert f"SDK's {sdk} attempts" in text, name
        assert f"engine's {engine}" in " ".join(text.split()), name
        assert claim.replace("\n", " ") in " ".join(text.split()), name
        assert "settings above" not in text, name


@pytest.mark.requirement("ER-69")
def test_the_readme_span_tree_is_what_simulate_spans_prints() -> None:
    """The README's span tree is reproduced by the command its text names."""
    import io

    block = (ROOT / "README.md").read_text(encoding="utf-8")
    command = re.search(r"`python -m statemachine (simulate --spans [^`]+)`", block)
    assert command, "the README names no command that prints its span tree"
    out = io.StringIO()
    assert _cli.main(command.group(1).split(), stdout=out) == 0
    printed = out.getvalue().split("\n", 1)[1]  # under its "== scenario" line
    assert f"```text\n{printed}```\n<!-- /otel-span-tree -->" in block


def test_the_fast_lanes_slow_modules_exist() -> None:
    """Every module the fast lane leaves out (tests/conftest.py) is a test module here:
    a renamed one would silently run in the fast lane."""
    from .conftest import SLOW_MODULES

    assert all((ROOT / "tests" / name).is_file() for name in SLOW_MODULES), SLOW_MODULES


DRIVER_EXAMPLES = [
    code for _, code in blocks(ROOT / "docs" / "drivers.md", "python") if "def main" in code
]


@pytest.mark.requirement("ER-69", "ER-53")
@pytest.mark.parametrize(
    "code",
    DRIVER_EXAMPLES,
    ids=[
        ("async-" if "async def main" in code else "sync-")
        + ("openai" if "import openai" in code else "anthropic")
        for code in DRIVER_EXAMPLES
    ],
)
def test_each_drivers_page_example_runs_offline_and_prints_what_the_readme_shows(
    code: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/drivers.md's examples (each SDK, sync and async), as written, against the
    loopback vendor's default script: two retries, a tool round, an answer; each prints
    the README's output, and the model saw the tool result in its own API's form."""
    script = _vendor.parse_script(_vendor.DEFAULT_SCRIPT, "default")
    waits = _Waits()
    with _vendor.LoopbackVendor(repeat=True) as vendor:
        for path, responses in script.items():
            vendor.script(path, *responses)
        _vendor_env(monkeypatch, vendor.url)
        _run_example(code, monkeypatch, waits)
        anthropic, openai = vendor.requests(_vendor.ANTHROPIC), vendor.requests(_vendor.OPENAI)
    assert capsys.readouterr().out == _marked(ROOT / "README.md", "readme-example-output")
    assert len(waits.seconds) == 2
    assert waits.seconds[0] >= 1.0
    sent = openai if "import openai" in code else anthropic
    assert (len(anthropic) + len(openai), len(sent)) == (4, 4)
    last = sent[-1].body["messages"]
    if sent is openai:
        assert [m["role"] for m in last] == ["user", "assistant", "tool"]
        assert last[2]["tool_call_id"] == last[1]["tool_calls"][0]["id"]
    else:
        assert [m["role"] for m in last] == ["user", "assistant", "user"]
    assert "Paris: sunny, 21 °C" in json.dumps(last[2], ensure_ascii=False)


def test_there_is_an_example_per_sdk_and_driver() -> None:
    """Four examples: Anthropic and OpenAI, each with run_turn and with arun_turn."""
    kinds = {
        ("openai" if "import openai" in code else "anthropic", "async def main" in code)
        for code in [*DRIVER_EXAMPLES, _agent_loop()]
    }
    assert kinds == {(sdk, run_async) for sdk in ("anthropic", "openai") for run_async in (0, 1)}


@pytest.mark.requirement("ER-69")
def test_the_drivers_page_shows_the_vendors_default_script() -> None:
    """The script docs/drivers.md prints is the one `vendor` serves without --script."""
    assert _marked(ROOT / "docs" / "drivers.md", "vendor-default-script") == _vendor.DEFAULT_SCRIPT


@pytest.mark.slow
@pytest.mark.requirement("ER-69")
def test_the_readme_agent_loop_runs_against_the_vendor_command(tmp_path: Path) -> None:
    """What the README tells a newcomer to type: `python -m statemachine vendor` in one
    process (a free port here), the example saved as example.py run in another with
    ANTHROPIC_BASE_URL pointing at it, real waits and all. Its output is the README's."""
    import os
    import subprocess
    import sys

    (tmp_path / "example.py").write_text(_agent_loop(), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    vendor = subprocess.Popen(
        [sys.executable, "-m", "statemachine", "vendor", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert vendor.stdout is not None
        first = vendor.stdout.readline()
        url = re.search(r"on (http://127\.0\.0\.1:\d+):", first)
        assert url, first
        env |= {"ANTHROPIC_BASE_URL": url.group(1), "ANTHROPIC_API_KEY": "loopback"}
        example = subprocess.run(
            [sys.executable, "example.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        vendor.terminate()
        log, _ = vendor.communicate(timeout=30)
    assert example.returncode == 0, example.stderr
    assert example.stdout == _marked(ROOT / "README.md", "readme-example-output")
    assert "POST /v1/messages -> 429 (retry-after: 1)" in log
    assert "POST /v1/messages -> 200 tool call: get_weather" in log


@pytest.mark.requirement("ER-69")
def test_the_readme_command_table_lists_every_command_and_flag() -> None:
    """Each subcommand of the CLI has a row in the README's command table naming every
    one of its options."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z]+) [^|]*\|.*$", readme, re.M)}
    parser = _cli._parser()
    (commands,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    assert set(rows) == set(commands.choices)
    for name, sub in commands.choices.items():
        for action in sub._actions:
            for flag in action.option_strings:
                if flag in ("-h", "--help"):
                    continue
                assert flag in rows[name], f"{name}: {flag} is not in the README's table"


def test_the_layout_page_names_every_module_and_only_modules_that_exist() -> None:
    """docs/layout.md is the package's map: each module of ``statemachine/`` is named
    under its folder's heading, and each name there is a module of that folder."""
    page = (ROOT / "docs" / "layout.md").read_text("utf-8")
    named: set[str] = set()
    for section in re.split(r"^## ", page, flags=re.M)[1:]:
        folder = re.match(r"`statemachine/`|`(\w+)/`", section)
        assert folder is not None, section[:60]
        base = ROOT / "statemachine" / (folder.group(1) or "")
        for row in re.findall(r"^\| (.+?) \| .+ \|$", section, flags=re.M):
            sub = re.match(r"`(\w+)/` \((.*)\)", row)
            if sub:
                files = [
                    base / sub.group(1) / n for n in re.findall(r"`([\w.]+\.py)`", sub.group(2))
                ]
            else:
                files = [base / n for n in re.findall(r"`([\w.]+\.py)`", row)]
            named |= {f.relative_to(ROOT).as_posix() for f in files}
    modules = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "statemachine").rglob("*.py")
        if p.name != "__init__.py" or p.parent.name in ("statemachine", "check")
    }
    assert sorted(modules - named) == []
    assert sorted(named - modules) == []
