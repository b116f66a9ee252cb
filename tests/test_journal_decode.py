"""A journal's Assembled entries, read without the copy of their request: the same event
as the general decoder makes, and every forged one refused with the same error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import settings as settings_
from hypothesis import strategies as st

import statemachine as sm
from statemachine.core._codec import decode
from statemachine.store._journal import EVENT, RECORD_VERSION, read_entry

_TEXT = st.text(max_size=8) | st.sampled_from(["\ud800", "é", "$type", "$float"])
_SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([2**14001, -(2**14001), 2**63 - 1, 2**63])
    | st.floats()
    | _TEXT
)
_DATA = st.recursive(
    _SCALAR,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(_TEXT | st.integers(0, 3), inner, max_size=3)
    ),
    max_leaves=10,
)


def _deep(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


_ASSEMBLED = st.fixed_dictionaries(
    {"$type": st.just("Assembled")},
    optional={
        "request": st.integers(98, 102).map(_deep) | _DATA,
        "size": st.integers(-2, 2**64) | st.sampled_from([True, 1.0, None, "1", 2**63 - 1]),
        "extra": _SCALAR,
    },
)


def _outcome(read: Any) -> tuple[str, Any]:
    try:
        return "read", read()
    except ValueError as exc:
        return "refused", str(exc)


def _same(data: dict[Any, Any]) -> None:
    general = _outcome(lambda: decode(data, "event"))
    fast = _outcome(lambda: read_entry(["e", 1.5, None, data], RECORD_VERSION)[0])
    if general[0] == "read":
        assert fast == ("read", (EVENT, general[1]))
        assert type(fast[1][1]) is sm.Assembled
    else:
        assert fast == general


@pytest.mark.requirement("ER-70")
@given(data=_ASSEMBLED)
@example({"$type": "Assembled", "request": _deep(101), "size": 1})
@example({"$type": "Assembled", "request": {"a": ["\ud800"]}, "size": 1})
@example({"$type": "Assembled", "request": [float("inf")], "size": 1})
@example({"$type": "Assembled", "request": {"a": 2**14001}, "size": 1})
@example({"$type": "Assembled", "request": {1: 2}, "size": 1})
@example({"$type": "Assembled", "request": {}, "size": 2**63})
@example({"$type": "Assembled", "request": {}, "size": True})
@example({"$type": "Assembled", "request": {}, "size": -1})
@example({"$type": "Assembled", "request": {}, "extra": 1})
@settings_(max_examples=500, deadline=None)
def test_an_assembled_entry_reads_as_the_general_decoder_reads_it(data: dict[Any, Any]) -> None:
    """Any Assembled entry, well formed or forged (a request that is no JSON data, too
    deep, a lone surrogate, an int too large, a non-finite float, a size out of range
    or of the wrong type, a field missing or unknown): the event the general decoder
    makes, or its very error."""
    _same(data)


@pytest.mark.requirement("ER-70")
@given(request=_DATA)
@settings_(max_examples=300, deadline=None)
def test_an_assembled_entry_fresh_from_the_parser_is_the_event_a_host_sent(request: Any) -> None:
    """An entry as a store gives it back (parsed from its text) is read as the Assembled
    the host sent: equal to it, its request equal to the host's."""
    try:
        sent = sm.Assembled(request, 7)
        text = json.dumps({"$type": "Assembled", "request": sent.request, "size": 7})
    except (ValueError, TypeError):
        return  # no JSON data: never journaled
    data = json.loads(text)
    _same(data)
    step = read_entry(["e", 1.5, None, data], RECORD_VERSION)[0]
    assert step == (EVENT, sent)
    assert step[1].request == sent.request
