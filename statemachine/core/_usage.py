"""What one model call used and what it was: a value the host reports with its event."""

from __future__ import annotations

import math
from typing import Any

import attrs

from ._exceptions import InvalidValue
from ._json_data import MAX_COUNT, check_unicode, finite, short_repr

MAX_TEXT = 1000
"""The longest model name, response id, finish reason, provider name or server address a
usage keeps."""

MAX_PORT = 65535


def _tokens(_instance: object, attribute: Any, value: Any) -> None:
    if value is None:
        return
    if type(value) is not int or not 0 <= value <= MAX_COUNT:
        raise InvalidValue(
            f"Usage.{attribute.name}: must be an int >= 0 (< 2**63) or None, "
            f"got {short_repr(value)}"
        )


def _cost(_instance: object, _attribute: Any, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not finite(value):
        raise InvalidValue(
            f"Usage.cost_usd: must be a finite number >= 0 or None, got {value!r:.60}"
        )
    if value < 0:
        raise InvalidValue(f"Usage.cost_usd: must be a finite number >= 0 or None, got {value!r}")


def _text(_instance: object, attribute: Any, value: Any) -> None:
    if value is None:
        return
    if type(value) is not str:
        raise InvalidValue(
            f"Usage.{attribute.name}: must be a str or None, got {short_repr(value)}"
        )
    if len(value) > MAX_TEXT:
        raise InvalidValue(f"Usage.{attribute.name}: longer than {MAX_TEXT} characters")
    check_unicode(value, f"Usage.{attribute.name}")


def _port(_instance: object, _attribute: Any, value: Any) -> None:
    if value is None:
        return
    if type(value) is not int or not 0 < value <= MAX_PORT:
        raise InvalidValue(
            f"Usage.server_port: must be an int from 1 to {MAX_PORT} or None, "
            f"got {short_repr(value)}"
        )


def _flag(_instance: object, attribute: Any, value: Any) -> None:
    if value is not None and type(value) is not bool:
        raise InvalidValue(
            f"Usage.{attribute.name}: must be True, False or None, got {short_repr(value)}"
        )


def _count(value: Any) -> Any:
    """A token count as it came: an int stays, a whole float (some SDKs) becomes one."""
    if type(value) is float and value.is_integer() and 0 <= value <= MAX_COUNT:
        return int(value)
    return value


def _number(value: Any) -> Any:
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:  # an int too large for a float: refused as infinite
            return math.inf
    return value


@attrs.frozen
class Usage:
    """What one model call used, as the provider reported it (every field may be
    ``None``): its tokens (``input_tokens``, the whole prompt, of which
    ``cached_tokens`` read from a prompt cache and ``cache_creation_tokens`` written to
    one; ``output_tokens``, of which ``reasoning_tokens``), its ``cost_usd`` (what the
    event charges), the ``model`` that answered, the ``response_id`` and the
    ``finish_reason``; and where it went: ``provider_name`` (OpenTelemetry's
    ``gen_ai.provider.name``), ``server_address``, ``server_port`` and ``streamed``.
    """

    input_tokens: int | None = attrs.field(default=None, converter=_count, validator=_tokens)
    output_tokens: int | None = attrs.field(default=None, converter=_count, validator=_tokens)
    cached_tokens: int | None = attrs.field(default=None, converter=_count, validator=_tokens)
    cost_usd: float | None = attrs.field(default=None, converter=_number, validator=_cost)
    model: str | None = attrs.field(default=None, validator=_text)
    response_id: str | None = attrs.field(default=None, validator=_text)
    finish_reason: str | None = attrs.field(default=None, validator=_text)
    cache_creation_tokens: int | None = attrs.field(
        default=None, converter=_count, validator=_tokens
    )
    reasoning_tokens: int | None = attrs.field(default=None, converter=_count, validator=_tokens)
    provider_name: str | None = attrs.field(default=None, validator=_text)
    server_address: str | None = attrs.field(default=None, validator=_text)
    server_port: int | None = attrs.field(default=None, validator=_port)
    streamed: bool | None = attrs.field(default=None, validator=_flag)

    @property
    def total_tokens(self) -> int | None:
        """Input and output tokens together, when both are known."""
        if self.input_tokens is None or self.output_tokens is None:
            return None
        return self.input_tokens + self.output_tokens
