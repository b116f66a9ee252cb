"""Scenario files: settings and the events a host would send, scripted in TOML.

A scenario scripts what the world does to an agent (the model fails, the context
overflows, a plugin crashes) and what the engine must end with; ``simulate`` drives the
real engine through it on a virtual clock. The format is ``docs/simulate.md`` ("Your own
scenarios"). Each key's check is a row of a table here (:data:`TOP_KEYS`,
:data:`TURN_KEYS`, :data:`STEP_KEYS`, :data:`EVENT_KEYS`, :data:`CALL_KEYS`,
:data:`OUTCOME_KEYS`) read by one function; :data:`MAX_REPEAT` and :data:`MAX_EVENTS`
bound a run. A :class:`ScenarioError` names the file, the line, the problem and the path
of the offending value (``turn[2].steps[3]``, counted from 1).
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import attrs

from .. import ConfigError, ErrorCategory, SessionStatus, Settings, ToolErrorCategory, TurnStatus

ACTIONS = ("Assemble", "CallModel", "Wait", "InvokeTools", "Finish")
OPEN = "open"
"""``expect_session_status`` for a session that has not ended."""

MAX_REPEAT = 10_000
"""The most a step's or a turn's ``repeat`` may be: an engine turn takes a few dozen
events on any sane settings, and ten thousand turns run in seconds."""
MAX_EVENTS = 1_000_000
"""The most events a scenario may script in all (each turn's repeat times its steps'
repeats, summed), so that a run always ends in reasonable time."""


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
    invoke_failed: bool = False


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
    """The line of each top-level ``expect_*`` key."""
    end: str | None = None
    """How the host ends the session after the turns (``Session.end``), if it does."""

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

    def table(
        self, raw: Any, keys: Mapping[str, _Key], path: str, line_of: Callable[[str], int]
    ) -> dict[str, Any]:
        """The values of table ``raw`` at ``path``, each checked (and converted) by its
        row of ``keys``; ``line_of(key)`` is the line an error names."""
        if not isinstance(raw, dict):
            raise self.fail(line_of(""), path, f"must be a table, got {_kind(raw)} {raw!r}")
        for key in raw:
            if key not in keys:
                known = ", ".join(keys)
                raise self.fail(line_of(key), _at(path, key), f"unknown key (known: {known})")
        values: dict[str, Any] = {}
        for key, spec in keys.items():
            if key not in raw:
                if spec.required:
                    raise self.fail(line_of(key), path, f"needs '{key}' ({spec.expected})")
                continue
            value = raw[key]
            if not spec.ok(value):
                problem = f"must be {spec.expected}, got {_kind(value)} {value!r}"
                raise self.fail(line_of(key), _at(path, key), problem)
            values[key] = value if spec.convert is None else spec.convert(value)
        return values


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


class _Key(NamedTuple):
    """One key of a table: the values it takes (and in words), whether the table must
    have it, and what its value becomes (``None``: itself)."""

    ok: Callable[[Any], bool]
    expected: str
    required: bool = False
    convert: Callable[[Any], Any] | None = None


def _count(minimum: int = 0, maximum: int | None = None) -> _Key:
    def ok(v: Any) -> bool:
        return type(v) is int and v >= minimum and (maximum is None or v <= maximum)

    if maximum is None:
        return _Key(ok, f"an integer >= {minimum}")
    return _Key(ok, f"an integer from {minimum} to {maximum}")


def _one_of(values: Iterable[Any], convert: Callable[[Any], Any] | None = None) -> _Key:
    names = tuple(getattr(v, "value", v) for v in values)
    return _Key(
        lambda v: type(v) is str and v in names, f"one of {', '.join(names)}", False, convert
    )


def _is_number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and v >= 0


_ANY = _Key(lambda _v: True, "any value")
_NUMBER = _Key(_is_number, "a number >= 0")
_TEXT = _Key(lambda v: type(v) is str, "a string")
_NAME = _Key(lambda v: type(v) is str and v != "", "a non-empty string")
_BOOL = _Key(lambda v: type(v) is bool, "true or false")
_REPEAT = _count(1, MAX_REPEAT)


def _non_empty(what: str, required: bool = False) -> _Key:
    return _Key(lambda v: type(v) is list and bool(v), what, required)


TOP_KEYS: dict[str, _Key] = {
    "description": _TEXT,
    "seed": _count(),
    "expect_turn_status": _one_of(TurnStatus, TurnStatus),
    "expect_session_status": _one_of([*SessionStatus, OPEN]),
    "expect_retries_used": _count(),
    "end": _one_of(("completed", "cancelled", "failed")),
    "settings": _Key(lambda v: type(v) is dict, "a [settings] table"),
    "turn": _non_empty("an array of [[turn]] tables"),
}
"""A scenario's top-level keys (``expect_session_status`` also takes :data:`OPEN`)."""
TURN_KEYS: dict[str, _Key] = {
    "steps": _non_empty("a non-empty array of {event = ...}", required=True),
    "repeat": _REPEAT,
    "expect_status": _one_of(TurnStatus, TurnStatus),
    "expect_fallbacks": _count(),
}
EVENT_KEYS: dict[str, dict[str, _Key]] = {
    "Assembled": {"size": _count()._replace(required=True), "request": _ANY},
    "CannotShrink": {},
    "ModelReplied": {
        "cost": _NUMBER,
        "reply": _ANY,
        "tool_calls": _Key(lambda v: type(v) is list, "an array of {provider, name, ...}"),
    },
    "ModelFailed": {
        "category": _one_of(ErrorCategory)._replace(required=True),
        "message": _TEXT,
        "retry_after": _NUMBER,
        "headers": _Key(
            lambda v: type(v) is dict and all(type(x) is str for x in v.values()),
            "a table of header names to string values",
        ),
        "partial": _BOOL,
        "code": _TEXT,
        "status": _Key(_count(100).ok, "an HTTP status code"),
        "cost": _NUMBER,
    },
    "WaitDone": {},
    "ToolsDone": {
        "outcomes": _Key(lambda v: type(v) is list, "an array of {ok = ...}", required=True)
    },
    "Cancelled": {"reason": _TEXT},
}
EVENTS = tuple(EVENT_KEYS)
"""The events a step may name."""
STEP_KEYS: dict[str, _Key] = {
    "event": _one_of(EVENTS)._replace(required=True),
    "repeat": _REPEAT,
    "takes": _NUMBER,
    "expect_action": _one_of(ACTIONS),
}
"""The keys any step may have; its event's own are :data:`EVENT_KEYS`."""
CALL_KEYS: dict[str, _Key] = {
    "provider": _NAME._replace(required=True),
    "name": _NAME._replace(required=True),
    "arguments": _ANY,
    "id": _NAME,
    "terminates_turn": _BOOL,
}
"""The keys of a ``ModelReplied`` step's ``tool_calls``; ``id`` defaults to ``c<turn>.<n>``."""
OUTCOME_KEYS: dict[str, _Key] = {
    "ok": _BOOL._replace(required=True),
    "content": _ANY,
    "category": _one_of(ToolErrorCategory, ToolErrorCategory),
    "call_id": _NAME,
    "invoke_failed": _BOOL,
}
"""The keys of a ``ToolsDone`` step's ``outcomes``; without ``call_id`` the outcomes go,
in order, to the calls of the last ``InvokeTools``."""


