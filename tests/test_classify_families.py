"""The wording families of issue 28, end to end (ER-170..ER-179).

Each family's real bodies are corpus entries (``tests/corpus/``, checked one by one in
``tests/test_corpus.py``); the tests here take those bodies to the engine (what the
turn does with each category), and hold the edges of the two new sources of a
classification: a body's retry delay (Gemini's ``RetryInfo``) and an AWS event
stream's headers (botocore's frames and errors, built by botocore itself).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import statemachine as sm

C = sm.ErrorCategory
CORPUS = Path(__file__).resolve().parent / "corpus"
WALL = 1_000_000_000.0
"""Sun, 09 Sep 2001 01:46:40 GMT."""


def _corpus() -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = {}
    for path in sorted(CORPUS.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                entry = json.loads(line)
                entries[entry["name"]] = entry
    return entries


ENTRIES = _corpus()


def _classify_entry(name: str, **kwargs: Any) -> sm.ModelError:
    entry = ENTRIES[name]
    return sm.classify((entry["status"], entry["headers"], entry["body"].encode()), **kwargs)


def _turn(settings: sm.Settings | None = None) -> sm.Turn:
    session = sm.Session(
        settings or sm.Settings(), seed=1, clock=lambda: 0.0, wall_clock=lambda: WALL
    )
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("req", 100))
    return turn


# -- what the turn does with each family ----------------------------------------------


@pytest.mark.requirement("ER-170", "ER-171", "ER-172")
@pytest.mark.parametrize(
    "name",
    [
        "vllm-400-decoder-prompt-longer-than-maximum-model-length",
        "xinference-500-decoder-prompt-longer-than-maximum-model-length",
        "llamacpp-500-context-size-has-been-exceeded",
        "llamacpp-500-exceed-context-size-pr15780",
        "tgi-200-sse-inputs-plus-max-new-tokens",
        "tgi-422-inputs-must-have-less-than",
        "xai-400-maximum-prompt-length",
        "gemini-400-array-wrapped-input-token-count",
    ],
)
def test_a_self_hosted_or_new_vendor_overflow_reduces_the_context(name: str) -> None:
    """Each real overflow body, 500s included, makes the engine ask for a smaller
    request (``Assemble(reduce=True)``), never a wait or the same request again."""
    action = _turn().send(sm.ModelFailed(_classify_entry(name)))
    assert action == sm.Assemble(reduce=True, withhold_tools=False, instruction=None)


@pytest.mark.requirement("ER-172")
@pytest.mark.parametrize(
    ("body", "category"),
    [
        ([], C.INVALID_REQUEST),
        (["The input token count exceeds the maximum number of tokens allowed"], C.INVALID_REQUEST),
        ([[{"error": {"message": "context window"}}]], C.INVALID_REQUEST),
        (({"error": {"message": "context window"}},), C.CONTEXT_LENGTH_EXCEEDED),
        ([{"error": {"message": "bad field"}}, {"error": {"message": "context window"}}],
         C.INVALID_REQUEST),
    ],
)  # fmt: skip
def test_only_an_array_whose_first_element_is_an_object_is_unwrapped(
    body: Any, category: sm.ErrorCategory
) -> None:
    """The first element is read when it is an object (a tuple of parsed JSON too);
    text in an array, a nested array and the elements after the first are never read:
    the status decides."""
    assert sm.classify((400, {}, body)).category is category


@pytest.mark.requirement("ER-173")
@pytest.mark.parametrize(
    "name",
    ["gemini-400-api-key-invalid", "gemini-400-api-key-expired", "xai-400-incorrect-api-key"],
)
def test_a_bad_key_ends_the_turn_at_once_even_with_fallback_models(name: str) -> None:
    """A refused key is ``auth_error``: the turn ends with that status, no retry and no
    fallback (another model behind the same key fails the same way)."""
    turn = _turn(sm.Settings(fallback_models=("backup-model",)))
    action = turn.send(sm.ModelFailed(_classify_entry(name)))
    assert isinstance(action, sm.Finish)
    assert action.status is sm.TurnStatus.AUTH_ERROR


@pytest.mark.requirement("ER-174")
@pytest.mark.parametrize(
    "name",
    [
        "xai-429-used-all-available-credits",
        "xai-403-used-all-available-credits",
        "anthropic-400-credit-balance-too-low",
    ],
)
def test_spent_credits_end_the_turn_unknown_error_without_a_wait(name: str) -> None:
    """Exhausted credits, even as a 429, are never waited on nor retried, and no
    fallback is tried (every model bills the same account): the turn ends
    ``unknown_error`` with ``code="payment_required"`` for the host to act on."""
    error = _classify_entry(name)
    assert not error.retryable
    turn = _turn(sm.Settings(fallback_models=("backup-model",)))
    action = turn.send(sm.ModelFailed(error))
    assert isinstance(action, sm.Finish)
    assert action.status is sm.TurnStatus.UNKNOWN_ERROR
    assert action.error is not None and action.error.code == "payment_required"


@pytest.mark.requirement("ER-174", "ER-175")
def test_a_gemini_quota_429_that_mentions_billing_is_still_a_rate_limit() -> None:
    """Gemini's per-minute quota says "check your plan and billing details" and asks
    for a 26 s wait: it is no spent account (no credit phrase), it is waited on."""
    error = _classify_entry("gemini-429-retry-info-retry-delay")
    assert (error.category, error.retry_after_seconds) == (C.RATE_LIMITED, 26.0)
    action = _turn().send(sm.ModelFailed(error))
    assert isinstance(action, sm.Wait)
    assert action.seconds >= 26.0


# -- a body's retry delay (ER-175, ER-176) --------------------------------------------


def _gemini_429(delay: Any, *, first: int = 0) -> dict[str, Any]:
    filler = [{"@type": "type.googleapis.com/google.rpc.Help", "links": []}] * first
    retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
    return {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED",
                      "details": [*filler, retry]}}  # fmt: skip


IN_TEN_SECONDS = "Sun, 09 Sep 2001 01:46:50 GMT"


@pytest.mark.requirement("ER-175")
@pytest.mark.parametrize(
    ("headers", "wall", "expected"),
    [
        ({}, None, 26.0),
        ({"retry-after-ms": "1500"}, None, 1.5),
        ({"retry-after": "7"}, None, 7.0),
        ({"retry-after-ms": "soon", "retry-after": "-3"}, None, 26.0),
        ({"retry-after": IN_TEN_SECONDS}, None, 26.0),
        ({"retry-after": IN_TEN_SECONDS}, WALL, 26.0),
    ],
)
def test_the_body_delay_comes_after_the_delay_headers_and_before_a_date(
    headers: dict[str, str], wall: float | None, expected: float
) -> None:
    """``retry-after-ms``, then ``retry-after`` delay-seconds, then the body's
    ``retryDelay``, then an HTTP-date: a usable delay needs no clock, a date does. An
    unusable header is skipped for the body's delay."""
    error = sm.classify((429, headers, _gemini_429("26s")), wall=wall)
    assert error.retry_after_seconds == expected


