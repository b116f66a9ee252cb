"""Settings: defaults, validation, TOML."""

from __future__ import annotations

import inspect
from pathlib import Path

import attrs
import pytest

import statemachine as sm


@pytest.mark.requirement("ER-2")
def test_defaults_are_the_specs_canonical_values() -> None:
    """With no configuration the engine uses 500 ms, x2 and 5 retries."""
    settings = sm.Settings()
    assert settings.base_delay_ms == 500
    assert settings.backoff_factor == 2
    assert settings.max_retries == 5
    assert settings.breaker_threshold == 3
    assert 3 <= settings.doom_loop_threshold <= 5
    assert settings.max_delay_ms >= 8000
    assert settings.session_retry_ceiling > settings.max_retries
    assert (settings.max_turns, settings.max_cost_usd, settings.max_wall_clock_s) == (None,) * 3
    assert settings.fallback_models == ()


@pytest.mark.requirement("ER-2")
def test_settings_are_frozen_and_configurable() -> None:
    """Every knob can be set; a settings object cannot be changed afterwards."""
    settings = sm.Settings(base_delay_ms=100, backoff_factor=3, max_retries=2)
    assert (settings.base_delay_ms, settings.backoff_factor, settings.max_retries) == (100, 3, 2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        settings.max_retries = 9  # type: ignore[misc]


@pytest.mark.requirement("ER-28")
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("base_delay_ms", -1),
        ("base_delay_ms", float("nan")),
        ("base_delay_ms", "500"),
        ("backoff_factor", 0.5),
        ("backoff_factor", float("inf")),
        ("max_retries", -1),
        ("max_retries", 2.5),
        ("max_retries", True),
        ("max_delay_ms", -5),
        ("session_retry_ceiling", -1),
        ("breaker_threshold", 0),
        ("doom_loop_threshold", 1),
        ("max_turns", -1),
        ("max_cost_usd", -0.01),
        ("max_wall_clock_s", float("nan")),
        ("fallback_models", "gpt-x"),
        ("fallback_models", ["ok", ""]),
        ("model", ""),
        ("model_timeout_s", 0),
        ("max_server_wait_s", -1),
    ],
)
def test_invalid_values_raise_config_error_naming_the_field(field: str, value: object) -> None:
    """A bad value is refused with a ConfigError whose message starts with the field."""
    with pytest.raises(sm.ConfigError) as info:
        sm.Settings(**{field: value})
    assert str(info.value).startswith(f"{field}:")
    assert isinstance(info.value, ValueError)


@pytest.mark.requirement("ER-28")
def test_unknown_key_and_positional_arguments_are_refused() -> None:
    """An unknown keyword names itself; settings take keywords only."""
    with pytest.raises(sm.ConfigError, match=r"^max_retry: unknown setting"):
        sm.Settings(max_retry=3)
    with pytest.raises(sm.ConfigError, match="keyword"):
        sm.Settings(500)


@pytest.mark.requirement("ER-28")
def test_from_toml_reads_the_settings_table_from_text_and_file(tmp_path: Path) -> None:
    """``from_toml`` reads a ``[settings]`` table, from text or from a path."""
    text = '[settings]\nbase_delay_ms = 250\nfallback_models = ["b", "c"]\n[other]\nx = 1\n'
    from_text = sm.Settings.from_toml(text)
    path = tmp_path / "s.toml"
    path.write_text(text)
    assert sm.Settings.from_toml(path) == from_text
    assert sm.Settings.from_toml(str(path)) == from_text
    assert from_text.base_delay_ms == 250
    assert from_text.fallback_models == ("b", "c")


@pytest.mark.requirement("ER-28")
@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[settings]\nmax_retries = -2\n", r"^max_retries: must be >= 0"),
        ("[settings]\nmax_retrys = 2\n", r"^max_retrys: unknown setting"),
        ("[settings]\nbackoff_factor = 'two'\n", r"^backoff_factor: must be a number"),
        ("[settings\nmax_retries = 2\n", r"not valid TOML.*line 1"),
        ("max_retries = 2\n", "^max_retries: a setting outside the \\[settings\\] table"),
        ("[setting]\nmax_retries = 2\n", "did you mean \\[settings\\]"),
        ("settings = 3\n", "must be a table"),
    ],
)
def test_from_toml_errors_name_the_problem(text: str, match: str) -> None:
    """Bad TOML, bad values and unknown keys are ConfigErrors that say what is wrong."""
    with pytest.raises(sm.ConfigError, match=match):
        sm.Settings.from_toml(text)


@pytest.mark.requirement("ER-28")
def test_an_unknown_keyword_lists_the_known_fields_like_the_toml_path() -> None:
    """``Settings(unknown=...)`` is a ConfigError naming the keyword, a close field and
    every known field, as ``from_dict`` and ``from_toml`` do."""
    with pytest.raises(sm.ConfigError) as by_keyword:
        sm.Settings(max_retry=3)
    with pytest.raises(sm.ConfigError) as by_table:
        sm.Settings.from_toml("[settings]\nmax_retry = 3\n")
    for info in (by_keyword, by_table):
        message = str(info.value)
        assert message.startswith("max_retry: unknown setting")
        assert "did you mean max_retries?" in message
        known = message.split("(known: ", 1)[1].rstrip(")").split(", ")
        assert known == sorted(f.name for f in attrs.fields(sm.Settings))


@pytest.mark.requirement("ER-28")
def test_from_dict_with_keys_of_mixed_types_names_the_unknown_one() -> None:
    """A non-str key is unknown like any other (not a TypeError from sorting them)."""
    with pytest.raises(sm.ConfigError, match=r"^3: unknown setting"):
        sm.Settings.from_dict({3: 1, "max_retry": 2, "max_retries": 2})