def _step(check: _Checker, raw: Any, turn: int, index: int) -> Step:
    path = f"turn[{turn + 1}].steps[{index + 1}]"
    line = check.lines.step(turn, index)
    if not isinstance(raw, dict):
        raise check.fail(line, path, f"must be a table like {{event = ...}}, got {raw!r}")
    event = raw.get("event")
    if event not in EVENTS:
        named = f"unknown event {event!r}" if event is not None else "has no 'event' key"
        where = f"{path}.event" if event is not None else path
        raise check.fail(line, where, f"{named} (one of {', '.join(EVENTS)})")
    values = check.table(raw, {**STEP_KEYS, **EVENT_KEYS[str(event)]}, path, lambda _k: line)
    if event == "ModelReplied":
        values["tool_calls"] = tuple(
            ToolCallSpec(**check.table(call, CALL_KEYS, f"{path}.tool_calls[{i}]", lambda _k: line))
            for i, call in enumerate(values.get("tool_calls", ()), 1)
        )
    if event == "ToolsDone":
        values["outcomes"] = tuple(
            _outcome(check, item, f"{path}.outcomes[{i}]", line)
            for i, item in enumerate(values["outcomes"], 1)
        )
    common = {key: values.pop(key) for key in STEP_KEYS if key in values}
    return Step(
        common["event"],
        values,
        common.get("repeat", 1),
        float(common.get("takes", 0.0)),
        common.get("expect_action"),
        path,
        line,
    )


def _outcome(check: _Checker, raw: Any, path: str, line: int) -> OutcomeSpec:
    values = check.table(raw, OUTCOME_KEYS, path, lambda _key: line)
    if values["ok"] and "category" in values:
        raise check.fail(line, f"{path}.category", "a successful outcome has no error category")
    if values["ok"] and values.get("invoke_failed"):
        raise check.fail(line, f"{path}.invoke_failed", "a successful outcome was invoked")
    return OutcomeSpec(**values)


def _turn(check: _Checker, raw: Any, index: int) -> TurnSpec:
    path = f"turn[{index + 1}]"
    line = check.lines.turn(index)
    values = check.table(raw, TURN_KEYS, path, lambda key: check.lines.key(key, line) or line)
    return TurnSpec(
        tuple(_step(check, step, index, i) for i, step in enumerate(values["steps"])),
        values.get("repeat", 1),
        values.get("expect_status"),
        values.get("expect_fallbacks"),
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

    def line_of(key: str) -> int:
        if key == "settings":
            return lines.settings or 1
        return lines.key(key, None) or 1

    values = check.table(data, TOP_KEYS, "", line_of)
    if "turn" not in values:
        raise check.fail(1, "turn", "the scenario has no [[turn]] table")
    table = values.get("settings", {})
    try:
        settings = Settings.from_dict(table, source="[settings]")
    except ConfigError as exc:
        field, problem = str(exc).split(":", 1)
        at = lines.key(field, lines.settings) or lines.settings
        raise check.fail(at, f"settings.{field}", problem.strip()) from None
    specs = tuple(_turn(check, raw, i) for i, raw in enumerate(values["turn"]))
    _check_events(check, specs)
    return Scenario(
        name=name,
        source=source,
        description=values.get("description", ""),
        seed=values.get("seed", 0),
        settings=settings,
        settings_table=dict(table),
        turns=specs,
        expect_turn_status=values.get("expect_turn_status"),
        expect_session_status=values.get("expect_session_status"),
        expect_retries_used=values.get("expect_retries_used"),
        end=values.get("end"),
        expect_lines={key: line_of(key) for key in TOP_KEYS if key.startswith("expect_")},
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
