"""The ready-made providers report a ``Usage`` (and the priced cost) from every
response they see: replies, content-filtered and refused replies, and streams that
broke after the usage was reported.

The real ``anthropic`` and ``openai`` clients talk to the loopback server of
``tests/servers/fake_llm.py``; the providers' ``complete`` is called directly (and
through ``arun_turn`` for the session-level spend).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import anthropic
import attrs
import openai
import pytest

import statemachine as sm
from statemachine.providers import (
    AnthropicModel,
    AsyncAnthropicModel,
    AsyncOpenAIModel,
    OpenAIModel,
)

from .servers.fake_llm import (
    ANTHROPIC,
    OPENAI,
    Canned,
    FakeLLM,
    anthropic_error,
    anthropic_message,
    anthropic_stream,
    openai_completion,
    openai_error,
)

PRICE = (3.0, 15.0)
"""USD per million input and output tokens."""


def _priced(tokens_in: int, tokens_out: int) -> float:
    return tokens_in * PRICE[0] / 1e6 + tokens_out * PRICE[1] / 1e6


@pytest.fixture
def server() -> Iterator[FakeLLM]:
    with FakeLLM() as fake:
        yield fake


def _went(server: FakeLLM, provider: str, *, streamed: bool = False) -> dict[str, Any]:
    """The fields of a ``Usage`` that say where a call to ``server`` went."""
    url = urlsplit(server.url)
    return {
        "provider_name": provider,
        "server_address": url.hostname,
        "server_port": url.port,
        "streamed": streamed,
    }


def _call(model: str | None = "m-requested") -> sm.CallModel:
    return sm.CallModel({"messages": [{"role": "user", "content": "hi"}]}, 0, model)


def _anthropic(server: FakeLLM) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="test", max_retries=0)


def _async_anthropic(server: FakeLLM) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0)


def _openai(server: FakeLLM) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0)


def _async_openai(server: FakeLLM) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0)


def _async_complete(make: Any, server: FakeLLM, **kwargs: Any) -> Any:
    """``complete(_call())`` of the async provider ``make(client, **kwargs)``, run on a
    fresh client of the loopback server."""
    connect = _async_anthropic if make is AsyncAnthropicModel else _async_openai

    async def run() -> sm.ModelReplied | sm.ModelFailed:
        async with connect(server) as client:
            return await make(client, **kwargs).complete(_call())

    return asyncio.run(run())


# -- wire bodies ------------------------------------------------------------------------


def _anthropic_reply(stop_reason: str = "end_turn", **usage: Any) -> Canned:
    canned = anthropic_message("the answer", stop_reason=stop_reason)
    canned.body.update(id="msg_served", model="claude-served")
    canned.body["usage"] = usage
    return canned


def _openai_reply(finish_reason: str = "stop", usage: Any = None) -> Canned:
    canned = openai_completion("the answer", finish_reason=finish_reason)
    canned.body.update(id="chatcmpl-served", model="gpt-served")
    canned.body["usage"] = usage
    return canned


def _message_start(**usage: Any) -> tuple[str, dict[str, Any]]:
    return (
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": "msg_stream",
                "type": "message",
                "role": "assistant",
                "model": "claude-served",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            },
        },
    )


_BLOCK_START = (
    "content_block_start",
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
)


def _text_delta(text: str) -> tuple[str, dict[str, Any]]:
    return (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
    )


_OVERLOADED = (
    "error",
    {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
)


def _chunk(delta: dict[str, Any] | None, usage: Any = None, finish: str | None = None) -> str:
    """One ``chat.completion.chunk`` as an SSE line: ``delta`` None is the usage-only
    chunk (no choices) that ``include_usage`` streams end with."""
    choices = (
        []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    )
    body = {
        "id": "chatcmpl-stream",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "gpt-served",
        "choices": choices,
        "usage": usage,
    }
    return f"data: {json.dumps(body)}\n\n"


def _openai_chunks(*chunks: str, done: bool = False, cut: bool = False) -> Canned:
    text = "".join(chunks) + ("data: [DONE]\n\n" if done else "")
    return Canned(200, text.encode(), content_type="text/event-stream", cut=cut)


def _openai_usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


# -- successful replies -------------------------------------------------------------------


_ANTHROPIC_USAGE = {
    "input_tokens": 1000,
    "output_tokens": 50,
    "cache_read_input_tokens": 300,
    "cache_creation_input_tokens": 200,
}
_ANTHROPIC_FILLED = sm.Usage(
    input_tokens=1500,  # 1000 uncached + 300 read from the cache + 200 written to it
    output_tokens=50,
    cached_tokens=300,
    cost_usd=_priced(1500, 50),
    model="claude-served",
    response_id="msg_served",
    finish_reason="end_turn",
    cache_creation_tokens=200,
)


@pytest.mark.requirement("ER-143", "ER-88", "ER-52")
def test_anthropic_reply_fills_every_usage_field(server: FakeLLM) -> None:
    """A sync Anthropic reply gives a Usage with every field, the prompt counted whole."""
    server.script(ANTHROPIC, _anthropic_reply(**_ANTHROPIC_USAGE))
    with _anthropic(server) as client:
        event = AnthropicModel(client, price_per_mtok=PRICE).complete(_call())
    assert isinstance(event, sm.ModelReplied)
    assert event.usage == attrs.evolve(_ANTHROPIC_FILLED, **_went(server, "anthropic"))
    assert event.cost == pytest.approx(0.00525)
    assert event.reply["usage"]["input_tokens"] == 1000  # the reply is kept as it came


@pytest.mark.requirement("ER-143", "ER-88", "ER-52")
def test_async_anthropic_reply_and_stream_fill_every_usage_field(server: FakeLLM) -> None:
    """AsyncAnthropicModel fills the Usage from a reply and from a finished stream (whose
    output tokens arrive with message_delta)."""
    server.script(
        ANTHROPIC,
        _anthropic_reply(**_ANTHROPIC_USAGE),
        anthropic_stream(
            _message_start(input_tokens=4000, output_tokens=1, cache_read_input_tokens=1000),
            _BLOCK_START,
            _text_delta("Hel"),
            _text_delta("lo"),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 7},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ),
    )
    texts: list[str] = []
    replied = _async_complete(AsyncAnthropicModel, server, price_per_mtok=PRICE)
    streamed = _async_complete(
        AsyncAnthropicModel, server, price_per_mtok=PRICE, on_text=texts.append
    )
    assert isinstance(replied, sm.ModelReplied)
    assert replied.usage == attrs.evolve(_ANTHROPIC_FILLED, **_went(server, "anthropic"))
    assert isinstance(streamed, sm.ModelReplied)
    assert texts == ["Hel", "lo"]
    assert streamed.usage == sm.Usage(
        input_tokens=5000,
        output_tokens=7,
        cached_tokens=1000,
        cost_usd=_priced(5000, 7),
        model="claude-served",
        response_id="msg_stream",
        finish_reason="end_turn",
        **_went(server, "anthropic", streamed=True),
    )
    assert streamed.cost == pytest.approx(0.015105)


_OPENAI_FILLED = sm.Usage(
    input_tokens=1000,
    output_tokens=200,
    cached_tokens=400,
    cost_usd=_priced(1000, 200),
    model="gpt-served",
    response_id="chatcmpl-served",
    finish_reason="stop",
)


@pytest.mark.requirement("ER-143", "ER-88", "ER-52")
def test_openai_reply_fills_every_usage_field(server: FakeLLM) -> None:
    """A sync OpenAI completion gives a Usage with every field, cached tokens included."""
    server.script(OPENAI, _openai_reply(usage=_openai_usage(1000, 200, cached=400)))
    with _openai(server) as client:
        event = OpenAIModel(client, price_per_mtok=PRICE).complete(_call())
    assert isinstance(event, sm.ModelReplied)
    assert event.usage == attrs.evolve(_OPENAI_FILLED, **_went(server, "openai"))
    assert event.cost == pytest.approx(0.006)


@pytest.mark.requirement("ER-143", "ER-88", "ER-52")
def test_async_openai_reply_and_stream_fill_every_usage_field(server: FakeLLM) -> None:
    """AsyncOpenAIModel fills the Usage from a completion and from a finished stream whose
    usage came in the final, choice-less chunk (include_usage)."""
    server.script(
        OPENAI,
        _openai_reply(usage=_openai_usage(1000, 200, cached=400)),
        _openai_chunks(
            _chunk({"role": "assistant", "content": "Hi"}),
            _chunk({}, finish="stop"),
            _chunk(None, usage=_openai_usage(900, 20, cached=0)),
            done=True,
        ),
    )
    texts: list[str] = []
    replied = _async_complete(AsyncOpenAIModel, server, price_per_mtok=PRICE)
    streamed = _async_complete(
        AsyncOpenAIModel,
        server,
        price_per_mtok=PRICE,
        on_text=texts.append,
    )
    assert isinstance(replied, sm.ModelReplied)
    assert replied.usage == attrs.evolve(_OPENAI_FILLED, **_went(server, "openai"))
    assert isinstance(streamed, sm.ModelReplied)
    assert texts == ["Hi"]
    assert streamed.usage == sm.Usage(
        input_tokens=900,
        output_tokens=20,
        cached_tokens=0,
        cost_usd=_priced(900, 20),
        model="gpt-served",
        response_id="chatcmpl-stream",
        finish_reason="stop",
        **_went(server, "openai", streamed=True),
    )
    # asked by default: without it a stream reports no usage, and is never charged
    assert server.requests(OPENAI)[1].body["stream_options"] == {"include_usage": True}


# -- filtered and refused replies ---------------------------------------------------------


@pytest.mark.requirement("ER-143", "ER-88", "ER-52")
@pytest.mark.parametrize("how", ["finish_reason", "refusal"])
def test_openai_content_filtered_reply_is_charged(server: FakeLLM, how: str) -> None:
    """An OpenAI content_filter finish (or a message.refusal) is ModelFailed(content_filtered)
    carrying the usage and its cost, 1000 * 3 + 200 * 15 per million: 0.006."""
    if how == "finish_reason":
        canned = _openai_reply("content_filter", usage=_openai_usage(1000, 200))
    else:
        canned = _openai_reply("stop", usage=_openai_usage(1000, 200))
        canned.body["choices"][0]["message"]["refusal"] = "I can't help with that."
    server.script(OPENAI, canned)
    with _openai(server) as client:
        event = OpenAIModel(client, price_per_mtok=PRICE).complete(_call())
    assert isinstance(event, sm.ModelFailed)
    assert event.error.category is sm.ErrorCategory.CONTENT_FILTERED
    assert event.cost == pytest.approx(0.006)
    assert event.usage == sm.Usage(
        input_tokens=1000,
        output_tokens=200,
        cost_usd=event.cost,
        model="gpt-served",
        response_id="chatcmpl-served",
        finish_reason="content_filter" if how == "finish_reason" else "stop",
        **_went(server, "openai"),
    )


@pytest.mark.requirement("ER-143", "ER-88", "ER-52")
def test_anthropic_refusal_is_charged(server: FakeLLM) -> None:
    """An Anthropic stop_reason refusal is ModelFailed(content_filtered) carrying the usage
    and its cost (sync and async alike)."""
    server.script(
        ANTHROPIC,
        _anthropic_reply("refusal", input_tokens=1000, output_tokens=200),
        _anthropic_reply("refusal", input_tokens=1000, output_tokens=200),
    )
    with _anthropic(server) as client:
        sync_event = AnthropicModel(client, price_per_mtok=PRICE).complete(_call())
    async_event = _async_complete(AsyncAnthropicModel, server, price_per_mtok=PRICE)
    for event in (sync_event, async_event):
        assert isinstance(event, sm.ModelFailed)
        assert (event.error.category, event.error.code) == (
            sm.ErrorCategory.CONTENT_FILTERED,
            "refusal",
        )
        assert event.cost == pytest.approx(0.006)
        assert event.usage == sm.Usage(
            input_tokens=1000,
            output_tokens=200,
            cost_usd=event.cost,
            model="claude-served",
            response_id="msg_served",
            finish_reason="refusal",
            **_went(server, "anthropic"),
        )


# -- broken streams -----------------------------------------------------------------------


def _broken_anthropic(*events: tuple[str, dict[str, Any]], how: str) -> Canned:
    """A stream of ``events`` that then breaks: the connection drops, or an in-stream
    overloaded error arrives."""
    if how == "cut":
        return anthropic_stream(*events, cut=True)
    return anthropic_stream(*events, _OVERLOADED)


_STREAM_USAGE = sm.Usage(
    input_tokens=4000,
    output_tokens=1,
    cost_usd=_priced(4000, 1),
    model="claude-served",
    response_id="msg_stream",
)


@pytest.mark.requirement("ER-143", "ER-88", "ER-52", "ER-31")
@pytest.mark.parametrize("how", ["cut", "error_event"])
def test_anthropic_stream_broken_after_text_returns_the_usage(server: FakeLLM, how: str) -> None:
    """A stream that reported 4,000 input tokens (message_start) and delivered text, then
    broke, is ModelFailed(partial=True) carrying that usage and its cost."""
    server.script(
        ANTHROPIC,
        _broken_anthropic(
            _message_start(input_tokens=4000, output_tokens=1),
            _BLOCK_START,
            _text_delta("half a sent"),
            how=how,
        ),
    )
    texts: list[str] = []
    event = _async_complete(AsyncAnthropicModel, server, price_per_mtok=PRICE, on_text=texts.append)
    assert isinstance(event, sm.ModelFailed)
    assert event.partial is True
    assert texts == ["half a sent"]
    assert event.error.category is sm.ErrorCategory.OVERLOADED
    assert event.usage == attrs.evolve(_STREAM_USAGE, **_went(server, "anthropic", streamed=True))
    assert event.cost == pytest.approx(0.012015)


@pytest.mark.requirement("ER-143", "ER-88", "ER-52", "ER-31")
@pytest.mark.parametrize("how", ["cut", "error_event"])
def test_anthropic_stream_broken_before_text_returns_the_usage_unpartial(
    server: FakeLLM, how: str
) -> None:
    """The same break after message_start but before any delta is ModelFailed(partial=False)
    carrying the usage and its cost (the engine may retry it)."""
    server.script(
        ANTHROPIC,
        _broken_anthropic(_message_start(input_tokens=4000, output_tokens=1), how=how),
    )
    texts: list[str] = []
    event = _async_complete(AsyncAnthropicModel, server, price_per_mtok=PRICE, on_text=texts.append)
    assert isinstance(event, sm.ModelFailed)
    assert event.partial is False
    assert texts == []
    assert event.error.category is sm.ErrorCategory.OVERLOADED
    assert event.error.retryable
    assert event.usage == attrs.evolve(_STREAM_USAGE, **_went(server, "anthropic", streamed=True))
    assert event.cost == pytest.approx(0.012015)


@pytest.mark.requirement("ER-143", "ER-88", "ER-52", "ER-31")
def test_anthropic_stream_broken_after_message_delta_reports_its_output_tokens(
    server: FakeLLM,
) -> None:
    """A stream broken after message_delta (before message_stop) reports the output tokens
    and stop reason the delta brought, not message_start's."""
    server.script(
        ANTHROPIC,
        anthropic_stream(
            _message_start(input_tokens=4000, output_tokens=1),
            _BLOCK_START,
            _text_delta("all of it"),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 150},
                },
            ),
            cut=True,
        ),
    )
    event = _async_complete(AsyncAnthropicModel, server, price_per_mtok=PRICE, on_text=print)
    assert isinstance(event, sm.ModelFailed)
    assert event.partial is True
    assert event.usage == sm.Usage(
        input_tokens=4000,
        output_tokens=150,
        cost_usd=_priced(4000, 150),
        model="claude-served",
        response_id="msg_stream",
        finish_reason="end_turn",
        **_went(server, "anthropic", streamed=True),
    )
    assert event.cost == pytest.approx(0.01425)


