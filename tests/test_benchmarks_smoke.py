"""Smoke tests for ``benchmarks/``: every measurement runs with tiny counts and returns
the structure the runner prints. Timings are never asserted (they belong in
``benchmarks/README.md`` as recorded ratios, not in tests)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks import __main__ as runner
from benchmarks import (
    _timing,
    creation,
    driver,
    events,
    hotpath,
    hypothesis_rate,
    memory,
    model_check,
    retry,
)
from benchmarks._timing import measure, ratio


@pytest.fixture(autouse=True)
def _no_full_collect(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiny runs: skip the full ``gc.collect()`` before each timed batch."""
    monkeypatch.setattr(_timing, "FULL_COLLECT", False)


def _positive(value: Any) -> bool:
    return isinstance(value, float | int) and math.isfinite(value) and value > 0


def test_measure_reports_median_per_operation() -> None:
    """``measure`` divides by the op count and reports the repeats it was asked for."""

    def total(values: list[int]) -> int:
        return sum(values)

    result = measure(lambda: list(range(10)), total, 10, repeats=3)
    assert result["repeats"] == 3
    assert result["ops"] == 10
    assert 0 < result["min_us"] <= result["median_us"] <= result["max_us"]
    with pytest.raises(ValueError, match="ops"):
        measure(lambda: None, lambda _: None, 0)
    assert ratio(1.0, 0.0) == math.inf


def test_retry_rows_and_ratios() -> None:
    """Measurement 1 has every variant side by side and the headline ratio."""
    result = retry.run(**runner.QUICK["retry"])
    assert set(result["rows"]) >= {
        "ours (ModelFailed->Wait + WaitDone->CallModel)",
        "tenacity @retry, overhead/attempt",
        "hand-written try/except loop, overhead/attempt",
        "transitions, model add_model-ed (2 triggers)",
        "transitions, model not added (2 triggers)",
        "dict (state, event) table + guard (2 fires)",
    }
    assert _positive(result["rows"]["ours (ModelFailed->Wait + WaitDone->CallModel)"])
    assert _positive(result["ratios"]["ours / tenacity"])
    assert isinstance(result["met"], bool)


def test_dict_table_variant_decides_like_the_engine() -> None:
    """The hand-written table refuses a sixth retry, as the engine's guard does."""
    decider = retry._Decider(0)
    for _ in range(retry.MAX_RETRIES):
        assert retry.fire(decider, "ModelFailed", None)[0] == "wait"
        assert retry.fire(decider, "WaitDone", None) == ("call", decider.attempt)
    with pytest.raises(LookupError):
        retry.fire(decider, "ModelFailed", None)


def test_events_cover_every_path() -> None:
    """Measurement 2 times every step of the four paths."""
    result = events.run(**runner.QUICK["events"])
    assert set(result["paths"]) == {"happy", "retry", "reduction", "tool crash"}
    for name, path in result["paths"].items():
        assert len(path["steps_us"]) == len(events.PATHS[name])
        assert all(_positive(v) for v in path["steps_us"].values())
    assert result["worst_event_us"] == max(p["worst_us"] for p in result["paths"].values())


def test_creation_and_growth() -> None:
    """Measurement 3 reports creation costs and one growth point per live level."""
    result = creation.run(**runner.QUICK["creation"])
    assert set(result["creation_us"]) == {
        "Session()",
        "session.new_turn()",
        "turn.start()",
        "Session() + new_turn()",
    }
    assert list(result["growth_us_per_session_turn_start"]) == ["10 live", "100 live"]
    assert _positive(result["growth_ratio_last_first"])
    assert list(result["transitions_add_model_us"]) == ["10 registered", "20 registered"]


