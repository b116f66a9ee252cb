"""The import name ``statemachine`` is also PyPI's ``python-statemachine``'s.

Both distributions install into one ``site-packages/statemachine/`` directory, so each
overwrites the other's files: ``import statemachine`` may load either, and uninstalling
one breaks the other (``pip check`` sees nothing). This module tells the clash loudly,
with both names and the fix: at import (a cheap look for the other package's modules
beside ours) and in the CLI (also asking the installed distributions' metadata).
"""

from __future__ import annotations

import os
from importlib import metadata

OTHER = "python-statemachine"
"""The other distribution that installs the import name ``statemachine``."""

FOREIGN_MODULES = ("statemachine.py", "transition.py", "factory.py")
"""Modules of ``python-statemachine`` that this package does not have."""


def message(other_version: str | None = None) -> str:
    """The error: what clashes, why it breaks, and the fix."""
    other = f"{OTHER} {other_version}" if other_version else OTHER
    return (
        f"two distributions install the import name 'statemachine': turnstate (this "
        f"engine) and {other}. They share one directory in site-packages, so each "
        "overwrites the other's files and 'import statemachine' may load either. Fix: "
        f"install them in separate virtual environments, or `pip uninstall -y {OTHER} "
        "turnstate && pip install turnstate` to keep this one."
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
