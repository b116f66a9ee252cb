"""``InMemoryStore``: session records in this process's memory, the embedded default."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ._bytes import BytesStore
from ._core import (
    DEFAULT_MAX_BYTES,
    check_max_bytes,
    check_name,
    check_payload,
    check_ttl,
    check_version,
    key_prefix,
)
from ._errors import not_found, stale

_KEYS_KEPT = 4096
"""How many checked session ids an InMemoryStore keeps the keys of."""


class InMemoryStore(BytesStore):
    """Session records in this process's memory: the embedded default.

    Thread-safe (one lock). Records are kept as JSON bytes, exactly as a server
    would keep them, so what a worker changes after a write never leaks into the
    store. ``clock`` (monotonic seconds) measures ``ended_ttl_s``.
    :meth:`for_tenant` gives a store on the same memory under a tenant namespace.
    """

    def __init__(
        self,
        *,
        prefix: str = "statemachine",
        tenant: str | None = None,
        ended_ttl_s: float | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._base = prefix
        self._prefix = key_prefix(prefix, tenant)
        self.ended_ttl_s = check_ttl(ended_ttl_s)
        self.max_bytes = check_max_bytes(max_bytes)
        self._clock = clock
        self._lock = threading.Lock()
        self._data: dict[str, tuple[int, bytes, float | None, str | None]] = {}
        """key -> (version, record bytes, expiry, incarnation)"""
        self._keys: dict[str, str] = {}
        """session id -> its key, for the ids checked already"""

    def for_tenant(self, tenant: str) -> InMemoryStore:
        """A store sharing this one's memory, under ``tenant``'s namespace."""
        other = InMemoryStore(
            prefix=self._base,
            tenant=tenant,
            ended_ttl_s=self.ended_ttl_s,
            max_bytes=self.max_bytes,
            clock=self._clock,
        )
        other._lock = self._lock
        other._data = self._data
        return other

    def key(self, session_id: str) -> str:
        """The key of ``session_id`` (validated)."""
        key = self._keys.get(session_id)
        if key is None:
            key = self._prefix + check_name(session_id)
            if len(self._keys) >= _KEYS_KEPT:
                self._keys.clear()
            self._keys[session_id] = key
        return key

    def _get(self, key: str) -> tuple[int, bytes, float | None, str | None] | None:
        entry = self._data.get(key)
        if entry is not None and entry[2] is not None and self._clock() >= entry[2]:
            del self._data[key]
            return None
        return entry

    def load_payload(self, session_id: str) -> tuple[int, bytes]:
        key = self.key(session_id)
        with self._lock:
            entry = self._get(key)
        if entry is None:
            raise not_found(session_id)
        return entry[0], entry[1]

    def compare_and_set_payload(
        self,
        session_id: str,
        expected_version: int,
        payload: bytes,
        incarnation: str | None,
        ended: bool = False,
    ) -> int:
        expected = expected_version
        if type(expected) is not int or expected < 0:
            expected = check_version(session_id, expected_version)
        key = self._keys.get(session_id) or self.key(session_id)
        if len(payload) > self.max_bytes:
            check_payload(session_id, payload, self.max_bytes)  # raises, naming the size
        lock = self._lock
        lock.acquire()  # not `with`: half the cost, on every write
        try:
            entry = self._data.get(key)
            if entry is not None and entry[2] is not None:
                entry = self._get(key)  # it may have expired
            actual = 0 if entry is None else entry[0]
            if actual != expected:
                raise stale(session_id, expected, actual)
            if (
                entry is not None
                and incarnation is not None
                and entry[3] not in (None, incarnation)
            ):
                raise stale(session_id, expected, actual, another_incarnation=True)
            expires = None
            if ended and self.ended_ttl_s is not None:
                expires = self._clock() + self.ended_ttl_s
            self._data[key] = (actual + 1, payload, expires, incarnation)
            return actual + 1
        finally:
            lock.release()

    def delete(self, session_id: str) -> bool:
        key = self.key(session_id)
        with self._lock:
            return self._get(key) is not None and self._data.pop(key, None) is not None

    def __repr__(self) -> str:
        return f"<InMemoryStore {self._prefix}* ({len(self._data)} keys)>"
