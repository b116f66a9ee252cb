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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Record which collected test names which requirement ID."""
    for item in items:
        for marker in item.iter_markers("requirement"):
            for requirement in marker.args:
                REQUIREMENT_MARKERS.setdefault(str(requirement), set()).add(item.nodeid)
