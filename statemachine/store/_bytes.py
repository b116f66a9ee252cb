"""The stores this package ships keep records as bytes: what they share above them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._core import SessionStore, Stored, decode_record, encode_record, record_incarnation
from ._journal import current_record


class BytesStore(SessionStore):
    """What our stores share above the bytes: ``load`` and ``compare_and_set`` of a
    record as JSON data, over ``load_payload`` and ``compare_and_set_payload`` of its
    bytes (which a :class:`~statemachine.store.Worker` calls directly)."""

    max_bytes: int

    def load_payload(self, session_id: str) -> tuple[int, bytes]:  # pragma: no cover
        """:meth:`load` without decoding: the version and the record's bytes."""
        raise NotImplementedError

    def compare_and_set_payload(  # pragma: no cover - each store defines it
        self,
        session_id: str,
        expected_version: int,
        payload: bytes,
        incarnation: str | None,
        ended: bool = False,
    ) -> int:
        """:meth:`compare_and_set` of a record already encoded as JSON bytes (what a
        worker writes); ``incarnation`` is the one the record names."""
        raise NotImplementedError

    def load(self, session_id: str) -> Stored:
        """:meth:`SessionStore.load`, the record's journal applied (its ``"snapshot"`` is
        the session's current one)."""
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
        """:meth:`SessionStore.compare_and_set`; a record that names its incarnation is
        written only over that incarnation."""
        payload = encode_record(session_id, record, self.max_bytes)
        return self.compare_and_set_payload(
            session_id,
            expected_version,
            payload,
            incarnation=record_incarnation(record),
            ended=ended,
        )
