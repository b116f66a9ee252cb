"""The pieces of JSON text every store record is built from: :func:`json_text` and
:func:`number_text`, written as ``json.dumps`` writes a record (compact, UTF-8, no NaN)."""

from __future__ import annotations

import json
from json.encoder import encode_basestring
from typing import Any


def _not_json(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_py_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
"""The encoding every store record uses: compact, UTF-8, no NaN."""
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
# json's C encoder, built once (JSONEncoder.encode builds one per call, most of the
# cost of encoding a small value); the same output as _py_dumps.
_c_encode = (
    None
    if _c_make_encoder is None
    # markers None: no circular check (the engine's data is checked acyclic when it comes
    # in), and no dict shared between calls or threads
    else _c_make_encoder(None, _not_json, encode_basestring, None, ":", ",", False, False, False)
)


def json_text(value: Any) -> str:
    """``value`` (plain JSON data) as the compact JSON text a store record holds."""
    if _c_encode is None:  # pragma: no cover - CPython always has the C encoder
        return _py_dumps(value)
    if type(value) is str:
        return encode_basestring(value)
    return "".join(_c_encode(value, 0))


def number_text(value: float) -> str:
    """A number as JSON writes it: ``float.__repr__`` for a float (a float subclass, such
    as numpy's, goes through the encoder, which writes it the same way), ``int``'s for
    an int."""
    kind = type(value)
    if kind is float:
        return float.__repr__(value)
    if kind is int:
        return int.__repr__(value)
    return json_text(value)
