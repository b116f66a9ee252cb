"""Packaging: the right ``statemachine`` is imported and the public surface is the contract's."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path
from typing import Any

import pytest

import statemachine as sm

ROOT = Path(__file__).parent.parent

CONTRACT_NAMES = {
    "Settings", "ConfigError", "ErrorCategory", "ToolErrorCategory", "ModelError", "classify",
    "Session", "SessionEnded", "SessionStatus", "Assemble", "CallModel", "Wait", "InvokeTools",
    "Finish", "Assembled", "CannotShrink", "ModelReplied", "ToolCall", "ModelFailed", "WaitDone",
    "ToolsDone", "ToolOutcome", "ToolResult", "IllegalEvent", "TurnStatus", "run_turn",
    "arun_turn",
}  # fmt: skip


def test_the_imported_package_is_this_repository() -> None:
    """``import statemachine`` gives this project, not PyPI's python-statemachine, which
    uses the same import name."""
    assert Path(sm.__file__).resolve().parent == (ROOT / "statemachine").resolve()
    dist = importlib.metadata.distribution("turnstate")
    assert dist.metadata["Name"] == "turnstate"
    assert "statemachine" in (dist.read_text("top_level.txt") or "statemachine")


def test_public_surface_holds_every_contract_name_and_is_sorted() -> None:
    """Every name of ``api.md`` is importable from the top level; ``__all__`` is sorted
    and names only what exists."""
    assert set(sm.__all__) >= CONTRACT_NAMES
    assert sm.__all__ == sorted(sm.__all__)
    for name in sm.__all__:
        assert hasattr(sm, name), name


def test_enums_are_str_valued_and_statuses_distinct() -> None:
    """Categories and statuses compare equal to their string values, each distinct."""
    assert sm.ErrorCategory.RATE_LIMITED == "rate_limited"
    for enum in (sm.ErrorCategory, sm.ToolErrorCategory, sm.TurnStatus, sm.SessionStatus):
        values = [member.value for member in enum]
        assert len(values) == len(set(values))
        assert all(isinstance(member, str) for member in enum)
    contract_statuses = {
        "completed", "content_filtered", "auth_error", "invalid_request", "context_exhausted",
        "retries_exhausted", "retry_ceiling_reached", "budget_exhausted", "breaker_open",
        "unknown_error",
    }  # fmt: skip
    assert contract_statuses <= {s.value for s in sm.TurnStatus}


def test_package_is_typed() -> None:
    """The package ships ``py.typed`` for type checkers."""
    assert (ROOT / "statemachine" / "py.typed").exists()


def test_version_is_the_installed_distributions() -> None:
    """``statemachine.__version__`` is the installed ``turnstate`` version."""
    from importlib import metadata

    import statemachine

    assert statemachine.__version__ == metadata.version("turnstate")


def test_import_loads_no_dev_tool() -> None:
    """``import statemachine`` imports none of the dev tools (model check, simulate,
    scenarios, diagrams, CLI): they live in ``statemachine.dev``."""
    import subprocess
    import sys

    code = (
        "import sys, statemachine, statemachine.providers, statemachine.tools, "
        "statemachine.store; "
        "print(sorted(m for m in sys.modules if m.startswith('statemachine.dev')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


_EXTRAS = {
    "statemachine.otel": ("opentelemetry", "otel"),
    "statemachine.temporal": ("temporalio", "temporal"),
    "statemachine.mcp": ("mcp", "mcp"),
    "statemachine.integrations.pydantic_ai": ("pydantic_ai", "pydantic-ai"),
    "statemachine.integrations.openai_agents": ("agents", "openai-agents"),
}


@pytest.mark.parametrize("module", sorted(_EXTRAS))
def test_a_module_whose_extra_is_missing_names_the_extra(module: str) -> None:
    """Importing an optional module without its extra raises an ``ImportError`` that
    names the module, the ``pip install`` line of its extra and what was missing, not a
    bare "No module named" from deep inside (the extra is hidden in a fresh
    interpreter by a finder that refuses its top-level package)."""
    import subprocess
    import sys

    package, extra = _EXTRAS[module]
    code = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {package!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    message = out.stdout.strip()
    assert message.startswith(f"{module} needs "), message
    assert f"pip install 'turnstate[{extra}]'" in message
    assert f"No module named '{package}" in message


def _copy_with(tmp_path: Path, *, module: str | None = None, dist_info: bool = False) -> Path:
    """This package copied under ``tmp_path``, as if ``python-statemachine`` had been
    installed beside it: one of its modules dropped into the package directory, or its
    dist-info next to it (what pip leaves in site-packages)."""
    import shutil

    shutil.copytree(ROOT / "statemachine", tmp_path / "statemachine")
    if module is not None:
        (tmp_path / "statemachine" / module).write_text("class StateMachine: ...\n")
    if dist_info:
        info = tmp_path / "python_statemachine-2.5.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: python-statemachine\nVersion: 2.5.0\n"
        )
    return tmp_path


def _run(path: Path, *args: str) -> Any:
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(path)}
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=path,
        check=False,
        timeout=120,
    )


def test_the_import_name_clash_is_an_error_naming_both_distributions(tmp_path: Path) -> None:
    """With python-statemachine's files in the package directory, ``import statemachine``
    raises ImportError naming both distributions and the fix; without them it imports."""
    clean = _run(_copy_with(tmp_path / "clean"), "-c", "import statemachine")
    assert clean.returncode == 0, clean.stderr
    clashed = _run(
        _copy_with(tmp_path / "clash", module="statemachine.py"), "-c", "import statemachine"
    )
    assert clashed.returncode != 0
    assert "ImportError: two distributions install the import name 'statemachine'" in clashed.stderr
    assert "turnstate" in clashed.stderr and "python-statemachine" in clashed.stderr
    assert "pip uninstall -y python-statemachine`, then reinstall turnstate" in clashed.stderr


def test_the_cli_reports_the_clash_and_exits_2(tmp_path: Path) -> None:
    """With python-statemachine installed (its dist-info on the path), the CLI says so,
    with the installed version and the fix, and exits 2 instead of crashing later."""
    done = _run(_copy_with(tmp_path, dist_info=True), "-m", "statemachine", "simulate", "--list")
    assert done.returncode == 2
    assert done.stderr.startswith("statemachine: error: two distributions")
    assert "python-statemachine 2.5.0" in done.stderr


def test_a_shadowing_package_is_refused_by_the_start_up_check(tmp_path: Path) -> None:
    """The check a wheel installs (statemachine/_clash_hook.py as _turnstate_clash, run
    from its .pth) refuses ``import statemachine`` when the directory Python would
    import holds python-statemachine's modules, whoever's ``__init__`` is there (ours,
    as in a shared site-packages, or the other's, as when it shadows an editable
    install); a clean directory imports; other imports are not touched."""
    import shutil

    hook = tmp_path / "hook"
    hook.mkdir()
    shutil.copy(ROOT / "statemachine" / "_clash_hook.py", hook / "_turnstate_clash.py")
    other = tmp_path / "other" / "statemachine"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("from .statemachine import StateMachine\n")
    (other / "statemachine.py").write_text("class StateMachine: ...\n")
    start = f"import sys; sys.path.insert(0, {str(hook)!r}); import _turnstate_clash; "
    start += "_turnstate_clash.install(); import json, email; "
    shadowed = _run(tmp_path / "other", "-c", start + "import statemachine")
    assert shadowed.returncode != 0
    assert "ImportError: two distributions install the import name 'statemachine'" in (
        shadowed.stderr
    )
    assert "pip uninstall -y python-statemachine" in shadowed.stderr
    mixed = _run(
        _copy_with(tmp_path / "mixed", module="transition.py"), "-c", start + "import statemachine"
    )
    assert "ImportError: two distributions" in mixed.stderr
    clean = _run(
        _copy_with(tmp_path / "clean"),
        "-c",
        start + "import statemachine; print(statemachine.Session)",
    )
    assert clean.returncode == 0, clean.stderr
    assert "Session" in clean.stdout


def _fake_other_wheel(directory: Path) -> Path:
    """A wheel of "python-statemachine" with its package's signature modules."""
    import base64
    import hashlib
    import zipfile

    files = {
        "statemachine/__init__.py": b"from .statemachine import StateMachine\n",
        "statemachine/statemachine.py": b"class StateMachine: ...\n",
        "statemachine/factory.py": b"",
        "python_statemachine-2.5.0.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: python-statemachine\nVersion: 2.5.0\n"
        ),
        "python_statemachine-2.5.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    record += "python_statemachine-2.5.0.dist-info/RECORD,,\n"
    wheel = directory / "python_statemachine-2.5.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("python_statemachine-2.5.0.dist-info/RECORD", record)
    return wheel


