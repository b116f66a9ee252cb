"""``classify``: turn what a real provider gives you into a ``ModelError``.

One boundary, as httpcore translates its errors at one place: every shape a provider
hands back on failure (an SDK exception, an ``httpx`` response, a ``(status, headers,
body)`` triple, botocore's errors and event-stream frames, a reply that is a refusal) is
read into a status, headers and a body, and the body into the few facts the rules read
(:class:`_Error`). :data:`_RULES` is ``specs/classification.md``'s table of rules, read
by one loop; what no rule takes is one of two special cases (:func:`_verdict`). A
vendor's new wording or code is a phrase or a name added to a rule's vocabulary, a new
kind of error a new rule.

Any body costs a bounded time (ER-58; the ``MAX_*`` bounds below). A delay the headers
or the body ask for is copied onto ``retry_after_seconds`` (``specs/retry-after.md``).
Nothing here raises: input that matches no shape is ``unknown``, carrying its ``repr``.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import reprlib
from collections import deque
from collections.abc import Callable, Collection, Container, Mapping
from typing import Any, Literal, NamedTuple

import attrs

from ..core._events import ModelFailed
from ..core._json_data import MAX_DEPTH, MAX_INT_BITS, finite, json_problem
from ..core._model_error import Headers, ModelError, to_headers
from ..core._retry_after import header_retry_after
from ..core._state_text import json_text
from ..core._taxonomy import ErrorCategory

_MAX_MESSAGE = 2000
"""Longest message kept from a body or an exception; logs do not need more."""

MAX_BODY = 65_536
"""Bytes (characters, for a str) of a body that classify reads: the first 64 KiB and,
of a longer body, the last 64 KiB too (a stream's error event is its last). Error
bodies are a few hundred bytes; the rest of a huge one is never looked at."""
MAX_SSE_LINES = 64
"""``data:`` lines of a server-sent-events body that classify parses as JSON (only
lines that mention ``error`` are tried), head and tail together."""
MAX_BODY_VALUES = 1024
"""Values (containers, strings, numbers...) of a body that classify keeps: a parsed
body with more, deeper than ``MAX_DEPTH`` or with more than ``MAX_BODY`` characters
of text is kept as a bounded copy (breadth first: the top-level fields come first)."""
MAX_BODY_STRING = 4096
"""Characters of one string a bounded copy keeps (so one huge string cannot starve
the fields next to it of the ``MAX_BODY`` characters)."""
MAX_DETAILS = 16
"""Entries of a Google ``error.details`` list read for its ``ErrorInfo`` reason and its
``RetryInfo`` delay (Gemini sends three or four)."""
MAX_RETRY_DELAY = 315_576_000_000
"""Seconds: the largest ``google.protobuf.Duration`` (10,000 years). A longer
``retryDelay`` is no Duration, so no delay."""
_DURATION = re.compile(r"([0-9]{1,12})(?:\.[0-9]{1,9})?s")
"""A ``google.protobuf.Duration`` in its JSON form: seconds, up to nine decimals, ``s``."""

# -- what the rules match: each vendor's words and names ----------------------------

_QUOTA_CODES = frozenset(
    {
        "insufficient_quota",
        "billing_error",
        "billing_hard_limit_reached",
        "exceeded_current_quota_error",  # Moonshot (403, 429)
        "Arrearage",  # DashScope (400): the account is in arrears
    }
)
"""Codes or types of a spent quota or balance: waiting does not refill an account."""
_CREDIT_PHRASES = (
    "credit balance is too low",  # Anthropic (400): "Your credit balance is too low ..."
    "used all available credits",  # xAI (429, 403): "Your team ... has either used all ..."
)
"""Said (any status) when the account has no credit left."""
_FILTER_CODES = frozenset(
    {
        "content_filter",
        "content_policy_violation",
        "refusal",
        "data_inspection_failed",  # DashScope's OpenAI-compatible code
        "DataInspectionFailed",  # DashScope's own
    }
)
_GEMINI_BLOCKS = frozenset(
    {"SAFETY", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY", "RECITATION"}
)
"""Gemini's ``finishReason`` / ``promptFeedback.blockReason`` values that mean its
filters stopped the reply (a 200 with no text, or with a cut candidate)."""
_STOPPED = frozenset({"refusal", "content_filter"}) | _GEMINI_BLOCKS
_FILTER_PHRASES = ("your input was flagged",)
"""Said (any status) when a moderation step refused the request (OpenRouter's 403:
"... requires moderation on ... Your input was flagged for ...")."""
_CONTEXT_STATUSES = frozenset({400, 413, 422, None, 200})
"""Where a context overflow is read by its code or its common wording: a bad request,
and an error event in a stream."""
_CONTEXT_CODES = frozenset(
    {"context_length_exceeded", "string_above_max_length", "exceed_context_size_error"}
)
_CONTEXT_PHRASES = (
    "prompt is too long",
    "context length",  # also OpenAI's and vLLM's "maximum context length"
    "context window",
    "context_length_exceeded",
    "exceed context limit",
    "exceeds the context",
    "too many tokens",
    "input is too long",
    "exceeds the available context size",  # llama.cpp server
    "exceeds the maximum number of tokens allowed",  # Gemini: "The input token count ..."
    "maximum model length",  # vLLM: "The decoder prompt (length N) is longer than the ..."
    "inputs must have less than",  # TGI: "`inputs` must have less than N tokens"
    "tokens + max_new_tokens must be",  # TGI: "`inputs` tokens + `max_new_tokens` must be <= N"
    "maximum prompt length",  # xAI: "This model's maximum prompt length is N but the ..."
    "exceeded model token limit",  # Moonshot: "Your request exceeded model token limit: N"
    "input token length too long",  # Moonshot's documented 400
    "range of input length should be",  # DashScope (Qwen): "... should be [1, 983616]"
    "input token count is",  # Vertex Gemini: "the input token count is N but model only ..."
)
"""Said (any casing, backticks ignored) by an error whose request does not fit the
model's context."""
_OUTPUT_LIMIT_PHRASES = ("max tokens must be",)
"""Said by an error about the output limit the request asked for, which a smaller
context does not fix (Cohere: "too many tokens: max tokens must be less than or equal
to 4096, the maximum output for this model"): it overrides the context phrases."""
_TOO_LARGE_PHRASES = (
    "request too large",  # OpenAI: "Request too large for gpt-4o ... on tokens per min"
    "must be reduced",  # OpenAI: "The input or output tokens must be reduced ..."
)
"""Said by a 429 for a request larger than the per-minute limit itself (ER-95), never by
an ordinary rate limit ("Rate limit reached ... Please try again")."""
_OVERFLOW_500_PHRASES = (
    "context size has been exceeded",  # llama.cpp server, the context full mid-way
    "exceeds the available context size",  # llama.cpp server, before it answered 400
    "longer than the maximum model length",  # vLLM's words behind Xinference's 500
)
"""Said by a 500 of a self-hosted server whose context overflowed (ER-171); fewer than
a 400's: a 500's wording is read only where a server is known to mean an overflow."""
_KEY_REASONS = frozenset({"API_KEY_INVALID"})
"""Gemini's ``google.rpc.ErrorInfo`` reasons for a key it refuses, sent with HTTP 400."""
_KEY_PHRASES = (
    "incorrect api key provided",  # xAI (400)
    "api key not valid",  # Gemini (400): "API key not valid. Please pass a valid API key."
    "api key expired",  # Gemini (400): "API key expired. Please renew the API key."
)
"""Said by a 400 whose API key is invalid or expired (ER-173)."""
_C = ErrorCategory
_BY_TYPE = {
    name: category
    for category, names in (
        (_C.RATE_LIMITED, "rate_limit_error rate_limit_exceeded requests tokens"),
        (_C.RATE_LIMITED, "throttlingexception"),
        (_C.OVERLOADED, "overloaded_error api_error server_error service_unavailable"),
        (_C.OVERLOADED, "timeout_error serviceunavailableexception internalserverexception"),
        (_C.OVERLOADED, "modeltimeoutexception"),
        (_C.AUTH_ERROR, "authentication_error permission_error invalid_api_key permission_denied"),
        (_C.INVALID_REQUEST, "invalid_request_error not_found_error request_too_large"),
        (_C.INVALID_REQUEST, "model_not_found validationexception"),
    )
    for name in names.split()
}
"""The category an error's type or code names, in lower case (rows 4 and 9): Bedrock's
event-stream ``throttlingException`` and its HTTP ``ThrottlingException`` are one name."""
_FRAME_KINDS = frozenset({"exception", "error"})
"""``:message-type`` values of an AWS event-stream frame that carries an error: its status
is the stream's (200), or botocore's ``to_response_dict`` marker (400), never the error's."""


def classify(obj: object, *, wall: float | None = None) -> ModelError:
    """Classify what a model provider gave you; never raises (but for a ``wall`` that
    is not a finite number: ``ValueError``).

    ``obj`` may be an exception of the official ``anthropic`` or ``openai`` SDK
    (any ``APIError``: status errors, in-stream errors, connection errors and
    timeouts), any other exception, an ``httpx``/``httpx2`` response (anything
    with ``status_code`` and ``headers``), a tuple ``(status, headers, body)``
    with the body as bytes, str or parsed JSON, botocore's ``ClientError`` (its
    ``EventStreamError`` too), an event-stream frame (``EventStreamMessage``) or its
    ``to_response_dict()``, an SDK reply whose stop or finish reason is a refusal or a
    content filter, a ``ModelFailed`` or a ``ModelError`` (returned as is). See
    ``specs/classification.md`` for the table.

    ``wall`` is the Unix time an HTTP-date ``retry-after`` is measured against (when
    the response has no usable ``date`` header); without it such a date stays in the
    headers and the engine measures it against the wall time of the step that takes
    the error (the session's, never this process's ``time.time``).
    """
    when = None if wall is None else _wall_time(wall)  # a caller's mistake: raised
    try:
        error = _classify(obj)
    except Exception as exc:  # the promise is "never raises": a last resort
        return ModelError(
            ErrorCategory.UNKNOWN,
            _clip(f"unclassifiable {type(obj).__name__}: {_safe_repr(obj)} ({_safe_repr(exc)})"),
            body=None,
        )
    if when is not None and error.retry_after_seconds is None and error.headers:
        waited = header_retry_after(error.headers, when)
        if waited is not None:
            error = attrs.evolve(error, retry_after_seconds=waited)
    return error


def _wall_time(wall: object) -> float:
    if isinstance(wall, bool) or not isinstance(wall, int | float) or not finite(wall):
        raise ValueError(f"wall: must be a finite Unix time in seconds, got {wall!r:.60}")
    return float(wall)


def _classify(obj: object) -> ModelError:
    if isinstance(obj, ModelError):
        return obj
    if isinstance(obj, ModelFailed):
        return obj.error
    if isinstance(obj, tuple):
        return _from_tuple(obj)
    if isinstance(obj, BaseException):
        return _from_exception(obj)
    to_response_dict = getattr(obj, "to_response_dict", None)
    if callable(to_response_dict):  # botocore's EventStreamMessage: one frame of a stream
        obj = to_response_dict()
    if isinstance(obj, Mapping) and "status_code" in obj and "headers" in obj:
        # botocore's response dict: {"status_code", "headers", "body"}
        return _from_tuple((obj["status_code"], obj["headers"], obj.get("body")))
    status = getattr(obj, "status_code", None)
    if isinstance(status, int) and hasattr(obj, "headers"):
        return _from_response(obj, status)
    refusal = _refusal_of_reply(obj)
    if refusal is not None:
        return refusal
    return ModelError(
        ErrorCategory.UNKNOWN, _clip(f"not a provider error: {_safe_repr(obj)}"), body=None
    )


# -- the input shapes -------------------------------------------------------------


def _from_tuple(obj: tuple[Any, ...]) -> ModelError:
    if len(obj) != 3:
        return ModelError(
            ErrorCategory.UNKNOWN,
            _clip(f"expected (status, headers, body), got a {len(obj)}-tuple: {_safe_repr(obj)}"),
            body=None,
        )
    status, headers, body = obj
    if isinstance(status, bool) or not isinstance(status, int):
        status = None
    return _from_parts(status, _headers(headers), _parse_body(body), None)


def _from_response(response: Any, status: int) -> ModelError:
    try:
        body = response.content
    except Exception:  # a streamed response not read yet: classify by status
        body = None
    return _from_parts(
        status, _headers(getattr(response, "headers", None)), _parse_body(body), None
    )


def _from_exception(exc: BaseException) -> ModelError:
    names = {cls.__name__ for cls in type(exc).__mro__}
    message = _exception_message(exc)
    if "ContentFilterFinishReasonError" in names:
        return ModelError(
            ErrorCategory.CONTENT_FILTERED,
            message,
            code="content_filter",
            body=_bounded(getattr(exc, "body", None)),
        )
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    response_status = getattr(response, "status_code", None)
    if status is None and isinstance(response_status, int) and hasattr(response, "headers"):
        # httpx.HTTPStatusError (raise_for_status()): the response tells it all
        return _from_response(response, response_status)
    if isinstance(status, int) and not isinstance(status, bool):
        headers = _headers(getattr(response, "headers", None))
        return _from_parts(status, headers, _parse_body(getattr(exc, "body", None)), message)
    if isinstance(response, Mapping) and isinstance(response.get("Error"), Mapping):
        return _from_aws(response, message)
    if is_timeout(exc, names):
        return ModelError(ErrorCategory.OVERLOADED, message, code="timeout")
    if _is_connection_error(exc, names):
        return ModelError(ErrorCategory.OVERLOADED, message, code="connection_error")
    body = getattr(exc, "body", None)
    if body is not None:  # an SDK APIError without a status: an error event in a stream
        return _from_parts(None, None, _parse_body(body), message)
    return ModelError(ErrorCategory.UNKNOWN, message, code=type(exc).__name__, body=None)


def _from_aws(response: Mapping[str, Any], message: str) -> ModelError:
    """botocore's ``ClientError`` (``EventStreamError`` too) by its parsed ``response``:
    ``{"Error": {"Code", "Message"}, "ResponseMetadata": {"HTTPStatusCode",
    "HTTPHeaders"}}``. A stream's exception frame has no metadata: its ``Code`` is the
    frame's ``:exception-type`` and decides, as an error event's type does."""
    meta = response.get("ResponseMetadata")
    if not isinstance(meta, Mapping):
        meta = {}
    status = meta.get("HTTPStatusCode")
    if isinstance(status, bool) or not isinstance(status, int):
        status = None
    return _from_parts(status, _headers(meta.get("HTTPHeaders")), response, message)


def is_timeout(exc: BaseException, names: set[str]) -> bool:
    return isinstance(exc, TimeoutError) or any(
        name in names for name in ("APITimeoutError", "TimeoutException", "Timeout", "ReadTimeout")
    )


def _is_connection_error(exc: BaseException, names: set[str]) -> bool:
    return isinstance(exc, ConnectionError) or any(
        name in names
        for name in ("APIConnectionError", "TransportError", "NetworkError", "RemoteProtocolError")
    )


def _exception_message(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    if not isinstance(message, str) or not message:
        message = str(exc) or type(exc).__name__
    return _clip(message)


def plain_data(obj: object) -> Any:
    """An SDK model as plain JSON data (so a snapshot can hold it), else itself."""
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json")
        except Exception:
            return repr(obj)
    return obj


def _refusal_of_reply(obj: object) -> ModelError | None:
    """An SDK reply that is itself a refusal: Anthropic ``stop_reason``, OpenAI
    ``finish_reason`` / ``message.refusal``. The body is kept as plain JSON."""
    said = _refusal_said(obj)
    if said is None:
        return None
    message, code = said
    return refused(message, code, _bounded(plain_data(obj)))


def refused(message: str, code: str, body: Any) -> ModelError:
    """The error of a reply that is a refusal or that a content filter stopped: its
    HTTP call succeeded (200), but the turn must end ``content_filtered``."""
    return ModelError(ErrorCategory.CONTENT_FILTERED, message, code=code, status=200, body=body)


def _refusal_said(obj: object) -> tuple[str, str] | None:
    """(message, code) of a reply that is a refusal, else ``None``."""
    if getattr(obj, "stop_reason", None) == "refusal":
        return "the model refused", "refusal"
    choices = getattr(obj, "choices", None)
    if not isinstance(choices, list | tuple) or not choices:
        return None
    choice = choices[0]
    if getattr(choice, "finish_reason", None) == "content_filter":
        return "the reply was stopped by the content filter", "content_filter"
    refusal = getattr(getattr(choice, "message", None), "refusal", None)
    if isinstance(refusal, str) and refusal:
        return _clip(refusal), "refusal"
    return None


# -- the rules ----------------------------------------------------------------------


class _Error(NamedTuple):
    """What classify reads of one error, from its body (:func:`_error_fields`), any
    vendor, and its headers; the rules read the first five."""

    code: str | None = None
    """The vendor's code: ``error.code`` as text, Gemini's ``status``, Anthropic's
    ``details.error_code``."""
    etype: str | None = None
    """The error's type: the body's (botocore's ``Error.Code`` too), else an AWS header's."""
    said: str = ""
    """What the server says in text, lower case and without backticks; ``""`` when it
    says nothing in text (a validator's problem list may echo the request: never read)."""
    finish: str | None = None
    """The stop or finish reason of a reply, or Gemini's block reason."""
    reason: str | None = None
    """Google's ``ErrorInfo.reason`` (``API_KEY_INVALID``)."""
    message: str | None = None
    """What the server says, when it says it in text."""
    problems: Any = None
    """A ``message`` or ``detail`` that is an object or a list (a validator's problems:
    FastAPI's 422, Mistral's), shown but never read."""
    delay: float | None = None
    """Google's ``RetryInfo.retryDelay``, else a numeric ``retry_after`` (Replicate's),
    in seconds."""
    status: int | None = None
    """An HTTP error status the body names as its numeric ``error.code`` (400-599)."""


def _names(error: _Error, rule: _Rule) -> str | None:
    """The error's code, else its type, when it is one of the rule's names."""
    if error.code in rule.of:
        return error.code
    return error.etype if error.etype in rule.of else None


def _says(error: _Error, rule: _Rule) -> str | None:
    """The first of the rule's phrases the error says, unless it says one of ``unless``."""
    said = error.said
    for phrase in rule.of:
        if phrase in said:
            return None if any(word in said for word in rule.unless) else phrase
    return None


def _finishes(error: _Error, rule: _Rule) -> str | None:
    """The reply's stop, finish or block reason, when it is one of the rule's."""
    return error.finish if error.finish in rule.of else None


def _reason(error: _Error, rule: _Rule) -> str | None:
    """Google's ``ErrorInfo`` reason, when it is one of the rule's."""
    return error.reason if error.reason in rule.of else None


class _ServerErrors:
    """Every status from 500 up, but 501 (Not Implemented: a retry changes nothing)."""

    def __contains__(self, status: object) -> bool:
        return isinstance(status, int) and status >= 500 and status != 501


_Verdict = tuple[ErrorCategory, str | None]
"""A category and the code kept."""
_HTTP_STATUS = "http_<status>"
"""A rule's ``otherwise`` that stands for ``http_`` and the status (``http_503``)."""


@attrs.frozen
class _Rule:
    """A row of ``specs/classification.md``'s table of rules."""

    id: str
    """The row's id there (``3c``); its number is the mapping's row."""
    category: ErrorCategory
    statuses: Container[int | None] | None = None
    """The statuses it applies to (``None`` among them: an error event in a stream, an
    exception with no status); ``None``: every status."""
    when: Callable[[_Error, _Rule], str | None] | None = None
    """What it matches, and so what it returns: one of its names or phrases (``of``)
    the error has; ``None``: the status alone decides."""
    of: Collection[str] = ()
    unless: tuple[str, ...] = ()
    """Phrases that veto a match of ``_says``."""
    keeps: Literal["vendor", "match", "nothing"] = "vendor"
    """The code kept: the vendor's name for the error (its code, else its type), the
    name or reason that matched, or nothing but ``otherwise``."""
    otherwise: str | None = None
    """The code when what it keeps is ``None``."""
    before_type: bool = False
    """Read, for the status an in-stream error's numeric code names, before the event's
    own type (row 4)."""

    def gives(self, error: _Error, matched: str | None, status: int | None) -> _Verdict:
        """The category and the code of an error this rule matched."""
        if self.keeps == "vendor":
            code = error.code or error.etype
        else:
            code = matched if self.keeps == "match" else None
        if code is None and self.otherwise is _HTTP_STATUS:
            return self.category, f"http_{status}"
        return self.category, code or self.otherwise


_RULES = (
    # row 1: a spent quota or balance is never retried, whatever the status (ER-41)
    _Rule("1a", _C.UNKNOWN, when=_names, of=_QUOTA_CODES),
    _Rule("1b", _C.UNKNOWN, statuses={402}, otherwise="payment_required"),
    _Rule("1c", _C.UNKNOWN, when=_says, of=_CREDIT_PHRASES, keeps="nothing",
          otherwise="payment_required"),  # ER-174
    # row 2: a refusal or a content filter, whatever the status (ER-242)
    _Rule("2a", _C.CONTENT_FILTERED, when=_names, of=_FILTER_CODES, keeps="match"),
    _Rule("2b", _C.CONTENT_FILTERED, when=_finishes, of=_STOPPED, keeps="match"),
    _Rule("2c", _C.CONTENT_FILTERED, when=_says, of=_FILTER_PHRASES, otherwise="content_filter"),
    # row 3: a request that does not fit; only a smaller one helps (ER-170, ER-240)
    _Rule("3a", _C.CONTEXT_LENGTH_EXCEEDED, statuses=_CONTEXT_STATUSES, when=_names,
          of=_CONTEXT_CODES),
    _Rule("3b", _C.CONTEXT_LENGTH_EXCEEDED, statuses=_CONTEXT_STATUSES, when=_says,
          of=_CONTEXT_PHRASES, unless=_OUTPUT_LIMIT_PHRASES),
    _Rule("3c", _C.CONTEXT_LENGTH_EXCEEDED, statuses={429}, when=_says, of=_TOO_LARGE_PHRASES,
          before_type=True),  # ER-95
    _Rule("3d", _C.CONTEXT_LENGTH_EXCEEDED, statuses={500}, when=_says,
          of=_OVERFLOW_500_PHRASES, before_type=True),  # ER-171
    # (row 4, an error event in a stream, is the first special case: _verdict)
    _Rule("5", _C.RATE_LIMITED, statuses={429}, otherwise="rate_limited"),
    # row 6: the key (ER-173)
    _Rule("6a", _C.AUTH_ERROR, statuses={400, 401, 403}, when=_reason, of=_KEY_REASONS,
          keeps="match"),
    _Rule("6b", _C.AUTH_ERROR, statuses={401, 403}),
    _Rule("6c", _C.AUTH_ERROR, statuses={400}, when=_says, of=_KEY_PHRASES),
    # row 7: the server's trouble, worth a retry
    _Rule("7a", _C.OVERLOADED, statuses={408, 409}, otherwise=_HTTP_STATUS),
    _Rule("7b", _C.OVERLOADED, statuses=_ServerErrors(), otherwise=_HTTP_STATUS),
    _Rule("8", _C.INVALID_REQUEST, statuses={400, 404, 413, 422}),
    # (row 9, any other status, is the second special case: by type, else unknown)
)  # fmt: skip
"""``specs/classification.md``'s table of rules, in order: the first that matches decides."""


def _first_rule(error: _Error, status: int | None) -> tuple[_Rule, str | None] | None:
    """The first rule that matches an error of ``status``, and what it matched."""
    for rule in _RULES:
        if rule.statuses is not None and status not in rule.statuses:
            continue
        if rule.when is None:
            return rule, None
        matched = rule.when(error, rule)
        if matched is not None:
            return rule, matched
    return None


def _verdict(error: _Error, status: int | None, echo: int | None) -> _Verdict:
    """The category and code of an error of ``status``: the first rule that matches,
    else an error event in a stream (row 4) or an error no rule names (row 9).

    ``echo`` is the HTTP error status an in-stream error names as its numeric code.
    """
    found = _first_rule(error, status)
    if found is not None:
        return found[0].gives(error, found[1], status)
    by_type = _by_type(error)
    vendor = error.code or error.etype
    if status is None or 200 <= status < 400:
        # an error event inside a (streamed) response: its type decides, else the status
        # its code names (OpenRouter), whose overflow wording comes before the type
        # (llama.cpp's 500 in a stream it began)
        if echo is None:
            return by_type, vendor
        found = _first_rule(error, echo)
        if found is not None and (by_type is ErrorCategory.UNKNOWN or found[0].before_type):
            return found[0].gives(error, found[1], echo)
        status = echo
    if by_type is not ErrorCategory.UNKNOWN:
        return by_type, vendor
    return ErrorCategory.UNKNOWN, vendor or f"http_{status}"


def _by_type(error: _Error) -> ErrorCategory:
    for name in (error.code, error.etype):
        if name is not None:
            category = _BY_TYPE.get(name.lower())
            if category is not None:
                return category
    return ErrorCategory.UNKNOWN


def _from_parts(
    status: int | None, headers: Headers | None, body: Any, fallback_message: str | None
) -> ModelError:
    error = _error_fields(body)
    etype, echo = error.etype, error.status
    if headers:
        etype = etype or _header_type(headers)
        if headers.get(":message-type") in _FRAME_KINDS:
            status = echo = None  # a frame's error is an event in the stream: its type decides
    text = error.message or fallback_message
    if text:
        message = _clip(text)
    elif error.problems is not None:
        message = _clip(json_text(_bounded(error.problems)))
    else:
        message = f"HTTP {status}" if status else ""
    said = message.lower().replace("`", "") if text else ""
    error = error._replace(etype=etype, said=said)
    category, code = _verdict(error, status, echo)
    # a delay, else the body's own; a date waits for a wall time (classify's, or the step's)
    waited = header_retry_after(headers, None) if headers else None
    return ModelError(
        category,
        message,
        retry_after_seconds=error.delay if waited is None else waited,
        headers=headers,
        code=code,
        status=status,
        body=_bounded(body),
    )


def _header_type(headers: Headers) -> str | None:
    """The error's type where AWS puts it in the headers: an event-stream frame's
    ``:exception-type`` (or ``:error-code``), an HTTP response's ``x-amzn-errortype``
    (``ThrottlingException:http://internal.amazon.com/...``: the part before ``:``)."""
    for name in (":exception-type", ":error-code"):
        if name in headers:
            return headers[name] or None
    if "x-amzn-errortype" in headers:
        return headers["x-amzn-errortype"].partition(":")[0] or None
    return None


# -- reading a body -----------------------------------------------------------------


_NO_FIELDS = _Error()


def _error_fields(body: Any) -> _Error:
    """The error's fields, from a body of any vendor.

    Anthropic: ``{"type": "error", "error": {"type", "message", "details":
    {"error_code"}}}``; OpenAI: ``{"error": {"message", "type", "code"}}`` (its SDK
    keeps only the inner object as ``exc.body``); Google: ``{"error": {"code",
    "message", "status", "details": [...]}}``, Vertex's wrapped in a list; FastAPI:
    ``{"detail": ...}``; botocore: ``{"Error": {"Code", "Message"}}``; a bare string is
    the message.
    """
    if isinstance(body, str):
        return _Error(message=body)
    if isinstance(body, list | tuple) and body and isinstance(body[0], Mapping):
        body = body[0]  # Vertex: [{"error": {...}}]
    if not isinstance(body, Mapping):
        return _NO_FIELDS
    inner = body.get("error")
    if isinstance(inner, str):  # {"error": "message"} (some gateways, xAI, TGI)
        return _Error(message=inner, delay=_retry_after_field(body))
    if inner is None and isinstance(body.get("Error"), Mapping):  # botocore
        aws = body["Error"]
        return _Error(etype=_str(aws.get("Code")), message=_str(aws.get("Message")))
    err: Mapping[str, Any] = inner if isinstance(inner, Mapping) else body
    etype = _str(err.get("type"))
    code, status = _code_of(err)
    details = err.get("details")
    if code is None and isinstance(details, Mapping):
        code = _str(details.get("error_code"))  # Anthropic's
    reason, delay = _google_details(details)
    if delay is None:
        delay = _retry_after_field(err, body)
    raw_message, detail = err.get("message"), body.get("detail")
    return _Error(
        etype=None if etype == "error" else etype,  # the Anthropic envelope, no inner object
        code=code,
        message=_str(raw_message) or _str(detail),  # a detail: FastAPI's, Mistral's 401
        problems=next(
            (raw for raw in (raw_message, detail) if isinstance(raw, Mapping | list) and raw),
            None,
        ),
        finish=_stop_reason(body),
        reason=reason,
        delay=delay,
        status=status,
    )


def _code_of(err: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """The error's code as text, and the HTTP error status it names when it is a number
    (the one echoed by Gemini, vLLM, llama.cpp): a number names no vendor's error, so
    the code is then Gemini's ``status`` ("RESOURCE_EXHAUSTED"), else none."""
    raw = err.get("code")
    if isinstance(raw, bool) or not isinstance(raw, int):
        return _str(raw), None
    named = err.get("status")
    return (_str(named) if isinstance(named, str) else None), (raw if 400 <= raw <= 599 else None)


def _stop_reason(body: Mapping[str, Any]) -> str | None:
    """A reply's stop reason (Anthropic's, also a stream's ``delta``), else its finish
    or block reason."""
    delta = body.get("delta")
    return (
        _str(body.get("stop_reason"))
        or (_str(delta.get("stop_reason")) if isinstance(delta, Mapping) else None)
        or _finish_reason(body)
    )


def _google_details(details: Any) -> tuple[str | None, float | None]:
    """(``ErrorInfo.reason``, ``RetryInfo.retryDelay`` in seconds) of a Google
    ``error.details`` list, read in its first :data:`MAX_DETAILS` entries."""
    reason = delay = None
    if isinstance(details, list | tuple):
        for item in itertools.islice(details, MAX_DETAILS):
            kind = item.get("@type") if isinstance(item, Mapping) else None
            if not isinstance(kind, str):
                continue
            if kind.endswith("google.rpc.ErrorInfo"):
                reason = reason or _str(item.get("reason"))
            elif kind.endswith("google.rpc.RetryInfo") and delay is None:
                delay = _duration(item.get("retryDelay"))
    return reason, delay


def _duration(raw: Any) -> float | None:
    """Seconds of a ``google.protobuf.Duration`` in its JSON form (``"26s"``,
    ``"0.5s"``), or ``None`` for anything else: a sign, an exponent, ``inf`` or more
    than :data:`MAX_RETRY_DELAY` seconds is no Duration."""
    if not isinstance(raw, str):
        return None
    found = _DURATION.fullmatch(raw)
    if found is None or int(found[1]) > MAX_RETRY_DELAY:
        return None
    return float(raw[:-1])


def _retry_after_field(*places: Mapping[str, Any]) -> float | None:
    """The first usable ``retry_after`` of ``places`` (the error object, then the body)
    as seconds: a finite JSON number from 0 to :data:`MAX_RETRY_DELAY` (a string, a
    bool, a negative or a longer delay is no delay)."""
    for place in places:
        raw = place.get("retry_after")
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            continue
        try:
            seconds = float(raw)
        except OverflowError:
            continue
        if 0.0 <= seconds <= MAX_RETRY_DELAY:  # NaN fails both
            return seconds + 0.0
    return None


def _finish_reason(body: Mapping[str, Any]) -> str | None:
    choices = body.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], Mapping):
        return _str(choices[0].get("finish_reason"))
    feedback = body.get("promptFeedback")  # Gemini: the prompt itself was blocked
    if isinstance(feedback, Mapping):
        blocked = _str(feedback.get("blockReason"))
        if blocked in _GEMINI_BLOCKS:
            return blocked
    candidates = body.get("candidates")  # Gemini: a candidate the filters stopped
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], Mapping):
        return _str(candidates[0].get("finishReason"))  # "STOP" stops nothing here
    return None


