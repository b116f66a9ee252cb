"""What every session store shares: the errors, key naming, and the byte boundary.

A store keeps one *record* per session: a JSON object (see ``_store_record``) and a
version number that goes up by one on every write. Records cross this module's
boundary as bytes, so the size limit and the JSON checks are the same for every
backend, and a store never hands back anything it could not parse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

from ..core._exceptions import ConfigError, SnapshotError

SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""Session ids and tenant names: letters, digits, ``.``, ``_``, ``-``; 1 to 128 of them.

No ``:`` (the key separator), no ``*?[]`` (Redis glob characters), no whitespace: an
id can only ever name its own key, never another tenant's."""

PREFIX_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,64}")

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
"""Records larger than this (4 MiB) are refused on write and reported corrupt on read."""


class StoreError(Exception):
    """Base class of the store's errors; ``session_id`` names the session concerned."""

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class InvalidSessionId(StoreError, ValueError):
    """A session id or tenant name does not match ``[A-Za-z0-9._-]{1,128}``."""


class SessionNotFound(StoreError, LookupError):
    """No record for this session: never created, deleted, expired, or lost (a store
    restarted without persistence)."""


class StaleWrite(StoreError, RuntimeError):
    """A compare-and-set was refused: the stored version is not the expected one.

    ``expected`` is the version the writer had read, ``actual`` the stored one
    (0: no record). Nothing was written.
    """

    def __init__(self, message: str, *, session_id: str, expected: int, actual: int) -> None:
        super().__init__(message, session_id=session_id)
        self.expected = expected
        self.actual = actual


class CorruptSession(StoreError, SnapshotError):
    """The stored record cannot be used: not JSON, truncated, oversized, of a foreign
    format or version, or a snapshot ``Session.restore`` refuses. The message names
    the session and what was wrong; the stored data is left exactly as it was."""


class RecordTooLarge(StoreError, ValueError):
    """A record to be written is larger than the store's ``max_bytes``; nothing was written."""


class StoreUnavailable(StoreError, ConnectionError):
    """The store's server could not be reached (down, restarting, loading its data)."""


@attrs.frozen
class Stored:
    """One session's record as read from a store, with the version it was read at."""

    session_id: str
    version: int
    record: dict[str, Any]


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


def oversized(session_id: str, size: int, max_bytes: int) -> CorruptSession:
    return CorruptSession(
        f"session {session_id!r}: the stored record is {size} bytes, over the store's "
        f"max_bytes ({max_bytes}); it was not read",
        session_id=session_id,
    )


def stale(
    session_id: str, expected: int, actual: int, *, another_incarnation: bool = False
) -> StoreError:
    """The error for a refused compare-and-set."""
    if another_incarnation:
        return StaleWrite(
            f"session {session_id!r}: stale write refused: the id was deleted and created "
            f"again since this state was read (version {actual} is another session's)",
            session_id=session_id,
            expected=expected,
            actual=actual,
        )
    if actual == 0 and expected > 0:
        return SessionNotFound(
            f"session {session_id!r}: no record (expected version {expected}): it was "
            "deleted, expired, or lost when the store restarted without persistence",
            session_id=session_id,
        )
    if expected == 0:
        message = f"session {session_id!r} already exists (version {actual})"
    else:
        message = (
            f"session {session_id!r}: stale write refused: expected version {expected}, "
            f"the store holds version {actual}"
        )
    return StaleWrite(message, session_id=session_id, expected=expected, actual=actual)


def record_incarnation(record: Mapping[str, Any]) -> str | None:
    """The incarnation a record names, if it names one."""
    incarnation = record.get("incarnation")
    return incarnation if type(incarnation) is str and incarnation else None


def not_found(session_id: str) -> SessionNotFound:
    return SessionNotFound(
        f"session {session_id!r}: no record: never created, deleted, expired, or lost "
        "when the store restarted without persistence",
        session_id=session_id,
    )


class BytesStore:
    """What our stores share above the bytes: ``load`` and ``compare_and_set`` of a
    record as JSON data, over ``load_payload`` and ``compare_and_set_payload`` of its
    bytes (which a :class:`~statemachine.store.Worker` calls directly)."""

    max_bytes: int

    def load_payload(self, session_id: str) -> tuple[int, bytes]:  # pragma: no cover
        raise NotImplementedError

    def compare_and_set_payload(  # pragma: no cover - each store defines it
        self,
        session_id: str,
        expected_version: int,
        payload: bytes,
        *,
        incarnation: str | None,
        ended: bool = False,
    ) -> int:
        raise NotImplementedError

    def load(self, session_id: str) -> Stored:
        """The record of ``session_id`` and its version, its journal applied (its
        ``"snapshot"`` is the session's current one); ``SessionNotFound`` if none,
        ``CorruptSession`` if it cannot be read (left untouched)."""
        from ._journal import current_record  # noqa: PLC0415 - _journal imports this module

        version, payload = self.load_payload(session_id)
        data = decode_record(session_id, payload, self.max_bytes)
        return Stored(session_id, version, current_record(session_id, data))

    def compare_and_set(
        self,
        session_id: str,
        expected_version: int,
        record: Mapping[str, Any],
        *,
        ended: bool = False,
    ) -> int:
        """Write ``record`` if the stored version is ``expected_version`` (0: create) and,
        when the record names its incarnation, the stored one is that incarnation;
        returns the new version. Raises ``StaleWrite`` (or ``SessionNotFound`` when the
        record vanished) and writes nothing otherwise."""
        payload = encode_record(session_id, record, self.max_bytes)
        return self.compare_and_set_payload(
            session_id,
            expected_version,
            payload,
            incarnation=record_incarnation(record),
            ended=ended,
        )
