"""Scenario files: settings and the events a host would send, scripted in TOML.

A scenario scripts what the world does to an agent (the model fails, the context
overflows, a plugin crashes) and what the engine must end with. The simulator
(``python -m statemachine simulate``) drives the real engine through it on a virtual
clock. The schema::

    description = "one line shown above the trace"
    seed = 0                                   # jitter seed (default 0)
    expect_turn_status = "completed"           # the last turn's TurnStatus
    expect_session_status = "open"             # a SessionStatus, or "open"
    expect_retries_used = 3                    # session retries (waits + fallbacks)

    [settings]                                 # sm.Settings fields; omitted = defaults
    fallback_models = ["backup"]

    [[turn]]                                   # one per turn, in order
    repeat = 1                                 # play this turn n times
    expect_status = "completed"                # this turn's TurnStatus
    expect_fallbacks = 0                       # moves down fallback_models
    steps = [                                  # one event per line
      {event = "Assembled", size = 1200},
      {event = "ModelFailed", category = "rate_limited", retry_after = 2, repeat = 3},
      {event = "ModelReplied", cost = 0.002},
    ]

Step keys: ``event`` (required) and, for any event, ``repeat`` (send it n times, at
most :data:`MAX_REPEAT`; a turn's ``repeat`` too, and a scenario scripts at most
:data:`MAX_EVENTS` events in all),
``takes`` (virtual seconds the host spent before the event arrived) and
``expect_action`` (the action the engine must answer with: ``Assemble``,
``CallModel``, ``Wait``, ``InvokeTools`` or ``Finish``). Per event:

* ``Assembled``: ``size`` (int, required), ``request`` (any; default a string naming
  the turn and size);
* ``CannotShrink``, ``WaitDone``: nothing;
* ``ModelFailed``: ``category`` (required), ``message``, ``retry_after`` (seconds),
  ``headers`` (a table of raw HTTP headers: ``retry-after``, ``retry-after-ms``),
  ``partial`` (bool), ``code``, ``status``;
* ``ModelReplied``: ``cost`` (USD), ``reply`` (any), ``tool_calls``: a list of
  ``{provider, name, arguments, id}`` (``id`` defaults to ``c<turn>.<n>``);
* ``ToolsDone``: ``outcomes``: a list of ``{ok, content, category, call_id}``;
  without ``call_id`` the outcomes go, in order, to the calls of the last
  ``InvokeTools``;
* ``Cancelled``: ``reason``.

A ``Wait`` is honoured by the simulator: the virtual clock moves by its seconds and
it sends ``WaitDone`` itself, unless the next scripted step is a ``WaitDone`` (to
add ``takes``) or a ``Cancelled`` (to abandon the turn mid-backoff).

Errors name the file, the line and the problem, with the path of the offending
value (``turn[2].steps[3]``, counted from 1): :class:`ScenarioError`.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from ..core._exceptions import ConfigError
from ..core._settings import Settings
from ..core._taxonomy import ErrorCategory, SessionStatus, ToolErrorCategory, TurnStatus

EVENTS = (
    "Assembled",
    "CannotShrink",
    "ModelReplied",
    "ModelFailed",
    "WaitDone",
    "ToolsDone",
    "Cancelled",
)
ACTIONS = ("Assemble", "CallModel", "Wait", "InvokeTools", "Finish")
OPEN = "open"
"""``expect_session_status`` for a session that has not ended."""

_COMMON = ("event", "repeat", "takes", "expect_action")
_EVENT_KEYS: dict[str, tuple[str, ...]] = {
    "Assembled": ("size", "request"),
    "CannotShrink": (),
    "ModelReplied": ("cost", "reply", "tool_calls"),
    "ModelFailed": (
        "category",
        "message",
        "retry_after",
        "headers",
        "partial",
        "code",
        "status",
        "cost",
    ),
    "WaitDone": (),
    "ToolsDone": ("outcomes",),
    "Cancelled": ("reason",),
}
_TOP_KEYS = (
    "description",
    "seed",
    "expect_turn_status",
    "expect_session_status",
    "expect_retries_used",
    "end",
    "settings",
    "turn",
)
_TURN_KEYS = ("steps", "repeat", "expect_status", "expect_fallbacks")
MAX_REPEAT = 10_000
"""The most a step's or a turn's ``repeat`` may be: an engine turn takes a few dozen
events on any sane settings, and ten thousand turns run in seconds."""
MAX_EVENTS = 1_000_000
"""The most events a scenario may script in all (each turn's repeat times its steps'
repeats, summed), so that a run always ends in reasonable time."""
_CALL_KEYS = ("provider", "name", "arguments", "id", "terminates_turn")
_OUTCOME_KEYS = ("ok", "content", "category", "call_id")


class ScenarioError(ConfigError):
    """A scenario file is not valid: ``where`` is ``file:line``, ``path`` the value."""

    def __init__(self, where: str, path: str, problem: str) -> None:
        self.where = where
        self.path = path
        self.problem = problem
        super().__init__(f"{where}: {path + ': ' if path else ''}{problem}")


@attrs.frozen
class ToolCallSpec:
    """A tool call a scripted reply asks for."""

    provider: str
    name: str
    arguments: Any = None
    id: str | None = None
    terminates_turn: bool = False


@attrs.frozen
class OutcomeSpec:
    """A scripted tool outcome."""

    ok: bool
    content: Any = ""
    category: ToolErrorCategory | None = None
    call_id: str | None = None


@attrs.frozen
class Step:
    """One scripted event (``fields`` holds its event-specific keys, validated)."""

    event: str
    fields: Mapping[str, Any]
    repeat: int
    takes: float
    expect_action: str | None
    path: str
    line: int


@attrs.frozen
class TurnSpec:
    """One scripted ``[[turn]]``."""

    steps: tuple[Step, ...]
    repeat: int
    expect_status: TurnStatus | None
    expect_fallbacks: int | None
    path: str
    line: int


@attrs.frozen
class Scenario:
    """A parsed, validated scenario."""

    name: str
    source: str
    """Where it came from: a file path, or ``built-in``."""
    description: str
    seed: int
    settings: Settings
    settings_table: Mapping[str, Any]
    turns: tuple[TurnSpec, ...]
    expect_turn_status: TurnStatus | None
    expect_session_status: str | None
    expect_retries_used: int | None
    expect_lines: Mapping[str, int] = attrs.field(factory=dict)
    end: str | None = None
    """How the host ends the session after the turns (``Session.end``), if it does."""
    """The line of each top-level ``expect_*`` key."""

    def where(self, line: int) -> str:
        """``file:line`` for messages."""
        return f"{self.source}:{line}"


# -- locating lines ---------------------------------------------------------------


class _Lines:
    """Finds the line of a value in the TOML text, by the shape people write it in."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.turns: list[int] = []
        self.settings: int | None = None
        headers: list[int] = []
        for number, line in enumerate(self.lines, 1):
            stripped = line.strip()
            if re.match(r"\[\[\s*turn\s*\]\]", stripped):
                self.turns.append(number)
                headers.append(number)
            elif re.match(r"\[\s*settings\s*\]", stripped):
                self.settings = number
                headers.append(number)
            elif stripped.startswith("["):
                headers.append(number)
        self.headers = headers

    def _region(self, start: int | None) -> tuple[int, int]:
        if start is None:
            first = self.headers[0] if self.headers else len(self.lines) + 1
            return 1, first
        later = [h for h in self.headers if h > start]
        return start, later[0] if later else len(self.lines) + 1

    def key(self, key: str, start: int | None) -> int | None:
        """The line of ``key = ...`` in the table that starts at ``start`` (``None``:
        the top-level keys before the first table)."""
        lo, hi = self._region(start)
        pattern = re.compile(rf"\s*[\"']?{re.escape(key)}[\"']?\s*=")
        for number in range(lo, hi):
            if pattern.match(self.lines[number - 1]):
                return number
        return None

    def turn(self, index: int) -> int:
        return self.turns[index] if index < len(self.turns) else 1

    def step(self, turn: int, index: int) -> int:
        """The line of the ``index``-th ``{event = ...}`` of the ``turn``-th turn."""
        start = self.turn(turn)
        lo, hi = self._region(start)
        seen = 0
        for number in range(lo, hi):
            for _ in re.finditer(r"\{\s*[\"']?event[\"']?\s*=", self.lines[number - 1]):
                if seen == index:
                    return number
                seen += 1
        return self.key("steps", start) or start


