"""``Settings``: every knob of the engine, validated, with documented defaults.

Defaults we chose where the specification leaves the value open:

* ``max_delay_ms = 30_000``: well above the canonical schedule (8 s for the fifth
  retry), so the spec's defaults are never clipped, yet a raised ``max_retries`` cannot
  make one wait grow past half a minute.
* ``session_retry_ceiling = 20``: four calls' worth of spent retries; a session that
  needs more is in an outage, and should stop spending time and money.
* ``doom_loop_threshold = 3``: the third identical call in a row shows the model
  learned nothing from the first two results.
* ``max_server_wait_s = 300``: a server asking for more than five minutes is better
  parked (``retry_deferred``, with ``Finish.retry_at``) than slept on.
* ``max_context_reductions = 3``: a context that overflows after three reductions is
  not converging.
* ``denial_threshold = 5``: five denials in a row is a denial storm (the doom-loop
  guard already stops the third *identical* call).
* ``max_conflict_retries = 3``: a conflict that survives three serialized retries is
  not transient.
* ``doom_check_window = 10``; sliding windows are off unless both settings are given.
"""

from __future__ import annotations

import difflib
import inspect
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ._exceptions import ConfigError
from ._json_data import MAX_COUNT, finite, json_problem


def _number(*, minimum: float = 0.0, optional: bool = False) -> Any:
    def check(_instance: object, attribute: Any, value: Any) -> None:
        name = attribute.name
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{name}: must be a number, got {value!r:.60}")
        if not finite(value) or value < minimum:
            raise ConfigError(f"{name}: must be a finite number >= {minimum:g}, got {value!r}")

    return check


def _integer(*, minimum: int = 0, optional: bool = False) -> Any:
    def check(_instance: object, attribute: Any, value: Any) -> None:
        name = attribute.name
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: must be an int, got {value!r:.60}")
        if value < minimum:
            raise ConfigError(f"{name}: must be >= {minimum}, got {value!r}")
        if value > MAX_COUNT:
            raise ConfigError(f"{name}: must be < 2**63, got an int of {value.bit_length()} bits")

    return check


def _positive(_instance: object, attribute: Any, value: Any) -> None:
    name = attribute.name
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name}: must be a number or None, got {value!r:.60}")
    if not finite(value) or value <= 0:
        raise ConfigError(f"{name}: must be a finite number > 0, got {value!r}")