def _str(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, int):
        return str(value)
    return None


def _parse_body(body: Any) -> Any:
    """Bytes and str become parsed JSON when they hold JSON (or an SSE ``error``
    event's data); otherwise text (JSON too deep to parse too). Parsed JSON is kept as
    is. A body longer than :data:`MAX_BODY` is never parsed whole: it is read for its
    SSE error event, else kept as the text of its head."""
    if isinstance(body, bytes | bytearray | memoryview):
        head, tail = _byte_parts(body)
    elif isinstance(body, str):
        head, tail = _text_parts(body)
    else:
        return body
    text = head.strip()
    if tail is None:
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            pass
    event = _sse_error(head, tail)
    if event is not None:
        return event
    return text or None


def _byte_parts(body: bytes | bytearray | memoryview) -> tuple[str, str | None]:
    """The decoded head of ``body`` and, when it is longer than :data:`MAX_BODY`, its
    decoded tail from the first whole line (invalid UTF-8 is replaced)."""
    try:
        raw = memoryview(body).cast("B")  # a flat view of bytes, whatever the shape
    except TypeError:  # not contiguous: copy it (no network body is shaped so)
        raw = memoryview(memoryview(body).tobytes())
    head = raw[:MAX_BODY].tobytes().decode("utf-8", errors="replace")
    if len(raw) <= MAX_BODY:
        return head, None
    start = len(raw) - MAX_BODY
    tail = raw[start:].tobytes()
    if raw[start - 1] != 0x0A:  # starts mid-line: that line is not whole
        tail = tail.partition(b"\n")[2]
    return head, tail.decode("utf-8", errors="replace")


