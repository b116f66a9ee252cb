"""Every exception the package raises on purpose: for a caller who breaks the protocol
or hands in bad data (agent failures are *events*); each names what was wrong, and the
engine's state is left as it was."""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting, a settings file or a scenario file holds an invalid value or key
    (the message starts with the field's name)."""


class InvalidValue(TypeError, ValueError):
    """A value the host built (an event, a ``ToolCall``, a ``ToolOutcome``, a
    ``ModelError``, a ``Usage``) holds a field of a wrong type or value; the message
    starts with the field's name. A host's programming error, never an agent failure:
    a driver re-raises it instead of reporting a model error.
    """


class IllegalEvent(RuntimeError):
    """An event was sent that the turn cannot take in its current state (``state``;
    ``event`` is its name). Nothing changed: the turn can go on with a legal event."""

    def __init__(self, message: str, *, event: str, state: str) -> None:
        super().__init__(message)
        self.event = event
        self.state = state


class SessionEnded(RuntimeError):
    """``Session.new_turn()`` was called after the session ended with ``status``."""

    def __init__(self, message: str, *, status: object) -> None:
        super().__init__(message)
        self.status = status


class TurnInProgress(RuntimeError):
    """``Session.new_turn()`` was called while the current turn has not finished."""


class SnapshotError(ValueError):
    """Data given to ``Session.restore()`` is corrupt, truncated or foreign (the
    message names the key)."""