@pytest.mark.requirement("ER-175")
def test_without_a_body_delay_a_date_is_still_measured() -> None:
    """The body's delay takes nothing from the headers it does not replace: with none,
    the date is measured against ``wall`` as before, or left for the engine."""
    body = {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"}}
    assert (
        sm.classify((429, {"retry-after": IN_TEN_SECONDS}, body), wall=WALL).retry_after_seconds
        == 10.0
    )
    left = sm.classify((429, {"retry-after": IN_TEN_SECONDS}, body))
    assert left.retry_after_seconds is None
    assert left.headers is not None and left.headers["retry-after"] == IN_TEN_SECONDS


@pytest.mark.requirement("ER-176")
@pytest.mark.parametrize(
    ("delay", "seconds"),
    [
        ("26s", 26.0),
        ("0s", 0.0),
        ("0.5s", 0.5),
        ("38.804097346s", 38.804097346),
        ("315576000000s", 315_576_000_000.0),
        ("315576000001s", None),
        ("1000000000000s", None),
        ("1e308s", None),
        ("-5s", None),
        ("+5s", None),
        ("infs", None),
        ("nans", None),
        ("26", None),
        (" 26s", None),
        ("26s ", None),
        ("26S", None),
        ("26.1234567891s", None),
        ("26.s", None),
        (26, None),
        (26.0, None),
        (True, None),
        (None, None),
        ({"seconds": 26}, None),
    ],
)
def test_a_retry_delay_is_read_only_as_a_duration(delay: Any, seconds: float | None) -> None:
    """Only the JSON form of a ``google.protobuf.Duration``, within its range, is a
    delay: anything else (a forged 1e308, a sign, infinity, a bare number) is no wait
    at all, never an error; the 429 is a rate limit either way."""
    error = sm.classify((429, {}, _gemini_429(delay)))
    assert error.category is C.RATE_LIMITED
    assert error.retry_after_seconds == seconds


@pytest.mark.requirement("ER-176")
def test_the_longest_legal_delay_defers_the_turn_with_a_finite_retry_at() -> None:
    """Ten thousand years is a legal Duration: the engine does not sleep on it, it
    parks the turn (``retry_deferred``) at a finite ``retry_at``."""
    error = sm.classify((429, {}, _gemini_429("315576000000s")))
    action = _turn().send(sm.ModelFailed(error))
    assert isinstance(action, sm.Finish)
    assert action.status is sm.TurnStatus.RETRY_DEFERRED
    assert action.retry_at is not None and math.isfinite(action.retry_at)
    assert action.retry_at >= WALL + 300


@pytest.mark.requirement("ER-176")
@pytest.mark.parametrize("delay", ["1e308s", "-5s", "infs", 1e308])
def test_a_forged_delay_gives_the_engine_its_own_backoff(delay: Any) -> None:
    """An unusable delay is no retry-after: the engine waits its own backoff (within
    the first retry's bound) and retries."""
    error = sm.classify((429, {}, _gemini_429(delay)))
    action = _turn().send(sm.ModelFailed(error))
    assert isinstance(action, sm.Wait)
    assert 0 <= action.seconds <= 1.5 * sm.Settings().base_delay_ms / 1000


@pytest.mark.requirement("ER-175")
def test_the_first_retry_info_and_error_info_count() -> None:
    """Two RetryInfo details: the first usable one is the wait; an unusable first one
    gives way to the next. Details that are not objects are skipped."""
    two = _gemini_429("5s")
    two["error"]["details"].append(
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "9s"}
    )
    assert sm.classify((429, {}, two)).retry_after_seconds == 5.0
    bad_first = _gemini_429("never")
    bad_first["error"]["details"] = ["text", 7, None, *bad_first["error"]["details"]]
    bad_first["error"]["details"].append(
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "9s"}
    )
    assert sm.classify((429, {}, bad_first)).retry_after_seconds == 9.0