def test_memory_shapes() -> None:
    """Measurement 4a gives bytes per turn and per session+turn for each shape."""
    result = memory.run(**runner.QUICK["memory"])
    assert set(result["shapes"]) == {"calling", "after 1 retry", "after 5 retries"}
    for shape in result["shapes"].values():
        assert _positive(shape["per_turn_bytes"])
        assert shape["per_session_and_turn_bytes"] == pytest.approx(
            shape["per_turn_bytes"] + shape["per_session_bytes"]
        )
    # a retry adds trace entries and actions: the turn grows
    shapes = result["shapes"]
    assert shapes["after 5 retries"]["per_turn_bytes"] > shapes["calling"]["per_turn_bytes"]


def test_driver_runs_or_says_why() -> None:
    """Measurement 4b drives real turns through ``arun_turn`` (or explains the skip)."""
    result = driver.run(**runner.QUICK["driver"])
    if "skipped" in result:
        assert "arun_turn" in result["skipped"]
        return
    assert result["concurrent_turns"] == 20
    assert result["statuses"] == {"completed": 20}
    assert _positive(result["events_per_s"])


def test_model_check_runs_or_says_why() -> None:
    """Measurement 5a times ``check(Settings())`` when the checker exists."""
    result = model_check.run(repeats=1)
    if "skipped" in result:
        assert "_check" in result["skipped"] or "check()" in result["skipped"]
        return
    assert _positive(result["seconds"])
    assert isinstance(result["met"], bool)


def test_hypothesis_statistics_are_parsed() -> None:
    """Measurement 5b reads examples and seconds from hypothesis' statistics output."""
    text = """
tests/test_stateful.py::TurnMachine::runTest:

  - during reuse phase (0.10 seconds):
    - 3 passing examples, 0 failing examples, 1 invalid examples

  - during generate phase (1.50 seconds):
    - Typical runtimes: ~ 1-3 ms, of which ~ 0-1 ms in data generation
    - 96 passing examples, 0 failing examples, 0 invalid examples

  - Stopped because settings.max_examples=100
"""
    parsed = hypothesis_rate.parse_statistics(text)
    assert parsed == {
        "tests/test_stateful.py::TurnMachine::runTest": {
            "examples": 100.0,
            "invalid": 1.0,
            "seconds": 1.6,
        }
    }


def test_hypothesis_rate_skips_a_missing_suite(tmp_path: Path) -> None:
    """A suite that does not exist is a skip with a message, not a crash."""
    missing = hypothesis_rate.ROOT / "tests" / "no_such_suite_here.py"
    assert "does not exist" in hypothesis_rate.run(suite=missing)["skipped"]


def test_optional_modules_are_skipped_when_absent() -> None:
    """Another helper's module that is missing is reported as skipped."""
    result = runner._optional("no_such_benchmark_module", runner._nothing)()
    assert "not available" in result["skipped"]


def test_runner_prints_every_section_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m benchmarks --quick --only ... --json FILE`` prints and writes results."""
    out = tmp_path / "results.json"
    code = runner.main(["--quick", "--only", "retry,events", "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "1. per retry decision" in printed
    assert "ours / tenacity" in printed
    assert "2. per event on every path" in printed
    assert "QUICK RUN" in printed
    data = json.loads(out.read_text(encoding="utf-8"))
    assert set(data) >= {"machine", "retry", "events"}
    assert data["machine"]["nproc"] >= 1


def test_runner_rejects_unknown_names() -> None:
    """An unknown measurement name is a usage error naming it."""
    with pytest.raises(SystemExit):
        runner.main(["--only", "retry,bogus"])


def test_report_survives_a_broken_measurement() -> None:
    """A measurement that raised shows its error; the others still print."""
    results = {
        "machine": runner.machine_info(),
        "quick": True,
        "retry": {"error": "RuntimeError: boom", "wall_s": 0.0},
    }
    text = runner.report(results)
    assert "ERROR: RuntimeError: boom" in text


def test_hotpath_what_if_factories_build_equal_actions() -> None:
    """The profiler's what-if constructors build actions equal to the real ones."""
    import statemachine as sm

    wait = hotpath.fast_wait_factory()(0.5, sm.ErrorCategory.RATE_LIMITED, 1)
    assert wait == sm.Wait(0.5, sm.ErrorCategory.RATE_LIMITED, 1)
    call = hotpath.fast_call_model_factory()("req", 2, "m", True)
    assert call == sm.CallModel("req", 2, "m", True)
    tool = sm.ToolCall("c", "p", "search", {"b": 1, "a": [1, 2]})
    assert hotpath.fingerprint_unhashed(tool) == '["search",{"a":[1,2],"b":1}]'
    result = hotpath.fast_tool_result_factory()("c", "x", True, None)
    assert result == sm.ToolResult("c", "x", True, None)


