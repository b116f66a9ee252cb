"""The eleven failure scenarios of docs/integrations.md, run against the real
frameworks alone and with their integrations (``benchmarks/frameworks.py``): the
integrations are correct in every row a model wrapper can decide, and the table the
page shows is the one the harness prints.

Outside CI a missing framework skips this module; in CI (``CI=1``) it fails.
"""

from __future__ import annotations

import os

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("pydantic_ai")
    pytest.importorskip("agents")

from benchmarks import frameworks


@pytest.fixture(scope="module")
def played() -> tuple[str, dict[tuple[str, str, str], frameworks.Outcome]]:
    return frameworks.table()


@pytest.mark.requirement("ER-230", "ER-231", "ER-232", "ER-234")
def test_integrations_are_correct_in_every_row_a_wrapper_can_decide(
    played: tuple[str, dict[tuple[str, str, str], frameworks.Outcome]],
) -> None:
    """Every integration row is correct except the ones CANNOT names (and says why);
    even those are never resent."""
    _, outcomes = played
    for scenario in frameworks.SCENARIOS:
        for framework in frameworks.FRAMEWORKS:
            outcome = outcomes[framework, "engine", scenario.key]
            if (framework, scenario.key) in frameworks.CANNOT:
                assert outcome.main == 1 and outcome.status == "stream_interrupted", outcome
                continue
            assert frameworks.correct(scenario, outcome), (framework, scenario.key, outcome)
    wrong = {
        key: outcome
        for key, outcome in outcomes.items()
        if key[1] == "alone"
        and not frameworks.correct(
            next(s for s in frameworks.SCENARIOS if s.key == key[2]), outcome
        )
    }
    # the frameworks alone miss rows the engine gets right: what the page is about
    assert {(framework, key) for framework, _, key in wrong} >= {
        ("pydantic-ai", "401-fallback"),
        ("openai-agents", "insufficient-quota"),
        ("openai-agents", "tpm-reduce"),
    }


def test_the_page_shows_the_table_the_harness_prints(
    played: tuple[str, dict[tuple[str, str, str], frameworks.Outcome]],
) -> None:
    """docs/integrations.md holds the table as ``python -m benchmarks.frameworks
    --write`` writes it (run that after changing an integration or a scenario)."""
    text, _ = played
    assert frameworks.written() == text


def test_correct_judges_each_scenario_by_its_own_rule() -> None:
    """The judge rejects the failures each rule is about (a fallback that answered a
    401, a resent overflow, a second request after a broken stream) and an unknown
    scenario."""
    by_key = {scenario.key: scenario for scenario in frameworks.SCENARIOS}
    hidden = frameworks.Outcome(main=1, backup=1, answer="from the fallback")
    assert not frameworks.correct(by_key["401-fallback"], hidden)
    resent = frameworks.Outcome(main=2, answer="ok", sizes=[9, 9])
    assert not frameworks.correct(by_key["context-overflow"], resent)
    assert frameworks.correct(
        by_key["context-overflow"], frameworks.Outcome(answer="ok", sizes=[9, 5])
    )
    twice = frameworks.Outcome(main=2, status="stream_interrupted", tokens=127)
    assert not frameworks.correct(by_key["stream-broken"], twice)
    with pytest.raises(ValueError, match="no such scenario"):
        frameworks.correct(frameworks.Scenario("nope", "nope", ()), frameworks.Outcome())


def test_overhead_benchmark_reports_both_frameworks_as_ratios() -> None:
    """``benchmarks.frameworks.run`` (tiny counts; timings are never asserted) measures
    each framework alone and through its integration, and reports the ratio."""
    result = frameworks.run(n=2, repeats=1)
    assert set(result["rows"]) == {
        f"{framework} {mode}"
        for framework in frameworks.FRAMEWORKS
        for mode in ("alone", "+ EngineModel")
    } | {"the engine's own turn per request (no framework)"}
    assert all(value > 0 for value in result["rows"].values())
    assert set(result["ratios"]) == {
        f"{framework}: EngineModel / alone" for framework in frameworks.FRAMEWORKS
    }
