"""The build backend: setuptools', plus the shadowing check every wheel installs.

``pyproject.toml`` names this module (``backend-path = ["tools"]``). Each wheel
setuptools builds, editable or not, gets two more files at its root:
``_turnstate_clash.py`` (a copy of ``statemachine/_clash_hook.py``) and
``turnstate-clash.pth``, whose line installs that check at interpreter start-up, so
``import statemachine`` raises an ImportError with the fix when PyPI's
``python-statemachine`` would be imported in place of this project. setuptools has
no option for a file at a wheel's root that an editable install also gets; a wheel
is a zip with a RECORD of hashes, so both are added here and RECORD is rewritten.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - the rest of the PEP 517 hooks unchanged

ROOT = Path(__file__).resolve().parent.parent
HOOK_MODULE = "_turnstate_clash.py"
PTH = "turnstate-clash.pth"
PTH_LINE = "import _turnstate_clash; _turnstate_clash.install()\n"


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    name = _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    _add_hook(Path(wheel_directory) / name)
    return name


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    name = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    _add_hook(Path(wheel_directory) / name)
    return name


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def _add_hook(wheel: Path) -> None:
    """Rewrite ``wheel`` with the hook module and its .pth at its root, in RECORD."""
    added = {
        HOOK_MODULE: (ROOT / "statemachine" / "_clash_hook.py").read_bytes(),
        PTH: PTH_LINE.encode(),
    }
    rewritten = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(
        rewritten, "w", compression=zipfile.ZIP_DEFLATED
    ) as target:
        (record,) = [n for n in source.namelist() if n.endswith(".dist-info/RECORD")]
        for item in source.infolist():
            if item.filename not in (record, *added):
                target.writestr(item, source.read(item))
        for name, data in added.items():
            target.writestr(name, data)
        lines = [
            line + "\n"
            for line in source.read(record).decode().splitlines()
            if line and line.split(",", 1)[0] not in added
        ]
        lines[-1:-1] = [_record_line(name, data) for name, data in added.items()]
        target.writestr(record, "".join(lines))
    os.replace(rewritten, wheel)