@pytest.mark.requirement("ER-52", "ER-31", "ER-151")
def test_anthropic_stream_broken_before_message_start_is_classified(server: FakeLLM) -> None:
    """A stream that broke before reporting any usage or text is ModelFailed(classify(exc)),
    what a driver would send for the exception, unpartial, uncharged, saying where the
    call went."""
    server.script(ANTHROPIC, anthropic_stream(_OVERLOADED))
    event = _async_complete(AsyncAnthropicModel, server, price_per_mtok=PRICE, on_text=print)
    assert isinstance(event, sm.ModelFailed)
    assert (event.error.category, event.partial, event.cost) == (
        sm.ErrorCategory.OVERLOADED,
        False,
        0.0,
    )
    assert "Overloaded" in event.error.message
    assert event.usage == sm.Usage(**_went(server, "anthropic", streamed=True))


_HALF = _chunk({"role": "assistant", "content": "Half an ans"})


@pytest.mark.requirement("ER-143", "ER-88", "ER-52", "ER-31")
@pytest.mark.parametrize(
    ("chunks", "partial", "texts"),
    [
        # text, then the final usage chunk, then the connection drops before [DONE]
        ((_HALF, _chunk(None, usage=_openai_usage(1000, 200))), True, ["Half an ans"]),
        # usage on every chunk (continuous usage): a later chunk without usage does not
        # erase it (the SDK snapshot keeps only the last chunk's)
        (
            (
                _chunk({"role": "assistant", "content": ""}, usage=_openai_usage(1000, 200)),
                _HALF,
            ),
            True,
            ["Half an ans"],
        ),
        # usage before any text
        ((_chunk({"role": "assistant"}, usage=_openai_usage(1000, 200)),), False, []),
    ],
    ids=["usage-after-text", "usage-before-a-usageless-chunk", "usage-before-text"],
)
def test_openai_stream_broken_after_usage_returns_the_usage(
    server: FakeLLM, chunks: tuple[str, ...], partial: bool, texts: list[str]
) -> None:
    """An OpenAI stream that reported usage 1000/200 and then broke is ModelFailed carrying
    the usage and cost 0.006, partial only when text was delivered."""
    server.script(OPENAI, _openai_chunks(*chunks, cut=True))
    seen: list[str] = []
    event = _async_complete(
        AsyncOpenAIModel,
        server,
        price_per_mtok=PRICE,
        on_text=seen.append,
        stream_options={"include_usage": True},
    )
    assert isinstance(event, sm.ModelFailed)
    assert event.partial is partial
    assert seen == texts
    assert (event.error.category, event.error.code) == (
        sm.ErrorCategory.OVERLOADED,
        "connection_error",
    )
    assert event.usage == sm.Usage(
        input_tokens=1000,
        output_tokens=200,
        cost_usd=_priced(1000, 200),
        model="gpt-served",
        response_id="chatcmpl-stream",
        **_went(server, "openai", streamed=True),
    )
    assert event.cost == pytest.approx(0.006)


