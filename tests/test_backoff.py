"""Backoff formula, jitter and retry-after precedence."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import statemachine as sm
from statemachine.core import _backoff
from statemachine.core._backoff import jitter, wait_seconds
from statemachine.core._retry_after import retry_after

from .helpers import calling_turn, fail, new_session

SPECS = Path(__file__).parent.parent / "specs"
WALL = 1_000_000_000.0


def _formula(text: str) -> list[str]:
    block = text.split("```")[1] if "<!--" not in text else text.split("<!-- formula -->")[1]
    block = block.split("```")[1] if "```" in block else block
    return [line.strip() for line in block.strip().splitlines() if "=" in line]


@pytest.mark.requirement("ER-22")
def test_formula_in_docstring_and_spec_agree() -> None:
    """The formula is written twice, in ``_backoff``'s docstring and ``specs/backoff.md``;
    the two say the same."""
    doc = _backoff.__doc__ or ""
    doc_lines = [
        line.strip() for line in doc.split("::")[1].split("``n``")[0].splitlines() if "=" in line
    ]
    spec_lines = _formula((SPECS / "backoff.md").read_text())
    assert doc_lines == spec_lines
    assert len(doc_lines) == 2


@pytest.mark.requirement("ER-22")
@given(st.integers(0, 2**64 - 1), st.integers(0, 10**6))
def test_jitter_is_uniform_in_unit_interval(seed: int, draw: int) -> None:
    """Every draw lies in [0, 1) and is a pure function of (seed, draw)."""
    u = jitter(seed, draw)
    assert 0.0 <= u < 1.0
    assert jitter(seed, draw) == u


def test_jitter_spreads_over_the_interval() -> None:
    """Draws of one seed cover the interval roughly evenly (no stuck bits)."""
    draws = [jitter(7, i) for i in range(4000)]
    buckets = [0] * 10
    for u in draws:
        buckets[int(u * 10)] += 1
    assert min(buckets) > 300
    assert max(buckets) < 500


def _delay_ms(n: int, base: float, factor: float, cap: float) -> float:
    """``delay_ms(n)`` as ``specs/backoff.md`` writes it: ``min(base * factor ** n, cap)``
    (a power too large for a float is the cap)."""
    try:
        return min(base * float(factor) ** n, cap)
    except OverflowError:
        return cap


@pytest.mark.requirement("ER-22")
@pytest.mark.requirement("ER-1")
@given(
    n=st.integers(0, 40),
    u=st.floats(0, 1, exclude_max=True),
    base=st.floats(0, 10_000),
    factor=st.floats(1, 10),
    cap=st.floats(0, 100_000),
)
def test_wait_lies_in_the_contract_envelope(
    n: int, u: float, base: float, factor: float, cap: float
) -> None:
    """Without a retry-after the n-th wait lies in [0.5, 1.5) x min(base*factor^n, cap)."""
    nominal = _delay_ms(n, base, factor, cap)
    assert nominal <= cap
    seconds = wait_seconds(n, u, None, base, factor, cap)
    assert 0.5 * nominal / 1000 - 1e-9 <= seconds <= 1.5 * nominal / 1000 + 1e-9


@pytest.mark.requirement("ER-3")
@given(st.integers(0, 8), st.floats(0, 1, exclude_max=True), st.floats(0, 1e6))
def test_retry_after_is_a_floor(n: int, u: float, server: float) -> None:
    """The wait is never shorter than the server's requested wait."""
    assert wait_seconds(n, u, server, 500, 2, 30_000) >= server


def test_huge_retry_numbers_do_not_overflow() -> None:
    """A factor to a huge power caps at ``max_delay_ms`` instead of raising."""
    assert wait_seconds(10_000, 0.5, None, 500, 2.0, 30_000) == 30.0
    assert wait_seconds(10_000, 0.0, None, 500, 2.0, 30_000) == 15.0


def _truth_rows() -> list[tuple[str, str, str, str, str]]:
    text = (SPECS / "retry-after.md").read_text()
    table = text.split("<!-- truth-table -->")[1].split("<!-- /truth-table -->")[0]
    rows = []
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[0], cells[1], cells[2], cells[3], cells[4]))
    return rows


@pytest.mark.requirement("ER-4")
@pytest.mark.requirement("ER-21")
@pytest.mark.parametrize(("s", "ms", "ra", "date", "expected"), _truth_rows())
def test_retry_after_truth_table(s: str, ms: str, ra: str, date: str, expected: str) -> None:
    """Each row of the precedence truth table in ``specs/retry-after.md`` holds."""
    headers = {}
    if ms != "-":
        headers["Retry-After-Ms"] = ms
    if ra != "-":
        headers["RETRY-AFTER"] = ra
    if date != "-":
        headers["Date"] = date
    field = None if s == "-" else float(s)
    error = sm.ModelError("rate_limited", retry_after_seconds=field, headers=headers or None)
    got = retry_after(error, WALL)
    if expected == "none":
        assert got is None
    else:
        assert got is not None
        assert math.isclose(got, float(expected), abs_tol=1e-6)


@pytest.mark.requirement("ER-21")
@given(
    st.one_of(
        st.text(max_size=30),
        st.floats(allow_nan=True, allow_infinity=True).map(str),
        st.integers(-(10**30), 10**30).map(str),
    )
)
def test_arbitrary_header_values_never_raise(raw: str) -> None:
    """Whatever the headers hold, reading them never raises and never gives a negative
    or non-finite wait."""
    error = sm.ModelError("overloaded", headers={"retry-after": raw, "retry-after-ms": raw})
    got = retry_after(error, WALL)
    assert got is None or (math.isfinite(got) and got >= 0)