def test_hotpath_profile_quick() -> None:
    """The profiler returns its profiles, part timings, what-ifs and memory table."""
    result = hotpath.run(quick=True)
    assert "== hot path profile" in result["text"]
    assert len(result["profiles"]) == 2
    assert all(math.isfinite(v) for v in result["parts_us"].values()), result["parts_us"]
    for label, gain in result["what_if_us"].items():
        assert math.isfinite(gain["before_us"]), label
        assert math.isfinite(gain["after_us"]), label
    memory = result["trace_memory"]
    assert all(v > 0 for v in memory.values()), memory


def test_state_copy_quick() -> None:
    """Measurement 6 reports both contenders of each comparison and their ratios."""
    from benchmarks import state_copy

    result = state_copy.run(**runner.QUICK["copy"])
    assert set(result["snapshot_us"]) == {
        "snapshot() + restore()",
        "json.dumps + json.loads of that snapshot",
        "snapshot() alone",
        "restore() alone",
    }
    assert set(result["advance_us"]) == {
        "Worker.advance, InMemoryStore",
        "one engine event (turn.send)",
        "json.dumps of the stored record",
    }
    assert result["snapshot_restore_over_json"] > 0
    assert result["advance_over_event"] > 0
    assert isinstance(result["met"], bool)


def test_classify_bodies_quick() -> None:
    """Measurement 7 times ``sm.classify`` on every body row and reports the bounds it
    reads within (each row's category is checked by the measurement itself)."""
    from benchmarks import classify_bodies

    result = classify_bodies.run(**runner.QUICK["classify"])
    assert list(result["rows"]) == list(classify_bodies.ROWS)
    assert all(_positive(v) for v in result["rows"].values())
    assert result["categories"][classify_bodies.ROWS[1]] == "overloaded"
    assert set(result["bounds"]) == {"MAX_BODY", "MAX_SSE_LINES", "MAX_BODY_VALUES"}
    assert "7. sm.classify" in "\n".join(
        runner._section("classify", runner.TITLES["classify"], result)
    )


def test_tool_round_quick() -> None:
    """Measurement 8 reports a per-call cost for every round size and the ratio."""
    from benchmarks import tool_round

    result = tool_round.run(**runner.QUICK["tools"])
    assert set(result["per_call_us"]) == {str(n) for n in tool_round.SIZES}
    assert result["worst_over_one_call"] > 0
    assert isinstance(result["met"], bool)


def test_affinity_plan_keeps_a_session_on_its_previous_worker() -> None:
    """The affinity plan gives every step to one worker, seeded; at affinity 1 a session
    never leaves worker ``session % workers``, below 1 sessions move."""
    from benchmarks import redis_store

    plan = redis_store.affinity_plan(4, 4000, 32, 0.9, seed=7)
    assert sum(len(part) for part in plan) == 4000
    assert plan == redis_store.affinity_plan(4, 4000, 32, 0.9, seed=7)
    sticky = redis_store.affinity_plan(4, 4000, 32, 1.0, seed=7)
    assert all(session % 4 == worker for worker, part in enumerate(sticky) for session in part)
    moved = {
        session for worker, part in enumerate(plan) for session in part if session % 4 != worker
    }
    assert len(moved) > 16  # about 12 moves a session at 0.9
    assert len(redis_store.affinity_plan(1, 50, 4, 0.5, seed=1)[0]) == 50


