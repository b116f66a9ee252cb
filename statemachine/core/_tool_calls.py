"""Tool calls the model asks for, what the host reports back, and what the model sees."""

from __future__ import annotations

from typing import Any

import attrs

from ._exceptions import InvalidValue
from ._json_data import check_unicode, instance_of, member_of, owned_json
from ._model_error import OPAQUE
from ._taxonomy import ToolErrorCategory


def _nonempty_str(name: str) -> Any:
    def check(_instance: object, _attribute: object, value: Any) -> None:
        if not isinstance(value, str) or not value:
            raise InvalidValue(f"{name}: must be a non-empty str, got {value!r:.60}")
        check_unicode(value, name)

    return check


def _arguments(value: Any) -> Any:
    return owned_json(value, "ToolCall.arguments")


def _content(value: Any) -> Any:
    return owned_json(value, "ToolOutcome.content")


def _details(value: Any) -> Any:
    return owned_json(value, "ToolOutcome.details")


RETRYABLE_TOOL_CATEGORIES = frozenset(
    {ToolErrorCategory.TIMEOUT, ToolErrorCategory.CONCURRENCY_CONFLICT}
)
"""The tool errors that are retryable by default."""


@attrs.frozen
class ToolCall:
    """One tool call from a model reply.

    ``provider`` names the tool provider (plugin, MCP server) that serves ``name``: the
    circuit breaker counts crashes per provider. ``arguments`` is the call's input as
    the model gave it (JSON data). ``terminates_turn`` marks a terminal tool: once it
    succeeds, the loop is done.
    """

    id: str = attrs.field(validator=_nonempty_str("ToolCall.id"))
    provider: str = attrs.field(validator=_nonempty_str("ToolCall.provider"))
    name: str = attrs.field(validator=_nonempty_str("ToolCall.name"))
    arguments: Any = attrs.field(default=None, metadata=OPAQUE, converter=_arguments)
    terminates_turn: bool = attrs.field(default=False, kw_only=True, validator=instance_of(bool))


def _optional_tool_category(raw: Any) -> ToolErrorCategory | None:
    return None if raw is None else member_of(ToolErrorCategory, raw, "category")


@attrs.frozen
class ToolOutcome:
    """What the host reports for one invoked tool call.

    A failed outcome (``ok=False``) should carry its ``category`` (none: ``unknown``);
    ``permission_denied`` also reports a policy's denial, which the denial breaker
    counts. ``retryable`` defaults from the category; ``details`` keeps the raw
    underlying error (JSON data). ``invoke_failed``: the provider could not run the
    call (it raised, or timed out). The crash breaker counts :attr:`crashed` outcomes;
    an error result the tool returned as its answer is the model's to handle.
    """

    call_id: str = attrs.field(validator=_nonempty_str("ToolOutcome.call_id"))
    ok: bool = attrs.field(validator=instance_of(bool))
    content: Any = attrs.field(default="", metadata=OPAQUE, converter=_content)
    category: ToolErrorCategory | None = attrs.field(
        default=None, converter=_optional_tool_category
    )
    retryable: bool | None = attrs.field(
        default=None,
        kw_only=True,
        validator=attrs.validators.optional(instance_of(bool)),
    )
    details: Any = attrs.field(default=None, kw_only=True, metadata=OPAQUE, converter=_details)
    invoke_failed: bool = attrs.field(default=False, kw_only=True, validator=instance_of(bool))

    @property
    def crashed(self) -> bool:
        """Whether the crash breaker counts this outcome: the provider's process died
        (``process_crashed``) or it could not run the call (``invoke_failed``)."""
        return self.invoke_failed or self.category is ToolErrorCategory.PROCESS_CRASHED

    def __attrs_post_init__(self) -> None:
        if self.ok and self.invoke_failed:
            raise InvalidValue(
                f"invoke_failed: a successful ToolOutcome ({self.call_id!r}) was invoked"
            )
        if self.ok and self.category is not None:
            raise InvalidValue(
                f"category: a successful ToolOutcome ({self.call_id!r}) has no error "
                f"category, got {self.category.value!r}"
            )
        if self.ok and self.retryable:
            raise InvalidValue(f"retryable: a successful ToolOutcome ({self.call_id!r}) is final")
        if self.retryable is None:
            retryable = not self.ok and self.category in RETRYABLE_TOOL_CATEGORIES
            object.__setattr__(self, "retryable", retryable)


@attrs.frozen
class ToolResult:
    """What goes back to the model for one tool call: ``is_error`` flags an error
    result; ``category``, ``retryable`` and ``details`` (no part in ``==``) say which."""

    call_id: str
    content: Any = attrs.field(metadata=OPAQUE)
    is_error: bool = False
    category: ToolErrorCategory | None = attrs.field(default=None, eq=False)
    retryable: bool = attrs.field(default=False, eq=False, kw_only=True)
    details: Any = attrs.field(default=None, eq=False, kw_only=True, metadata=OPAQUE)
