"""Tests that kill the mutants of ``statemachine/io/_classify.py`` the other suites let
live (``python -m tools.mutate --module statemachine/io/_classify.py``; the verdicts
are in specs/mutation.md).

Each body is one a provider really sends (its source is named next to it); the bounds
are checked at their edge, one value either side.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import openai
import pytest

import statemachine as sm
from tests.helpers import dict_depth, list_depth, nested_dicts, nested_lists

C = sm.ErrorCategory
# the bounds as ER-58 and specs/classification.md state them, written out, not read from
# the module (a test that read them would move with a mutated bound)
MAX_BODY = 65_536
MAX_SSE_LINES = 64
MAX_BODY_VALUES = 1024
MAX_BODY_STRING = 4096
REQUEST = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")

# -- context overflow, one phrase or code at a time -----------------------------------

CONTEXT_BODIES = [
    pytest.param(
        # Groq (thepersonalaicompany/amurex-backend#51, OpenHands/OpenHands#1902): the
        # code alone says it, the message names no phrase
        {"error": {"message": "Please reduce the length of the messages or completion.",
                   "type": "invalid_request_error", "param": "messages",
                   "code": "context_length_exceeded"}},
        "context_length_exceeded", id="groq-code-only"),
    pytest.param(
        # OpenAI (AnswerDotAI/fastllm#45, orchidfiles/ungate#26)
        {"error": {"message": "Invalid 'input[149].call_id': string too long. Expected a "
                              "string with maximum length 64, but got a string with length "
                              "86 instead.",
                   "type": "invalid_request_error", "param": "input[149].call_id",
                   "code": "string_above_max_length"}},
        "string_above_max_length", id="openai-string-above-max-length"),
    pytest.param(
        # MiniMax's Anthropic-compatible endpoint (rowboatlabs/rowboat#514)
        {"type": "error",
         "error": {"type": "bad_request_error",
                   "message": "invalid params, context window exceeds limit (2013)",
                   "http_code": "400"},
         "request_id": "06340988ef34a8f048d8267af65d3228"},
        "bad_request_error", id="minimax-context-window"),
    pytest.param(
        # LM Studio (Gitlawb/openclaude#353)
        {"error": "The number of tokens to keep from the initial prompt is greater than the "
                  "context length (n_keep: 13055>= n_ctx: 4096). Try to load the model with a "
                  "larger context length, or provide a shorter input."},
        None, id="lmstudio-context-length"),
    pytest.param(
        # Amazon Bedrock (aws-samples/assessment-generator#2; the REST body is
        # {"message": ...}, charmbracelet/crush#946)
        {"message": "Input is too long for requested model."},
        None, id="bedrock-input-is-too-long"),
    pytest.param(
        # Cohere v1 ({"message": ...}; cohere-ai/sandbox-topically#4)
        {"message": "too many tokens: total number of tokens (prompt and prediction) cannot "
                    "exceed 2048 - received 6354. Try using a shorter prompt or a smaller "
                    "max_tokens value."},
        None, id="cohere-too-many-tokens"),
]  # fmt: skip


@pytest.mark.requirement("ER-40")
@pytest.mark.parametrize(("body", "code"), CONTEXT_BODIES)
def test_each_context_phrase_and_code_is_read_on_its_own(body: Any, code: str | None) -> None:
    """A 400 that says the context overflowed in only one of the known ways (one code,
    or one phrase) is context_length_exceeded, with the vendor's code kept; as bytes
    and as parsed JSON."""
    for given in (body, json.dumps(body).encode()):
        error = sm.classify((400, {"content-type": "application/json"}, given))
        assert (error.category, error.code, error.status) == (
            C.CONTEXT_LENGTH_EXCEEDED,
            code,
            400,
        )


@pytest.mark.requirement("ER-40")
def test_an_sdk_error_without_a_body_is_read_by_its_quoted_message() -> None:
    """Groq's OpenAI-style SDK error quotes the body in its message; without a parsed
    body, ``context_length_exceeded`` in that message is enough."""
    quoted = (
        "Error code: 400 - {'error': {'message': 'Please reduce the length of the messages "
        "or completion.', 'type': 'invalid_request_error', 'param': 'messages', 'code': "
        "'context_length_exceeded'}}"
    )
    exc = openai.BadRequestError(quoted, response=httpx2.Response(400, request=REQUEST), body=None)
    error = sm.classify(exc)
    assert (error.category, error.status, error.code) == (C.CONTEXT_LENGTH_EXCEEDED, 400, None)
    assert error.message == quoted


@pytest.mark.requirement("ER-41")
def test_a_billing_hard_limit_on_a_400_is_not_an_invalid_request() -> None:
    """OpenAI's ``billing_hard_limit_reached`` comes with HTTP 400
    (bajrangCoder/acode-plugin-chatgpt#19, all-in-aigc/aiwallpaper#2): unknown, not
    retried, code kept; not invalid_request."""
    body = {
        "error": {
            "message": "Billing hard limit has been reached",
            "type": "invalid_request_error",
            "param": None,
            "code": "billing_hard_limit_reached",
        }
    }
    error = sm.classify((400, {}, json.dumps(body).encode()))
    assert (error.category, error.code) == (C.UNKNOWN, "billing_hard_limit_reached")
    assert not error.retryable


# -- error events inside a 200 stream, every Anthropic error type ----------------------

ANTHROPIC_STREAM_TYPES = [
    ("overloaded_error", "Overloaded", C.OVERLOADED),
    ("api_error", "Internal server error", C.OVERLOADED),
    ("timeout_error", "Request timed out", C.OVERLOADED),
    ("rate_limit_error", "Number of request tokens has exceeded your rate limit", C.RATE_LIMITED),
    ("authentication_error", "invalid x-api-key", C.AUTH_ERROR),
    ("permission_error", "Your API key does not have permission to use the specified resource",
     C.AUTH_ERROR),
    ("invalid_request_error", "messages: text content blocks must be non-empty",
     C.INVALID_REQUEST),
    ("not_found_error", "model: claude-nope", C.INVALID_REQUEST),
    ("request_too_large", "Request exceeds the maximum allowed number of bytes",
     C.INVALID_REQUEST),
]  # fmt: skip


@pytest.mark.requirement("ER-44")
@pytest.mark.parametrize(("etype", "message", "category"), ANTHROPIC_STREAM_TYPES)
def test_every_anthropic_error_type_in_a_stream_is_read_by_its_type(
    etype: str, message: str, category: C
) -> None:
    """An Anthropic ``event: error`` after a 200 (the Messages streaming docs) is
    classified by its error type, each of the documented types; the status carries
    nothing, so nothing else could decide."""
    event = {"type": "error", "error": {"type": etype, "message": message}}
    sse = (
        'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1",'
        '"type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-5",'
        '"stop_reason":null}}\n\n'
        f"event: error\ndata: {json.dumps(event)}\n\n"
    )
    error = sm.classify((200, {"content-type": "text/event-stream"}, sse.encode()))
    assert (error.category, error.code, error.message, error.status) == (
        category,
        etype,
        message,
        200,
    )


# -- replies that are refusals ---------------------------------------------------------


def _anthropic_message(stop_reason: str) -> Any:
    return anthropic.types.Message.model_validate(
        {
            "id": "msg_01RefusalTestMessage123456789",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-opus-4-7",
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": 20, "output_tokens": 1},
        }
    )


def _chat_completion(finish_reason: str, refusal: str | None) -> Any:
    return openai.types.chat.ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "gpt-4o-2024-08-06",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": finish_reason,
                    "logprobs": None,
                    "message": {"role": "assistant", "content": None, "refusal": refusal},
                }
            ],
        }
    )


@pytest.mark.requirement("ER-40")
def test_a_refusal_reply_keeps_status_200_and_its_plain_json_body() -> None:
    """Each refusal shape of a reply is content_filtered with status 200, the code that
    names it, and the reply itself as plain JSON (its ``model_dump``)."""
    cases = [
        (_anthropic_message("refusal"), "refusal", "the model refused"),
        (_chat_completion("content_filter", None), "content_filter",
         "the reply was stopped by the content filter"),
        (_chat_completion("stop", "I'm sorry, I can't assist with that."), "refusal",
         "I'm sorry, I can't assist with that."),
    ]  # fmt: skip
    for reply, code, message in cases:
        error = sm.classify(reply)
        assert (error.category, error.code, error.status, error.message) == (
            C.CONTENT_FILTERED,
            code,
            200,
            message,
        )
        assert error.body == reply.model_dump(mode="json")


@pytest.mark.requirement("ER-43")
def test_an_ordinary_reply_is_not_a_refusal() -> None:
    """A reply that finished normally is no provider error: unknown, not a refusal."""
    for reply in (_anthropic_message("end_turn"), _chat_completion("stop", None)):
        error = sm.classify(reply)
        assert error.category is C.UNKNOWN
        assert error.code is None
        assert error.message.startswith("not a provider error")


# -- the bounds, at their edge ---------------------------------------------------------


def _openai_body(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}


@pytest.mark.requirement("ER-40")
def test_a_message_is_kept_whole_up_to_2000_characters_then_cut() -> None:
    """A message of exactly 2000 characters is kept whole; one more, and it is cut to
    1999 characters and an ellipsis (2000 in all)."""
    exact = "The server had an error while processing your request. " * 40
    exact = exact[:2000]
    error = sm.classify((500, {}, _openai_body(exact)))
    assert error.message == exact
    longer = exact + "x"
    error = sm.classify((500, {}, _openai_body(longer)))
    assert error.message == longer[:1999] + "…"
    assert len(error.message) == 2000


def _padded_json(size: int) -> bytes:
    """Anthropic's 529 body, pretty-printed with trailing whitespace up to ``size``."""
    body = b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}'
    return body + b" " * (size - len(body) - 1) + b"\n"