@pytest.mark.requirement("ER-3")
@pytest.mark.requirement("ER-4")
def test_engine_wait_honours_headers_case_insensitively() -> None:
    """A ``Retry-After`` header with odd casing raises the engine's Wait to its value."""
    session = new_session()
    turn = calling_turn(session)
    action = turn.send(fail("rate_limited", headers=[("ReTrY-aFtEr", "9")]))
    assert isinstance(action, sm.Wait)
    assert action.seconds == 9.0


@pytest.mark.requirement("ER-21")
def test_engine_ignores_garbage_retry_after() -> None:
    """A garbage retry-after neither raises nor changes the jittered wait."""
    clean = calling_turn(new_session(seed=3)).send(fail("rate_limited"))
    dirty = calling_turn(new_session(seed=3)).send(
        fail("rate_limited", retry_after_seconds=float("nan"), headers={"retry-after": "x"})
    )
    assert isinstance(clean, sm.Wait) and isinstance(dirty, sm.Wait)
    assert clean.seconds == dirty.seconds


@pytest.mark.requirement("ER-1")
@pytest.mark.requirement("ER-25")
def test_jitter_varies_from_seed_to_seed_and_repeats_per_seed() -> None:
    """Different seeds give different waits; the same seed gives the same."""
    waits = {}
    for seed in range(20):
        action = calling_turn(new_session(seed=seed)).send(fail("overloaded"))
        assert isinstance(action, sm.Wait)
        waits[seed] = action.seconds
    assert len(set(waits.values())) == 20
    again = calling_turn(new_session(seed=5)).send(fail("overloaded"))
    assert isinstance(again, sm.Wait) and again.seconds == waits[5]


def test_spec_table_of_default_waits_matches_settings() -> None:
    """The default schedule table in ``specs/backoff.md`` matches the defaults."""
    text = (SPECS / "backoff.md").read_text()
    rows = re.findall(r"^\| (\d) \| (\d+) \|", text, flags=re.M)
    settings = sm.Settings()
    assert len(rows) == settings.max_retries
    for n, delay in rows:
        assert float(delay) == _delay_ms(
            int(n), settings.base_delay_ms, settings.backoff_factor, settings.max_delay_ms
        )
        # u = 0.5 leaves the delay unjittered: the engine's wait is the table's
        assert (
            wait_seconds(
                int(n),
                0.5,
                None,
                settings.base_delay_ms,
                settings.backoff_factor,
                settings.max_delay_ms,
            )
            == float(delay) / 1000
        )


@pytest.mark.requirement("ER-21")
@pytest.mark.requirement("ER-4")
def test_headers_with_numbers_or_odd_values_never_raise() -> None:
    """A header value given as a number is read as text; one of another type is
    dropped; neither raises."""
    numeric = sm.ModelError("rate_limited", headers={"retry-after": 5})
    assert retry_after(numeric, WALL) == 5.0
    odd = sm.ModelError("rate_limited", headers={"retry-after": None, "x": object()})
    assert retry_after(odd, WALL) is None
    assert sm.Headers([("a", "1"), "not-a-pair"]) == {"a": "1"}


VECTORS = json.loads((Path(__file__).parent / "data" / "backoff-vectors.json").read_text("utf-8"))
"""Known answers written once by the first release; any change to the documented formula,
the jitter's constants, its first draw or the default seed fails here."""


@pytest.mark.requirement("ER-22")
@pytest.mark.parametrize(("seed", "draw", "expected"), VECTORS["jitter"])
def test_jitter_known_answers(seed: int, draw: int, expected: str) -> None:
    """``jitter(seed, draw)`` is bit for bit the committed value."""
    assert repr(jitter(seed, draw)) == expected


@pytest.mark.requirement("ER-22", "ER-1")
@pytest.mark.parametrize("case", VECTORS["schedules"], ids=lambda c: f"{c['settings']}-{c['seed']}")
def test_backoff_schedule_known_answers(case: dict[str, object]) -> None:
    """A call failing with rate limits until it stops gets exactly the committed waits,
    then the committed status."""
    settings = sm.Settings(**case["settings"])  # type: ignore[arg-type]
    session = sm.Session(settings, seed=case["seed"], clock=lambda: 0.0, wall_clock=lambda: 1.7e9)  # type: ignore[arg-type]
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("r", 1))
    waits = []
    while True:
        action = turn.send(sm.ModelFailed(sm.ModelError("rate_limited")))
        if not isinstance(action, sm.Wait):
            assert isinstance(action, sm.Finish)
            assert action.status.value == case["then"]
            break
        waits.append(repr(action.seconds))
        turn.send(sm.WaitDone())
    assert waits == case["waits"]


@pytest.mark.requirement("ER-22", "ER-4")
def test_backoff_with_retry_after_known_answers() -> None:
    """Server retry-afters raise the committed waits exactly where they are larger."""
    session = sm.Session(sm.Settings(), seed=5, clock=lambda: 0.0, wall_clock=lambda: 1.7e9)
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("r", 1))
    for retry_after_seconds, expected in VECTORS["with_retry_after"]:
        error = sm.ModelError("overloaded", retry_after_seconds=retry_after_seconds)
        action = turn.send(sm.ModelFailed(error))
        got = repr(action.seconds) if isinstance(action, sm.Wait) else action.status.value  # type: ignore[union-attr]
        assert got == expected
        if isinstance(action, sm.Wait):
            turn.send(sm.WaitDone())