@pytest.mark.requirement("ER-28")
@pytest.mark.parametrize(
    "path",
    [
        pytest.param(Path("settings\0.toml"), id="nul-byte-path"),
        pytest.param("settings\0.toml", id="nul-byte-str"),
        pytest.param(Path("/"), id="a-directory"),
    ],
)
def test_a_path_that_cannot_be_read_is_a_config_error_naming_it(path: Path | str) -> None:
    """A path with a NUL byte or a directory is a ConfigError naming the path (a NUL
    byte used to escape as a bare ValueError from the OS layer)."""
    with pytest.raises(sm.ConfigError) as info:
        sm.Settings.from_toml(path)
    assert type(info.value) is sm.ConfigError
    shown = str(path) if str(path).isprintable() else repr(str(path))
    assert str(info.value).startswith(f"{shown}: ")


@pytest.mark.requirement("ER-28")
def test_any_os_error_reading_the_file_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever ``OSError`` reading raises, with or without an errno, the error is a
    ConfigError that names the path and says why."""
    path = tmp_path / "s.toml"
    path.write_text("[settings]\n")

    def refuse(*_args: object, **_kwargs: object) -> str:
        raise OSError("the disk went away")

    monkeypatch.setattr(Path, "read_text", refuse)
    with pytest.raises(sm.ConfigError) as info:
        sm.Settings.from_toml(path)
    assert str(info.value) == f"{path}: cannot read settings file: the disk went away"


def test_from_toml_missing_file_is_a_config_error(tmp_path: Path) -> None:
    """A path that does not exist is named in the error."""
    missing = tmp_path / "nope.toml"
    with pytest.raises(sm.ConfigError, match=r"nope\.toml"):
        sm.Settings.from_toml(missing)


def test_to_dict_round_trips() -> None:
    """``to_dict`` gives plain data that ``from_dict`` reads back to equal settings."""
    settings = sm.Settings(fallback_models=("a",), max_turns=4, max_cost_usd=1.5)
    assert sm.Settings.from_dict(settings.to_dict()) == settings


@pytest.mark.requirement("ER-2")
@pytest.mark.requirement("ER-28")
@pytest.mark.requirement("ER-94")
def test_a_retry_sub_table_is_read_like_the_specs_settings_block() -> None:
    """``[settings.retry]`` holds the three retry keys together; unknown or doubled keys
    are errors."""
    settings = sm.Settings.from_toml(
        "[settings]\nmax_turns = 4\n[settings.retry]\nbase_delay_ms = 100\n"
        "backoff_factor = 3\nmax_retries = 2\nmax_delay_ms = 9000\n"
    )
    assert (settings.base_delay_ms, settings.backoff_factor, settings.max_retries) == (100, 3, 2)
    assert (settings.max_delay_ms, settings.max_turns) == (9000, 4)
    with pytest.raises(sm.ConfigError, match=r"^retry\.max_turns: unknown retry setting"):
        sm.Settings.from_toml(
            "[settings.retry]\nbase_delay_ms = 1\nbackoff_factor = 2\nmax_retries = 1\n"
            "max_turns = 4\n"
        )
    with pytest.raises(sm.ConfigError, match=r"^max_retries: given both"):
        sm.Settings.from_toml(
            "[settings]\nmax_retries = 1\n[settings.retry]\nbase_delay_ms = 1\n"
            "backoff_factor = 2\nmax_retries = 2\n"
        )


@pytest.mark.requirement("ER-94")
@pytest.mark.parametrize(
    ("given", "missing"),
    [
        ({"base_delay_ms": 100, "max_retries": 2}, "backoff_factor"),
        ({"backoff_factor": 2}, "base_delay_ms"),
        ({"base_delay_ms": 100, "backoff_factor": 2}, "max_retries"),
        ({}, "base_delay_ms"),
    ],
)
def test_a_partial_retry_table_is_refused_naming_what_is_missing(
    given: dict[str, float], missing: str
) -> None:
    """The spec's ``retry{}`` is all-or-nothing: a partial block is a ConfigError that
    names the first missing field, and nothing is built."""
    with pytest.raises(sm.ConfigError, match=rf"^retry\.{missing}: missing") as caught:
        sm.Settings.from_dict({"retry": given})
    assert "all-or-nothing" in str(caught.value)


@pytest.mark.requirement("ER-94")
def test_a_document_without_a_settings_table_gets_the_defaults(tmp_path: Path) -> None:
    """A bare document (no ``[settings]``) works without tuning: the defaults."""
    assert sm.Settings.from_toml("[scenario]\nname = 'x'\n") == sm.Settings()
    path = tmp_path / "empty.toml"
    path.write_text("# nothing here\n", encoding="utf-8")
    assert sm.Settings.from_toml(path) == sm.Settings()


@pytest.mark.requirement("ER-94")
@pytest.mark.parametrize("text", ["# only a comment", "# one\n\n  # two\n", "", "  \n"])
def test_a_document_of_comments_only_gets_the_defaults(text: str) -> None:
    """TOML text that holds only comments or blank lines is the empty document (the
    defaults), not a path that names no file."""
    assert sm.Settings.from_toml(text) == sm.Settings()


def test_a_mistyped_path_is_still_named_as_a_missing_file() -> None:
    """A one-line str that is neither TOML nor a file says so."""
    with pytest.raises(sm.ConfigError, match=r"^nowhere/settings\.toml: no such settings file$"):
        sm.Settings.from_toml("nowhere/settings.toml")


def test_the_constructor_shows_its_fields() -> None:
    """``inspect.signature(Settings)`` lists the fields with their defaults."""
    parameters = inspect.signature(sm.Settings).parameters
    assert parameters["base_delay_ms"].default == 500
    assert parameters["max_retries"].kind is inspect.Parameter.KEYWORD_ONLY