@pytest.mark.requirement("ER-52", "ER-31", "ER-151")
def test_openai_stream_broken_before_usage_and_text_is_classified(server: FakeLLM) -> None:
    """An OpenAI stream that broke after a usage-less, text-less chunk is
    ModelFailed(classify(exc)) of the connection error, saying where the call went."""
    server.script(OPENAI, _openai_chunks(_chunk({"role": "assistant"}), cut=True))
    event = _async_complete(AsyncOpenAIModel, server, price_per_mtok=PRICE, on_text=print)
    assert isinstance(event, sm.ModelFailed)
    assert (event.error.category, event.error.code, event.partial) == (
        sm.ErrorCategory.OVERLOADED,
        "connection_error",
        False,
    )
    assert event.usage == sm.Usage(**_went(server, "openai", streamed=True))


# -- odd shapes -----------------------------------------------------------------------------


_GARBAGE_USAGES: list[Any] = [
    {"input_tokens": "lots", "output_tokens": -3, "cache_read_input_tokens": [1]},
    {"input_tokens": 2**64, "output_tokens": True, "prompt_tokens_details": "no"},
    {
        "prompt_tokens": 1.5,
        "completion_tokens": None,
        "prompt_tokens_details": {"cached_tokens": -1},
    },
    "garbage",
    None,
]


