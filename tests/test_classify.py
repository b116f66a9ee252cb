"""``sm.classify``: the real SDKs' exceptions, responses and raw triples, read by
body as well as by status (the table is specs/classification.md).

SDK exceptions are built the way the SDKs build them: an ``httpx2.Response`` goes
through the client's own ``_make_status_error_from_response``, so the body shape
(Anthropic keeps the whole envelope, OpenAI only the inner ``error`` object) is
the one users will see.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

import statemachine as sm
from tests.helpers import list_depth, nested_lists

C = sm.ErrorCategory
REQUEST = httpx2.Request("POST", "http://127.0.0.1:9/v1/messages")
ANTHROPIC = anthropic.Anthropic(api_key="test", base_url="http://127.0.0.1:9", max_retries=0)
OPENAI = openai.OpenAI(api_key="test", base_url="http://127.0.0.1:9/v1", max_retries=0)


def anthropic_exc(status: int, etype: str, message: str, **headers: str) -> Exception:
    body = {"type": "error", "error": {"type": etype, "message": message}}
    response = httpx2.Response(status, request=REQUEST, headers=headers, json=body)
    return ANTHROPIC._make_status_error_from_response(response)


def openai_exc(
    status: int, message: str, etype: str | None, code: str | None, **headers: str
) -> Exception:
    body = {"error": {"message": message, "type": etype, "param": None, "code": code}}
    response = httpx2.Response(status, request=REQUEST, headers=headers, json=body)
    return OPENAI._make_status_error_from_response(response)


ANTHROPIC_CASES = [
    (429, "rate_limit_error", "Number of requests has exceeded your rate limit", C.RATE_LIMITED),
    (529, "overloaded_error", "Overloaded", C.OVERLOADED),
    (503, "api_error", "Service unavailable", C.OVERLOADED),
    (500, "api_error", "Internal server error", C.OVERLOADED),
    (504, "timeout_error", "Gateway timeout", C.OVERLOADED),
    (400, "invalid_request_error", "prompt is too long: 201000 tokens > 200000 maximum",
     C.CONTEXT_LENGTH_EXCEEDED),
    (400, "invalid_request_error",
     "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000",
     C.CONTEXT_LENGTH_EXCEEDED),
    (400, "invalid_request_error", "messages: roles must alternate", C.INVALID_REQUEST),
    (401, "authentication_error", "invalid x-api-key", C.AUTH_ERROR),
    (403, "permission_error", "Your API key does not have permission", C.AUTH_ERROR),
    (404, "not_found_error", "model: claude-nope", C.INVALID_REQUEST),
    (413, "request_too_large", "Request exceeds the maximum allowed number of bytes",
     C.INVALID_REQUEST),
    (402, "billing_error", "Your credit balance is too low", C.UNKNOWN),
]  # fmt: skip


@pytest.mark.requirement("ER-40")
@pytest.mark.parametrize(("status", "etype", "message", "category"), ANTHROPIC_CASES)
def test_anthropic_status_errors(status: int, etype: str, message: str, category: C) -> None:
    """Each Anthropic error status and error type lands in its category, keeping the
    vendor's type as code, the status, the message and the body."""
    error = sm.classify(anthropic_exc(status, etype, message))
    assert error.category is category
    assert error.status == status
    assert error.code == etype
    assert error.message == message
    assert error.body["error"]["type"] == etype


OPENAI_CASES = [
    (429, "Rate limit reached for gpt-4o", "requests", "rate_limit_exceeded", C.RATE_LIMITED),
    (429, "You exceeded your current quota", "insufficient_quota", "insufficient_quota",
     C.UNKNOWN),
    (400, "This model's maximum context length is 8192 tokens.", "invalid_request_error",
     "context_length_exceeded", C.CONTEXT_LENGTH_EXCEEDED),
    (400, "This model's maximum context length is 8192 tokens.", "invalid_request_error",
     None, C.CONTEXT_LENGTH_EXCEEDED),
    (400, "The response was filtered", "invalid_request_error", "content_filter",
     C.CONTENT_FILTERED),
    (400, "Your request was rejected by our safety system", "invalid_request_error",
     "content_policy_violation", C.CONTENT_FILTERED),
    (400, "Invalid value for 'temperature'", "invalid_request_error", "invalid_value",
     C.INVALID_REQUEST),
    (401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key",
     C.AUTH_ERROR),
    (403, "Country, region, or territory not supported", "request_forbidden",
     "unsupported_country_region_territory", C.AUTH_ERROR),
    (404, "The model `gpt-9` does not exist", "invalid_request_error", "model_not_found",
     C.INVALID_REQUEST),
    (422, "Unprocessable", "invalid_request_error", None, C.INVALID_REQUEST),
    (409, "Conflict", "server_error", None, C.OVERLOADED),
    (500, "The server had an error", "server_error", None, C.OVERLOADED),
    (502, "Bad gateway", "server_error", None, C.OVERLOADED),
    (503, "The engine is currently overloaded", "server_error", None, C.OVERLOADED),
]  # fmt: skip