def test_steps_on_previous_worker_counts_each_sessions_successive_versions() -> None:
    """The measured affinity: of the applied advances after each session's first, the
    share whose previous version the same worker applied."""
    from benchmarks import redis_store

    reports = [
        {"versions": [[0, 2], [0, 3], [1, 3]]},  # worker 0
        {"versions": [[0, 4], [1, 2]]},  # worker 1
    ]
    # (0,3) after (0,2): same; (0,4) after (0,3): other; (1,3) after (1,2): other
    assert redis_store._on_previous_worker(reports) == pytest.approx(1 / 3)
    assert redis_store._on_previous_worker([{"versions": []}]) == 1.0


def test_redis_quick_reports_server_cpu_and_affinity(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m benchmarks --only redis --quick`` reports the server's CPU per
    attempt for ours and the floor, and the affinity fleets beside the random ones."""
    import shutil

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH")
    results = runner.run_all(["redis"], quick=True, log=lambda _t: None)
    result = results["redis"]
    assert "error" not in result, result.get("traceback")
    for fleet in (result, result["affinity"]):
        assert _positive(fleet["server_cpu_us_per_attempt"]["1"])
        assert _positive(fleet["floor_server_cpu_us_per_attempt"]["1"])
        assert _positive(fleet["server_cpu_of_floor"]["1"])
        assert fleet["steps_on_previous_worker"]["1"] == 1.0
    assert result["affinity"]["share"] == 0.9
    text = runner.report(results)
    assert "90% of a session's steps on its previous worker" in text


@pytest.mark.slow
def test_fleet_quick_accounts_for_every_session_and_request() -> None:
    """The fleet benchmark's outage story, five times faster, with 12 sessions.

    Every session ends with one status, the vendor's log sorts each request into the
    phase its moment fell in, and the outage's requests are exactly those logged there.
    """
    from benchmarks import fleet

    result = fleet.run(sessions=12, scale=0.2, rows=("engine", "openai"))
    for name, row in result["rows"].items():
        assert sum(row["statuses"].values()) == 12, name
        assert row["requests"] >= 12, name  # one call each at the least
        assert row["outage_requests"] <= row["requests"] - row["after_recovery_requests"]
        assert row["over_capacity_after_recovery"] <= row["after_recovery_requests"]
    engine = result["rows"]["engine"]
    assert engine["statuses"] == {"completed": 12}  # the engine waits the outage out
    assert engine["p95_after_recovery_s"] is not None
    assert engine["p95_after_recovery_s"] >= 0  # measured from the recovery
    assert engine["outage_requests"] >= 1  # a session that started in it met it


def test_fleet_vendor_answers_by_phase() -> None:
    """The vendor's answer is chosen by the story's moment, and the bucket caps the rate."""
    from benchmarks import fleet

    vendor = fleet.Vendor(capacity=2.0)
    clock = iter([0.0, 0.0, 0.0, 2.5, 8.0, 12.5])
    vendor.now = lambda: next(clock)  # type: ignore[method-assign]
    answers = [vendor._answer() for _ in range(6)]
    assert [status for status, _, _ in answers] == [200, 200, 429, 429, 503, 200]
    assert answers[2][1] == {}  # over capacity: a bare 429
    assert answers[3][1] == {"retry-after": "5"}  # the outage's 429 says when
    assert [kind for _, kind in vendor.log] == ["ok", "ok", "over", "throttled", "down", "ok"]
    summary = fleet.summarize(vendor, [(13.0, "completed"), (14.0, "RateLimitError 429")])
    assert summary["outage_requests"] == 2
    assert summary["after_recovery_requests"] == 1
    assert summary["p95_after_recovery_s"] is None  # 1 of 2 completed: under 95 %
    assert summary["statuses"] == {"completed": 1, "RateLimitError 429": 1}
