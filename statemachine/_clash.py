"""The import name ``statemachine`` is also PyPI's ``python-statemachine``'s.

Both distributions install into one ``site-packages/statemachine/`` directory, so each
overwrites the other's files: ``import statemachine`` may load either, and uninstalling
one breaks the other (``pip check`` sees nothing). The clash is told loudly, with both
names and the fix: at import by this package (a cheap look for the other package's
modules beside ours), at import by :mod:`statemachine._clash_hook` when the other
package shadows this one (it is installed to run before any ``statemachine`` is
imported), and in the CLI (also asking the installed distributions' metadata).
"""

from __future__ import annotations

from ._clash_hook import FOREIGN_MODULES, OTHER, foreign_modules, message, other_distribution

__all__ = ["FOREIGN_MODULES", "OTHER", "foreign_modules", "message", "other_distribution"]