def _flag(_instance: object, attribute: Any, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{attribute.name}: must be true or false, got {value!r:.60}")


def _models(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ConfigError(f"fallback_models: must be a list of model names, got {value!r}")
    for name in value:
        if not isinstance(name, str) or not name or json_problem(name) is not None:
            raise ConfigError(
                f"fallback_models: model names must be non-empty, valid text, got {name!r:.60}"
            )
    return tuple(str(name) for name in value)


def _model(_instance: object, _attribute: object, value: Any) -> None:
    if value is not None and (
        not isinstance(value, str) or not value or json_problem(value) is not None
    ):
        raise ConfigError(f"model: must be a non-empty, valid str or None, got {value!r:.60}")


@attrs.frozen(kw_only=True)
class Settings:
    """The engine's settings. Every field has a default; all are keyword-only.

    Retry: the n-th retry of one call waits the backoff of ``_backoff.py`` (from
    ``base_delay_ms``, ``backoff_factor``, ``max_delay_ms``, the session's jitter and the
    server's retry-after); a call is retried at most ``max_retries`` times, a session at
    most ``session_retry_ceiling`` times, and a ``concurrency_conflict`` tool call at
    most ``max_conflict_retries`` times, one call at a time.

    Bounds (``None`` = unbounded): ``max_turns``, ``max_cost_usd`` and
    ``max_wall_clock_s`` (the injected clock; with ``wall_clock_counts_idle = False``
    without the time between turns) are checked after every turn; one that fires
    takes the limit-reached path, as do the breakers: ``breaker_threshold`` crashed
    rounds of one tool provider in a row (or ``breaker_window_threshold`` of its last
    ``breaker_window``), and ``denial_threshold`` ``permission_denied`` outcomes in a
    row (or ``denial_window_threshold`` of the last ``denial_window``).
    """

    base_delay_ms: float = attrs.field(default=500, validator=_number())
    backoff_factor: float = attrs.field(default=2.0, validator=_number(minimum=1.0))
    max_retries: int = attrs.field(default=5, validator=_integer())
    max_delay_ms: float = attrs.field(default=30_000, validator=_number())
    session_retry_ceiling: int = attrs.field(default=20, validator=_integer())
    max_server_wait_s: float = attrs.field(default=300.0, validator=_number())
    max_context_reductions: int = attrs.field(default=3, validator=_integer())
    breaker_threshold: int = attrs.field(default=3, validator=_integer(minimum=1))
    doom_loop_threshold: int = attrs.field(default=3, validator=_integer(minimum=2))
    max_turns: int | None = attrs.field(default=None, validator=_integer(optional=True))
    max_cost_usd: float | None = attrs.field(default=None, validator=_number(optional=True))
    max_wall_clock_s: float | None = attrs.field(default=None, validator=_number(optional=True))
    denial_threshold: int | None = attrs.field(
        default=5, validator=_integer(minimum=1, optional=True)
    )
    denial_window: int | None = attrs.field(
        default=None, validator=_integer(minimum=1, optional=True)
    )
    denial_window_threshold: int | None = attrs.field(
        default=None, validator=_integer(minimum=1, optional=True)
    )
    breaker_window: int | None = attrs.field(
        default=None, validator=_integer(minimum=1, optional=True)
    )
    breaker_window_threshold: int | None = attrs.field(
        default=None, validator=_integer(minimum=1, optional=True)
    )
    max_conflict_retries: int = attrs.field(default=3, validator=_integer())
    doom_check_window: int = attrs.field(default=10, validator=_integer(minimum=2))
    wall_clock_counts_idle: bool = attrs.field(default=True, validator=_flag)
    model: str | None = attrs.field(default=None, validator=_model)
    fallback_models: tuple[str, ...] = attrs.field(default=(), converter=_models)
    model_timeout_s: float | None = attrs.field(default=None, validator=_positive)
    tool_timeout_s: float | None = attrs.field(default=None, validator=_positive)

    def __attrs_post_init__(self) -> None:
        for window, threshold in (
            ("denial_window", "denial_window_threshold"),
            ("breaker_window", "breaker_window_threshold"),
        ):
            size, count = getattr(self, window), getattr(self, threshold)
            if (size is None) != (count is None):
                given, other = (window, threshold) if count is None else (threshold, window)
                raise ConfigError(f"{other}: must be set together with {given} (a sliding window)")
            if size is not None and count > size:
                raise ConfigError(
                    f"{threshold}: {count} events cannot fit a window of {window} = {size}"
                )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "settings") -> Settings:
        """Build settings from a mapping; an unknown key raises ``ConfigError``. A
        ``retry`` sub-table (the specification's block) holds all of ``base_delay_ms``,
        ``backoff_factor`` and ``max_retries`` once given, and no key given beside it.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: must be a table of settings, got {data!r}")
        if "retry" in data:
            data = _flatten_retry(data, source)
        unknown = sorted(set(data) - FIELD_NAMES, key=str)
        if unknown:
            raise _unknown(unknown[0], f" in {source}")
        return cls(**data)

    @classmethod
    def from_toml(cls, text_or_path: str | os.PathLike[str]) -> Settings:
        """Read the ``[settings]`` table of a TOML document or file (a ``Path``, or a
        str that names an existing file and holds no ``=``). Other tables are ignored;
        a document with no ``[settings]`` table gets the defaults.
        """
        source, text = _read(text_or_path)
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{source}: not valid TOML: {exc}") from None
        table = document.get("settings")
        if table is None:  # a bare document works without tuning, as the spec's does
            _check_stray(document, source)
            return cls()
        return cls.from_dict(table, source=f"{source} [settings]")

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain data (``from_dict`` reads it back)."""
        data = attrs.asdict(self)
        data["fallback_models"] = list(self.fallback_models)
        return data


FIELD_NAMES = frozenset(f.name for f in attrs.fields(Settings))


def _unknown(name: object, where: str) -> ConfigError:
    """The error for an unknown setting: it names the key, where it was given, a
    close known name if there is one, and every known field."""
    text = name if isinstance(name, str) else repr(name)
    close = difflib.get_close_matches(text, sorted(FIELD_NAMES), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return ConfigError(
        f"{text}: unknown setting{where}{hint} (known: {', '.join(sorted(FIELD_NAMES))})"
    )


REQUIRED_RETRY_FIELDS = ("base_delay_ms", "backoff_factor", "max_retries")
"""The three fields the specification's ``retry{}`` block requires once it is given."""
RETRY_FIELD_NAMES = frozenset(
    (*REQUIRED_RETRY_FIELDS, "max_delay_ms", "session_retry_ceiling", "max_server_wait_s")
)
"""Every field a ``retry{}`` block may give."""


def _flatten_retry(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    retry = data["retry"]
    if not isinstance(retry, Mapping):
        raise ConfigError(f"retry: must be a table of retry settings in {source}, got {retry!r}")
    missing = [key for key in REQUIRED_RETRY_FIELDS if key not in retry]
    if missing:
        raise ConfigError(
            f"retry.{missing[0]}: missing in {source}: a retry table is all-or-nothing "
            f"(give {', '.join(REQUIRED_RETRY_FIELDS)} together, or leave it out; "
            f"missing: {', '.join(missing)})"
        )
    flat = {key: value for key, value in data.items() if key != "retry"}
    for key, value in retry.items():
        if key not in RETRY_FIELD_NAMES:
            raise ConfigError(
                f"retry.{key}: unknown retry setting in {source} "
                f"(known: {', '.join(sorted(RETRY_FIELD_NAMES))})"
            )
        if key in flat:
            raise ConfigError(f"{key}: given both in {source} and in its retry table")
        flat[key] = value
    return flat


def _check_stray(document: Mapping[str, Any], source: str) -> None:
    """A document without ``[settings]`` gets the defaults, unless it looks like a
    settings table that missed: a setting at the top level, or ``[setting]``."""
    for key, value in document.items():
        if key in FIELD_NAMES or key == "retry":
            raise ConfigError(f"{key}: a setting outside the [settings] table of {source}")
        if isinstance(value, Mapping) and difflib.get_close_matches(key, ["settings"], cutoff=0.8):
            raise ConfigError(f"[{key}]: not a table of {source}; did you mean [settings]?")


_attrs_init = Settings.__init__


def _init(self: Settings, *args: Any, **kwargs: Any) -> None:
    # Python would raise a bare TypeError for an unknown keyword; the contract asks
    # for a ConfigError naming it.
    if args:
        raise ConfigError(f"{args[0]!r}: Settings takes keyword arguments only")
    unknown = sorted(set(kwargs) - FIELD_NAMES)
    if unknown:
        raise _unknown(unknown[0], " in Settings()")
    _attrs_init(self, **kwargs)


_init.__signature__ = inspect.signature(_attrs_init)  # type: ignore[attr-defined]
_init.__doc__ = _attrs_init.__doc__
Settings.__init__ = _init  # type: ignore[method-assign]


def _read(text_or_path: str | os.PathLike[str]) -> tuple[str, str]:
    """(a name for messages, the TOML text) of TOML text or a file; reading a file
    fails only with a ``ConfigError`` naming it (a missing or unreadable file, a
    directory, a path with a NUL byte, bytes that are not UTF-8)."""
    if isinstance(text_or_path, str) and (
        "=" in text_or_path or "\n" in text_or_path or not os.path.exists(text_or_path)
    ):
        if not _reads_as_toml(text_or_path):
            raise ConfigError(f"{_shown(text_or_path)}: no such settings file")
        return "settings text", text_or_path
    try:
        path = Path(text_or_path)
    except TypeError:
        raise ConfigError(
            f"settings: expected TOML text or a path, got {type(text_or_path).__name__}"
        ) from None
    name = _shown(str(path))
    try:
        return name, path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read settings file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{name}: not UTF-8 text") from None
    except ValueError as exc:  # a NUL byte in the path: no file can have that name
        raise ConfigError(f"{name}: cannot read settings file: {exc}") from None


def _reads_as_toml(text: str) -> bool:
    """Whether a str that names no file is TOML text rather than a mistyped path: it
    sets a key or opens a table, or it is blank or only comments (the defaults, as the
    empty document gets)."""
    if "=" in text or "[" in text:
        return True
    return all(not line.strip() or line.lstrip().startswith("#") for line in text.splitlines())


def _shown(path: str) -> str:
    """``path`` as a message shows it: as is when printable, else as a repr."""
    return path if path.isprintable() else repr(path)
