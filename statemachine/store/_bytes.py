"""The stores this package ships keep records as bytes: what they share above them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._core import Stored, decode_record, encode_record, record_incarnation
from ._journal import current_record


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
        incarnation: str | None,
        ended: bool = False,
    ) -> int:
        raise NotImplementedError

    def load(self, session_id: str) -> Stored:
        """The record of ``session_id`` and its version, its journal applied (its
        ``"snapshot"`` is the session's current one); ``SessionNotFound`` if none,
        ``CorruptSession`` if it cannot be read (left untouched)."""
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