# -- AWS event streams and botocore (ER-177, ER-178) -----------------------------------


def _frame(kind: str, payload: bytes) -> Any:
    """An exception frame as botocore's decoder gives it (an ``EventStreamMessage`` with
    the headers of aws-samples/foundation-model-benchmarking-tool#247's frame)."""
    eventstream = pytest.importorskip("botocore.eventstream")
    headers = {":exception-type": kind, ":content-type": "application/json",
               ":message-type": "exception"}  # fmt: skip
    return eventstream.EventStreamMessage(prelude=None, headers=headers, payload=payload, crc=0)


def _event_stream_error(frame: Any) -> Any:
    """The error botocore's EventStream raises for that frame (``_parse_event``),
    parsed by botocore's own parser against Bedrock's ResponseStream shape."""
    exceptions = pytest.importorskip("botocore.exceptions")
    loaders = pytest.importorskip("botocore.loaders")
    model = pytest.importorskip("botocore.model")
    parsers = pytest.importorskip("botocore.parsers")
    service = model.ServiceModel(
        loaders.Loader().load_service_model("bedrock-runtime", "service-2")
    )
    parsed = parsers.EventStreamJSONParser().parse(
        frame.to_response_dict(), service.shape_for("ResponseStream")
    )
    return exceptions.EventStreamError(parsed, "InvokeModelWithResponseStream")


