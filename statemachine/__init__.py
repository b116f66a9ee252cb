"""A deterministic, sans-IO state machine for the error-recovery part of an LLM
agent's turn loop.

The host sends events (``sm.ModelFailed``, ``sm.WaitDone``...) to a turn and gets
actions back (``sm.Wait``, ``sm.CallModel``...); the engine never sleeps, calls or
reads a clock of its own. See ``README.md`` and ``specs/``.
"""

import os as _os

from . import _clash

if _clash.foreign_modules(_os.path.dirname(__file__)):
    raise ImportError(_clash.message(_clash.other_distribution()))

from ._version import __version__ as __version__
from .core._actions import Action, Assemble, CallModel, Fallback, Finish, InvokeTools, Wait
from .core._events import (
    Assembled,
    Cancelled,
    CannotShrink,
    Event,
    ModelFailed,
    ModelReplied,
    ToolsDone,
    WaitDone,
)
from .core._exceptions import (
    ConfigError,
    IllegalEvent,
    InvalidValue,
    SessionEnded,
    SnapshotError,
    TurnInProgress,
)
from .core._model_error import Headers, ModelError
from .core._session import Session, Turn
from .core._settings import Settings
from .core._taxonomy import ErrorCategory, SessionStatus, ToolErrorCategory, TurnStatus
from .core._tool_calls import ToolCall, ToolOutcome, ToolResult
from .core._trace import TraceRecord
from .core._usage import Usage
from .io._classify import classify
from .io._drivers import (
    AsyncContextProvider,
    AsyncModelProvider,
    AsyncToolProvider,
    ContextProvider,
    ModelProvider,
    ToolProvider,
    arun_turn,
    run_turn,
)
from .io._loop import report_usage
from .io._trace_file import TraceFileError, TraceWriter

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
    "InvalidValue",
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
    "TraceFileError",
    "TraceRecord",
    "TraceWriter",
    "Turn",
    "TurnInProgress",
    "TurnStatus",
    "Usage",
    "Wait",
    "WaitDone",
    "arun_turn",
    "classify",
    "report_usage",
    "run_turn",
]