@pytest.mark.requirement("ER-58")
def test_a_body_of_exactly_max_body_bytes_is_parsed_whole_and_one_more_is_not() -> None:
    """MAX_BODY bytes are read as one JSON document; MAX_BODY + 1 bytes are not (the
    body is then text, and the status decides)."""
    exact = _padded_json(MAX_BODY)
    assert len(exact) == MAX_BODY
    error = sm.classify((529, {}, exact))
    assert (error.category, error.code) == (C.OVERLOADED, "overloaded_error")
    assert error.body == json.loads(exact)
    over = _padded_json(MAX_BODY + 1)
    error = sm.classify((529, {}, over))
    assert (error.category, error.code) == (C.OVERLOADED, "http_529")
    assert isinstance(error.body, str)
    # a str body is cut the same way
    assert sm.classify((529, {}, exact.decode())).body == json.loads(exact)
    assert isinstance(sm.classify((529, {}, over.decode())).body, str)


TEXT_DELTA = (
    'data: {"type":"content_block_delta","index":0,'
    '"delta":{"type":"text_delta","text":"That error means the file is missing."}}\n\n'
)
ERROR_EVENT = (
    'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
    '"message":"Overloaded"}}\n\n'
)


@pytest.mark.requirement("ER-58", "ER-44")
def test_the_error_event_is_found_among_max_sse_lines_candidates_and_not_after() -> None:
    """Text deltas that mention "error" are candidates too: the error event is found
    when it is the MAX_SSE_LINES-th candidate, not when it is one later."""
    for before, found in ((MAX_SSE_LINES - 1, True), (MAX_SSE_LINES, False)):
        body = TEXT_DELTA * before + ERROR_EVENT
        error = sm.classify((200, {}, body.encode()))
        if found:
            assert (error.category, error.code) == (C.OVERLOADED, "overloaded_error")
        else:
            assert (error.category, error.code) == (C.UNKNOWN, None)


