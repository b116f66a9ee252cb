"""Measurement 5b: hypothesis examples per second of the stateful suite.

Runs ``pytest tests/test_stateful.py --hypothesis-show-statistics`` in a subprocess
(a fixed seed, the profile the environment selects, ``HYPOTHESIS_PROFILE`` or the
suite's default) and reads hypothesis' own statistics: for each test, the examples
it ran (passing + failing + invalid) and the seconds its phases took. Examples per
second = examples / phase seconds, per test and in total. For a stateful test one
example is one whole run of rules (a sequence of steps on a fresh machine).
Skips with a message if the suite does not exist.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "tests" / "test_stateful.py"

_TEST = re.compile(r"^(\S+::\S+):\s*$")
_PHASE = re.compile(r"during (\w+) phase \(([\d.]+) seconds\)")
_COUNTS = re.compile(r"(\d+) passing examples?, (\d+) failing examples?, (\d+) invalid examples?")


def parse_statistics(text: str) -> dict[str, dict[str, float]]:
    """``{test id: {"examples": n, "invalid": k, "seconds": s}}`` from hypothesis'
    statistics output (``examples`` counts passing, failing and invalid ones)."""
    tests: dict[str, dict[str, float]] = {}
    current: dict[str, float] | None = None
    for line in text.splitlines():
        match = _TEST.match(line.strip())
        if match:
            current = tests.setdefault(
                match.group(1), {"examples": 0.0, "invalid": 0.0, "seconds": 0.0}
            )
            continue
        if current is None:
            continue
        phase = _PHASE.search(line)
        if phase:
            current["seconds"] += float(phase.group(2))
            continue
        counts = _COUNTS.search(line)
        if counts:
            current["examples"] += sum(int(g) for g in counts.groups())
            current["invalid"] += int(counts.group(3))
    return tests


def run(suite: Path = SUITE, seed: int = 0, timeout: float = 180.0) -> dict[str, Any]:
    """Examples/s of each test of ``suite`` and overall (or a skip message)."""
    if not suite.exists():
        return {"skipped": f"{suite.relative_to(ROOT)} does not exist yet"}
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(suite),
        "-q",
        "-p",
        "no:cacheprovider",
        "--hypothesis-show-statistics",
        f"--hypothesis-seed={seed}",
    ]
    t0 = time.perf_counter()
    done = subprocess.run(  # noqa: S603 - our own interpreter on our own test file
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        check=False,
    )
    wall = time.perf_counter() - t0
    tests = parse_statistics(done.stdout)
    if not tests:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        return {"skipped": f"no hypothesis statistics (pytest exit {done.returncode}): {tail}"}
    examples = sum(t["examples"] for t in tests.values())
    seconds = sum(t["seconds"] for t in tests.values())
    return {
        "profile": os.environ.get("HYPOTHESIS_PROFILE", "(suite default)"),
        "pytest_exit": done.returncode,
        "pytest_wall_s": wall,
        "tests": {
            name: {**t, "examples_per_s": t["examples"] / t["seconds"] if t["seconds"] else 0.0}
            for name, t in tests.items()
        },
        "examples": examples,
        "seconds": seconds,
        "examples_per_s": examples / seconds if seconds else 0.0,
    }
