"""``ModelError``: a model-provider failure in the taxonomy, and its raw headers."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

from ._taxonomy import RETRYABLE_CATEGORIES, ErrorCategory

OPAQUE = {"opaque": True}
"""attrs metadata: the field holds the host's own data, stored and restored as-is."""


class Headers(Mapping[str, str]):
    """An immutable, case-insensitive view of raw HTTP response headers.

    Built from a mapping (``dict``, ``httpx.Headers``, anything with ``items()``) or
    from ``(name, value)`` pairs; bytes are decoded as latin-1, as HTTP does, and
    numbers are written as text. A pair whose name or value is none of these is
    dropped, never raised on. ``headers["Retry-After"]`` and ``headers["retry-after"]``
    are the same header; the last of repeated names wins.
    """

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


def _text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("latin-1")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return None


def _to_headers(raw: object) -> Headers | None:
    if raw is None or isinstance(raw, Headers):
        return raw
    if isinstance(raw, Mapping | list | tuple) or callable(getattr(raw, "items", None)):
        return Headers(raw)  # type: ignore[arg-type]
    raise TypeError(f"headers: expected a mapping or (name, value) pairs, got {raw!r}")


def _to_category(raw: Any) -> ErrorCategory:
    if type(raw) is ErrorCategory:
        return raw
    try:
        return ErrorCategory(raw)
    except ValueError:
        names = ", ".join(c.value for c in ErrorCategory)
        raise ValueError(f"category: {raw!r} is not one of {names}") from None


@attrs.frozen
class ModelError:
    """A model-provider failure, classified.

    ``retry_after_seconds`` is what the provider's SDK or body said; when it is
    ``None`` (or unusable), ``retry-after-ms`` and then ``retry-after`` (seconds or an
    HTTP-date) are read from ``headers``. Unusable values (garbage, negative, NaN,
    infinite, a date in the past) are ignored, never raised and never waited on.

    ``code``, ``status`` and ``body`` keep the vendor's raw error for logs and for
    ``unknown`` errors, which are not retried.
    """

    category: ErrorCategory = attrs.field(converter=_to_category)
    message: str = ""
    retry_after_seconds: float | None = None
    headers: Headers | None = attrs.field(default=None, converter=_to_headers)
    code: str | None = None
    status: int | None = None
    body: Any = attrs.field(default=None, metadata=OPAQUE, eq=False)

    @property
    def retryable(self) -> bool:
        """Whether the engine retries this category (rate limits and overloads)."""
        return self.category in RETRYABLE_CATEGORIES