@pytest.mark.requirement("ER-58", "ER-44")
def test_a_tail_that_starts_on_a_line_boundary_keeps_that_line() -> None:
    """A long buffered stream whose last MAX_BODY bytes begin exactly with the error
    event's line (the byte before is a newline): that line is whole and is read."""
    event_line = (
        b'data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n'
    )
    filler = (
        b'data: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"hi"}}\n'
    )
    head = filler * (MAX_BODY // len(filler) + 2)
    rest = MAX_BODY - len(event_line)
    tail = event_line + filler * (rest // len(filler)) + b"\n" * (rest % len(filler))
    assert len(tail) == MAX_BODY
    error = sm.classify((200, {}, head + tail))
    assert (error.category, error.code) == (C.OVERLOADED, "overloaded_error")
    assert sm.classify((200, {}, (head + tail).decode())).code == "overloaded_error"


def _values(body: Any) -> int:
    """How many JSON values ``body`` holds (containers, keys' values, scalars)."""
    if isinstance(body, dict):
        return 1 + sum(_values(v) for v in body.values())
    if isinstance(body, list):
        return 1 + sum(_values(v) for v in body)
    return 1


def _body_with_values(total: int) -> dict[str, Any]:
    """Anthropic's 529 envelope plus a list of usage numbers, ``total`` values in all."""
    body: dict[str, Any] = {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
        "n": [],
    }
    body["n"] = list(range(total - _values(body)))
    assert _values(body) == total
    return body


@pytest.mark.requirement("ER-58")
def test_a_parsed_body_of_max_body_values_is_kept_as_is_and_one_more_is_cut() -> None:
    """A parsed body of exactly MAX_BODY_VALUES values is kept as given; one value more
    and the kept copy holds at most MAX_BODY_VALUES."""
    exact = _body_with_values(MAX_BODY_VALUES)
    error = sm.classify((529, {}, exact))
    assert error.body is exact
    over = _body_with_values(MAX_BODY_VALUES + 1)
    error = sm.classify((529, None, over))
    assert error.code == "overloaded_error"
    assert _values(error.body) == MAX_BODY_VALUES  # the first ones, breadth first
    assert error.body["error"] == over["error"]
    assert error.body["n"] == over["n"][: len(error.body["n"])]  # numbers copied as numbers
    assert error.headers is None  # no headers given, none invented


@pytest.mark.requirement("ER-58")
def test_a_parsed_body_of_max_body_characters_is_kept_as_is_and_one_more_is_cut() -> None:
    """Keys count as text: a body whose keys and strings make exactly MAX_BODY
    characters is kept as given; one character more and its long string is cut."""
    keys = len("error") + len("type") + len("api_error") + len("message")
    for extra, kept_whole in ((0, True), (1, False)):
        body = {"error": {"type": "api_error", "message": "e" * (MAX_BODY - keys + extra)}}
        error = sm.classify((500, {}, body))
        assert error.category is C.OVERLOADED
        if kept_whole:
            assert error.body is body
        else:
            assert len(error.body["error"]["message"]) == MAX_BODY_STRING


@pytest.mark.requirement("ER-40")
def test_a_422_validation_error_without_a_vendor_type_is_an_invalid_request() -> None:
    """A FastAPI-based OpenAI-compatible server answers a malformed request with 422
    and FastAPI's ``{"detail": [...]}``: invalid_request by its status alone."""
    body = {
        "detail": [
            {
                "type": "missing",
                "loc": ["body", "messages"],
                "msg": "Field required",
                "input": {"model": "llama-3.1-8b-instruct"},
            }
        ]
    }
    error = sm.classify((422, {"content-type": "application/json"}, json.dumps(body).encode()))
    assert (error.category, error.code, error.status) == (C.INVALID_REQUEST, None, 422)


@pytest.mark.requirement("ER-44")
def test_an_sse_data_line_without_the_optional_space_is_read() -> None:
    """The SSE format makes the space after ``data:`` optional (servers built on
    Spring's SseEmitter write none): the error event is still found."""
    sse = 'event: error\ndata:{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    error = sm.classify((200, {"content-type": "text/event-stream"}, sse.encode()))
    assert (error.category, error.code) == (C.OVERLOADED, "overloaded_error")


@pytest.mark.requirement("ER-58")
def test_a_copied_body_cuts_each_string_to_max_body_string() -> None:
    """A body over the bounds is copied with each string cut to MAX_BODY_STRING
    characters, the short ones whole."""
    long_text = "Internal error while generating. " * 3000
    body = {"error": {"type": "api_error", "message": "Internal server error"}, "log": long_text}
    error = sm.classify((500, {}, body))
    assert error.body["log"] == long_text[:MAX_BODY_STRING]
    assert error.body["error"] == body["error"]


@pytest.mark.requirement("ER-58")
def test_a_copy_of_a_body_nested_too_deep_keeps_exactly_max_depth_levels() -> None:
    """JSON nested deeper than MAX_DEPTH (100, ER-58) is kept down to that depth, not
    one level less, and nothing below it."""
    error = sm.classify((400, None, nested_lists(150)))
    assert error.category is C.INVALID_REQUEST
    assert list_depth(error.body) == (100, None)


# -- what is kept as is, and what the copy keeps ---------------------------------------

MAX_DEPTH = 100
MAX_INT_BITS = 14_000


@pytest.mark.requirement("ER-58")
@pytest.mark.parametrize("shape", ["lists", "dicts"])
def test_a_body_exactly_max_depth_containers_deep_is_kept_as_is_one_more_is_copied(
    shape: str,
) -> None:
    """MAX_DEPTH (100) nested containers are JSON data within the bounds: the parsed
    body is kept as the same object. One more, and the copy keeps 100 levels."""
    build: Any = nested_lists if shape == "lists" else nested_dicts

    def depth_of(value: Any) -> int:
        return list_depth(value)[0] if shape == "lists" else dict_depth(value)

    within = build(MAX_DEPTH - 1)  # MAX_DEPTH containers, the root included
    assert sm.classify((400, None, within)).body is within
    beyond = build(MAX_DEPTH)
    kept = sm.classify((400, None, beyond)).body
    assert kept is not beyond
    assert depth_of(kept) == MAX_DEPTH  # 100 containers, None below the last


@pytest.mark.requirement("ER-58")
def test_an_int_of_max_int_bits_is_kept_and_a_longer_one_is_dropped() -> None:
    """An int of MAX_INT_BITS (14,000) bits is JSON data within the bounds; a longer
    one (its decimal text alone would be a hostile cost) becomes None in the copy,
    while the ints beside it are kept."""
    largest = (1 << MAX_INT_BITS) - 1
    body = {"error": {"message": "m"}, "n": largest}
    assert sm.classify((400, None, body)).body is body
    longer = {"error": {"message": "m"}, "n": largest + 1, "m": largest, "k": 7}
    kept = sm.classify((400, None, longer)).body
    assert kept == {"error": {"message": "m"}, "n": None, "m": largest, "k": 7}


@pytest.mark.requirement("ER-58")
def test_a_body_with_nan_or_infinity_keeps_none_there_and_the_rest() -> None:
    """json.loads reads NaN and Infinity; a snapshot cannot hold them, so the copy
    writes None in their place and keeps finite numbers and flags as they are."""
    raw = b'{"error": {"message": "m"}, "a": NaN, "b": Infinity, "c": 1.5, "d": true}'
    kept = sm.classify((400, None, raw)).body
    assert kept == {"error": {"message": "m"}, "a": None, "b": None, "c": 1.5, "d": True}
    assert type(kept["d"]) is bool and type(kept["c"]) is float


@pytest.mark.requirement("ER-58")
def test_the_copy_keeps_flags_as_flags_and_text_subclasses_as_text() -> None:
    """A body built by the host with a text enum and flags: copied (the enum is not
    plain JSON), the enum as its text, True and False as themselves (not 1 and 0)."""
    import enum

    class Kind(enum.StrEnum):
        OVERLOADED = "overloaded_error"

    body = {"error": {"type": Kind.OVERLOADED, "message": "m"}, "t": True, "f": False}
    error = sm.classify((200, None, body))
    assert error.category is C.OVERLOADED
    kept = error.body
    assert kept is not body
    assert type(kept["error"]["type"]) is str and kept["error"]["type"] == "overloaded_error"
    assert kept["t"] is True and kept["f"] is False


@pytest.mark.requirement("ER-58")
def test_the_copy_spends_one_budget_of_characters_across_strings() -> None:
    """Strings share MAX_BODY characters: 20 strings of MAX_BODY_STRING are cut to
    exactly MAX_BODY in all (16 whole, then empty ones)."""
    body = ["x" * MAX_BODY_STRING for _ in range(20)]
    kept = sm.classify((400, None, body)).body
    assert len(kept) == 20
    assert sum(len(s) for s in kept) == MAX_BODY
    assert [len(s) for s in kept[15:18]] == [MAX_BODY_STRING, 0, 0]


@pytest.mark.requirement("ER-58")
def test_the_copy_spends_its_character_budget_on_keys_too() -> None:
    """Keys count against MAX_BODY: of 17 keys of MAX_BODY_STRING characters, the
    first 16 fill the budget exactly and are kept (their values, numbers, cost no
    characters); the 17th is dropped."""
    body = {f"{i:04d}" + "k" * (MAX_BODY_STRING - 4): i for i in range(17)}
    kept = sm.classify((400, None, body)).body
    assert list(kept.values()) == list(range(16))


@pytest.mark.requirement("ER-58")
def test_the_copy_spends_one_budget_of_values_across_lists() -> None:
    """Two lists of 2,000 numbers: the copy holds MAX_BODY_VALUES values in all (the
    root, the two lists, then the first list's numbers), the second list empty."""
    body = [[0] * 2000, [1] * 2000]
    kept = sm.classify((400, None, body)).body
    assert [len(kept[0]), len(kept[1])] == [MAX_BODY_VALUES - 3, 0]


# -- how fields and shapes are read ----------------------------------------------------


@pytest.mark.requirement("ER-44")
def test_the_first_choice_and_the_first_candidate_decide() -> None:
    """n > 1 completions: only the first choice's finish reason (OpenAI) or the first
    candidate's (Gemini) is read."""
    filtered_last = {"choices": [{"finish_reason": "stop"}, {"finish_reason": "content_filter"}]}
    assert sm.classify((200, {}, filtered_last)).category is C.UNKNOWN
    filtered_first = {"choices": [{"finish_reason": "content_filter"}, {"finish_reason": "stop"}]}
    assert sm.classify((200, {}, filtered_first)).category is C.CONTENT_FILTERED
    blocked_last = {"candidates": [{"finishReason": "STOP"}, {"finishReason": "SAFETY"}]}
    assert sm.classify((200, {}, blocked_last)).category is C.UNKNOWN
    blocked_first = {"candidates": [{"finishReason": "SAFETY"}, {"finishReason": "STOP"}]}
    assert sm.classify((200, {}, blocked_first)).category is C.CONTENT_FILTERED


@pytest.mark.requirement("ER-40")
def test_an_anthropic_details_error_code_is_kept_only_without_a_code() -> None:
    """Anthropic's ``error.details.error_code`` names the error when ``error.code``
    does not; a code the error has wins."""
    body: dict[str, Any] = {"type": "error", "error": {"type": "invalid_request_error", "message": "m",
                                       "details": {"error_code": "invalid_tool_schema"}}}  # fmt: skip
    assert sm.classify((400, {}, body)).code == "invalid_tool_schema"
    body["error"]["code"] = "own_code"
    assert sm.classify((400, {}, body)).code == "own_code"


@pytest.mark.requirement("ER-40")
def test_a_numeric_status_field_is_no_vendor_name() -> None:
    """Gemini's ``status`` is a name ("RESOURCE_EXHAUSTED"); a server that echoes a
    number there names nothing: the code falls back as if it were absent."""
    body = {"error": {"code": 429, "message": "slow down", "status": 429}}
    assert sm.classify((429, {}, body)).code == "rate_limited"


@pytest.mark.requirement("ER-44")
def test_an_error_event_after_a_blank_head_of_max_body_bytes_is_found() -> None:
    """A stream padded with MAX_BODY bytes of blank keep-alive lines before its error
    event: the head is blank, the error is read from the tail."""
    body = b"\n" * MAX_BODY + b'data: {"type":"error","error":{"type":"overloaded_error"}}\n\n'
    error = sm.classify((200, {}, body))
    assert (error.category, error.code) == (C.OVERLOADED, "overloaded_error")


@pytest.mark.requirement("ER-58", "ER-44")
@pytest.mark.parametrize("as_bytes", [True, False])
def test_a_tail_that_starts_mid_line_drops_that_partial_line(as_bytes: bool) -> None:
    """The last MAX_BODY characters start inside a line that is not a ``data:`` line
    ("X" before it) but whose rest looks like one: that partial line is dropped, never
    read as an event. Starting on a line boundary, the same line is read."""
    event = 'data: {"type":"error","error":{"type":"rate_limit_error"}}'
    after = event + "\n" + "z" * (MAX_BODY - len(event) - 2) + "\n"
    assert len(after) == MAX_BODY  # the tail window starts exactly at the event
    head = "y" * MAX_BODY + "\n"
    for before, category in (("X", C.UNKNOWN), ("", C.RATE_LIMITED)):
        text = head + before + after
        body: Any = text.encode() if as_bytes else text
        assert sm.classify((200, {}, body)).category is category, repr(before)


@pytest.mark.requirement("ER-44")
def test_the_first_choice_decides_whatever_follows_it() -> None:
    """Only the first choice or candidate is looked at: what follows it (another
    choice, or something that is not one) changes nothing; an SDK reply likewise."""
    for body in (
        {"choices": [{"finish_reason": "content_filter"}, "not a choice"]},
        {"candidates": [{"finishReason": "SAFETY"}, None]},
    ):
        assert sm.classify((200, {}, body)).category is C.CONTENT_FILTERED

    class Choice:
        def __init__(self, finish_reason: str) -> None:
            self.finish_reason = finish_reason
            self.message = None

    class Reply:
        def __init__(self, *reasons: str) -> None:
            self.choices = [Choice(reason) for reason in reasons]

    assert sm.classify(Reply("content_filter", "stop")).category is C.CONTENT_FILTERED
    assert sm.classify(Reply("stop", "content_filter")).category is C.UNKNOWN


# -- input whose reading raises (ER-179): the two deleted statements no test noticed --------


class _Raising(Exception):
    """An SDK-like exception whose ``body`` cannot be read (a lazy property that fails)."""

    @property
    def body(self) -> Any:
        raise RuntimeError("body unreadable")


class _RaisingMapping(dict):  # type: ignore[type-arg]
    """A response dict (botocore's shape) whose every lookup fails."""

    def __getitem__(self, key: Any) -> Any:
        raise KeyError("no lookups")


class _RaisingFrame:
    def to_response_dict(self) -> Any:
        raise ValueError("frame truncated")


@pytest.mark.requirement("ER-43", "ER-179")
@pytest.mark.parametrize(
    ("given", "named"),
    [
        (_Raising("503 Service Unavailable"), "_Raising"),
        (_RaisingMapping(status_code=503, headers={}), "_RaisingMapping"),
        (_RaisingFrame(), "_RaisingFrame"),
    ],
)
def test_input_whose_reading_raises_is_an_unknown_error_naming_it(given: Any, named: str) -> None:
    """The last resort (statement #117 of the mutation run, deleted unnoticed): a body,
    a lookup or a conversion that raises gives an unknown ModelError naming the input's
    type and the failure, with or without a wall time, never None, never the exception."""
    for wall in (None, 1_000_000_000.0):
        error = sm.classify(given, wall=wall)
        assert isinstance(error, sm.ModelError)
        assert (error.category, error.code, error.body) == (C.UNKNOWN, None, None)
        assert error.message.startswith(f"unclassifiable {named}: ")
        assert "Error(" in error.message  # the failure's own repr is shown


@pytest.mark.requirement("ER-179")
def test_a_refusal_whose_model_dump_raises_keeps_its_repr_as_body() -> None:
    """A refusal reply whose ``model_dump`` fails (statement #290, deleted unnoticed)
    keeps its ``repr`` as the body, not nothing: a snapshot can still show what came."""

    class Refused:
        stop_reason = "refusal"

        def model_dump(self, **_: Any) -> Any:
            raise TypeError("not serialisable")

        def __repr__(self) -> str:
            return "Refused(id='msg_1')"

    error = sm.classify(Refused())
    assert (error.category, error.code, error.status) == (C.CONTENT_FILTERED, "refusal", 200)
    assert error.body == "Refused(id='msg_1')"


# -- a body's retry delay and Google's details, at their bounds (ER-176) --------------------

MAX_DETAILS = 16
MAX_RETRY_DELAY = 315_576_000_000


def _details_429(details: list[Any]) -> dict[str, Any]:
    return {"error": {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED",
                      "details": details}}  # fmt: skip


RETRY_26 = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "26s"}
KEY = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}
HELP = {"@type": "type.googleapis.com/google.rpc.Help", "links": []}