@pytest.mark.slow
@pytest.mark.parametrize("editable", [True, False], ids=["editable", "wheel"])
def test_a_shadowed_install_in_a_venv_is_reported_with_the_fix(
    tmp_path: Path, editable: bool
) -> None:
    """In a fresh virtual environment: this project installed (editable, as the README's
    first command does, or from its wheel), then python-statemachine over it:
    ``import statemachine`` and the CLI fail naming both and the fix, where the
    editable install used to load the other package silently. The fix as told
    (uninstall the other, force-reinstall this one) imports this project again. (pip
    builds this project as a user's would: its build requirements come from the index.)"""
    import subprocess
    import sys

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    other = _fake_other_wheel(wheels)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")

    def pip(*args: str) -> None:
        subprocess.run(
            [python, "-m", "pip", "-q", "--disable-pip-version-check", *args],
            check=True,
            timeout=300,
            capture_output=True,
        )

    where = "import importlib.util as u; print(u.find_spec('statemachine').origin)"
    ours = ["-e", str(ROOT)] if editable else [str(ROOT)]
    pip("install", "--no-deps", *ours)
    pip("install", "--no-deps", str(other))
    for argv in (["-c", "import statemachine"], ["-c", where], ["-m", "statemachine"]):
        shadowed = subprocess.run(
            [python, *argv], capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path
        )
        assert shadowed.returncode != 0, argv
        if argv[0] == "-m":  # said as the CLI says it, not behind runpy's prefix
            assert shadowed.returncode == 2, shadowed.stderr
            assert shadowed.stderr.startswith("statemachine: error: two distributions")
        assert "two distributions install the import name 'statemachine'" in shadowed.stderr
        assert "python-statemachine 2.5.0" in shadowed.stderr
        assert "pip uninstall -y python-statemachine" in shadowed.stderr
    pip("uninstall", "-y", "python-statemachine")
    pip("install", "--no-deps", "--force-reinstall", *ours)
    fixed = subprocess.run(
        [python, "-c", where], capture_output=True, text=True, timeout=120, check=True, cwd=tmp_path
    )
    expected = ROOT / "statemachine" if editable else venv / "lib"
    assert Path(fixed.stdout.strip()).is_relative_to(expected), fixed.stdout
