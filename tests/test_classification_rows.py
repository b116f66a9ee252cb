"""specs/classification.md's mapping, one entry at a time.

Real bodies (tests/corpus/, tests/test_classify.py) carry several of the table's
entries at once: OpenAI's context overflow says "maximum context length" *and* has
code ``context_length_exceeded``, its rate limits have code ``rate_limit_exceeded``
*and* type ``tokens``. Dropping one entry from the table is then invisible to them.
The bodies here are built to carry exactly one entry (a neutral message, one code or
one type, one status), so each documented phrase, name and status is proven to
decide on its own. The entries are written out as the spec states them, never read
from the module (a test that read the table would move with a mutated table).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import statemachine as sm

C = sm.ErrorCategory
NEUTRAL = "the request was rejected"  # says nothing any row reads


def _classify(status: int | None, body: Any) -> sm.ModelError:
    return sm.classify((status, {}, body))


# -- row 3: context overflow -----------------------------------------------------------

CONTEXT_PHRASES = [
    "prompt is too long",
    "maximum context length",
    "context length",
    "context window",
    "context_length_exceeded",
    "exceed context limit",
    "exceeds the context",
    "too many tokens",
    "input is too long",
    "exceeds the available context size",
    "exceeds the maximum number of tokens allowed",
    # self-hosted servers and newer vendors (ER-170)
    "maximum model length",
    "inputs must have less than",
    "tokens + max_new_tokens must be",
    "maximum prompt length",
]


@pytest.mark.requirement("ER-40", "ER-170")
@pytest.mark.parametrize("phrase", CONTEXT_PHRASES)
@pytest.mark.parametrize("status", [400, 413, 422, 200, None])
def test_each_context_phrase_alone_is_a_context_overflow(phrase: str, status: int | None) -> None:
    """A message that says it only this way, in any casing, is a context overflow on
    every status row 3 names; the same message without the phrase is not."""
    for said in (phrase, phrase.upper(), phrase.capitalize()):
        error = _classify(status, {"error": {"message": f"{NEUTRAL}: {said}."}})
        assert error.category is C.CONTEXT_LENGTH_EXCEEDED, said
        assert error.code is None
    without = _classify(status, {"error": {"message": f"{NEUTRAL}."}})
    assert without.category is not C.CONTEXT_LENGTH_EXCEEDED


@pytest.mark.requirement("ER-170")
@pytest.mark.parametrize(
    "said",
    [
        "`inputs` must have less than 4096 tokens. Given: 4545",
        "`inputs` tokens + `max_new_tokens` must be <= 4096. Given: 6 `inputs` tokens",
    ],
)
def test_backticks_around_a_name_do_not_hide_a_context_phrase(said: str) -> None:
    """TGI writes its parameter names in backticks (older releases did not): the
    phrases are read with the backticks left out."""
    assert _classify(422, {"error": said}).category is C.CONTEXT_LENGTH_EXCEEDED
    assert _classify(422, {"error": said.replace("`", "")}).category is C.CONTEXT_LENGTH_EXCEEDED


@pytest.mark.requirement("ER-40", "ER-171")
@pytest.mark.parametrize("status", [401, 403, 404, 500, 503])
def test_a_context_phrase_on_another_status_is_that_status_row(status: int) -> None:
    """Row 3 reads the message only on 400, 413, 422, 200 or none (a 500 only in the
    words of ER-171)."""
    error = _classify(status, {"error": {"message": "context length exceeded"}})
    assert error.category is not C.CONTEXT_LENGTH_EXCEEDED


CONTEXT_500_PHRASES = [
    "context size has been exceeded",
    "exceeds the available context size",
    "longer than the maximum model length",
]


@pytest.mark.requirement("ER-171")
@pytest.mark.parametrize("phrase", CONTEXT_500_PHRASES)
def test_each_self_hosted_context_phrase_makes_a_500_a_context_overflow(phrase: str) -> None:
    """A 500 that says it this way (any casing) overflowed a self-hosted server's
    context: reduced, never retried. The same words on a 502 or 503, and a 500 that
    says nothing of the kind, are overloaded."""
    for said in (phrase, phrase.upper()):
        error = _classify(500, {"error": {"message": f"{NEUTRAL}: {said}."}})
        assert (error.category, error.code) == (C.CONTEXT_LENGTH_EXCEEDED, None), said
    for status in (502, 503):
        assert _classify(status, {"error": {"message": phrase}}).category is C.OVERLOADED
    assert _classify(500, {"error": {"message": NEUTRAL}}).category is C.OVERLOADED


@pytest.mark.requirement("ER-95")
@pytest.mark.parametrize("phrase", ["request too large", "must be reduced"])
def test_each_too_large_phrase_alone_makes_a_429_a_context_overflow(phrase: str) -> None:
    for said in (phrase, phrase.upper()):
        error = _classify(429, {"error": {"message": f"{NEUTRAL}: {said}"}})
        assert error.category is C.CONTEXT_LENGTH_EXCEEDED
    assert _classify(429, {"error": {"message": NEUTRAL}}).category is C.RATE_LIMITED
    # only a 429 says it this way: a 400 saying it is an ordinary invalid request
    assert _classify(400, {"error": {"message": phrase}}).category is C.INVALID_REQUEST


# -- row 1: quota and billing; row 2: filters ------------------------------------------


@pytest.mark.requirement("ER-41")
def test_a_bare_402_is_payment_required() -> None:
    error = _classify(402, None)
    assert (error.category, error.code) == (C.UNKNOWN, "payment_required")


CREDIT_PHRASES = ["credit balance is too low", "used all available credits"]


@pytest.mark.requirement("ER-174")
@pytest.mark.parametrize("phrase", CREDIT_PHRASES)
@pytest.mark.parametrize("status", [400, 403, 429, 200, None])
def test_each_credit_phrase_alone_is_payment_required_on_any_status(
    phrase: str, status: int | None
) -> None:
    """A message that says the credits are spent is never retried nor taken for the
    request's fault, whatever the status and the vendor's own type; without the phrase
    the status row decides."""
    for said in (phrase, phrase.upper()):
        body = {"error": {"message": f"{NEUTRAL}: {said}.", "type": "invalid_request_error"}}
        error = _classify(status, body)
        assert (error.category, error.code) == (C.UNKNOWN, "payment_required"), said
    assert _classify(status, {"error": {"message": NEUTRAL}}).code != "payment_required"


KEY_PHRASES = ["incorrect api key provided", "api key not valid", "api key expired"]


@pytest.mark.requirement("ER-173")
@pytest.mark.parametrize("phrase", KEY_PHRASES)
def test_each_bad_key_phrase_alone_makes_a_400_an_auth_error(phrase: str) -> None:
    """A 400 whose message says the key is invalid or expired is an auth error; the
    same words on a 404 or 422 (not a key's answer) stay invalid requests."""
    for said in (phrase, phrase.upper()):
        error = _classify(400, {"error": {"message": f"{NEUTRAL}: {said}."}})
        assert (error.category, error.code) == (C.AUTH_ERROR, None), said
    for status in (404, 422):
        assert _classify(status, {"error": {"message": phrase}}).category is C.INVALID_REQUEST
    assert _classify(400, {"error": {"message": NEUTRAL}}).category is C.INVALID_REQUEST


def _error_info(reason: str, kind: str = "type.googleapis.com/google.rpc.ErrorInfo") -> Any:
    return {"error": {"code": 400, "message": NEUTRAL, "status": "INVALID_ARGUMENT",
                      "details": [{"@type": kind, "reason": reason}]}}  # fmt: skip


@pytest.mark.requirement("ER-173")
def test_gemini_api_key_invalid_reason_alone_makes_a_400_an_auth_error() -> None:
    """Gemini's ``ErrorInfo`` reason ``API_KEY_INVALID`` decides on its own (the message
    is neutral) and is the code kept; another reason, or the same reason in a detail of
    another type, leaves the 400 an invalid request."""
    error = _classify(400, _error_info("API_KEY_INVALID"))
    assert (error.category, error.code) == (C.AUTH_ERROR, "API_KEY_INVALID")
    on_403 = _classify(403, _error_info("API_KEY_INVALID"))
    assert (on_403.category, on_403.code) == (C.AUTH_ERROR, "API_KEY_INVALID")
    other = _classify(400, _error_info("RATE_LIMIT_EXCEEDED"))
    assert (other.category, other.code) == (C.INVALID_REQUEST, "INVALID_ARGUMENT")
    typed = _error_info("API_KEY_INVALID", "type.googleapis.com/google.rpc.Help")
    assert _classify(400, typed).category is C.INVALID_REQUEST


GEMINI_BLOCKS = ["SAFETY", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "RECITATION"]


@pytest.mark.requirement("ER-40")
@pytest.mark.parametrize("reason", GEMINI_BLOCKS)
def test_each_gemini_block_reason_is_content_filtered(reason: str) -> None:
    """Gemini's reasons, as the prompt's block reason and as the candidate's finish."""
    for body in (
        {"promptFeedback": {"blockReason": reason}},
        {"candidates": [{"finishReason": reason, "index": 0}]},
    ):
        error = _classify(200, body)
        assert (error.category, error.code) == (C.CONTENT_FILTERED, reason)
    for body in (
        {"promptFeedback": {"blockReason": "OTHER_REASON"}},
        {"candidates": [{"finishReason": "STOP", "index": 0}]},
    ):
        assert _classify(200, body).category is not C.CONTENT_FILTERED


# -- row 4 (in a stream) and row 9 (any other status): by type -------------------------

BY_TYPE = [
    ("overloaded_error", C.OVERLOADED),
    ("api_error", C.OVERLOADED),
    ("server_error", C.OVERLOADED),
    ("service_unavailable", C.OVERLOADED),
    ("timeout_error", C.OVERLOADED),
    ("rate_limit_error", C.RATE_LIMITED),
    ("rate_limit_exceeded", C.RATE_LIMITED),
    ("requests", C.RATE_LIMITED),
    ("tokens", C.RATE_LIMITED),
    ("authentication_error", C.AUTH_ERROR),
    ("permission_error", C.AUTH_ERROR),
    ("invalid_api_key", C.AUTH_ERROR),
    ("permission_denied", C.AUTH_ERROR),
    ("invalid_request_error", C.INVALID_REQUEST),
    ("not_found_error", C.INVALID_REQUEST),
    ("request_too_large", C.INVALID_REQUEST),
    ("model_not_found", C.INVALID_REQUEST),
    # Bedrock's stream exceptions, as its frames name them (ER-177)
    ("throttlingException", C.RATE_LIMITED),
    ("serviceUnavailableException", C.OVERLOADED),
    ("internalServerException", C.OVERLOADED),
    ("modelTimeoutException", C.OVERLOADED),
    ("validationException", C.INVALID_REQUEST),
]


CONTEXT_STATUSES = (400, 413, 422, 200, None)
"""Row 3 reads a code on these statuses only."""
NAMES = [
    # row 3: context overflow
    *[(name, C.CONTEXT_LENGTH_EXCEEDED, CONTEXT_STATUSES)
      for name in ("context_length_exceeded", "string_above_max_length",
                   "exceed_context_size_error")],
    # row 1: quota and billing, never retried whatever the status (ER-41)
    *[(name, C.UNKNOWN, (400, 429, 403, 500, 200, None))
      for name in ("insufficient_quota", "billing_error", "billing_hard_limit_reached",
                   "exceeded_current_quota_error", "Arrearage")],
    # row 2: filters
    *[(name, C.CONTENT_FILTERED, (400, 403, 200, None))
      for name in ("content_filter", "content_policy_violation", "refusal")],
    # row 4 (an error event in a stream: 200 or no status) and row 9 (a status no row
    # names, 418): by type
    *[(name, category, (200, None, 418)) for name, category in BY_TYPE],
]  # fmt: skip


@pytest.mark.requirement("ER-40", "ER-41", "ER-44")
@pytest.mark.parametrize(
    ("name", "category", "status"),
    [(name, category, status) for name, category, statuses in NAMES for status in statuses],
)
@pytest.mark.parametrize("field", ["code", "type"])
def test_each_name_decides_alone_in_either_field(
    name: str, category: sm.ErrorCategory, status: int | None, field: str
) -> None:
    """A body whose only name is ``name`` (as its code or as its type, beside a
    neutral message) is classified by it, on every status its row reads it on, and
    keeps it as its code."""
    error = _classify(status, {"error": {"message": NEUTRAL, field: name}})
    assert (error.category, error.code) == (category, name)


@pytest.mark.requirement("ER-44")
@pytest.mark.parametrize("status", [200, None, 418])
def test_a_name_the_by_type_table_does_not_know_is_unknown(status: int | None) -> None:
    error = _classify(status, {"error": {"message": NEUTRAL, "type": "teapot_error"}})
    assert (error.category, error.code) == (C.UNKNOWN, "teapot_error")


@pytest.mark.requirement("ER-177")
@pytest.mark.parametrize(
    ("name", "category"),
    [("ThrottlingException", C.RATE_LIMITED), ("SERVICEUNAVAILABLEEXCEPTION", C.OVERLOADED),
     ("Rate_Limit_Error", C.RATE_LIMITED), ("ValidationException", C.INVALID_REQUEST)],
)  # fmt: skip
def test_a_name_is_looked_up_in_any_casing(name: str, category: sm.ErrorCategory) -> None:
    """Bedrock names one exception ``throttlingException`` in a stream and
    ``ThrottlingException`` over HTTP: the by-type table reads names in lower case and
    the code keeps the vendor's casing."""
    error = _classify(None, {"error": {"message": NEUTRAL, "type": name}})
    assert (error.category, error.code) == (category, name)


FRAME = {":content-type": "application/json"}
"""Headers every event-stream frame carries beside its type."""


@pytest.mark.requirement("ER-177")
@pytest.mark.parametrize("kind", ["exception", "error"])
@pytest.mark.parametrize("status", [400, 200, 503])
def test_an_event_stream_error_frame_is_read_by_its_header_type(kind: str, status: int) -> None:
    """A frame whose ``:message-type`` is ``exception`` (its type in
    ``:exception-type``) or ``error`` (in ``:error-code``) is an error event of the
    stream: its header type decides and is its code, whatever status came with it
    (botocore's ``to_response_dict`` says 400 for every such frame), and it keeps none."""
    name = ":exception-type" if kind == "exception" else ":error-code"
    headers = {**FRAME, ":message-type": kind, name: "throttlingException"}
    error = sm.classify((status, headers, b'{"message":"Rate exceeded"}'))
    assert (error.category, error.code, error.status) == (
        C.RATE_LIMITED, "throttlingException", None
    )  # fmt: skip
    assert error.message == "Rate exceeded"


@pytest.mark.requirement("ER-177")
def test_a_frame_that_is_not_an_error_keeps_its_status() -> None:
    """An ``event`` frame carries no error: the status given decides, as for any
    response (and an unknown header type is kept as the code)."""
    headers = {**FRAME, ":message-type": "event", ":exception-type": "teapotException"}
    error = sm.classify((400, headers, b'{"message":"m"}'))
    assert (error.category, error.code, error.status) == (
        C.INVALID_REQUEST, "teapotException", 400
    )  # fmt: skip


@pytest.mark.requirement("ER-177")
def test_the_amzn_error_type_header_names_an_http_error() -> None:
    """Bedrock's HTTP errors name their type in ``x-amzn-ErrorType`` (before a ``:``):
    it is the code kept, and it decides where the status does not (a 418)."""
    headers = {"x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/coral/"}
    error = sm.classify((429, headers, b'{"message":"m"}'))
    assert (error.category, error.code) == (C.RATE_LIMITED, "ThrottlingException")
    odd = sm.classify((418, {"x-amzn-errortype": "ServiceUnavailableException"}, None))
    assert (odd.category, odd.code) == (C.OVERLOADED, "ServiceUnavailableException")
    empty = sm.classify((418, {"x-amzn-errortype": ":http://internal"}, None))
    assert (empty.category, empty.code) == (C.UNKNOWN, "http_418")
    body_first = {"error": {"message": "m", "type": "rate_limit_error"}}
    named = sm.classify((418, {"x-amzn-errortype": "ValidationException"}, body_first))
    assert named.code == "rate_limit_error"  # the body's own type comes first


# -- rows 5 to 9: the status decides ---------------------------------------------------

OVERLOADED_STATUSES = [408, 409, 500, 502, 503, 504, 505, 507, 520, 522, 524, 529, 599]


@pytest.mark.requirement("ER-40")
@pytest.mark.parametrize(
    ("status", "category"),
    [(429, C.RATE_LIMITED), (401, C.AUTH_ERROR), (403, C.AUTH_ERROR)]
    + [(status, C.OVERLOADED) for status in OVERLOADED_STATUSES]
    + [(status, C.INVALID_REQUEST) for status in (400, 404, 413, 422)]
    + [(status, C.UNKNOWN) for status in (402, 405, 410, 418, 451, 499, 501)],
)
def test_each_status_row_decides_on_a_body_that_names_nothing(
    status: int, category: sm.ErrorCategory
) -> None:
    """With no code or type, the status alone decides; every 5xx but 501 (not
    implemented: no retry helps) is overloaded, and 499 (nginx's log code for a
    client that hung up) is not a 5xx."""
    for body in (None, {"error": {"message": NEUTRAL}}, b"<html>Bad Gateway</html>"):
        assert _classify(status, body).category is category, (status, body)


@pytest.mark.requirement("ER-40")
def test_a_status_without_a_vendor_name_keeps_http_status_as_its_code() -> None:
    assert _classify(503, None).code == "http_503"
    assert _classify(418, None).code == "http_418"
    assert _classify(429, None).code == "rate_limited"
    assert _classify(400, None).code is None


# -- how the fields are read -----------------------------------------------------------


@pytest.mark.requirement("ER-40")
def test_the_anthropic_envelope_type_is_not_a_vendor_code() -> None:
    """``{"type": "error"}`` is the envelope's type, not the error's: no code is kept
    from it (and the message is still read)."""
    error = _classify(400, {"type": "error", "message": "bad field"})
    assert (error.category, error.code, error.message) == (C.INVALID_REQUEST, None, "bad field")


@pytest.mark.requirement("ER-43")
@pytest.mark.parametrize(("value", "kept"), [(True, None), (False, None), ("", None), (42, "42")])
def test_a_type_that_is_not_text_is_kept_only_as_a_number(value: Any, kept: str | None) -> None:
    """A boolean or an empty text is no name; a number is kept as its text."""
    error = _classify(400, {"error": {"message": NEUTRAL, "type": value}})
    assert (error.category, error.code) == (C.INVALID_REQUEST, kept)


@pytest.mark.requirement("ER-40")
def test_an_exception_with_a_message_attribute_keeps_that_message() -> None:
    """Google's API errors (``google.api_core.exceptions``) put the status before the
    message in ``str(exc)`` and keep the message alone on ``.message``."""

    class GoogleAPICallError(Exception):
        def __init__(self, message: str) -> None:
            super().__init__(f"429 {message}")
            self.message = message

    error = sm.classify(GoogleAPICallError("Resource has been exhausted (e.g. check quota)."))
    assert error.message == "Resource has been exhausted (e.g. check quota)."

    class Blank(Exception):
        message = ""

    assert sm.classify(Blank("said in str")).message == "said in str"


@pytest.mark.requirement("ER-43")
def test_a_reply_with_an_empty_refusal_is_not_a_refusal() -> None:
    """OpenAI's ``message.refusal`` is None or the refusal's text; an empty text
    refuses nothing."""

    class Message:
        refusal = ""
        content = "hello"

    class Choice:
        finish_reason = "stop"
        message = Message()

    class Reply:
        choices = [Choice()]  # noqa: RUF012

    assert sm.classify(Reply()).category is C.UNKNOWN
    Message.refusal = "I can't help with that."
    error = sm.classify(Reply())
    assert (error.category, error.code, error.message) == (
        C.CONTENT_FILTERED, "refusal", "I can't help with that."
    )  # fmt: skip


@pytest.mark.requirement("ER-58")
def test_a_body_built_by_hand_is_kept_as_a_json_copy() -> None:
    """A key that is not text is dropped, a value that is not JSON data becomes None;
    a body that is JSON data already is kept as the same object."""
    given: dict[Any, Any] = {1: "a", "error": {"message": "m"}}
    error = _classify(400, given)
    assert error.body == {"error": {"message": "m"}} and error.body is not given
    odd = {"x": object(), "error": {"message": "m"}}
    error = _classify(400, odd)
    assert error.body == {"x": None, "error": {"message": "m"}} and error.body is not odd
    plain = {"error": {"message": "m", "n": [1, 2.5, None, True]}}
    assert _classify(400, plain).body is plain


@pytest.mark.requirement("ER-43")
def test_an_object_that_is_no_provider_error_is_named_by_its_short_repr() -> None:
    error = sm.classify([1, [2, [3]]])
    assert error.message == "not a provider error: [1, [2, [3]]]"
    deep = sm.classify([[[[["x"]]]]])
    assert deep.message == "not a provider error: [[[[...]]]]"


# -- the message kept ------------------------------------------------------------------


@pytest.mark.requirement("ER-40")
def test_a_fastapi_detail_text_is_the_message_and_is_read() -> None:
    """FastAPI's ``{"detail": "..."}`` (Mistral's 401, many OpenAI-compatible servers):
    the detail is the message, and row 3 reads it like any message."""
    error = _classify(401, {"detail": "Unauthorized"})
    assert (error.category, error.message) == (C.AUTH_ERROR, "Unauthorized")
    overflow = _classify(400, {"detail": "This model's maximum context length is 4096"})
    assert overflow.category is C.CONTEXT_LENGTH_EXCEEDED
    # the error's own message comes first
    both = _classify(400, {"message": "said here", "detail": "not here"})
    assert both.message == "said here"


@pytest.mark.requirement("ER-40")
def test_a_message_that_is_an_object_is_shown_as_json_and_never_read() -> None:
    """Mistral's 422 and FastAPI's validation errors carry a list of problems, which
    may echo the request: the message is their JSON text, but no phrase is read from
    it (a prompt saying "context window" must not make a 400 a context overflow)."""
    problems = {"detail": [{"type": "extra_forbidden", "loc": ["body", "x"], "input": 1}]}
    mistral = _classify(422, {"object": "error", "message": problems,
                              "type": "invalid_request_error", "code": None})  # fmt: skip
    assert mistral.category is C.INVALID_REQUEST
    assert mistral.message == (
        '{"detail":[{"type":"extra_forbidden","loc":["body","x"],"input":1}]}'
    )
    fastapi = _classify(422, {"detail": [{"msg": "Field required", "loc": ["body"]}]})
    assert fastapi.message == '[{"msg":"Field required","loc":["body"]}]'
    echoed = {"error": {"message": [{"msg": "bad", "input": "fill the context window"}]}}
    error = _classify(400, echoed)
    assert error.category is C.INVALID_REQUEST
    assert "context window" in error.message
    assert _classify(400, {"error": {"message": {}}}).message == "HTTP 400"


@pytest.mark.requirement("ER-44")
def test_a_status_below_200_or_from_300_is_read_as_any_other_status() -> None:
    """Statuses 200-399 are a successful (streamed) response whose error event decides,
    with no code of its own; 1xx and the rest keep ``http_<status>``."""
    for status in (200, 204, 399):
        assert _classify(status, None).code is None, status
    for status in (100, 199):
        assert _classify(status, None).code == f"http_{status}", status


@pytest.mark.requirement("ER-43")
def test_a_status_that_is_a_flag_is_no_status() -> None:
    """``(True, headers, body)``: a boolean is no HTTP status (True == 1 in Python)."""
    error = sm.classify((True, {}, None))
    assert (error.status, error.message) == (None, "")
    assert sm.classify((503, {}, None)).message == "HTTP 503"


@pytest.mark.requirement("ER-43")
def test_an_object_needs_an_int_status_and_headers_to_be_read_as_a_response() -> None:
    class StatusOnly:
        status_code = 429

    class HeadersOnly:
        headers = {"retry-after": "3"}  # noqa: RUF012

    for obj in (StatusOnly(), HeadersOnly()):
        error = sm.classify(obj)
        assert error.category is C.UNKNOWN
        assert error.message.startswith("not a provider error"), obj


@pytest.mark.requirement("ER-43")
def test_an_exception_with_no_status_and_no_body_is_named_by_its_class() -> None:
    error = sm.classify(KeyError("missing"))
    assert (error.category, error.code, error.body) == (C.UNKNOWN, "KeyError", None)


@pytest.mark.requirement("ER-43")
def test_a_reply_with_no_choices_or_an_unreadable_dump_is_no_refusal() -> None:
    """An SDK reply object whose ``choices`` is empty is no provider error; a refusal
    whose ``model_dump`` is not callable keeps no body (it is not JSON data)."""

    class Empty:
        choices: list[Any] = []  # noqa: RUF012

    error = sm.classify(Empty())
    assert error.category is C.UNKNOWN and error.message.startswith("not a provider error")

    class Refused:
        stop_reason = "refusal"
        model_dump = None

    refused = sm.classify(Refused())
    assert (refused.category, refused.body) == (C.CONTENT_FILTERED, None)


@pytest.mark.requirement("ER-40")
@pytest.mark.parametrize("value", [1.5, {"name": "x"}, ["x"]])
def test_a_type_that_is_a_float_or_a_container_is_no_name(value: Any) -> None:
    error = _classify(400, {"error": {"message": NEUTRAL, "type": value}})
    assert (error.category, error.code) == (C.INVALID_REQUEST, None)


@pytest.mark.requirement("ER-42")
def test_headers_of_any_mapping_shape_are_read_and_garbage_is_dropped() -> None:
    """A dict, (name, value) pairs and an object with ``items()`` are all headers; a
    text or a number is no headers, dropped without raising."""

    class Items:
        def items(self) -> list[tuple[str, str]]:
            return [("Retry-After", "4")]

    for given in ({"retry-after": "4"}, [("Retry-After", "4")], Items()):
        error = sm.classify((429, given, None))
        assert error.headers is not None and error.headers["retry-after"] == "4"
        assert error.retry_after_seconds == 4.0
    own = sm.Headers({"retry-after": "4"})
    assert sm.classify((429, own, None)).headers is own
    for garbage in ("retry-after: 4", 12):
        error = sm.classify((429, garbage, None))
        assert (error.category, error.headers) == (C.RATE_LIMITED, None)


@pytest.mark.requirement("ER-43")
def test_a_short_repr_cuts_bytes_text_and_containers() -> None:
    """The "not a provider error" message shows at most 200 bytes or characters and 8
    items of a container, each cut marked."""
    prefix = "not a provider error: "
    for size, cut in ((200, False), (201, True)):
        mark = "..." if cut else ""
        assert sm.classify(b"b" * size).message == f"{prefix}{b'b' * 200!r}{mark}"
        array = sm.classify(bytearray(b"a" * size)).message
        assert array == f"{prefix}bytearray({b'a' * 200!r}{mark})"
    assert sm.classify(list(range(8))).message == "not a provider error: [0, 1, 2, 3, 4, 5, 6, 7]"
    assert sm.classify(list(range(9))).message.endswith("[0, 1, 2, 3, 4, 5, 6, 7, ...]")
    text = sm.classify({"k": "t" * 300}).message
    assert "..." in text and text.count("t") < 205
    assert "..." not in sm.classify({"k": "t" * 150}).message


# -- the table of rules in code, as the spec documents it --------------------------------

SPEC = Path(__file__).resolve().parent.parent / "specs" / "classification.md"


def _spec_rules() -> list[list[str]]:
    """The rows of the spec's "table of rules in code", as lists of cells."""
    text = SPEC.read_text(encoding="utf-8")
    start = text.index("## The table of rules in code")
    section = text[start : text.index("\n## ", start + 1)]
    rows = [
        [cell.strip() for cell in line.strip("|").split(" | ")] for line in section.splitlines()
    ]
    return [row for row in rows if re.fullmatch(r"\d+[a-z]?", row[0])]


def _statuses(cell: str) -> Any:
    if cell == "any":
        return None
    if cell.startswith("500 and up, but 501"):
        return "server errors"
    words = re.findall(r"\d+|none", cell.partition("(")[0])
    return {None if word == "none" else int(word) for word in words}


def _code_kept(rule: Any) -> str:
    if rule.keeps == "match":
        return "the reason" if rule.when.__name__ in {"_finishes", "_reason"} else "the name"
    if rule.keeps == "nothing":
        return f"`{rule.otherwise}`"
    if rule.otherwise is None:
        return "vendor's"
    otherwise = "http_<status>" if rule.otherwise == "http_<status>" else rule.otherwise
    return f"vendor's, else `{otherwise}`"


@pytest.mark.requirement("ER-40")
def test_the_spec_documents_every_rule_of_the_table_by_its_id() -> None:
    """specs/classification.md lists the rules of ``_RULES`` in their order, each by its
    id with the statuses it reads, the constant it matches, its category and the code it
    keeps: a rule added, dropped, moved or changed in the code without the spec (or the
    other way round) fails here. (This test reads the private table on purpose: it
    checks a document against the code, not the code's behaviour.)"""
    from statemachine.io import _classify

    documented = _spec_rules()
    assert [row[0] for row in documented] == [rule.id for rule in _classify._RULES]
    for row, rule in zip(documented, _classify._RULES, strict=True):
        _, statuses, matches, category, kept, _requirements = row
        assert category == f"`{rule.category.value}`", rule.id
        if isinstance(rule.statuses, set | frozenset):
            assert _statuses(statuses) == set(rule.statuses), rule.id
        else:
            expected = None if rule.statuses is None else "server errors"
            assert _statuses(statuses) == expected, rule.id
        if rule.when is None:
            assert matches == "the status alone", rule.id
        else:
            constant = next(name for name, value in vars(_classify).items() if value is rule.of)
            assert f"`{constant}`" in matches, rule.id
            for word in (*rule.of, *rule.unless):  # each name or phrase written out
                assert word in matches, (rule.id, word)
        assert kept.startswith(_code_kept(rule)), (rule.id, kept)
        assert ("before the event's type" in matches) == rule.before_type, rule.id


@pytest.mark.requirement("ER-243", "ER-95")
def test_in_a_stream_only_a_named_statuss_overflow_wording_comes_before_the_type() -> None:
    """An in-stream error whose type names a category (OpenAI's ``tokens``: rate
    limited) and whose numeric code names a 429: the 429's request-too-large wording
    (rule 3c) decides before the type; any other rule of the named status (row 1's 402,
    row 5's 429) does not, the type does."""
    too_large = {
        "error": {"code": 429, "type": "tokens", "message": "Request too large for gpt-4o"}
    }
    error = _classify(200, too_large)
    assert (error.category, error.code) == (C.CONTEXT_LENGTH_EXCEEDED, "tokens")
    for code in (429, 402):
        typed = {"error": {"code": code, "type": "tokens", "message": NEUTRAL}}
        assert _classify(None, typed).category is C.RATE_LIMITED, code
    untyped = {"error": {"code": 402, "message": NEUTRAL}}
    assert (_classify(None, untyped).category, _classify(None, untyped).code) == (
        C.UNKNOWN,
        "payment_required",
    )