@pytest.mark.requirement("ER-143", "ER-88", "ER-52")
@pytest.mark.parametrize("usage", _GARBAGE_USAGES)
def test_garbage_usage_is_unknown_never_an_exception(server: FakeLLM, usage: Any) -> None:
    """Token counts that are strings, negative, too large, fractional or missing, and
    labels that are not short strings, are None fields: no exception, no cost."""
    anthropic_reply = anthropic_message("ok")
    anthropic_reply.body.update(model=5, id="x" * 1001, usage=usage)
    openai_reply = openai_completion("ok")
    openai_reply.body.update(model=["gpt"], id="\ud800", usage=usage)
    openai_reply.body["choices"][0]["finish_reason"] = 7
    server.script(ANTHROPIC, anthropic_reply)
    server.script(OPENAI, openai_reply)
    with _anthropic(server) as aclient, _openai(server) as oclient:
        events = [
            AnthropicModel(aclient, model="m", price_per_mtok=PRICE).complete(_call()),
            OpenAIModel(oclient, model="m", price_per_mtok=PRICE).complete(_call()),
        ]
    anthropic_event, openai_event = events
    assert isinstance(anthropic_event, sm.ModelReplied)
    assert isinstance(openai_event, sm.ModelReplied)
    assert anthropic_event.usage == sm.Usage(finish_reason="end_turn", **_went(server, "anthropic"))
    assert openai_event.usage == sm.Usage(**_went(server, "openai"))
    assert anthropic_event.cost == openai_event.cost == 0.0