@pytest.mark.requirement("ER-40")
@pytest.mark.parametrize(("status", "message", "etype", "code", "category"), OPENAI_CASES)
def test_openai_status_errors(
    status: int, message: str, etype: str, code: str | None, category: C
) -> None:
    """Each OpenAI error status and code lands in its category, keeping the code (or
    the type when there is none), the status and the message."""
    error = sm.classify(openai_exc(status, message, etype, code))
    assert error.category is category
    assert error.status == status
    assert error.code == (code or etype)
    assert error.message == message


@pytest.mark.requirement("ER-41")
def test_insufficient_quota_is_never_a_rate_limit() -> None:
    """OpenAI's 429 insufficient_quota is unknown, not retryable, with its code kept;
    the engine ends the turn unknown_error after a single attempt, while a plain
    429 on the same status is retried."""
    quota = sm.classify(
        openai_exc(429, "You exceeded your current quota", "x", "insufficient_quota")
    )
    assert quota.category is C.UNKNOWN
    assert quota.code == "insufficient_quota"
    assert not quota.retryable
    turn = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0).new_turn()
    turn.start()
    turn.send(sm.Assembled("req", 1))
    assert turn.send(sm.ModelFailed(quota)).status is sm.TurnStatus.UNKNOWN_ERROR
    limited = sm.classify(openai_exc(429, "Rate limit reached", "requests", "rate_limit_exceeded"))
    assert limited.retryable


@pytest.mark.requirement("ER-42", "ER-3", "ER-4")
@pytest.mark.parametrize(
    ("headers", "at_least"),
    [({"retry-after": "7"}, 7.0), ({"retry-after-ms": "2500"}, 2.5), ({"Retry-After": "4"}, 4.0)],
)
def test_retry_after_headers_are_carried_through_to_the_wait(
    headers: dict[str, str], at_least: float
) -> None:
    """The SDK exception's response headers ride on the ModelError, and the engine's
    Wait honours them (seconds or milliseconds, any case)."""
    for exc in (
        anthropic_exc(429, "rate_limit_error", "slow down", **headers),
        openai_exc(429, "slow down", "requests", "rate_limit_exceeded", **headers),
    ):
        error = sm.classify(exc)
        assert error.headers is not None
        turn = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0).new_turn()
        turn.start()
        turn.send(sm.Assembled("req", 1))
        wait = turn.send(sm.ModelFailed(error))
        assert isinstance(wait, sm.Wait)
        assert wait.seconds >= at_least


@pytest.mark.requirement("ER-44")
def test_in_stream_overloaded_error_with_http_200() -> None:
    """An error event inside a 200 stream is classified by its type: the Anthropic SDK's
    APIStatusError(status 200), a raw SSE body, and OpenAI's status-less APIError."""
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    response = httpx2.Response(200, request=REQUEST)
    exc = ANTHROPIC._make_status_error(json.dumps(body), body=body, response=response)
    error = sm.classify(exc)
    assert (error.category, error.status, error.code) == (C.OVERLOADED, 200, "overloaded_error")
    sse = "event: message_start\ndata: {}\n\nevent: error\ndata: " + json.dumps(body) + "\n\n"
    assert sm.classify((200, {}, sse)).category is C.OVERLOADED
    stream_error = openai.APIError(
        "The server had an error", REQUEST, body={"message": "boom", "type": "server_error"}
    )
    assert sm.classify(stream_error).category is C.OVERLOADED
    limited = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}
    assert sm.classify((200, {}, limited)).category is C.RATE_LIMITED