# -- validation --------------------------------------------------------------------


class _Checker:
    def __init__(self, source: str, lines: _Lines) -> None:
        self.source = source
        self.lines = lines

    def fail(self, line: int | None, path: str, problem: str) -> ScenarioError:
        return ScenarioError(f"{self.source}:{line or 1}", path, problem)

    def unknown_keys(
        self,
        table: Mapping[str, Any],
        known: tuple[str, ...],
        line: int,
        path: str,
        table_line: int | None = None,
    ) -> None:
        """Refuse a key not in ``known``; with ``table_line`` (a ``[[table]]``'s header)
        the error points at the key's own line in that table."""
        for key in table:
            if key not in known:
                found = self.lines.key(key, table_line) if table_line is not None else None
                raise self.fail(
                    found or line,
                    f"{path}.{key}" if path else key,
                    f"unknown key (known: {', '.join(known)})",
                )


def _kind(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _want(
    check: _Checker,
    value: Any,
    ok: Callable[[Any], bool],
    expected: str,
    line: int,
    path: str,
) -> Any:
    if not ok(value):
        raise check.fail(line, path, f"must be {expected}, got {_kind(value)} {value!r}")
    return value


def _is_int(minimum: int, maximum: int | None = None) -> Callable[[Any], bool]:
    return lambda v: (
        isinstance(v, int)
        and not isinstance(v, bool)
        and v >= minimum
        and (maximum is None or v <= maximum)
    )


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_table(v: Any) -> bool:
    return isinstance(v, dict)


def _enum(
    check: _Checker, kind: type[Any], value: Any, line: int, path: str, extra: str = ""
) -> Any:
    names = [member.value for member in kind]
    if extra:
        names.append(extra)
    if not isinstance(value, str) or value not in names:
        raise check.fail(line, path, f"{value!r} is not one of {', '.join(names)}")
    return value if value == extra else kind(value)


def _is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def _is_list(v: Any) -> bool:
    return isinstance(v, list)


def _is_name(v: Any) -> bool:
    return isinstance(v, str) and bool(v)


def _is_headers(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


def _one_of(values: Iterable[str]) -> tuple[Callable[[Any], bool], str]:
    names = tuple(values)
    return (lambda v: v in names), f"one of {', '.join(names)}"


_Field = tuple[Callable[[Any], bool], str, bool]
"""(predicate, what it expects, required) of one key."""

_ANY: _Field = (lambda _v: True, "any value", False)
_NUMBER: _Field = (_is_number, "a number >= 0", False)
_TEXT: _Field = (_is_str, "a string", False)
_COMMON_FIELDS: dict[str, _Field] = {
    "repeat": (_is_int(1, MAX_REPEAT), f"an integer from 1 to {MAX_REPEAT}", False),
    "takes": _NUMBER,
    "expect_action": (*_one_of(ACTIONS), False),
}
_FIELDS: dict[str, dict[str, _Field]] = {
    "Assembled": {"size": (_is_int(0), "an integer >= 0", True), "request": _ANY},
    "CannotShrink": {},
    "ModelReplied": {
        "cost": _NUMBER,
        "reply": _ANY,
        "tool_calls": (_is_list, "an array of {provider, name, ...}", False),
    },
    "ModelFailed": {
        "category": (*_one_of(ErrorCategory), True),
        "message": _TEXT,
        "retry_after": _NUMBER,
        "headers": (_is_headers, "a table of header names to string values", False),
        "partial": (_is_bool, "true or false", False),
        "cost": _NUMBER,
        "code": _TEXT,
        "status": (_is_int(100), "an HTTP status code", False),
    },
    "WaitDone": {},
    "ToolsDone": {"outcomes": (_is_list, "an array of {ok = ...}", True)},
    "Cancelled": {"reason": _TEXT},
}


def _fields(
    check: _Checker, raw: Mapping[str, Any], spec: Mapping[str, _Field], line: int, path: str
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, (ok, expected, required) in spec.items():
        if key in raw:
            values[key] = _want(check, raw[key], ok, expected, line, f"{path}.{key}")
        elif required:
            raise check.fail(line, path, f"needs '{key}' ({expected})")
    return values


def _step(check: _Checker, raw: Any, turn: int, index: int) -> Step:
    path = f"turn[{turn + 1}].steps[{index + 1}]"
    line = check.lines.step(turn, index)
    _want(check, raw, _is_table, "a table like {event = ...}", line, path)
    event = raw.get("event")
    if event is None:
        raise check.fail(line, path, f"has no 'event' key (one of {', '.join(EVENTS)})")
    if event not in EVENTS:
        raise check.fail(
            line, f"{path}.event", f"unknown event {event!r} (one of {', '.join(EVENTS)})"
        )
    check.unknown_keys(raw, _COMMON + tuple(_FIELDS[event]), line, path)
    common = _fields(check, raw, _COMMON_FIELDS, line, path)
    fields = _fields(check, raw, _FIELDS[event], line, path)
    if event == "ModelReplied":
        fields["tool_calls"] = tuple(
            _call(check, call, line, f"{path}.tool_calls[{i + 1}]")
            for i, call in enumerate(fields.get("tool_calls", ()))
        )
    if event == "ToolsDone":
        fields["outcomes"] = tuple(
            _outcome(check, item, line, f"{path}.outcomes[{i + 1}]")
            for i, item in enumerate(fields["outcomes"])
        )
    return Step(
        event,
        fields,
        common.get("repeat", 1),
        float(common.get("takes", 0.0)),
        common.get("expect_action"),
        path,
        line,
    )


def _call(check: _Checker, raw: Any, line: int, path: str) -> ToolCallSpec:
    _want(check, raw, _is_table, "a table {provider, name, ...}", line, path)
    check.unknown_keys(raw, _CALL_KEYS, line, path)
    nonempty = "a non-empty string"
    values = {}
    for key in ("provider", "name"):
        if key not in raw:
            raise check.fail(line, path, f"a tool call needs '{key}'")
        values[key] = _want(check, raw[key], _is_name, nonempty, line, f"{path}.{key}")
    if "id" in raw:
        values["id"] = _want(check, raw["id"], _is_name, nonempty, line, f"{path}.id")
    terminal = _want(
        check,
        raw.get("terminates_turn", False),
        _is_bool,
        "true or false",
        line,
        f"{path}.terminates_turn",
    )
    return ToolCallSpec(arguments=raw.get("arguments"), terminates_turn=terminal, **values)


def _outcome(check: _Checker, raw: Any, line: int, path: str) -> OutcomeSpec:
    _want(check, raw, _is_table, "a table {ok = ...}", line, path)
    check.unknown_keys(raw, _OUTCOME_KEYS, line, path)
    if "ok" not in raw:
        raise check.fail(line, path, "an outcome needs 'ok' (true or false)")
    ok = _want(check, raw["ok"], _is_bool, "true or false", line, f"{path}.ok")
    category = None
    if "category" in raw:
        if ok:
            raise check.fail(line, f"{path}.category", "a successful outcome has no error category")
        category = _enum(check, ToolErrorCategory, raw["category"], line, f"{path}.category")
    call_id = None
    if "call_id" in raw:
        call_id = _want(
            check,
            raw["call_id"],
            _is_name,
            "a non-empty string",
            line,
            f"{path}.call_id",
        )
    return OutcomeSpec(ok, raw.get("content", ""), category, call_id)


def _turn(check: _Checker, raw: Any, index: int) -> TurnSpec:
    path = f"turn[{index + 1}]"
    line = check.lines.turn(index)
    _want(check, raw, _is_table, "a [[turn]] table", line, path)
    check.unknown_keys(raw, _TURN_KEYS, line, path, table_line=line)

    def at(key: str) -> int:
        return check.lines.key(key, line) or line

    if "steps" not in raw:
        raise check.fail(line, path, "has no 'steps' (an array of {event = ...})")
    steps = _want(
        check,
        raw["steps"],
        lambda v: isinstance(v, list) and bool(v),
        "a non-empty array",
        at("steps"),
        f"{path}.steps",
    )
    repeat = _want(
        check,
        raw.get("repeat", 1),
        _is_int(1, MAX_REPEAT),
        f"an integer from 1 to {MAX_REPEAT}",
        at("repeat"),
        f"{path}.repeat",
    )
    status = raw.get("expect_status")
    if status is not None:
        status = _enum(check, TurnStatus, status, at("expect_status"), f"{path}.expect_status")
    fallbacks = raw.get("expect_fallbacks")
    if fallbacks is not None:
        _want(
            check,
            fallbacks,
            _is_int(0),
            "an integer >= 0",
            at("expect_fallbacks"),
            f"{path}.expect_fallbacks",
        )
    return TurnSpec(
        tuple(_step(check, step, index, i) for i, step in enumerate(steps)),
        repeat,
        status,
        fallbacks,
        path,
        line,
    )


def _check_events(check: _Checker, turns: tuple[TurnSpec, ...]) -> None:
    """Refuse a scenario that scripts more than :data:`MAX_EVENTS` events in all,
    naming the turn where the count goes over."""
    total = 0
    for spec in turns:
        total += spec.repeat * sum(step.repeat for step in spec.steps)
        if total > MAX_EVENTS:
            raise check.fail(
                check.lines.key("repeat", spec.line) or spec.line,
                spec.path,
                f"the scenario scripts more than {MAX_EVENTS} events up to here (each "
                "turn's repeat times the repeats of its steps); lower the repeats",
            )


def parse(text: str, source: str, name: str) -> Scenario:
    """Parse and validate scenario ``text`` from ``source``; :class:`ScenarioError`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = re.search(r"\(at line (\d+), column \d+\)", message)
        line = int(found.group(1)) if found else 1
        raise ScenarioError(f"{source}:{line}", "", f"invalid TOML: {message}") from None
    lines = _Lines(text)
    check = _Checker(source, lines)
    for key in data:
        if key not in _TOP_KEYS:
            raise check.fail(
                lines.key(key, None), key, f"unknown key (known: {', '.join(_TOP_KEYS)})"
            )
    top = lines.key
    description = _want(
        check,
        data.get("description", ""),
        _is_str,
        "a string",
        top("description", None) or 1,
        "description",
    )
    seed = _want(
        check, data.get("seed", 0), _is_int(0), "an integer >= 0", top("seed", None) or 1, "seed"
    )
    table = data.get("settings", {})
    settings_line = lines.settings or 1
    _want(check, table, _is_table, "a [settings] table", settings_line, "settings")
    try:
        settings = Settings.from_dict(table, source="[settings]")
    except ConfigError as exc:
        field = str(exc).split(":", 1)[0]
        line = lines.key(field, lines.settings) or settings_line
        raise check.fail(line, f"settings.{field}", str(exc).split(":", 1)[1].strip()) from None
    expect_turn = data.get("expect_turn_status")
    if expect_turn is not None:
        expect_turn = _enum(
            check,
            TurnStatus,
            expect_turn,
            top("expect_turn_status", None) or 1,
            "expect_turn_status",
        )
    expect_session = data.get("expect_session_status")
    if expect_session is not None:
        expect_session = str(
            _enum(
                check,
                SessionStatus,
                expect_session,
                top("expect_session_status", None) or 1,
                "expect_session_status",
                OPEN,
            )
        )
    expect_retries = data.get("expect_retries_used")
    if expect_retries is not None:
        _want(
            check,
            expect_retries,
            _is_int(0),
            "an integer >= 0",
            top("expect_retries_used", None) or 1,
            "expect_retries_used",
        )
    end = data.get("end")
    if end is not None:
        ends = ("completed", "cancelled", "failed")
        _want(
            check,
            end,
            lambda v: v in ends,
            f"one of {', '.join(ends)}",
            top("end", None) or 1,
            "end",
        )
    turns = data.get("turn")
    if turns is None:
        raise check.fail(1, "turn", "the scenario has no [[turn]] table")
    _want(
        check,
        turns,
        lambda v: isinstance(v, list) and bool(v),
        "an array of [[turn]] tables",
        1,
        "turn",
    )
    specs = tuple(_turn(check, raw, i) for i, raw in enumerate(turns))
    _check_events(check, specs)
    return Scenario(
        name=name,
        source=source,
        description=description,
        seed=seed,
        settings=settings,
        settings_table=dict(table),
        turns=specs,
        expect_turn_status=expect_turn,
        expect_session_status=expect_session,
        expect_retries_used=expect_retries,
        end=end,
        expect_lines={
            key: lines.key(key, None) or 1
            for key in ("expect_turn_status", "expect_session_status", "expect_retries_used")
        },
    )


def load(path: str | Path) -> Scenario:
    """Read a scenario file; its name is the file's stem."""
    path = Path(path)
    name = str(path) if str(path).isprintable() else repr(str(path))
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(
            name, "", f"cannot read the scenario file: {exc.strerror or exc}"
        ) from None
    except UnicodeDecodeError:
        raise ScenarioError(name, "", "not UTF-8 text") from None
    except ValueError as exc:  # a NUL byte in the path
        raise ScenarioError(name, "", f"cannot read the scenario file: {exc}") from None
    return parse(text, str(path), path.stem)


ORDER = (
    "rate-limit-storm",
    "overloaded-fallback",
    "context-overflow-shrinks",
    "context-overflow-cannot-shrink",
    "auth-error-no-fallback",
    "invalid-request",
    "content-filtered",
    "unknown-error",
    "stream-interrupted",
    "retry-deferred",
    "plugin-crash-breaker",
    "doom-loop",
    "retry-ceiling",
    "max-turns",
    "max-cost",
    "max-wall-clock",
    "cancelled",
    "conflict-retried",
    "denial-breaker",
    "terminal-tool",
    "user-cancels-session",
    "auth-error-fails-session",
    "billed-failure",
    "plugin-dies-under-three-calls",
)
"""The built-ins in the order ``simulate`` runs them: the model error categories,
then tools, then the session-wide limits. Files not listed here run after them."""


def builtin_names() -> tuple[str, ...]:
    """The built-in scenarios, in the order ``simulate`` runs them."""
    folder = resources.files("statemachine.dev") / "scenarios"
    found = {
        entry.name.removesuffix(".toml")
        for entry in folder.iterdir()
        if entry.name.endswith(".toml")
    }
    return tuple(name for name in ORDER if name in found) + tuple(sorted(found - set(ORDER)))


def builtin(name: str) -> Scenario:
    """The built-in scenario ``name``; ``ScenarioError`` if there is none."""
    if name not in builtin_names():
        raise ScenarioError(
            name, "", f"no such built-in scenario (built-ins: {', '.join(builtin_names())})"
        )
    text = (resources.files("statemachine.dev") / "scenarios" / f"{name}.toml").read_text("utf-8")
    return parse(text, f"built-in:{name}.toml", name)