@pytest.mark.requirement("ER-176")
def test_the_sixteenth_detail_is_read_and_the_seventeenth_is_not() -> None:
    """Google's details are read in their first 16 entries: a RetryInfo or ErrorInfo at
    index 15 counts, one at index 16 does not."""
    at_edge = _details_429([HELP] * (MAX_DETAILS - 1) + [RETRY_26])
    assert sm.classify((429, {}, at_edge)).retry_after_seconds == 26.0
    past = _details_429([HELP] * MAX_DETAILS + [RETRY_26])
    assert sm.classify((429, {}, past)).retry_after_seconds is None
    key_at_edge = _details_429([HELP] * (MAX_DETAILS - 1) + [KEY])
    assert sm.classify((400, {}, key_at_edge)).category is C.AUTH_ERROR
    key_past = _details_429([HELP] * MAX_DETAILS + [KEY])
    assert sm.classify((400, {}, key_past)).category is C.INVALID_REQUEST


@pytest.mark.requirement("ER-176")
def test_a_retry_delay_at_the_largest_duration_is_kept_and_one_second_more_is_not() -> None:
    """The longest Duration (315,576,000,000 s) and nine decimals are a delay; one
    second more, or a tenth decimal, is none; twelve digits are the most read."""
    for raw, seconds in (
        (f"{MAX_RETRY_DELAY}s", float(MAX_RETRY_DELAY)),
        (f"{MAX_RETRY_DELAY}.999999999s", float(MAX_RETRY_DELAY) + 0.999999999),
        (f"{MAX_RETRY_DELAY + 1}s", None),
        ("1.0000000001s", None),
        ("0000000000007s", None),
        ("000000000007s", 7.0),
    ):
        delay = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": raw}
        assert sm.classify((429, {}, _details_429([delay]))).retry_after_seconds == seconds, raw