def _client_error(response: dict[str, Any]) -> Exception:
    exceptions = pytest.importorskip("botocore.exceptions")
    error: Exception = exceptions.ClientError(response, "InvokeModel")
    return error


THROTTLED = b'{"message":"Too many requests, please wait before trying again."}'


@pytest.mark.requirement("ER-177", "ER-178")
@pytest.mark.parametrize(
    ("kind", "category"),
    [
        ("throttlingException", C.RATE_LIMITED),
        ("serviceUnavailableException", C.OVERLOADED),
        ("internalServerException", C.OVERLOADED),
        ("modelTimeoutException", C.OVERLOADED),
        ("validationException", C.INVALID_REQUEST),
        ("modelStreamErrorException", C.UNKNOWN),
    ],
)
def test_a_bedrock_stream_exception_is_read_in_every_form_botocore_gives(
    kind: str, category: sm.ErrorCategory
) -> None:
    """The frame itself, its ``to_response_dict()`` and the ``EventStreamError`` botocore
    raises for it all give the frame's type as category and code, with no status (the
    stream's HTTP status was 200; botocore's 400 is its own marker).
    ``modelStreamErrorException`` (AWS: "Retry your request") stays unknown, as its 424
    does."""
    frame = _frame(kind, THROTTLED)
    exc = _event_stream_error(frame)
    assert exc.response["Error"]["Code"] == kind  # botocore read the header, not classify
    for given_ in (frame, frame.to_response_dict(), exc):
        error = sm.classify(given_)
        assert (error.category, error.code, error.status) == (category, kind, None), given_
        assert error.message.startswith("Too many requests")


@pytest.mark.requirement("ER-177", "ER-178")
def test_a_stream_validation_exception_that_says_input_is_too_long_is_an_overflow() -> None:
    """The frame's message is read like any other: Bedrock's "Input is too long" in a
    ``validationException`` frame is a context overflow."""
    frame = _frame("validationException", b'{"message":"Input is too long for requested model."}')
    assert sm.classify(_event_stream_error(frame)).category is C.CONTEXT_LENGTH_EXCEEDED


@pytest.mark.requirement("ER-178")
def test_a_client_error_is_read_by_its_status_headers_and_code() -> None:
    """botocore's ClientError for an HTTP error response: its ResponseMetadata gives the
    status and headers (a retry-after-ms header honoured), its Error the code."""
    response = {
        "Error": {
            "Code": "ThrottlingException",
            "Message": "Too many tokens, please wait before trying again.",
        },
        "ResponseMetadata": {
            "HTTPStatusCode": 429,
            "HTTPHeaders": {"retry-after-ms": "250"},
            "RetryAttempts": 4,
        },
    }
    error = sm.classify(_client_error(response))
    assert (error.category, error.code, error.status) == (
        C.RATE_LIMITED,
        "ThrottlingException",
        429,
    )
    assert error.retry_after_seconds == 0.25
    assert error.message == "Too many tokens, please wait before trying again."
    denied = {"Error": {"Code": "AccessDeniedException", "Message": "no"},
              "ResponseMetadata": {"HTTPStatusCode": 403, "HTTPHeaders": {}}}  # fmt: skip
    assert sm.classify(_client_error(denied)).category is C.AUTH_ERROR
    garbage = {
        "Error": {"Code": "ThrottlingException"},
        "ResponseMetadata": {"HTTPStatusCode": "429"},
    }
    odd = sm.classify(_client_error(garbage))
    assert (odd.category, odd.status) == (C.RATE_LIMITED, None)  # no status: the code decides