def _text_parts(body: str) -> tuple[str, str | None]:
    head = body[:MAX_BODY]
    if len(body) <= MAX_BODY:
        return head, None
    start = len(body) - MAX_BODY
    tail = body[start:]
    if body[start - 1] != "\n":
        tail = tail.partition("\n")[2]
    return head, tail


def _sse_error(head: str, tail: str | None) -> Mapping[str, Any] | None:
    """The first ``error`` event's data among the ``data:`` lines of head then tail,
    or the first event that ends the stream as a refusal or a content filter
    (Anthropic ``message_delta`` with ``stop_reason: "refusal"``, an OpenAI chunk
    with ``finish_reason: "content_filter"``)."""
    tried = 0
    for part in (head, tail or ""):
        for line in part.splitlines():
            if not line.startswith("data:") or not any(
                word in line for word in ("error", "refusal", "content_filter")
            ):
                continue
            if tried == MAX_SSE_LINES:
                return None
            tried += 1
            try:
                data = json.loads(line[5:].strip())
            except (ValueError, RecursionError):
                continue
            if isinstance(data, Mapping) and ("error" in data or _is_refusal_event(data)):
                return data
    return None


def _is_refusal_event(data: Mapping[str, Any]) -> bool:
    delta = data.get("delta")
    if isinstance(delta, Mapping) and delta.get("stop_reason") == "refusal":
        return True
    return _finish_reason(data) == "content_filter"


