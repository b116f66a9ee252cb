"""A deterministic, sans-IO state machine for the error-recovery part of an LLM
agent's turn loop.

The host sends events (``sm.ModelFailed``, ``sm.WaitDone``...) to a turn and gets
actions back (``sm.Wait``, ``sm.CallModel``...); the engine never sleeps, calls or
reads a clock of its own. See ``README.md`` and ``specs/``.
"""

from ._actions import Action, Assemble, CallModel, Fallback, Finish, InvokeTools, Wait
from ._classify import classify
from ._drivers import (
    AsyncContextProvider,
    AsyncModelProvider,
    AsyncToolProvider,
    ContextProvider,
    ModelProvider,
    ToolProvider,
    arun_turn,
    run_turn,
)
from ._events import (
    Assembled,
    Cancelled,
    CannotShrink,
    Event,
    ModelFailed,
    ModelReplied,
    ToolsDone,
    WaitDone,
)
from ._exceptions import ConfigError, IllegalEvent, SessionEnded, SnapshotError, TurnInProgress
from ._model_error import Headers, ModelError
from ._session import Session
from ._settings import Settings
from ._taxonomy import ErrorCategory, SessionStatus, ToolErrorCategory, TurnStatus
from ._tools import ToolCall, ToolOutcome, ToolResult
from ._trace import TraceRecord
from ._turn import Turn

__all__ = [
    "Action",
    "Assemble",
    "Assembled",
    "AsyncContextProvider",
    "AsyncModelProvider",
    "AsyncToolProvider",
    "CallModel",
    "Cancelled",
    "CannotShrink",
    "ConfigError",
    "ContextProvider",
    "ErrorCategory",
    "Event",
    "Fallback",
    "Finish",
    "Headers",
    "IllegalEvent",
    "InvokeTools",
    "ModelError",
    "ModelFailed",
    "ModelProvider",
    "ModelReplied",
    "Session",
    "SessionEnded",
    "SessionStatus",
    "Settings",
    "SnapshotError",
    "ToolCall",
    "ToolErrorCategory",
    "ToolOutcome",
    "ToolProvider",
    "ToolResult",
    "ToolsDone",
    "TraceRecord",
    "Turn",
    "TurnInProgress",
    "TurnStatus",
    "Wait",
    "WaitDone",
    "arun_turn",
    "classify",
    "run_turn",
]
