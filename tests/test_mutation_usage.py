"""What issue 38's mutation sample of a model call's usage (``core/_usage.py``, seed
20261207) found untested: the ends of each field's range, where a host's value is kept
or refused."""

from __future__ import annotations

import pytest

import statemachine as sm


@pytest.mark.requirement("ER-143")
def test_a_usage_text_of_1000_characters_is_kept_and_1001_refused() -> None:
    """A model name (or any text field) of exactly 1000 characters is kept as given; one
    more is refused naming the field."""
    name = "m" * 1000
    assert sm.Usage(model=name).model == name
    assert sm.Usage(server_address=name).server_address == name
    with pytest.raises(sm.InvalidValue, match=r"^Usage\.model: longer than 1000 characters$"):
        sm.Usage(model=name + "m")


@pytest.mark.requirement("ER-150")
def test_a_server_port_is_kept_from_1_to_65535() -> None:
    """The server's port is an int from 1 to 65535 (both kept); 0 and 65536 are
    refused naming the field and the range."""
    assert sm.Usage(server_port=1).server_port == 1
    assert sm.Usage(server_port=65535).server_port == 65535
    for port in (0, 65536):
        with pytest.raises(
            sm.InvalidValue, match=r"^Usage\.server_port: must be an int from 1 to 65535"
        ):
            sm.Usage(server_port=port)


@pytest.mark.requirement("ER-143")
@pytest.mark.parametrize("cost", [-0.5, -1e-9, -2, -1.0])
def test_a_negative_usage_cost_is_refused(cost: float) -> None:
    """A cost below zero, however small, is refused naming the field and the value."""
    with pytest.raises(
        sm.InvalidValue, match=r"^Usage\.cost_usd: must be a finite number >= 0 or None, got -"
    ):
        sm.Usage(cost_usd=cost)


@pytest.mark.requirement("ER-143")
@pytest.mark.parametrize("cost", [0, 0.0, -0.0])
def test_a_usage_cost_of_zero_is_kept(cost: float) -> None:
    """A call that cost nothing (a cached reply, a free tier) reports 0: kept, as a
    float."""
    usage = sm.Usage(cost_usd=cost)
    assert usage.cost_usd == 0.0
    assert type(usage.cost_usd) is float


@pytest.mark.requirement("ER-143")
@pytest.mark.parametrize("field", ["model", "response_id", "finish_reason", "provider_name"])
def test_a_usage_text_that_is_not_valid_unicode_is_refused(field: str) -> None:
    """A text field holding a lone surrogate (which no JSON writer can encode, so no
    trace or snapshot could keep it) is refused naming the field."""
    with pytest.raises(sm.InvalidValue, match=rf"^Usage\.{field}"):
        sm.Usage(**{field: "a\ud800"})


@pytest.mark.requirement("ER-143")
def test_a_whole_float_token_count_becomes_an_int() -> None:
    """Some SDKs report token counts as floats: a whole one (``5.0``, ``0.0``) is kept as
    the int; a fraction, a negative one or one past ``2**63 - 1`` is refused naming the
    field and the value as given."""
    usage = sm.Usage(input_tokens=5.0, output_tokens=0.0, reasoning_tokens=2.0**62)
    assert (usage.input_tokens, usage.output_tokens, usage.reasoning_tokens) == (5, 0, 2**62)
    assert type(usage.input_tokens) is int and type(usage.output_tokens) is int
    assert usage.total_tokens == 5
    for bad, shown in ((5.5, "5.5"), (-1.0, "-1.0"), (2.0**63, "9.223372036854776e")):
        with pytest.raises(
            sm.InvalidValue, match=rf"^Usage\.input_tokens: must be an int >= 0 .* got {shown}"
        ):
            sm.Usage(input_tokens=bad)


@pytest.mark.requirement("ER-143")
def test_total_tokens_is_known_only_when_input_and_output_are() -> None:
    """``total_tokens`` is input plus output when both are reported, ``None`` when
    either is unknown (never a guess from one of them)."""
    assert sm.Usage(input_tokens=5, output_tokens=7).total_tokens == 12
    assert sm.Usage(input_tokens=0, output_tokens=0).total_tokens == 0
    assert sm.Usage(input_tokens=5).total_tokens is None
    assert sm.Usage(output_tokens=7).total_tokens is None
    assert sm.Usage(cost_usd=0.5).total_tokens is None


@pytest.mark.requirement("ER-143")
def test_an_int_cost_is_kept_as_a_float_and_a_huge_one_refused() -> None:
    """A cost given as an int (``3``) is kept as the float ``3.0``; an int too large for
    a float is refused as not finite, naming the field."""
    usage = sm.Usage(cost_usd=3)
    assert usage.cost_usd == 3.0 and type(usage.cost_usd) is float
    with pytest.raises(sm.InvalidValue, match=r"^Usage\.cost_usd: must be a finite number"):
        sm.Usage(cost_usd=10**400)
