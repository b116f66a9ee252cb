"""What every session store shares: key naming, and the byte boundary.

Records (JSON objects, see ``_record``) cross this module's boundary as bytes, so the
size limit and the JSON checks are the same for every backend, and a store never hands
back anything it could not parse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import attrs

from ..core._exceptions import ConfigError
from ._errors import CorruptSession, InvalidSessionId, RecordTooLarge, oversized

SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""Session ids and tenant names: letters, digits, ``.``, ``_``, ``-``; 1 to 128 of them.

No ``:`` (the key separator), no ``*?[]`` (Redis glob characters), no whitespace: an
id can only ever name its own key, never another tenant's."""

PREFIX_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,64}")

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
"""Records larger than this (4 MiB) are refused on write and reported corrupt on read."""


@attrs.frozen
class Stored:
    """One session's record as read from a store, with the version it was read at."""

    session_id: str
    version: int
    record: dict[str, Any]


@runtime_checkable
class SessionStore(Protocol):
    """Where session records live. Versions start at 1; 0 means "no record".

    Implementations validate session ids, keep records as JSON with a size limit,
    and make ``compare_and_set`` atomic: of two writers that read version n, one
    writes n + 1 and the other gets :class:`StaleWrite`.
    """

    def load(self, session_id: str) -> Stored:
        """The record and its version; :class:`SessionNotFound` if there is none,
        :class:`CorruptSession` if it cannot be read (left untouched)."""
        ...

    def compare_and_set(
        self,
        session_id: str,
        expected_version: int,
        record: Mapping[str, Any],
        *,
        ended: bool = False,
    ) -> int:
        """Write ``record`` if the stored version is ``expected_version`` (0 to
        create); return the new version. ``ended`` marks an ended session (its TTL
        applies). Raises :class:`StaleWrite` / :class:`SessionNotFound`, writing nothing."""
        ...

    def delete(self, session_id: str) -> bool:
        """Remove the record; whether there was one."""
        ...


def check_name(value: object, what: str = "session id") -> str:
    """``value`` if it is a valid session id (or tenant name), else ``InvalidSessionId``."""
    if not isinstance(value, str) or SESSION_ID_PATTERN.fullmatch(value) is None:
        raise InvalidSessionId(
            f"{what} {value!r} is invalid: use 1 to 128 of A-Z a-z 0-9 . _ -",
            session_id=value if isinstance(value, str) else None,
        )
    return value


def key_prefix(prefix: str, tenant: str | None) -> str:
    """``prefix[:tenant]:session:`` after checking both parts."""
    if not isinstance(prefix, str) or PREFIX_PATTERN.fullmatch(prefix) is None:
        raise InvalidSessionId(f"prefix {prefix!r} is invalid: use 1 to 64 of A-Z a-z 0-9 . _ - :")
    if tenant is None:
        return f"{prefix}:session:"
    return f"{prefix}:{check_name(tenant, 'tenant')}:session:"


def check_max_bytes(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 256:
        raise ConfigError(f"max_bytes: must be an int >= 256, got {value!r}")
    return value


def check_ttl(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"ended_ttl_s: must be a number > 0 or None, got {value!r}")
    if value == float("inf"):
        return None
    return float(value)


def check_version(session_id: str, version: object) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(
            f"session {session_id!r}: expected_version must be an int >= 0, got {version!r}"
        )
    return version


def encode_record(session_id: str, record: Mapping[str, Any], max_bytes: int) -> bytes:
    """``record`` as compact UTF-8 JSON, or ``RecordTooLarge`` / ``ValueError``."""
    try:
        payload = json.dumps(
            record, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except (TypeError, ValueError) as exc:
        raise ValueError(f"session {session_id!r}: the record is not JSON data: {exc}") from None
    return check_payload(session_id, payload, max_bytes)


def check_payload(session_id: str, payload: bytes, max_bytes: int) -> bytes:
    """``payload`` if it fits in ``max_bytes``, else ``RecordTooLarge``."""
    if len(payload) > max_bytes:
        raise RecordTooLarge(
            f"session {session_id!r}: the record is {len(payload)} bytes, "
            f"over the store's max_bytes ({max_bytes}); nothing was written",
            session_id=session_id,
        )
    return payload


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_record(session_id: str, payload: object, max_bytes: int) -> dict[str, Any]:
    """The JSON object in ``payload``, or ``CorruptSession`` naming the session."""
    if isinstance(payload, str):
        payload = payload.encode()
    if not isinstance(payload, bytes | bytearray):
        raise CorruptSession(
            f"session {session_id!r}: the stored record is not text ({type(payload).__name__})",
            session_id=session_id,
        )
    if len(payload) > max_bytes:
        raise oversized(session_id, len(payload), max_bytes)
    try:
        data = json.loads(bytes(payload).decode(), parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise CorruptSession(
            f"session {session_id!r}: the stored record is not valid JSON "
            f"(truncated or corrupted): {reason}",
            session_id=session_id,
        ) from None
    if not isinstance(data, dict):
        raise CorruptSession(
            f"session {session_id!r}: the stored record is not a JSON object "
            f"({type(data).__name__})",
            session_id=session_id,
        )
    return data


def record_incarnation(record: Mapping[str, Any]) -> str | None:
    """The incarnation a record names, if it names one."""
    incarnation = record.get("incarnation")
    return incarnation if type(incarnation) is str and incarnation else None