@pytest.mark.requirement("ER-45")
def test_connection_errors_and_timeouts_are_overloaded_with_their_code() -> None:
    """Both SDKs' APIConnectionError and APITimeoutError, httpx transport errors and the
    builtin TimeoutError / ConnectionError are overloaded (retryable), code
    connection_error or timeout."""
    cases: list[tuple[BaseException, str]] = [
        (anthropic.APIConnectionError(request=REQUEST), "connection_error"),
        (anthropic.APITimeoutError(REQUEST), "timeout"),
        (openai.APIConnectionError(request=REQUEST), "connection_error"),
        (openai.APITimeoutError(REQUEST), "timeout"),
        (httpx.ConnectError("refused"), "connection_error"),
        (httpx.ReadTimeout("slow"), "timeout"),
        (httpx2.ConnectError("refused"), "connection_error"),
        (TimeoutError("model call timed out"), "timeout"),
        (ConnectionResetError("reset by peer"), "connection_error"),
    ]
    for exc, code in cases:
        error = sm.classify(exc)
        assert (error.category, error.code) == (C.OVERLOADED, code), exc
        assert error.retryable


@pytest.mark.requirement("ER-40", "ER-42")
@pytest.mark.parametrize("module", [httpx, httpx2])
def test_httpx_and_httpx2_responses(module: Any) -> None:
    """A response of either httpx generation is read by duck typing: status, headers
    and a JSON body."""
    response = module.Response(
        429,
        headers={"retry-after": "3"},
        json={"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}},
    )
    error = sm.classify(response)
    assert (error.category, error.status, error.code) == (C.RATE_LIMITED, 429, "rate_limit_error")
    assert error.headers is not None and error.headers["Retry-After"] == "3"


@pytest.mark.requirement("ER-40")
@pytest.mark.parametrize(
    "body",
    [
        b'{"error": {"message": "This model\'s maximum context length is 4096 tokens"}}',
        '{"error": {"message": "This model\'s maximum context length is 4096 tokens"}}',
        {"error": {"message": "This model's maximum context length is 4096 tokens"}},
    ],
)
def test_raw_triples_with_bytes_str_or_parsed_bodies(body: Any) -> None:
    """(status, headers, body) is read the same whether the body is bytes, str or
    parsed JSON."""
    error = sm.classify((400, [("x-request-id", "r1")], body))
    assert error.category is C.CONTEXT_LENGTH_EXCEEDED
    assert error.headers is not None and error.headers["X-Request-Id"] == "r1"


@pytest.mark.requirement("ER-40")
def test_refusals_and_content_filters_from_replies() -> None:
    """A successful reply that is a refusal (Anthropic stop_reason) or was filtered
    (OpenAI finish_reason, ContentFilterFinishReasonError) is content_filtered."""
    message = anthropic.types.Message.model_construct(
        id="m", type="message", role="assistant", content=[], model="c", stop_reason="refusal"
    )
    assert sm.classify(message).category is C.CONTENT_FILTERED
    choice = openai.types.chat.chat_completion.Choice.model_construct(
        index=0, finish_reason="content_filter", message=None
    )
    completion = openai.types.chat.ChatCompletion.model_construct(
        id="c", choices=[choice], created=0, model="g", object="chat.completion"
    )
    filtered = sm.classify(completion)
    assert (filtered.category, filtered.code) == (C.CONTENT_FILTERED, "content_filter")
    json.dumps(filtered.body)  # kept as plain JSON, so a snapshot can hold it
    exc = openai.ContentFilterFinishReasonError()
    assert sm.classify(exc).category is C.CONTENT_FILTERED
    assert sm.classify((200, {}, {"stop_reason": "refusal"})).category is C.CONTENT_FILTERED


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr for you")


class BrokenResponse:
    status_code = 503
    headers = {"retry-after": "1"}  # noqa: RUF012

    @property
    def content(self) -> bytes:
        raise RuntimeError("ResponseNotRead")


@pytest.mark.requirement("ER-43")
@pytest.mark.parametrize(
    "odd",
    [None, 42, "oops", (1,), ("x", "y", "z"), (418, 5, object()), Unprintable(), ValueError("x")],
)
def test_odd_input_is_unknown_and_never_raises(odd: object) -> None:
    """Input that matches no shape is unknown (not retried), never an exception."""
    error = sm.classify(odd)
    assert isinstance(error, sm.ModelError)
    assert error.category is C.UNKNOWN
    assert not error.retryable


@pytest.mark.requirement("ER-43")
def test_an_unread_response_is_classified_by_status() -> None:
    """A response whose body cannot be read is classified by its status and headers."""
    error = sm.classify(BrokenResponse())
    assert error.category is C.OVERLOADED
    assert error.headers is not None and error.headers["retry-after"] == "1"


@pytest.mark.requirement("ER-40")
def test_model_errors_and_model_failed_pass_through() -> None:
    """A ModelError is returned as is; a ModelFailed gives its error."""
    error = sm.ModelError(C.AUTH_ERROR, "no")
    assert sm.classify(error) is error
    assert sm.classify(sm.ModelFailed(error)) is error


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=10,
)