# -- any body shape gives a ModelError --------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=12,
)
DETAIL = st.fixed_dictionaries(
    {"@type": st.sampled_from(["type.googleapis.com/google.rpc.RetryInfo",
                               "type.googleapis.com/google.rpc.ErrorInfo"]) | JSON},
    optional={"retryDelay": st.text() | JSON, "reason": st.text() | JSON},
)  # fmt: skip


@pytest.mark.requirement("ER-172", "ER-176", "ER-179")
@given(
    status=st.sampled_from([None, 200, 400, 403, 422, 429, 500]),
    details=st.lists(DETAIL | JSON, max_size=20),
    wrap=st.booleans(),
    frame=st.sampled_from([None, "exception", "error", "event"]),
)
def test_any_details_array_or_frame_gives_a_legal_model_error(
    status: int | None, details: list[Any], wrap: bool, frame: str | None
) -> None:
    """Whatever the details, an array around the body or a frame's headers, classify
    returns a ModelError whose retry-after is a finite wait or none, and the engine
    takes it."""
    body: Any = {"error": {"code": 429, "message": "m", "details": details}}
    if wrap:
        body = [body]
    headers = (
        {} if frame is None else {":message-type": frame, ":exception-type": "throttlingException"}
    )
    error = sm.classify((status, headers, body))
    assert isinstance(error, sm.ModelError)
    wait = error.retry_after_seconds
    assert wait is None or (isinstance(wait, float) and 0 <= wait <= 315_576_000_000)
    action = _turn().send(sm.ModelFailed(error))
    assert isinstance(action, sm.Wait | sm.Finish | sm.Assemble | sm.CallModel)


# -- round two: vendors the corpus did not hold (ER-240..ER-244) ----------------------


@pytest.mark.requirement("ER-240")
@pytest.mark.parametrize(
    "name",
    [
        "moonshot-400-exceeded-model-token-limit",
        "moonshot-400-input-token-length-too-long",
        "dashscope-400-range-of-input-length",
        "gemini-400-vertex-model-only-supports-up-to",
        "cohere-400-too-many-tokens-size-limit-exceeded",
    ],
)
def test_round_two_overflows_reduce_the_context(name: str) -> None:
    error = _classify_entry(name)
    assert error.category is C.CONTEXT_LENGTH_EXCEEDED
    action = _turn().send(sm.ModelFailed(error))
    assert isinstance(action, sm.Assemble) and action.reduce


@pytest.mark.requirement("ER-240")
def test_an_output_limit_message_is_not_an_overflow() -> None:
    """Cohere's "too many tokens: max tokens must be ..." names the output limit the
    request asked for: an invalid request that ends the turn, not a reduction, though
    it carries the context phrase "too many tokens"."""
    error = _classify_entry("cohere-400-max-tokens-must-be-at-most-output")
    assert error.category is C.INVALID_REQUEST
    finish = _turn().send(sm.ModelFailed(error))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.INVALID_REQUEST
    body = {"message": "too many tokens: total number of tokens in the prompt cannot exceed 4081"}
    assert sm.classify((400, {}, body)).category is C.CONTEXT_LENGTH_EXCEEDED


@pytest.mark.requirement("ER-241")
@pytest.mark.parametrize(
    "name",
    [
        "moonshot-403-exceeded-current-quota-error",
        "moonshot-429-exceeded-current-quota-error",
        "dashscope-400-arrearage",
    ],
)
def test_a_spent_quota_code_ends_the_turn_without_a_wait_or_a_fallback(name: str) -> None:
    error = _classify_entry(name)
    assert error.category is C.UNKNOWN
    assert error.code in {"exceeded_current_quota_error", "Arrearage"}
    turn = _turn(sm.Settings(fallback_models=("other-model",)))
    finish = turn.send(sm.ModelFailed(error))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.UNKNOWN_ERROR