@pytest.mark.requirement("ER-143", "ER-88", "ER-52")
def test_whole_float_counts_are_kept_and_one_known_count_is_priced(server: FakeLLM) -> None:
    """A whole float count (12.0) is the int 12; a reply with only its output tokens known
    is priced on those alone; without a price the cost is 0.0 and cost_usd unknown."""
    server.script(
        OPENAI,
        _openai_reply(usage={"prompt_tokens": "?", "completion_tokens": 12.0}),
        _openai_reply(usage=_openai_usage(1000, 200)),
    )
    with _openai(server) as client:
        priced = OpenAIModel(client, price_per_mtok=PRICE).complete(_call())
        unpriced = OpenAIModel(client).complete(_call())
    assert isinstance(priced, sm.ModelReplied)
    assert priced.usage is not None
    assert (priced.usage.input_tokens, priced.usage.output_tokens) == (None, 12)
    assert priced.cost == pytest.approx(12 * 15 / 1e6)
    assert isinstance(unpriced, sm.ModelReplied)
    assert unpriced.usage is not None
    assert (unpriced.usage.input_tokens, unpriced.usage.cost_usd) == (1000, None)
    assert unpriced.cost == 0.0


@pytest.mark.requirement("ER-52")
@pytest.mark.parametrize("price", [(float("inf"), 1.0), (1.0, float("nan")), (10**400, 1.0)])
def test_a_price_that_is_not_a_finite_number_is_refused(server: FakeLLM, price: Any) -> None:
    """An infinite, NaN or float-overflowing price is refused when the provider is built
    (else a cost would be infinite, an event the engine refuses)."""
    with _openai(server) as client, pytest.raises(TypeError, match="price_per_mtok"):
        OpenAIModel(client, price_per_mtok=price)


