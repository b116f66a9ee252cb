"""Shared test configuration: hypothesis profiles and the requirement markers.

Profiles (select with ``HYPOTHESIS_PROFILE``; ``ci`` is the default):

* ``ci``: derandomized, a bounded number of examples, no example database (nothing
  is written into the repository), every failure printed as runnable code;
* ``fuzz``: many more examples, random seeds, the database kept under
  ``$HYPOTHESIS_DATABASE_DIR`` (default: a directory in the system temp dir).

The ``requirement`` marker IDs of every collected test are gathered into
``REQUIREMENT_MARKERS`` (``tests/test_requirements.py`` checks them against
``specs/requirements*.toml``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.database import DirectoryBasedExampleDatabase

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=100,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz",
    max_examples=20_000,
    deadline=None,
    print_blob=True,
    database=DirectoryBasedExampleDatabase(
        os.environ.get(
            "HYPOTHESIS_DATABASE_DIR",
            str(Path(tempfile.gettempdir()) / "statemachine-hypothesis"),
        )
    ),
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "debug",
    parent=settings.get_profile("ci"),
    verbosity=Verbosity.verbose,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

REQUIREMENT_MARKERS: dict[str, set[str]] = {}
"""requirement ID -> node IDs of the collected tests that name it."""

SLOW_MODULES = frozenset(
    {
        "test_benchmarks_smoke.py",  # runs every benchmark once
        "test_check.py",  # the exhaustive model check, on many settings
        "test_diagrams.py",  # graphviz renders
        "test_fuzz.py",
        "test_incident.py",  # a headless browser
        "test_integration_scenarios.py",
        "test_mcp_crash.py",  # real MCP server processes, killed mid-call
        "test_mutants.py",  # the model check against planted bugs
        "test_mutation_sample.py",  # mutation runs
        "test_stateful.py",  # hypothesis state machines
        "test_store_redis.py",  # a redis-server
        "test_temporal.py",  # a Temporal dev server
    }
)
"""Modules whose every test is ``slow``: the fast lane (``pytest -m "not slow"``) leaves
them out (single tests elsewhere carry ``@pytest.mark.slow`` themselves)."""


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects, so every test is seen
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of :data:`SLOW_MODULES` slow, and record which collected test
    names which requirement ID."""
    for item in items:
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        for marker in item.iter_markers("requirement"):
            for requirement in marker.args:
                REQUIREMENT_MARKERS.setdefault(str(requirement), set()).add(item.nodeid)
