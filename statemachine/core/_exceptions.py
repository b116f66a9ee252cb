"""Every exception the package raises on purpose.

Agent failures (a rate limit, a crashed tool) are *events*, never exceptions. These
classes are for a caller who breaks the protocol or hands in bad data; each message
names what was wrong, and the engine's state is left as it was.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A setting, a settings file or a scenario file holds an invalid value or key.

    The message starts with the name of the offending field.
    """


class InvalidValue(TypeError, ValueError):
    """A value the host built (an event, a ``ToolCall``, a ``ToolOutcome``, a
    ``ModelError``, a ``Usage``) holds a field the engine refuses at its door: a wrong
    type (the ``TypeError`` side) or a wrong value (the ``ValueError`` side).

    The message starts with the field's name. It is the host's programming error, never
    an agent failure: a driver that meets it inside a model provider re-raises it (the
    turn is cancelled), instead of reporting the call as a model error.
    """


class IllegalEvent(RuntimeError):
    """An event was sent that the turn cannot take in its current state.

    Raised before anything changes: the turn can go on with a legal event.
    ``event`` is the event's name and ``state`` the state it was refused in.
    """

    def __init__(self, message: str, *, event: str, state: str) -> None:
        super().__init__(message)
        self.event = event
        self.state = state


class SessionEnded(RuntimeError):
    """``Session.new_turn()`` was called after the session ended.

    ``status`` is the :class:`~statemachine.SessionStatus` it ended with.
    """

    def __init__(self, message: str, *, status: object) -> None:
        super().__init__(message)
        self.status = status


class TurnInProgress(RuntimeError):
    """``Session.new_turn()`` was called while the current turn has not finished.

    Finish it, or send it :class:`~statemachine.Cancelled`, first.
    """


class SnapshotError(ValueError):
    """Data given to ``Session.restore()`` is corrupt, truncated or foreign.

    The message names the key that was wrong.
    """