# -- the spend reaches the session ------------------------------------------------------------


class _Context:
    async def assemble(self, action: sm.Assemble) -> sm.Assembled:
        return sm.Assembled({"messages": [{"role": "user", "content": "hi"}]}, size=10)


class _Tools:
    async def invoke(self, call: sm.ToolCall) -> sm.ToolOutcome:
        return sm.ToolOutcome(call.id, ok=True, content="ok")


@pytest.mark.requirement("ER-143", "ER-88", "ER-52")
def test_a_content_filtered_turn_spends_toward_max_cost_usd(server: FakeLLM) -> None:
    """arun_turn with a content-filtered reply charges its 0.006 to the session, whose
    max_cost_usd (0.005) is then reached."""
    server.script(OPENAI, _openai_reply("content_filter", usage=_openai_usage(1000, 200)))
    session = sm.Session(sm.Settings(max_cost_usd=0.005), seed=3, clock=lambda: 0.0)
    turn = session.new_turn()

    async def run() -> sm.Finish:
        async with _async_openai(server) as client:
            model = AsyncOpenAIModel(client, model="gpt-test", price_per_mtok=PRICE)
            return await sm.arun_turn(turn, model=model, tools=_Tools(), context=_Context())

    finish = asyncio.run(run())
    assert finish.status is sm.TurnStatus.CONTENT_FILTERED
    assert session.cost_usd == pytest.approx(0.006)
    assert session.limit_reached is sm.SessionStatus.ERROR_MAX_BUDGET_USD
    assert sum(record.cost_usd for record in turn.trace) == pytest.approx(0.006)