@pytest.mark.requirement("ER-242")
@pytest.mark.parametrize(
    "name", ["dashscope-400-data-inspection-failed", "openrouter-403-input-flagged-by-moderation"]
)
def test_a_moderation_block_is_content_filtered_not_auth_or_invalid(name: str) -> None:
    error = _classify_entry(name)
    assert error.category is C.CONTENT_FILTERED
    finish = _turn().send(sm.ModelFailed(error))
    assert isinstance(finish, sm.Finish) and finish.status is sm.TurnStatus.CONTENT_FILTERED
    # DashScope's own envelope (no "error" object) names the same code
    native = {"code": "DataInspectionFailed", "message": "Input data may contain inappropriate"}
    assert sm.classify((400, {}, native)).category is C.CONTENT_FILTERED
    # a 403 that says nothing of moderation is still an auth error
    assert sm.classify((403, {}, {"error": {"message": "forbidden"}})).category is C.AUTH_ERROR


@pytest.mark.requirement("ER-243")
@pytest.mark.parametrize(
    ("code", "category"),
    [
        (429, C.RATE_LIMITED),
        (503, C.OVERLOADED),
        (400, C.INVALID_REQUEST),
        (401, C.AUTH_ERROR),
        (302, C.UNKNOWN),  # not an error status: no category
        (600, C.UNKNOWN),
        (True, C.UNKNOWN),  # a bool is no number here
        ("429", C.UNKNOWN),  # a name, not a status
    ],
)
def test_an_in_stream_error_is_read_by_the_status_its_code_names(
    code: Any, category: sm.ErrorCategory
) -> None:
    body = {"error": {"code": code, "message": "something upstream"}}
    for status in (200, None):
        error = sm.classify((status, {}, body))
        assert error.category is category, (status, code)
        assert error.status == status  # the response's status is kept
    # a type that names a category decides first
    typed = {"error": {"code": 429, "type": "overloaded_error", "message": "x"}}
    assert sm.classify((200, {}, typed)).category is C.OVERLOADED


@pytest.mark.requirement("ER-243")
def test_openrouters_midstream_rate_limit_is_retried() -> None:
    error = _classify_entry("openrouter-200-sse-midstream-error-code-429")
    assert error.category is C.RATE_LIMITED
    assert isinstance(_turn().send(sm.ModelFailed(error)), sm.Wait)


@pytest.mark.requirement("ER-244")
@pytest.mark.parametrize(
    ("retry_after", "seconds"),
    [
        (5, 5.0),
        (0.25, 0.25),
        (0, 0.0),
        (-0.0, 0.0),
        (-1, None),
        ("5", None),
        (True, None),
        (float("nan"), None),
        (float("inf"), None),
        (10**400, None),
        (315_576_000_000, 315_576_000_000.0),
        (315_576_000_001, None),
    ],
)
def test_a_body_retry_after_is_read_only_as_a_bounded_number(
    retry_after: Any, seconds: float | None
) -> None:
    for body in (
        {"detail": "throttled", "retry_after": retry_after},
        {"error": {"message": "throttled", "retry_after": retry_after}},
    ):
        error = sm.classify((429, {}, body))
        assert error.category is C.RATE_LIMITED
        assert error.retry_after_seconds == seconds, body
        if seconds is not None:
            assert math.copysign(1.0, error.retry_after_seconds) == 1.0  # no -0.0


