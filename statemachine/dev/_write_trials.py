"""``python -m statemachine.dev._write_trials``: write ``core/_trials.py`` anew.

Run it after a change to the table's rows or guards; ``tests/test_engine_build.py``
fails until the written-out trials are what this writes. It lives here, above the core,
because it reads the engine (``_engine.DISPATCH``, ``_engine.GUARDS``), which imports
the trials it writes.
"""

from __future__ import annotations

from pathlib import Path

from ..core import _builder, _engine, _trials


def main() -> None:
    """Write the trials of the table's groups below ``_trials.py``'s mark."""
    _builder.write_trials(Path(_trials.__file__), _engine.DISPATCH.groups, _engine.GUARDS)


if __name__ == "__main__":
    main()
