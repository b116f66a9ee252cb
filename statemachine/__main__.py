"""``python -m statemachine`` and the ``statemachine`` console script.

``simulate`` runs the built-in failure storms, ``diagram`` draws the machine,
``check`` model-checks it; ``--help`` on each says more.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); the exit code."""
    from statemachine import _clash  # noqa: PLC0415 - keep `import` cheap

    other = _clash.other_distribution()
    if other is not None:
        sys.stderr.write(f"statemachine: error: {_clash.message(other)}\n")
        return 2
    from statemachine.dev._cli import main as cli_main  # noqa: PLC0415 - keep `import` cheap

    try:
        return cli_main(argv)
    except BrokenPipeError:
        # The reader went away (`statemachine simulate | head`): not an error of ours.
        # Point stdout at devnull so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