@pytest.mark.requirement("ER-244")
def test_the_body_retry_after_is_a_floor_and_yields_to_headers_and_retry_info() -> None:
    error = _classify_entry("replicate-429-body-retry-after")
    assert error.retry_after_seconds == 5.0
    wait = _turn().send(sm.ModelFailed(error))
    assert isinstance(wait, sm.Wait) and wait.seconds >= 5.0
    body = {"retry_after": 5}
    assert sm.classify((429, {"retry-after": "2"}, body)).retry_after_seconds == 2.0
    google = {
        "error": {
            "code": 429,
            "retry_after": 5,
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}],
        }
    }
    assert sm.classify((429, {}, google)).retry_after_seconds == 7.0


@pytest.mark.requirement("ER-240")
def test_a_vertex_limit_that_is_not_tokens_is_not_an_overflow() -> None:
    """Vertex says "model only supports up to" of other counts too (video files): only
    its token wording is an overflow."""
    videos = {
        "error": {
            "code": 400,
            "message": "Unable to submit request because it has 12 video files but the model "
            "only supports up to 10.",
            "status": "INVALID_ARGUMENT",
        }
    }
    assert sm.classify((400, {}, videos)).category is C.INVALID_REQUEST


@pytest.mark.requirement("ER-242")
def test_a_flagged_input_keeps_the_vendors_code() -> None:
    body = {"error": {"message": "Your input was flagged for violence", "type": "guardrail"}}
    error = sm.classify((403, {}, body))
    assert (error.category, error.code) == (C.CONTENT_FILTERED, "guardrail")


@pytest.mark.requirement("ER-243")
def test_the_status_a_code_names_spans_400_to_599() -> None:
    for code, category, kept in (
        (599, C.OVERLOADED, "http_599"),
        (500, C.OVERLOADED, "http_500"),
        (399, C.UNKNOWN, None),  # no status named: nothing is kept
    ):
        body = {"error": {"code": code, "message": "upstream"}}
        error = sm.classify((200, {}, body))
        assert (error.category, error.code) == (category, kept), code


@pytest.mark.requirement("ER-243", "ER-177")
def test_a_stream_frame_is_not_read_by_a_numeric_code() -> None:
    """An AWS event-stream frame's type is in its headers and decides alone: a numeric
    code in its payload changes nothing (and the frame is not read again and again)."""
    headers = {":message-type": "exception", ":exception-type": "modelStreamErrorException"}
    error = sm.classify((200, headers, b'{"message": "x", "code": 500}'))
    assert error.category is C.UNKNOWN
    assert error.code == "modelStreamErrorException"
    assert error.body == {"message": "x", "code": 500}


@pytest.mark.requirement("ER-244")
def test_a_top_level_retry_after_is_read_beside_an_error_object_or_string() -> None:
    for body in (
        {"error": {"message": "slow"}, "retry_after": 5},
        {"error": "Too many requests", "retry_after": 5},
    ):
        assert sm.classify((429, {}, body)).retry_after_seconds == 5.0, body
    inner_first = {"error": {"message": "slow", "retry_after": 2}, "retry_after": 5}
    assert sm.classify((429, {}, inner_first)).retry_after_seconds == 2.0


@pytest.mark.requirement("ER-243", "ER-171")
def test_a_streamed_overflow_in_a_500s_words_reduces_the_context() -> None:
    """llama.cpp reports a context that filled mid-stream as an error event in the 200
    it began, typed ``server_error`` with code 500: the 500's overflow wording decides
    before the type's ``overloaded`` (a retry would fill it again)."""
    body = {
        "error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}
    }
    error = sm.classify((200, {}, body))
    assert (error.category, error.code) == (C.CONTEXT_LENGTH_EXCEEDED, "server_error")
    other = {"error": {"code": 500, "message": "out of memory", "type": "server_error"}}
    assert sm.classify((200, {}, other)).category is C.OVERLOADED
    wording_only = {"error": {"message": "Context size has been exceeded.", "type": "server_error"}}
    assert sm.classify((200, {}, wording_only)).category is C.OVERLOADED  # no status named