# -- an in-stream error read as the status its numeric code names (ER-243) -------------------


@pytest.mark.requirement("ER-243")
@pytest.mark.parametrize("status", [200, None])
def test_a_named_status_gives_the_code_its_rule_keeps_or_its_own(status: int | None) -> None:
    """An error event in a stream whose only name is its numeric ``error.code`` (as
    OpenRouter sends them) is read as a response of that status: the code is the one
    that status's rule keeps (``http_503`` for row 7, Google's ``ErrorInfo`` reason for
    row 6), or ``http_<that status>`` when no rule names it (row 9), never the stream's
    own status."""
    key = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID"}
    for body, expected in (
        ({"error": {"code": 503, "message": "upstream"}}, (C.OVERLOADED, "http_503")),
        ({"error": {"code": 418, "message": "upstream"}}, (C.UNKNOWN, "http_418")),
        ({"error": {"code": 400, "message": "m", "details": [key]}},
         (C.AUTH_ERROR, "API_KEY_INVALID")),
    ):  # fmt: skip
        error = sm.classify((status, {}, body))
        assert (error.category, error.code, error.status) == (*expected, status), body


@pytest.mark.requirement("ER-172")
def test_an_array_is_read_by_its_first_element_whatever_follows_it() -> None:
    """A JSON array whose first element is an object is read by that element, whatever
    the elements after it are; one whose first element is not an object is read by
    status, even when a later one is."""
    first = {"error": {"code": 400, "message": "The input token count (1200293) exceeds "
                       "the maximum number of tokens allowed (1048576).",
                       "status": "INVALID_ARGUMENT"}}  # fmt: skip
    error = sm.classify((400, {}, [first, "trailer"]))
    assert (error.category, error.code) == (C.CONTEXT_LENGTH_EXCEEDED, "INVALID_ARGUMENT")
    error = sm.classify((400, {}, ["leader", first]))
    assert (error.category, error.code) == (C.INVALID_REQUEST, None)