# -- keeping a bounded body ------------------------------------------------------------


def _bounded(body: Any) -> Any:
    """``body`` itself when it is JSON data within the bounds (:data:`MAX_BODY_VALUES`
    values, :data:`MAX_DEPTH` levels, :data:`MAX_BODY` characters of text), else a
    bounded copy: the first values breadth first, strings cut to
    :data:`MAX_BODY_STRING`, what is not JSON data (or too deep) ``None``, non-str keys
    dropped. So a hostile body costs a bounded walk, never a walk of all of it."""
    if _within(body):
        return body
    return _copy(body)


def _within(root: Any) -> bool:
    values = chars = 0
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        value, depth = stack.pop()
        values += 1
        if values > MAX_BODY_VALUES:
            return False
        kind = type(value)
        if kind is str:
            chars += len(value)
        elif kind is dict or kind is list or kind is tuple:
            if depth >= MAX_DEPTH or len(value) > MAX_BODY_VALUES:
                return False
            if kind is dict:
                for key, item in value.items():
                    if type(key) is not str:
                        return False
                    chars += len(key)
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)
        elif json_problem(value, strict=True) is not None:  # a number, a bool, None, or not data
            return False
        if chars > MAX_BODY:
            return False
    return True


def _copy(root: Any) -> Any:
    left = MAX_BODY_VALUES - 1  # values that may still be queued (the root is one)
    chars = MAX_BODY
    holder: list[Any] = [None]
    queue: deque[tuple[Any, Any, Any, int]] = deque([(root, holder, 0, 0)])
    pop, push = queue.popleft, queue.append
    while queue:
        value, parent, slot, depth = pop()
        kind = type(value)
        copied: Any = None
        if kind is str or (kind is not bool and isinstance(value, str)):
            copied = str(value[: min(chars, MAX_BODY_STRING)])
            chars -= len(copied)
        elif value is None or kind is bool:
            copied = value
        elif isinstance(value, int):
            copied = int(value) if value.bit_length() <= MAX_INT_BITS else None
        elif isinstance(value, float):
            copied = float(value) if math.isfinite(value) else None
        elif depth >= MAX_DEPTH:
            pass
        elif kind is list or kind is tuple or isinstance(value, list | tuple):
            items = list(itertools.islice(value, left))
            left -= len(items)
            copied = [None] * len(items)
            for i, item in enumerate(items):
                push((item, copied, i, depth + 1))
        elif isinstance(value, Mapping):
            copied = {}
            for key, item in itertools.islice(value.items(), left):
                left -= 1
                if type(key) is str and len(key) <= chars:
                    chars -= len(key)
                    copied[key] = None
                    push((item, copied, key, depth + 1))
        parent[slot] = copied
    return holder[0]


def _headers(raw: Any) -> Headers | None:
    try:
        return to_headers(raw)
    except Exception:  # unusable headers are dropped, not raised
        return None


class _ShortRepr(reprlib.Repr):
    """``repr`` cut short, never a walk of a huge value (bytes included)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxstring = self.maxother = self.maxlong = 200
        self.maxtuple = self.maxlist = self.maxdict = self.maxset = 8

    def repr_bytes(self, obj: bytes, _level: int) -> str:
        text = repr(obj[: self.maxstring])
        return text if len(obj) <= self.maxstring else text + "..."

    def repr_bytearray(self, obj: bytearray, level: int) -> str:
        return f"bytearray({self.repr_bytes(bytes(obj[: self.maxstring + 1]), level)})"


_SHORT_REPR = _ShortRepr()


def _safe_repr(obj: object) -> str:
    """A short ``repr`` of anything; never raises."""
    try:
        return _SHORT_REPR.repr(obj)
    except Exception:
        return f"<{type(obj).__name__} object>"


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"