@pytest.mark.requirement("ER-143", "ER-88", "ER-52", "ER-31")
def test_a_retried_broken_stream_is_charged_with_its_retry(server: FakeLLM) -> None:
    """A stream broken after message_start (4,000 input tokens) and before text is retried,
    and both attempts are charged: 0.012015 + the reply's 0.000105."""
    server.script(
        ANTHROPIC,
        anthropic_stream(_message_start(input_tokens=4000, output_tokens=1), _OVERLOADED),
        anthropic_stream(
            _message_start(input_tokens=10, output_tokens=1),
            _BLOCK_START,
            _text_delta("fine"),
            ("message_stop", {"type": "message_stop"}),
        ),
    )
    waits: list[float] = []
    session = sm.Session(sm.Settings(), seed=3, clock=lambda: 0.0)
    texts: list[str] = []

    async def run() -> sm.Finish:
        async with _async_anthropic(server) as client:
            model = AsyncAnthropicModel(
                client, model="claude-test", price_per_mtok=PRICE, on_text=texts.append
            )
            return await sm.arun_turn(
                session.new_turn(),
                model=model,
                tools=_Tools(),
                context=_Context(),
                sleep=waits.append,
            )

    finish = asyncio.run(run())
    assert finish.status is sm.TurnStatus.COMPLETED
    assert texts == ["fine"]
    assert len(waits) == 1
    assert server.count(ANTHROPIC) == 2
    assert session.cost_usd == pytest.approx(_priced(4000, 1) + _priced(10, 1))


# -- where each call went (issue 25) -------------------------------------------------------


@pytest.mark.requirement("ER-150")
@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"server_port": 0}, "Usage.server_port"),
        ({"server_port": 65536}, "Usage.server_port"),
        ({"server_port": True}, "Usage.server_port"),
        ({"server_port": "443"}, "Usage.server_port"),
        ({"streamed": 1}, "Usage.streamed"),
        ({"provider_name": 7}, "Usage.provider_name"),
        ({"server_address": "x" * 1001}, "Usage.server_address"),
        ({"cache_creation_tokens": -1}, "Usage.cache_creation_tokens"),
        ({"reasoning_tokens": 2**63}, "Usage.reasoning_tokens"),
    ],
)
def test_a_bad_where_field_is_refused_naming_it(fields: dict[str, Any], named: str) -> None:
    """Each new field of Usage refuses a value of the wrong kind or range with an
    InvalidValue that names it; the value stays frozen."""
    with pytest.raises(sm.InvalidValue, match=named):
        sm.Usage(**fields)
    usage = sm.Usage(server_port=443, streamed=False, provider_name="openai")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        usage.server_port = 80  # type: ignore[misc]


@pytest.mark.requirement("ER-150")
def test_usages_of_before_and_after_restore_from_a_snapshot() -> None:
    """A snapshot's usage as it was written before the new fields (no provider, no
    server) restores as it was, and one with every new field restores whole: the
    format version is the one the engine writes today."""
    now = [0.0]
    session = sm.Session(sm.Settings(), seed=1, clock=lambda: now[0])
    turn = session.new_turn()
    turn.start()
    turn.send(sm.Assembled("q", 1))
    full = sm.Usage(
        900,
        12,
        100,
        cost_usd=0.01,
        model="m-2026-01-01",
        cache_creation_tokens=50,
        reasoning_tokens=4,
        provider_name="anthropic",
        server_address="api.anthropic.com",
        server_port=443,
        streamed=True,
    )
    turn.send(sm.ModelFailed(sm.ModelError("overloaded", status=529), usage=full))
    data = session.snapshot()
    (entry,) = data["turn"]["usages"]
    assert entry[1]["provider_name"] == "anthropic"
    restored = sm.Session.restore(json.loads(json.dumps(data)), clock=lambda: now[0])
    assert restored.current_turn is not None
    assert restored.current_turn.trace[-1].usage == full
    # the same snapshot as the previous release wrote it: none of the new keys
    old = json.loads(json.dumps(data))
    old["turn"]["usages"] = [[entry[0], {"$type": "Usage", "input_tokens": 900}]]
    old_restored = sm.Session.restore(old, clock=lambda: now[0])
    assert old_restored.current_turn is not None
    assert old_restored.current_turn.trace[-1].usage == sm.Usage(900)


