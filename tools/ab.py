"""Run benchmarks against an earlier commit's package and this checkout's, in one process.

    python tools/ab.py --base REV --only retry,events [--rounds 3] [--quick]

The base commit's ``statemachine/``, ``benchmarks/`` and ``tests/`` are taken with ``git archive``
into a temporary folder. Both sides are imported into this one interpreter under their
own names in ``sys.modules`` (the set of the side about to run is swapped in before
each call, so a lazy import inside a benchmark loads that side's module), and the
measurements run alternately, base then new, ``--rounds`` times, so a burst of noise
on a shared machine reaches both. Every number of a measurement's result is printed
as the median over rounds of each side, with new / base beside it: a ratio against
another library measured in the same run (``ratios.*``) should stay within 10 %.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

_OURS = ("statemachine", "benchmarks", "tests")
"""The trees each side has its own of (``tests`` for the fakes some benchmarks import,
such as ``benchmarks.frameworks``' fake model server)."""


def _ours(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in _OURS)


def _extract(repo: Path, rev: str) -> Path:
    target = Path(tempfile.gettempdir()) / f"ab-{rev}"
    # only the trees not there yet: another run may be reading the others
    missing = [tree for tree in _OURS if not (target / tree).is_dir()]
    if missing:
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(  # noqa: S603 - read-only git query
            ["git", "-C", str(repo), "archive", rev, *missing],  # noqa: S607
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
            tar.extractall(target, filter="data")
    return target


class Side:
    """One package tree, with the modules it has loaded so far."""

    def __init__(self, label: str, root: Path) -> None:
        self.label = label
        self.root = root
        self.modules: dict[str, ModuleType] = {}

    def enter(self) -> None:
        for name in [n for n in sys.modules if _ours(n)]:
            del sys.modules[name]
        sys.modules.update(self.modules)
        sys.path.insert(0, str(self.root))

    def leave(self) -> None:
        sys.path.remove(str(self.root))
        self.modules = {n: m for n, m in sys.modules.items() if _ours(n)}

    def run(self, names: list[str], quick: bool) -> dict[str, Any]:
        self.enter()
        try:
            main = importlib.import_module("benchmarks.__main__")
            origin = Path(main.__file__ or "").resolve()
            if self.root.resolve() not in origin.parents:
                raise RuntimeError(f"{self.label}: benchmarks came from {origin}")
            result: dict[str, Any] = main.run_all(names, quick=quick, log=lambda _t: None)
            return result
        finally:
            self.leave()


def _leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, float]]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key not in {"machine", "wall_s", "traceback"}:
                yield from _leaves(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield prefix, float(value)


def main() -> int:
    """The command line; see the module docstring."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--only", required=True, help="comma-separated benchmark names")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny counts (a smoke run)")
    args = parser.parse_args()
    here = Path.cwd()
    sides = [Side("base", _extract(here, args.base)), Side("new", here)]
    names = [n for n in args.only.split(",") if n]
    seen: dict[str, dict[str, list[float]]] = {side.label: {} for side in sides}
    for round_ in range(args.rounds):
        for side in sides:
            result = side.run(names, args.quick)
            for name in names:
                if "error" in result[name] or "skipped" in result[name]:
                    print(f"{side.label} {name}: {result[name]}", file=sys.stderr)
            for key, number in _leaves(result):
                seen[side.label].setdefault(key, []).append(number)
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    base, new = seen["base"], seen["new"]
    width = max((len(k) for k in new), default=10)
    print(f"{'measure':<{width}}  {'base':>12}  {'new':>12}  new/base")
    for key in sorted(set(base) & set(new)):
        b, n = statistics.median(base[key]), statistics.median(new[key])
        ratio = f"{n / b:.3f}" if b else "-"
        print(f"{key:<{width}}  {b:>12.4g}  {n:>12.4g}  {ratio}")
    for key in sorted(set(base) ^ set(new)):
        print(f"{key:<{width}}  only in {'base' if key in base else 'new'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
