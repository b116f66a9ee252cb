"""The installed version of the ``turnstate`` distribution: a leaf module, so that no part
of the package imports the package root to learn it."""

from __future__ import annotations

from importlib import metadata

try:
    __version__: str = metadata.version("turnstate")
    """The installed version of the ``turnstate`` distribution."""
except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
    __version__ = "0+unknown"
