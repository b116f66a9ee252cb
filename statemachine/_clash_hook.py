"""The shadowing check that runs whichever ``statemachine`` Python would import.

A wheel of this project (editable or not) installs this file beside the package as
``_turnstate_clash.py`` with ``turnstate-clash.pth``, whose one line calls
:func:`install` at interpreter start-up (``tools/build_backend.py`` adds both). That
matters because the package's own ``__init__`` never runs when it is shadowed: an
editable install's finder comes after the path's, so PyPI's ``python-statemachine`` in
``site-packages`` wins silently, and a non-editable install whose ``__init__.py`` the
other package overwrote runs the other ``__init__``. :class:`ShadowCheck` sits first
on ``sys.meta_path``, answers only for ``statemachine``, asks the finders after it which
directory would be imported, and raises ``ImportError`` with the fix if that directory
holds the other package's modules. Any other import costs one string comparison.

Standard library only, and nothing here imports ``statemachine``.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from importlib.machinery import ModuleSpec
from types import ModuleType

OTHER = "python-statemachine"
"""The other distribution that installs the import name ``statemachine``."""

FOREIGN_MODULES = ("statemachine.py", "transition.py", "factory.py")
"""Modules of ``python-statemachine`` that this package does not have."""


def message(other_version: str | None = None) -> str:
    """The error: what clashes, why it breaks, and the fix."""
    other = f"{OTHER} {other_version}" if other_version else OTHER
    return (
        f"two distributions install the import name 'statemachine': turnstate (this "
        f"engine) and {other}, and Python would import the other one (or a mix of both). "
        f"Fix: `pip uninstall -y {OTHER}`, then reinstall turnstate, whose files it may "
        "have overwritten (`pip install --force-reinstall -e .` in its clone, or "
        "`pip install --force-reinstall` of its wheel); or keep the two in separate "
        "virtual environments. `pip check` cannot see this clash."
    )


def foreign_modules(package_dir: str) -> list[str]:
    """The other package's modules found in ``package_dir`` (one stat each)."""
    return [name for name in FOREIGN_MODULES if os.path.exists(os.path.join(package_dir, name))]


def other_distribution() -> str | None:
    """The installed version of ``python-statemachine``, if it is installed."""
    try:
        return metadata.version(OTHER)
    except metadata.PackageNotFoundError:
        return None


class ShadowCheck:
    """A meta path finder that refuses to import another ``statemachine`` (see the module)."""

    @classmethod
    def find_spec(
        cls, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        """``None`` for every name but ``statemachine``; for it, the spec the finders
        after this one give, unless its directory holds the other package's modules."""
        if name != "statemachine":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is cls or find is None:
                continue
            spec: ModuleSpec | None = find(name, path, target)
            if spec is None:
                continue
            for directory in spec.submodule_search_locations or ():
                if foreign_modules(directory):
                    _refuse_command_line()
                    raise ImportError(message(other_distribution()), name=name)
            return spec
        return None


def _refuse_command_line() -> None:
    """Under ``python -m statemachine``, say the clash as the CLI does and exit 2:
    an ``ImportError`` here would reach the user behind runpy's "Error while finding
    module specification" prefix, with exit code 1. (runpy sets ``sys.argv[0]`` to
    ``-m`` while it looks the module up.)"""
    argv = getattr(sys, "orig_argv", [])
    if sys.argv[:1] == ["-m"] and any(
        flag == "-m" and module.split(".")[0] == "statemachine"
        for flag, module in itertools.pairwise(argv)
    ):
        sys.stderr.write(f"statemachine: error: {message(other_distribution())}\n")
        raise SystemExit(2)


def install() -> None:
    """Put :class:`ShadowCheck` first on ``sys.meta_path`` (once)."""
    if ShadowCheck not in sys.meta_path:
        sys.meta_path.insert(0, ShadowCheck)
