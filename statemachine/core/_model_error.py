"""``ModelError``: a model-provider failure in the taxonomy, and its raw headers."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

from ._exceptions import InvalidValue
from ._json_data import json_problem, member_of
from ._taxonomy import RETRYABLE_CATEGORIES, ErrorCategory

OPAQUE = {"opaque": True}
"""attrs metadata: the field holds the host's own data, stored and restored as-is."""
HIDDEN = {"hidden": True}
"""attrs metadata: a field derived from others, never written or read by the codec."""
REPLY = {"opaque": True, "form": "reply_data"}
"""attrs metadata: the host's reply object, written as its JSON form (``reply_data``)."""


class Headers(Mapping[str, str]):
    """An immutable, case-insensitive view of raw HTTP response headers, from a
    mapping (anything with ``items()``) or ``(name, value)`` pairs: bytes decoded as
    latin-1, numbers written as text, any other pair dropped; the last of repeated
    names wins."""

    __slots__ = ("_items",)

    def __init__(self, raw: Mapping[Any, Any] | Iterable[tuple[Any, Any]] = ()) -> None:
        items_of = getattr(raw, "items", None)
        pairs = items_of() if callable(items_of) else raw
        items: dict[str, str] = {}
        for pair in pairs:
            try:
                name, value = pair
            except (TypeError, ValueError):
                continue
            name_text, value_text = _text(name), _text(value)
            if name_text is not None and value_text is not None:
                items[name_text.lower()] = value_text
        self._items = items

    def __getitem__(self, name: str) -> str:
        return self._items[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Headers):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self == Headers(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


def _valid_text(text: str) -> str:
    """``text`` with any lone surrogate replaced: header text must survive UTF-8."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def _text(value: object) -> str | None:
    if isinstance(value, str):
        return _valid_text(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("latin-1")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def to_headers(raw: object) -> Headers | None:
    """``raw`` (a mapping, httpx's or requests' headers, or (name, value) pairs) as
    :class:`Headers`; raises ``TypeError`` for anything else."""
    if raw is None or isinstance(raw, Headers):
        return raw
    if isinstance(raw, Mapping | list | tuple) or callable(getattr(raw, "items", None)):
        return Headers(raw)  # type: ignore[arg-type]
    raise InvalidValue(f"headers: expected a mapping or (name, value) pairs, got {raw!r}")


def _to_category(raw: Any) -> ErrorCategory:
    return member_of(ErrorCategory, raw, "category")


_MAX_TEXT = 65_536
"""Longest message or body text kept (the rest is cut): vendor bodies can be huge."""


def _message(raw: object) -> str:
    text = raw if isinstance(raw, str) else _safe_str(raw)
    return _valid_text(text[:_MAX_TEXT])


def _safe_str(raw: object) -> str:
    try:
        return str(raw)
    except Exception:
        return f"<{type(raw).__name__}>"


def _optional_text(raw: object) -> str | None:
    return None if raw is None else _message(raw)


def _status(raw: object) -> int | None:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 999:
        return None
    return int(raw)


def _retry_after_field(raw: object) -> float | str | None:
    """What a provider said, kept when it can be read later (whether it is usable is
    decided then): numbers as floats (an int too large: infinity), short text."""
    if raw is None or type(raw) is float:
        return raw
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        try:
            return float(raw)
        except OverflowError:
            return math.inf
    if isinstance(raw, float):
        return float(raw)
    if isinstance(raw, str):
        return _valid_text(raw) if len(raw) <= 256 else None
    return None


def _body(raw: object) -> Any:
    """The vendor's raw body, as JSON data: bytes are decoded, other objects kept as text."""
    if json_problem(raw) is None:
        return raw
    if isinstance(raw, bytes | bytearray):
        return bytes(raw[:_MAX_TEXT]).decode("utf-8", "replace")
    if isinstance(raw, str):
        return _message(raw)
    return _message(_safe_str(raw))


@attrs.frozen
class ModelError:
    """A model-provider failure, classified.

    ``retry_after_seconds`` is what the provider's SDK or body said; when it is
    unusable, the ``retry-after-ms`` and ``retry-after`` headers are read
    (``_retry_after.py``). ``code``, ``status`` and ``body`` keep the vendor's raw
    error. Nothing here raises on a provider's data: what is not text, JSON data or an
    HTTP status is written as text or dropped, so every ``ModelError`` can be saved in
    a snapshot.
    """

    category: ErrorCategory = attrs.field(converter=_to_category)
    message: str = attrs.field(default="", converter=_message)
    retry_after_seconds: float | str | None = attrs.field(
        default=None, converter=_retry_after_field
    )
    headers: Headers | None = attrs.field(default=None, converter=to_headers)
    code: str | None = attrs.field(default=None, converter=_optional_text)
    status: int | None = attrs.field(default=None, converter=_status)
    body: Any = attrs.field(default=None, metadata=OPAQUE, eq=False, converter=_body)

    @property
    def retryable(self) -> bool:
        """Whether the engine retries this category (rate limits and overloads)."""
        return self.category in RETRYABLE_CATEGORIES

    def __str__(self) -> str:
        """One line for a log: the category, the HTTP status and code, then the
        message, cut at :data:`SUMMARY_CHARS` (``repr`` keeps every field)."""
        head = self.category.value
        if self.status is not None:
            head += f" (HTTP {self.status})"
        if self.code:
            head += f" [{self.code:.60}]"
        message = " ".join(self.message.split())
        if len(message) > SUMMARY_CHARS:
            message = message[: SUMMARY_CHARS - 1] + "\u2026"
        return f"{head}: {message}" if message else head


SUMMARY_CHARS = 200
"""The longest message ``str(ModelError)`` shows."""