@pytest.mark.requirement("ER-151")
def test_an_error_the_sdk_raised_comes_back_classified_and_located(server: FakeLLM) -> None:
    """A 429 the OpenAI SDK raises and a 529 the Anthropic SDK raises (sync and async)
    are returned as ModelFailed(classify(exc)): the category, the HTTP status and the
    retry-after a driver would get, and a usage saying where the call went."""
    server.script(
        OPENAI,
        openai_error(429, "Rate limit reached", "requests", retry_after="7"),
        openai_error(429, "Rate limit reached", "requests", retry_after="7"),
    )
    server.script(ANTHROPIC, anthropic_error(529, "overloaded_error", "Overloaded"))
    with _openai(server) as oclient, _anthropic(server) as aclient:
        openai_event = OpenAIModel(oclient, model="m").complete(_call())
        anthropic_event = AnthropicModel(aclient, model="m").complete(_call())
    async_event = _async_complete(AsyncOpenAIModel, server, model="m")
    for event, provider, category, status in (
        (openai_event, "openai", sm.ErrorCategory.RATE_LIMITED, 429),
        (async_event, "openai", sm.ErrorCategory.RATE_LIMITED, 429),
        (anthropic_event, "anthropic", sm.ErrorCategory.OVERLOADED, 529),
    ):
        assert isinstance(event, sm.ModelFailed)
        assert (event.error.category, event.error.status) == (category, status)
        assert (event.partial, event.cost) == (False, 0.0)
        assert event.usage == sm.Usage(**_went(server, provider))
    assert isinstance(openai_event, sm.ModelFailed)
    assert openai_event.error.headers is not None
    assert openai_event.error.headers["retry-after"] == "7"


@pytest.mark.requirement("ER-151")
def test_the_sdks_cloud_clients_name_their_provider_and_server() -> None:
    """Azure OpenAI, Bedrock and Vertex clients give their conventions' provider names,
    and a base URL without a port gives the scheme's (443)."""
    clients = [
        (
            OpenAIModel,
            openai.AzureOpenAI(
                azure_endpoint="https://example.openai.azure.com",
                api_version="2024-10-21",
                api_key="x",
                max_retries=0,
            ),
            ("azure.ai.openai", "example.openai.azure.com", 443),
        ),
        (
            AnthropicModel,
            anthropic.AnthropicBedrock(  # fake credentials: nothing is sent
                aws_region="us-east-1",
                aws_access_key="a",
                aws_secret_key="b",  # noqa: S106
                max_retries=0,
            ),
            ("aws.bedrock", "bedrock-runtime.us-east-1.amazonaws.com", 443),
        ),
        (
            AnthropicModel,
            anthropic.AnthropicVertex(
                region="us-east5",
                project_id="p",
                access_token="t",  # noqa: S106
                max_retries=0,
            ),
            ("gcp.vertex_ai", "us-east5-aiplatform.googleapis.com", 443),
        ),
        (
            OpenAIModel,
            openai.OpenAI(api_key="x", max_retries=0),
            ("openai", "api.openai.com", 443),
        ),
        (
            OpenAIModel,
            openai.OpenAI(api_key="x", base_url="http://localhost/v1", max_retries=0),
            ("openai", "localhost", 80),
        ),
    ]
    for make, client, (provider, address, port) in clients:
        event = make(client, model="m")._raised(RuntimeError("down"))
        assert event.usage == sm.Usage(
            provider_name=provider, server_address=address, server_port=port, streamed=False
        )
        assert event.error.category is sm.ErrorCategory.UNKNOWN
        client.close()


@pytest.mark.requirement("ER-151")
def test_openai_reasoning_tokens_are_reported(server: FakeLLM) -> None:
    """completion_tokens_details.reasoning_tokens is Usage.reasoning_tokens."""
    usage = _openai_usage(1000, 200)
    usage["completion_tokens_details"] = {"reasoning_tokens": 150}
    server.script(OPENAI, _openai_reply(usage=usage))
    with _openai(server) as client:
        event = OpenAIModel(client).complete(_call())
    assert event.usage is not None
    assert (event.usage.output_tokens, event.usage.reasoning_tokens) == (200, 150)
