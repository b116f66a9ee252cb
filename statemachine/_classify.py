"""``classify``: turn what a real provider gives you into a ``ModelError``.

(Placeholder signature; the classification table lands with the drivers issue.)
"""

from __future__ import annotations

from ._model_error import ModelError


def classify(obj: object) -> ModelError:
    """Classify an SDK exception, an ``httpx.Response`` or ``(status, headers, body)``."""
    raise NotImplementedError("classify() is not implemented yet")