@pytest.mark.requirement("ER-43")
@given(
    status=st.integers(-1000, 1000) | st.none() | st.text(),
    headers=st.dictionaries(st.text(), st.text()) | st.lists(st.tuples(st.text(), st.text())),
    body=JSON | st.binary() | st.text(),
)
def test_any_triple_gives_a_legal_model_failed(status: Any, headers: Any, body: Any) -> None:
    """For any (status, headers, body), classify returns a ModelError that the engine
    takes as a ModelFailed in the calling state without raising."""
    error = sm.classify((status, headers, body))
    assert isinstance(error, sm.ModelError)
    turn = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0).new_turn()
    turn.start()
    turn.send(sm.Assembled("req", 1))
    action = turn.send(sm.ModelFailed(error))
    assert isinstance(action, sm.Wait | sm.Finish | sm.Assemble | sm.CallModel)


@pytest.mark.requirement("ER-4")
@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_http_status_errors_classify_by_their_response(module: Any) -> None:
    """``raise_for_status()``'s HTTPStatusError is read through its response: a 429 is a
    rate limit carrying its retry-after, on the field as well as in the headers."""
    request = module.Request("POST", "http://127.0.0.1/v1/messages")
    response = module.Response(
        429,
        headers={"retry-after": "7"},
        json={"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
        request=request,
    )
    with pytest.raises(module.HTTPStatusError) as info:
        response.raise_for_status()
    error = sm.classify(info.value)
    assert error.category is C.RATE_LIMITED
    assert error.retry_after_seconds == 7.0
    assert error.headers is not None and error.headers["Retry-After"] == "7"


@pytest.mark.requirement("ER-4")
def test_retry_after_ms_is_carried_on_the_field() -> None:
    """A raw triple's ``retry-after-ms`` is carried through as seconds on the field."""
    error = sm.classify((529, {"retry-after-ms": "1500"}, b'{"error":{"type":"overloaded_error"}}'))
    assert error.category is C.OVERLOADED
    assert error.retry_after_seconds == 1.5


# -- hostile bodies: a bounded read, whatever the size or shape ---------------------------

from statemachine.io import _classify  # noqa: E402 - the bounds are its constants

DELTA = b'data: {"type":"content_block_delta","delta":{"type":"text_delta","text":"hi"}}\n'
ERROR_EVENT = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n'
TEN_MB = 10_000_000


class _CountingJson:
    """Stands in for the ``json`` module inside ``_classify``: counts ``loads`` calls
    and remembers the longest text one was given."""

    def __init__(self) -> None:
        self.calls = 0
        self.longest = 0

    def loads(self, text: str) -> Any:
        self.calls += 1
        self.longest = max(self.longest, len(text))
        return json.loads(text)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> _CountingJson:
    spy = _CountingJson()
    monkeypatch.setattr(_classify, "json", spy)
    return spy


@pytest.mark.requirement("ER-58", "ER-44")
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview, str])
def test_ten_megabytes_of_sse_lines_are_read_in_a_bounded_prefix_and_tail(
    kind: Any, counting: _CountingJson
) -> None:
    """A buffered 10 MB stream whose error event is its last: the event is found in the
    body's tail, and classify parses a bounded number of short lines, never the whole
    body (it used to parse every one of its 125,000 lines)."""
    raw = DELTA * (TEN_MB // len(DELTA)) + ERROR_EVENT
    body = raw.decode() if kind is str else kind(raw)
    error = sm.classify((200, {}, body))
    assert (error.category, error.code) == (C.OVERLOADED, "overloaded_error")
    assert error.body == {"type": "error", "error": {"type": "overloaded_error"}}
    assert counting.calls <= _classify.MAX_SSE_LINES
    assert counting.longest <= _classify.MAX_BODY


@pytest.mark.requirement("ER-58")
def test_sse_lines_that_only_mention_errors_are_parsed_a_bounded_number_of_times(
    counting: _CountingJson,
) -> None:
    """Lines that say "error" but are no error event are tried at most MAX_SSE_LINES
    times in all; the body is then text, classified by status."""
    line = b'data: {"note": "no error here"}\n'
    error = sm.classify((503, {}, line * (TEN_MB // len(line))))
    assert (error.category, error.code) == (C.OVERLOADED, "http_503")
    assert counting.calls <= _classify.MAX_SSE_LINES
    assert isinstance(error.body, str) and len(error.body) <= _classify.MAX_BODY


@pytest.mark.requirement("ER-58", "ER-43")
@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\xff\xfe\x80" * (TEN_MB // 3), id="invalid-utf8"),
        pytest.param(b'{"error": {"message": "' + b"x" * TEN_MB + b'"}}', id="one-huge-line"),
        pytest.param("y" * TEN_MB, id="one-huge-str"),
        pytest.param("[" * 100_000 + "]" * 100_000, id="deep-json-text"),
        pytest.param('{"error":' * 30_000 + "1" + "}" * 30_000, id="deep-json-object"),
    ],
)
def test_hostile_bodies_are_classified_by_status_with_a_bounded_body(
    body: Any, counting: _CountingJson
) -> None:
    """Invalid UTF-8, a huge single line and JSON nested too deep to parse are not
    errors of classify (no RecursionError, no "unclassifiable"): the status decides,
    and the body kept is at most MAX_BODY characters of text."""
    error = sm.classify((503, {"retry-after": "2"}, body))
    assert (error.category, error.code, error.status) == (C.OVERLOADED, "http_503", 503)
    assert error.retry_after_seconds == 2.0
    assert not error.message.startswith("unclassifiable")
    assert len(error.message) <= 2000
    assert isinstance(error.body, str) and len(error.body) <= _classify.MAX_BODY
    assert counting.longest <= _classify.MAX_BODY


@pytest.mark.requirement("ER-58", "ER-40")
def test_a_huge_parsed_body_is_read_for_its_error_and_kept_bounded() -> None:
    """A parsed body of a million values is classified by its error object and kept as
    a bounded copy that is still JSON (the top-level fields first), not as text."""
    body = {
        "error": {"type": "overloaded_error", "message": "busy"},
        "items": list(range(1_000_000)),
        "blob": "z" * TEN_MB,
    }
    error = sm.classify((200, None, body))
    assert (error.category, error.code, error.message) == (C.OVERLOADED, "overloaded_error", "busy")
    kept = error.body
    assert isinstance(kept, dict)
    assert kept["error"] == {"type": "overloaded_error", "message": "busy"}
    assert len(kept["items"]) < _classify.MAX_BODY_VALUES
    assert len(json.dumps(kept)) <= 2 * _classify.MAX_BODY + 10 * _classify.MAX_BODY_VALUES


@pytest.mark.requirement("ER-58", "ER-43")
def test_deeply_nested_parsed_json_is_cut_at_the_depth_bound() -> None:
    """Parsed JSON nested 100,000 levels deep (built without recursion) never raises;
    the body kept stops at MAX_DEPTH levels and can be written as JSON."""
    error = sm.classify((400, None, nested_lists(100_000)))
    assert error.category is C.INVALID_REQUEST
    depth, _ = list_depth(error.body)
    assert depth <= _classify.MAX_DEPTH
    json.dumps(error.body)


@pytest.mark.requirement("ER-58", "ER-40")
@pytest.mark.parametrize("kind", ["bytes", "str", "parsed"])
def test_a_small_body_is_read_whole_and_kept_as_is(kind: str) -> None:
    """Under the bounds nothing changes: a small body is parsed whole and the very
    parsed value is kept."""
    parsed = {"error": {"type": "rate_limit_error", "message": "slow"}, "n": list(range(100))}
    text = json.dumps(parsed)
    body: Any = {"bytes": text.encode(), "str": text, "parsed": parsed}[kind]
    error = sm.classify((429, None, body))
    assert (error.category, error.code) == (C.RATE_LIMITED, "rate_limit_error")
    assert error.body == parsed
    if kind == "parsed":
        assert error.body is parsed


@pytest.mark.requirement("ER-58", "ER-43")
def test_odd_input_is_described_in_short() -> None:
    """What classify cannot read is named with a short repr, however big it is."""
    error = sm.classify((b"x" * TEN_MB, list(range(1_000_000))))
    assert error.category is C.UNKNOWN
    assert "2-tuple" in error.message
    assert len(error.message) <= 600
    assert len(sm.classify(b"y" * TEN_MB).message) <= 600


# -- ER-95: a 429 for a request larger than the per-minute limit ------------------------

TOO_LARGE = (
    "Request too large for gpt-4o in organization org-xxx on tokens per min (TPM): "
    "Limit 30000, Requested 36000. The input or output tokens must be reduced in order "
    "to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more."
)
TOO_LARGE_BODY = {
    "error": {"message": TOO_LARGE, "type": "tokens", "param": None, "code": "rate_limit_exceeded"}
}
RATE_LIMIT_REACHED = (
    "Rate limit reached for gpt-4o in organization org-xxx on tokens per min (TPM): "
    "Limit 30000, Used 29937, Requested 385. Please try again in 20ms. "
    "Visit https://platform.openai.com/account/rate-limits to learn more."
)


def _too_large_sdk_errors() -> list[tuple[Exception, str | None]]:
    """The openai SDK's RateLimitError, built by the client from a response, built
    directly with a response and the inner error object (as the SDK keeps it), and
    without a parsed body; each with the code classify keeps."""
    response = httpx2.Response(429, request=REQUEST, json=TOO_LARGE_BODY)
    built = OPENAI._make_status_error_from_response(response)
    assert isinstance(built, openai.RateLimitError)
    quoted = f"Error code: 429 - {TOO_LARGE_BODY}"
    direct = openai.RateLimitError(quoted, response=response, body=TOO_LARGE_BODY["error"])
    bodyless = openai.RateLimitError(quoted, response=response, body=None)
    return [(built, "rate_limit_exceeded"), (direct, "rate_limit_exceeded"), (bodyless, None)]


@pytest.mark.requirement("ER-95")
@pytest.mark.parametrize(
    ("exc", "code"), _too_large_sdk_errors(), ids=["client", "direct", "no-body"]
)
def test_request_too_large_429_from_the_openai_sdk_is_context_length_exceeded(
    exc: Exception, code: str | None
) -> None:
    """OpenAI's 429 "Request too large ... must be reduced" can never fit the per-minute
    limit: context_length_exceeded (not retried), the vendor's code and status kept.
    Without a parsed body the SDK's message (which quotes the body) decides."""
    error = sm.classify(exc)
    assert (error.category, error.status, error.code) == (C.CONTEXT_LENGTH_EXCEEDED, 429, code)
    assert "must be reduced" in error.message
    assert not error.retryable


@pytest.mark.requirement("ER-95")
@pytest.mark.parametrize("module", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_request_too_large_429_response_is_context_length_exceeded(module: Any) -> None:
    """An httpx (or httpx2) response with that body, headers carried through."""
    response = module.Response(429, headers={"x-request-id": "r1"}, json=TOO_LARGE_BODY)
    error = sm.classify(response)
    assert (error.category, error.status, error.code) == (
        C.CONTEXT_LENGTH_EXCEEDED,
        429,
        "rate_limit_exceeded",
    )
    assert error.headers is not None and error.headers["X-Request-Id"] == "r1"
    assert error.message == TOO_LARGE


@pytest.mark.requirement("ER-95")
@pytest.mark.parametrize(
    "body",
    [
        json.dumps(TOO_LARGE_BODY).encode(),
        json.dumps(TOO_LARGE_BODY),
        TOO_LARGE_BODY,
        TOO_LARGE_BODY["error"],  # the inner object alone, as the SDK keeps it
        TOO_LARGE.upper(),  # a bare text body, any casing
        {"error": {"message": "request too large for model x", "type": "tokens"}},
        {"error": {"message": "The input or output tokens MUST BE REDUCED.", "type": "tokens"}},
    ],
    ids=["bytes", "str", "parsed", "inner", "text-upper", "too-large-only", "reduced-only"],
)
def test_request_too_large_429_triples_are_context_length_exceeded(body: Any) -> None:
    """(status, headers, body) with a bytes, str or parsed body; either phrase, any case,
    whatever the model name."""
    error = sm.classify((429, [("retry-after", "1")], body))
    assert error.category is C.CONTEXT_LENGTH_EXCEEDED
    assert error.status == 429


@pytest.mark.requirement("ER-95", "ER-41")
@pytest.mark.parametrize(
    ("status", "message", "etype", "code", "category"),
    [
        (429, RATE_LIMIT_REACHED, "tokens", "rate_limit_exceeded", C.RATE_LIMITED),
        (429, "Rate limit reached for gpt-4o on requests per min (RPM): Limit 500, Used 500, "
         "Requested 1. Please try again in 120ms.", "requests", "rate_limit_exceeded",
         C.RATE_LIMITED),
        (429, "You exceeded your current quota, please check your plan and billing details.",
         "insufficient_quota", "insufficient_quota", C.UNKNOWN),
        (400, TOO_LARGE, "tokens", "rate_limit_exceeded", C.INVALID_REQUEST),  # a 429 only
    ],
    ids=["tokens", "requests", "insufficient-quota", "not-a-429"],
)  # fmt: skip
def test_ordinary_429s_are_not_request_too_large(
    status: int, message: str, etype: str, code: str, category: C
) -> None:
    """An ordinary OpenAI rate limit ("Rate limit reached ... Please try again in 20ms",
    type tokens or requests) stays rate_limited, insufficient_quota stays unknown,
    and the phrases decide on a 429 only."""
    body = {"error": {"message": message, "type": etype, "param": None, "code": code}}
    for given_ in (openai_exc(status, message, etype, code), (status, {}, body)):
        error = sm.classify(given_)
        assert (error.category, error.code) == (category, code)


@pytest.mark.requirement("ER-95")
def test_anthropic_input_tokens_rate_limit_stays_rate_limited() -> None:
    """Anthropic's 429 "would exceed the rate limit ... Please reduce the prompt length
    ... or try again later" may pass after a wait: neither phrase, still rate_limited."""
    message = (
        "This request would exceed the rate limit for your organization of 30,000 input "
        "tokens per minute. Please reduce the prompt length or the maximum tokens "
        "requested, or try again later."
    )
    error = sm.classify(anthropic_exc(429, "rate_limit_error", message))
    assert error.category is C.RATE_LIMITED


@pytest.mark.requirement("ER-95")
def test_a_session_reduces_the_context_on_a_request_too_large_429() -> None:
    """End to end: the engine answers that error with Assemble(reduce=True), never a
    Wait, and an ordinary 429 on the same status still waits."""
    response = httpx2.Response(429, request=REQUEST, json=TOO_LARGE_BODY)
    err = sm.classify(OPENAI._make_status_error_from_response(response))
    s = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0)
    t = s.new_turn()
    t.start()
    t.send(sm.Assembled("req", 100))
    action = t.send(sm.ModelFailed(err))
    assert action == sm.Assemble(reduce=True, withhold_tools=False, instruction=None)
    limited = sm.classify(openai_exc(429, RATE_LIMIT_REACHED, "tokens", "rate_limit_exceeded"))
    t2 = sm.Session(sm.Settings(), seed=1, clock=lambda: 0.0).new_turn()
    t2.start()
    t2.send(sm.Assembled("req", 100))
    assert isinstance(t2.send(sm.ModelFailed(limited)), sm.Wait)


@pytest.mark.requirement("ER-40")
@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"promptFeedback": {"blockReason": "SAFETY", "safetyRatings": []}}, "SAFETY"),
        ({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"}}, "PROHIBITED_CONTENT"),
        ({"candidates": [{"finishReason": "RECITATION", "index": 0}]}, "RECITATION"),
        (
            {"candidates": [{"finishReason": "SAFETY", "content": {"parts": [{"text": "No"}]}}]},
            "SAFETY",
        ),
    ],
)
def test_gemini_safety_blocks_are_content_filtered(body: object, code: str) -> None:
    """A Gemini 200 its filters stopped (the prompt blocked, or the candidate cut) is
    surfaced as content_filtered with Gemini's reason, whatever the input form."""
    for form in (body, json.dumps(body), json.dumps(body).encode()):
        error = sm.classify((200, {}, form))
        assert (error.category, error.code) == (sm.ErrorCategory.CONTENT_FILTERED, code)
    done = {"candidates": [{"finishReason": "STOP", "content": {"parts": [{"text": "hi"}]}}]}
    assert sm.classify((200, {}, done)).category is not sm.ErrorCategory.CONTENT_FILTERED
    limited = {"candidates": [{"finishReason": "MAX_TOKENS"}]}
    assert sm.classify((200, {}, limited)).category is not sm.ErrorCategory.CONTENT_FILTERED
