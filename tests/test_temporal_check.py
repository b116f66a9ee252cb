"""``smt.check_replay`` refuses what is not a ``SessionWorkflow`` history with a
``ValueError`` naming what is wrong (no server needed: the committed histories)."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest

try:
    from temporalio.client import WorkflowHistory

    from statemachine import temporal as smt

    from . import temporal_support as support
except ImportError:  # pragma: no cover - the extra is installed in CI
    if os.environ.get("CI"):
        raise
    pytest.skip("temporalio is not installed", allow_module_level=True)


def storm() -> dict[str, Any]:
    """The committed storm history, parsed."""
    return json.loads((support.HISTORIES / "storm.json").read_text(encoding="utf-8"))


def start_attributes(history: dict[str, Any]) -> dict[str, Any]:
    return history["events"][0]["workflowExecutionStartedEventAttributes"]  # type: ignore[no-any-return]


def with_input(value: Any) -> dict[str, Any]:
    """The storm history whose start event carries ``value`` (JSON) as its input."""
    history = storm()
    payload = start_attributes(history)["input"]["payloads"][0]
    payload["data"] = base64.b64encode(json.dumps(value).encode()).decode()
    return history


def original_input() -> dict[str, Any]:
    payload = start_attributes(storm())["input"]["payloads"][0]
    return json.loads(base64.b64decode(payload["data"]))  # type: ignore[no-any-return]


@pytest.mark.requirement("ER-190")
def test_a_history_of_another_workflow_type_is_refused() -> None:
    """Another workflow type's history is refused, even one that ended before its first
    command (the case that used to pass as clean)."""
    other = storm()
    start_attributes(other)["workflowType"]["name"] = "billing.Invoice"
    with pytest.raises(ValueError, match=r"'billing\.Invoice' workflow's.*turnstate\.Session"):
        smt.check_replay(other)
    first_only = storm()
    start_attributes(first_only)["workflowType"]["name"] = "other.Thing"
    first_only["events"] = first_only["events"][:1]
    with pytest.raises(ValueError, match=r"'other\.Thing'"):
        smt.check_replay(json.dumps(first_only))
    with pytest.raises(ValueError, match=r"'other\.Thing'"):
        smt.check_replay(WorkflowHistory.from_json("x", first_only))
    assert smt.check_replay(storm()) is None  # the untouched history still checks clean


@pytest.mark.requirement("ER-190")
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("hello", r"start event's input is not a SessionInput .*str"),
        (42, r"start event's input is not a SessionInput"),
        ({"settings": "fast"}, r"not a SessionInput .*settings"),
        ({"turns_per_run": 0}, r"input: SessionInput\.turns_per_run: must be an int >= 1"),
        ({"sleep_through_deferred": -1}, r"SessionInput\.sleep_through_deferred"),
        ({"session_id": ""}, r"SessionInput\.session_id"),
        ({"activity_timeout_s": -5.0}, r"SessionInput\.activity_timeout_s"),
    ],
)
def test_a_malformed_input_is_refused_naming_the_field(value: Any, message: str) -> None:
    """A start event whose input is not a valid SessionInput: ``ValueError`` naming it."""
    with pytest.raises(ValueError, match=message):
        smt.check_replay(with_input(value))


@pytest.mark.requirement("ER-190")
def test_missing_input_and_non_histories_are_refused() -> None:
    """No input, two inputs, text that is not JSON, JSON that is not a history, a value
    of another type, a bad override: each a ``ValueError`` saying which."""
    none = storm()
    start_attributes(none).pop("input")
    with pytest.raises(ValueError, match="start event carries 0 inputs"):
        smt.check_replay(none)
    two = storm()
    payloads = start_attributes(two)["input"]["payloads"]
    payloads.append(payloads[0])
    with pytest.raises(ValueError, match="carries 2 inputs"):
        smt.check_replay(two)
    with pytest.raises(ValueError, match="history: the text is not JSON"):
        smt.check_replay("{not json")
    with pytest.raises(ValueError, match="must be an object holding 'events', got list"):
        smt.check_replay("[1, 2]")
    with pytest.raises(ValueError, match="history: not a Temporal history"):
        smt.check_replay({"events": [{"eventId": "not a number"}]})
    with pytest.raises(ValueError, match="got int"):
        smt.check_replay(7)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="first event must be WorkflowExecutionStarted"):
        smt.check_replay({"events": []})
    with pytest.raises(ValueError, match=r"^settings: must be a Settings"):
        smt.check_replay(storm(), settings={"max_retries": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^seed: must be an int"):
        smt.check_replay(storm(), seed="7")  # type: ignore[arg-type]
    assert original_input()["sleep_through_deferred"] is False  # the first release's bool
    assert smt.check_replay(with_input(original_input())) is None
